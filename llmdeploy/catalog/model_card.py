"""`model_card(spec)`: what engineers otherwise dig out of config.json by hand, as one JSON-able dict
(KV bytes per token for each KV dtype, weight size for each quantization)."""

from __future__ import annotations

from typing import Any

from llmdeploy.catalog.model_spec import ModelSpec

GIB = 2**30

KV_DTYPES = {"bf16": 2, "fp16": 2, "fp8": 1, "fp32": 4}
# bits per linear parameter (the rest stays 16-bit): see memory/footprint.py for the sources
WEIGHT_FORMATS = {
    "bf16": 16.0,
    "fp8": 8.0,
    "int8": 8.0,
    "awq/gptq int4": 4.0 + 20 / 128,
    "bnb nf4": 4.0 + 8.5 / 64,
}


def kv_bytes_per_token(spec: ModelSpec, kv_dtype_bytes: int) -> int:
    """All attention layers, one token, one GPU (no tensor parallelism); MLA stores one latent per
    layer; linear-attention layers keep a fixed state and no per-token KV."""
    if spec.is_mla:
        return spec.num_layers * (spec.kv_lora_rank + spec.qk_rope_head_dim) * kv_dtype_bytes
    layers = sum(1 for k in spec.kinds if k != "linear")
    return 2 * layers * spec.num_kv_heads * spec.head_dim * kv_dtype_bytes


def _weights_bytes(spec: ModelSpec, bits: float) -> int:
    p = spec.params
    return int(p.linear * bits / 8) + (p.total - p.linear) * 2


def model_card(spec: ModelSpec) -> dict[str, Any]:
    kinds = spec.kinds
    n_sliding = sum(1 for k in kinds if k == "sliding")
    card: dict[str, Any] = {
        "hf_id": spec.hf_id,
        "aliases": list(spec.aliases),
        "family": spec.family,
        "architecture": spec.architecture,
        "source": spec.source,
        "hidden_size": spec.hidden_size,
        "num_layers": spec.num_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_kv_heads": spec.num_kv_heads,
        "gqa_group_size": spec.gqa_group_size,
        "head_dim": spec.head_dim,
        "intermediate_size": spec.intermediate_size,
        "vocab_size": spec.vocab_size,
        "max_position_embeddings": spec.max_position_embeddings,
        "tie_word_embeddings": spec.tie_word_embeddings,
        "rope_theta": spec.rope_theta,
        "rope_scaling": dict(spec.rope_scaling) if spec.rope_scaling else None,
        "rope_local_base_freq": spec.rope_local_base_freq,
        "partial_rotary_factor": spec.partial_rotary_factor,
        "rms_norm_eps": spec.rms_norm_eps,
        "attention_bias": spec.attention_bias,
        "qk_norm": spec.qk_norm,
        "sliding_window": spec.sliding_window,
        "num_sliding_layers": n_sliding,
        "num_full_attention_layers": sum(1 for k in kinds if k == "full"),
        "num_chunked_attention_layers": sum(1 for k in kinds if k == "chunked"),
        "num_linear_attention_layers": sum(1 for k in kinds if k == "linear"),
        "attention_chunk_size": spec.attention_chunk_size,
        "hybrid": spec.is_hybrid,
        "moe": None,
        "mla": None,
        "num_params": spec.num_params,
        "params": {
            "embedding": spec.params.embedding,
            "layers": spec.params.layers,
            "head": spec.params.head,
            "extra": spec.params.extra,
            "active_per_token": spec.params.active_layers + spec.params.embedding + spec.params.head,
        },
        "kv_bytes_per_token": {name: kv_bytes_per_token(spec, b) for name, b in KV_DTYPES.items()},
        "weights_gib": {
            name: round(_weights_bytes(spec, bits) / GIB, 2) for name, bits in WEIGHT_FORMATS.items()
        },
    }
    if spec.is_moe:
        card["moe"] = {
            "num_experts": spec.num_experts,
            "num_experts_per_tok": spec.num_experts_per_tok,
            "moe_intermediate_size": spec.moe_intermediate_size,
            "num_shared_experts": spec.num_shared_experts,
            "shared_expert_intermediate_size": spec.shared_expert_intermediate_size,
            "first_k_dense_replace": spec.first_k_dense_replace,
        }
    if spec.is_mla:
        card["mla"] = {
            "kv_lora_rank": spec.kv_lora_rank,
            "q_lora_rank": spec.q_lora_rank,
            "qk_rope_head_dim": spec.qk_rope_head_dim,
            "qk_nope_head_dim": spec.qk_nope_head_dim,
            "v_head_dim": spec.v_head_dim,
        }
    if spec.weights_bytes_on_disk is not None:
        card["weights_gib"]["file" + (f" ({spec.file_quantization})" if spec.file_quantization else "")] = (
            round(spec.weights_bytes_on_disk / GIB, 3)
        )
    return card


def card_text(card: dict[str, Any]) -> str:
    """Readable rendering of `model_card` (nested dicts become indented blocks)."""
    lines = []
    for key, value in card.items():
        if isinstance(value, dict):
            lines.append(f"{key}:")
            lines += [f"  {k:<34}{_fmt(v)}" for k, v in value.items()]
        elif value is None or value == []:
            continue
        else:
            lines.append(f"{key:<36}{_fmt(value)}")
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int):
        return str(value)
    return f"{value:,}"
