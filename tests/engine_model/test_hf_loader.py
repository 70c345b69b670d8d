"""Hugging Face checkpoints (tiny random models saved by transformers) load and match transformers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from llmdeploy_engine.config import EngineConfig
from llmdeploy_engine.core.forward_batch import ForwardBatch
from llmdeploy_engine.loading.hf_loader import load_hf_config, safetensors_files
from llmdeploy_engine.runner.model_runner import ModelRunner

TINY: dict[str, Any] = {
    "vocab_size": 320,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6,
}
FAMILIES: dict[str, dict[str, Any]] = {
    "llama": {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}},
    "llama3-rope": {
        "model_type": "llama",
        "rope_parameters": {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    },
    "mistral": {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}, "sliding_window": None},
    "qwen2": {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}, "tie_word_embeddings": True},
    "qwen3": {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}, "head_dim": 32},
}


def save_tiny(folder: Path, family: str, shard: bool) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    extra = dict(FAMILIES[family])
    model_type = extra.pop("model_type", family)
    config = AutoConfig.for_model(model_type, **TINY, **extra)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # make biases and norms non-trivial so a missed one shows
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(folder, max_shard_size="100KB" if shard else "1GB")
    return model.eval()


@pytest.mark.parametrize(
    "family,shard",
    [("llama", False), ("llama3-rope", False), ("mistral", True), ("qwen2", False), ("qwen3", True)],
)
def test_checkpoint_logits_match_transformers(tmp_path: Path, family: str, shard: bool) -> None:
    hf = save_tiny(tmp_path, family, shard)
    assert (tmp_path / "model.safetensors.index.json").is_file() == shard
    assert len(safetensors_files(tmp_path)) > 1 if shard else len(safetensors_files(tmp_path)) == 1
    config = load_hf_config(tmp_path)
    assert config.qk_norm == (family == "qwen3") and config.attention_bias == (family == "qwen2")
    assert config.rope_scaling.rope_type == ("llama3" if family == "llama3-rope" else "default")
    runner = ModelRunner(EngineConfig(model=str(tmp_path), device="cpu", kv_cache_memory_bytes=8 * 2**20))
    ids = torch.randint(0, TINY["vocab_size"], (90,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.inference_mode():
        ref = hf(torch.tensor([ids])).logits[0].float()
    n = 80  # prefill 80 tokens, then 10 single-token decode steps
    table = list(range(-(-len(ids) // runner.block_size)))
    slots = list(range(len(ids)))  # blocks 0.. in order: slot == position
    got = [runner.execute(ForwardBatch(ids[:n], list(range(n)), slots[:n], [0], [n], [n], [table], [0]))[0]]
    for p in range(n, len(ids) - 1):
        batch = ForwardBatch([ids[p]], [p], [slots[p]], [0], [1], [p + 1], [table], [0])
        got.append(runner.execute(batch)[0])
    for step, logits in enumerate(got):
        want = ref[n - 1 + step]
        assert float((logits - want).abs().max() / want.abs().max()) < 1e-4, f"{family} step {step}"


def test_unsupported_model_type_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ValueError, match="not supported"):
        load_hf_config(tmp_path)
