"""GGUF files written here (tiny Llama, llama.cpp tensor names and Q/K permutation) load correctly."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize
from llmdeploy_engine.loading.gguf_loader import load_gguf, load_gguf_config

HEADS, KV_HEADS, HIDDEN, LAYERS, VOCAB, FFN = 4, 2, 64, 2, 256, 96
NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """What llama.cpp's converter does to Llama Q/K rows (rotate-half -> interleaved pairs)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 10000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}


def tiny_llama(rope: dict[str, object] | None = None) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        "llama",
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=FFN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        rope_parameters=rope or {"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


def write_gguf(
    path: Path, model: torch.nn.Module, qtype: GGMLQuantizationType, rope_freqs: np.ndarray | None = None
) -> None:
    writer = GGUFWriter(str(path), "llama")
    writer.add_block_count(LAYERS)
    writer.add_context_length(256)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(VOCAB)
    state = {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()}
    tensors = {
        "token_embd.weight": state["model.embed_tokens.weight"],
        "output_norm.weight": state["model.norm.weight"],
        "output.weight": state["lm_head.weight"],
    }
    for i in range(LAYERS):
        for hf_name, gguf_name in NAMES.items():
            w = state[f"model.layers.{i}.{hf_name}"]
            if hf_name.startswith("self_attn.q"):
                w = llama_cpp_permute(w, HEADS)
            elif hf_name.startswith("self_attn.k"):
                w = llama_cpp_permute(w, KV_HEADS)
            tensors[f"blk.{i}.{gguf_name}"] = w
    if rope_freqs is not None:
        tensors["rope_freqs.weight"] = rope_freqs
    for name, w in tensors.items():
        if w.ndim == 2 and qtype != GGMLQuantizationType.F32:
            writer.add_tensor(name, quantize(w, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(name, w)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("llama3_rope", [False, True])
@pytest.mark.slow
def test_f32_gguf_logits_match_the_original_model(tmp_path: Path, llama3_rope: bool) -> None:
    from llmdeploy_engine.config import EngineConfig, RopeScaling
    from llmdeploy_engine.core.forward_batch import ForwardBatch
    from llmdeploy_engine.model.model import rope_inv_freq
    from llmdeploy_engine.runner.model_runner import ModelRunner

    hf = tiny_llama(LLAMA3_ROPE if llama3_rope else None)
    path = tmp_path / "tiny.gguf"
    freqs = None
    if llama3_rope:  # as llama.cpp's converter writes it: default frequencies over Llama 3's
        scaling = RopeScaling("llama3", 8.0, 1.0, 4.0, 32)  # LLAMA3_ROPE
        freqs = (rope_inv_freq(16, 10000.0, RopeScaling()) / rope_inv_freq(16, 10000.0, scaling)).numpy()
    write_gguf(path, hf, GGMLQuantizationType.F32, freqs)
    config = load_gguf_config(path)
    assert (config.rope_freq_factors is not None) == llama3_rope
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (HEADS, KV_HEADS, 16)
    assert not config.tie_word_embeddings
    runner = ModelRunner(EngineConfig(model=str(path), device="cpu", kv_cache_memory_bytes=4 * 2**20))
    ids = list(range(3, 40))
    n = len(ids)
    ours = runner.execute(ForwardBatch(ids, list(range(n)), list(range(n)), [0], [n], [n], [[0, 1, 2]], [0]))[
        0
    ]
    with torch.inference_mode():
        ref = hf(torch.tensor([ids])).logits[0, -1]
    assert float((ours - ref).abs().max() / ref.abs().max()) < 1e-5


@pytest.mark.parametrize(
    "qtype,tolerance",
    [
        (GGMLQuantizationType.F16, 1e-3),
        (GGMLQuantizationType.BF16, 1e-2),
        (GGMLQuantizationType.Q8_0, 2e-2),
        (GGMLQuantizationType.Q4_0, 0.25),
        (GGMLQuantizationType.Q4_1, 0.25),
    ],
)
def test_quantized_tensors_dequantize_to_the_original(
    tmp_path: Path, qtype: GGMLQuantizationType, tolerance: float
) -> None:
    hf = tiny_llama()
    path = tmp_path / f"tiny-{qtype.name}.gguf"
    write_gguf(path, hf, qtype)
    _, weights = load_gguf(path)
    original = hf.state_dict()
    assert set(weights) == set(original)
    for name, w in weights.items():
        ref = original[name]
        assert w.shape == ref.shape, name
        assert float((w - ref).abs().max() / ref.abs().max()) < tolerance, name


def test_an_engine_start_parses_its_gguf_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Config, weights and chat template share one parse inside the scope (gguf-py's reader takes
    seconds on a real vocabulary); outside it nothing is kept."""
    from llmdeploy_engine.config import EngineConfig
    from llmdeploy_engine.loading import gguf_loader
    from llmdeploy_engine.runner.model_runner import ModelRunner

    path = tmp_path / "tiny.gguf"
    write_gguf(path, tiny_llama(), GGMLQuantizationType.F32)
    parsed: list[str] = []
    real = gguf_loader._open_reader

    def counting(p: str) -> object:
        parsed.append(p)
        return real(p)

    monkeypatch.setattr(gguf_loader, "_open_reader", counting)
    ModelRunner(EngineConfig(model=str(path), device="cpu", kv_cache_memory_bytes=4 * 2**20))
    assert len(parsed) == 1
    assert gguf_loader._shared_readers is None
    gguf_loader.load_gguf_config(path)
    gguf_loader.load_gguf_config(path)
    assert len(parsed) == 3  # no scope: each read parses
