"""`random:<hub id>`: a catalog architecture with random weights, for benchmarks without a checkpoint.

The shape comes from `llmdeploy.catalog.models.resolve_model` (the same facts the planner uses);
weights are drawn on the target device directly, normal(0, 0.02) for matrices and ones for norms,
which keeps activations and logits in a realistic range.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from llmdeploy_engine.config import ModelConfig, RopeScaling

RANDOM_PREFIX = "random:"

# transformers class name -> ours
_CLASSES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}


def is_random(model: str) -> bool:
    return model.startswith(RANDOM_PREFIX)


def config_from_spec(spec: Any) -> ModelConfig:
    """ModelConfig from a catalog ModelSpec (llmdeploy/catalog/model_spec.py)."""
    arch = _CLASSES.get(spec.architecture)
    if arch is None or spec.is_moe or spec.is_mla or spec.partial_rotary_factor != 1.0 or not spec.mlp_gated:
        raise ValueError(
            f"{spec.hf_id} ({spec.architecture}) is not an architecture the built-in engine runs; "
            f"supported: {', '.join(sorted(_CLASSES))} without MoE/MLA/partial RoPE"
        )
    scaling = RopeScaling()
    rope = dict(spec.rope_scaling or {})
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type == "llama3":
        scaling = RopeScaling(
            "llama3",
            float(rope["factor"]),
            float(rope["low_freq_factor"]),
            float(rope["high_freq_factor"]),
            int(rope["original_max_position_embeddings"]),
        )
    elif rope_type == "linear":
        scaling = RopeScaling("linear", float(rope["factor"]))
    elif rope_type != "default":
        raise ValueError(f"{spec.hf_id}: rope type {rope_type!r} is not supported by the built-in engine")
    return ModelConfig(
        architecture=arch,
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        # no sliding-window attention here: exact only up to the window, so the context stops there
        max_position_embeddings=min(
            spec.max_position_embeddings, spec.sliding_window or spec.max_position_embeddings
        ),
        rms_norm_eps=spec.rms_norm_eps or 1e-6,
        rope_theta=spec.rope_theta or 10000.0,
        rope_scaling=scaling,
        tie_word_embeddings=spec.tie_word_embeddings,
        attention_bias=spec.attention_bias,
        qk_norm=spec.qk_norm,
    )


def random_model_config(model: str) -> ModelConfig:
    from llmdeploy.catalog.models import resolve_model

    return config_from_spec(resolve_model(model.removeprefix(RANDOM_PREFIX)))


def init_random_weights(model: Any, seed: int, std: float = 0.02) -> None:
    """Fill every parameter in place (on its own device): norms 1, matrices and biases N(0, std).

    The full Hugging Face tensors are drawn in a fixed order from one seeded generator and each rank
    keeps its slice, so every tensor_parallel_size builds the same model.
    """
    ref = next(model.parameters())
    gen = torch.Generator(device=ref.device).manual_seed(seed)

    def tensors() -> Iterator[tuple[str, torch.Tensor]]:
        for name, shape in model.hf_shapes().items():
            if name.endswith("norm.weight"):
                yield name, torch.ones(shape, dtype=ref.dtype, device=ref.device)
            else:
                full = torch.empty(shape, dtype=ref.dtype, device=ref.device)
                yield name, full.normal_(0.0, std, generator=gen)

    with torch.no_grad():
        model.load_hf_tensors(tensors())
