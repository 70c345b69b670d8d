"""On a CUDA GPU: a random-weight Qwen2.5-0.5B architecture, our runner vs transformers, float32."""

from __future__ import annotations

import pytest
import torch
from llmdeploy_engine.config import EngineConfig
from llmdeploy_engine.core.forward_batch import ForwardBatch
from llmdeploy_engine.runner.model_runner import ModelRunner

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_random_qwen2_logits_match_transformers_on_cuda() -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    runner = ModelRunner(
        EngineConfig(
            model="random:Qwen/Qwen2.5-0.5B",
            device="cuda",
            dtype="float32",
            max_model_len=2048,
            gpu_memory_utilization=0.3,
        )
    )
    mc = runner.model_config
    assert runner.startup_report.device == "cuda" and runner.startup_report.peak_activation_bytes > 0
    hf_config = AutoConfig.for_model(
        "qwen2",
        vocab_size=mc.vocab_size,
        hidden_size=mc.hidden_size,
        intermediate_size=mc.intermediate_size,
        num_hidden_layers=mc.num_hidden_layers,
        num_attention_heads=mc.num_attention_heads,
        num_key_value_heads=mc.num_key_value_heads,
        rms_norm_eps=mc.rms_norm_eps,
        tie_word_embeddings=True,
    )
    hf_config.rope_parameters = {"rope_type": "default", "rope_theta": mc.rope_theta}
    with torch.device("cuda"):
        hf = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32).eval()
    hf.load_state_dict(runner.model.hf_state_dict(), strict=False)
    ids = torch.randint(0, mc.vocab_size, (40,), generator=torch.Generator().manual_seed(0)).tolist()
    n = len(ids)
    batch = ForwardBatch(ids, list(range(n)), list(range(n)), [0], [n], [n], [[0, 1, 2]], [0])
    ours = runner.execute(batch)[0]
    with torch.inference_mode():
        ref = hf(torch.tensor([ids], device="cuda")).logits[0, -1].float()
    assert float((ours - ref).abs().max() / ref.abs().max()) < 1e-3


def test_kv_cache_leaves_out_memory_the_process_already_holds() -> None:
    """A second engine (or the caller's tensors) in one process: the KV cache is sized without the
    memory already held, so 0.9 of the GPU stays 0.9 instead of running out of memory."""
    import gc

    gc.collect()
    torch.cuda.empty_cache()
    total = torch.cuda.mem_get_info()[1]
    held = torch.empty(int(total * 0.2), dtype=torch.uint8, device="cuda")  # 0.9 + 0.2 > 1 without the rule
    before = torch.cuda.memory_allocated()
    runner = ModelRunner(
        EngineConfig(
            model="random:Qwen/Qwen2.5-0.5B",
            device="cuda",
            max_model_len=2048,
            gpu_memory_utilization=0.9,
            enforce_eager=True,
        )
    )
    report = runner.startup_report
    assert report.held_bytes == before >= held.numel()
    assert any("held before the engine started" in line for line in report.log_lines())
    assert torch.cuda.memory_allocated() <= total * 0.9 + 2**30  # the budget, with rounding slack
    del runner, held
    gc.collect()
    torch.cuda.empty_cache()
