"""`random:<hub id>`: a catalog architecture with random weights, for benchmarks without a checkpoint.

The shape comes from random_models.json, the toolkit catalog's entries of the architectures the engine
runs (the same facts the planner uses; the engine never imports the toolkit); weights are drawn on the target device directly, normal(0, 0.02) for matrices and ones for norms,
which keeps activations and logits in a realistic range.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from llmdeploy_engine.config import ModelConfig, RopeScaling
from llmdeploy_engine.facts import ARCHITECTURES

RANDOM_PREFIX = "random:"

_TABLE = Path(__file__).with_name("random_models.json")
_VARIANT_TOKENS = {"instruct", "it", "chat", "hf", "base", "pt"}  # a fine-tune has its base's shape


def is_random(model: str) -> bool:
    return model.startswith(RANDOM_PREFIX)


def config_from_spec(spec: Any) -> ModelConfig:
    """ModelConfig from a catalog ModelSpec (llmdeploy/catalog/model_spec.py)."""
    arch = ARCHITECTURES.get(spec.architecture)
    if arch is None or spec.is_moe or spec.is_mla or spec.partial_rotary_factor != 1.0 or not spec.mlp_gated:
        raise ValueError(
            f"{spec.hf_id} ({spec.architecture}) is not an architecture the built-in engine runs; "
            f"supported: {', '.join(sorted(ARCHITECTURES))} without MoE/MLA/partial RoPE"
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


def _key(name: str) -> str:
    base = name.strip().rstrip("/").split("/")[-1].lower().removeprefix("meta-")
    return "-".join(t for t in base.split("-") if t not in _VARIANT_TOKENS)


@cache
def _index() -> dict[str, dict[str, Any]]:
    index: dict[str, dict[str, Any]] = {}
    for hf_id, facts in json.loads(_TABLE.read_text())["models"].items():
        entry = {**facts, "hf_id": hf_id}
        for name in (hf_id, *facts["aliases"]):
            index.setdefault(name.lower(), entry)
            index.setdefault(_key(name), entry)
    return index


def random_model_config(model: str) -> ModelConfig:
    name = model.removeprefix(RANDOM_PREFIX)
    facts = _index().get(name.strip().lower()) or _index().get(_key(name))
    if facts is None:
        raise ValueError(
            f"{name} is not an architecture the built-in engine runs with random weights; known: "
            f"the {', '.join(sorted(ARCHITECTURES))} models of the catalog ({_TABLE.name})"
        )
    spec = SimpleNamespace(**facts, is_moe=False, is_mla=False, partial_rotary_factor=1.0, mlp_gated=True)
    if spec.hf_id.lower() != name.strip().lower():
        spec.hf_id = name
    return config_from_spec(spec)


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
