"""A `ModelSpec` from a GGUF file's own metadata and tensor table (header only, no torch)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from llmdeploy.catalog.gguf_header import GGUFTensor, read_gguf_header
from llmdeploy.catalog.model_spec import ModelSpec, ParamCount, build_spec
from llmdeploy.errors import UserError

_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen2moe": "Qwen2MoeForCausalLM",
    "qwen3moe": "Qwen3MoeForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3": "Gemma3ForCausalLM",
    "phi2": "PhiForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "granite": "GraniteForCausalLM",
}


def spec_from_gguf(path: str | Path) -> ModelSpec:
    path = Path(path)
    header = read_gguf_header(path)
    fields = header.fields
    arch = fields.get("general.architecture")
    if arch not in _ARCHITECTURES:
        raise UserError.one(
            f"GGUF architecture {arch!r} of {path.name} is not supported",
            fix=f"supported: {', '.join(sorted(_ARCHITECTURES))}",
        )

    def meta(key: str, default: Any = None) -> Any:
        value = fields.get(f"{arch}.{key}")
        return default if value is None else value

    tensors = {t.name: t for t in header.tensors}
    embd = tensors["token_embd.weight"]
    hidden, vocab = (int(d) for d in embd.shape[:2])
    heads = int(meta("attention.head_count"))
    head_dim = int(meta("attention.key_length", 0)) or hidden // heads
    facts: dict[str, Any] = {
        "hf_id": path.stem,
        "aliases": [str(fields["general.name"])] if fields.get("general.name") else [],
        "family": str(fields.get("general.basename") or arch),
        "architecture": _ARCHITECTURES[arch],
        "num_layers": int(meta("block_count")),
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_kv_heads": int(meta("attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "intermediate_size": int(meta("feed_forward_length")),
        "vocab_size": int(meta("vocab_size", vocab)),
        "max_position_embeddings": int(meta("context_length")),
        "tie_word_embeddings": "output.weight" not in tensors,
        "rope_theta": float(meta("rope.freq_base", 10000.0)),
        "rms_norm_eps": float(meta("attention.layer_norm_rms_epsilon", 1e-5)),
        "attention_bias": "blk.0.attn_q.bias" in tensors,
        "qk_norm": "blk.0.attn_q_norm.weight" in tensors,
        "sliding_window": meta("attention.sliding_window"),
        "source": "gguf",
    }
    if facts["sliding_window"] is None:
        facts.pop("sliding_window")
    experts = meta("expert_count")
    if experts:
        facts["num_experts"] = int(experts)
        facts["num_experts_per_tok"] = int(meta("expert_used_count"))
        facts["moe_intermediate_size"] = int(meta("expert_feed_forward_length", facts["intermediate_size"]))
    spec = build_spec(facts)

    # The tensor table is the truth for the count and the size on disk.
    count = sum(int(t.n_elements) for t in tensors.values())
    size = sum(int(t.n_bytes) for t in tensors.values())
    p = spec.params
    exact = ParamCount(p.embedding, p.layers, p.head, count - (p.total - p.extra), p.linear, p.active_layers)
    file_type = _file_type_name(tensors)
    table = tuple((t.name, tuple(int(d) for d in t.shape), t.type_name) for t in tensors.values())
    return replace(
        spec, params=exact, weights_bytes_on_disk=size, file_quantization=file_type, gguf_tensors=table
    )


def _file_type_name(tensors: dict[str, GGUFTensor]) -> str:
    """The dominant tensor type of the layers (e.g. Q4_1), which is what "the quantization" means."""
    counts: dict[str, int] = {}
    for t in tensors.values():
        if t.name.startswith("blk."):
            counts[t.type_name] = counts.get(t.type_name, 0) + t.n_elements
    return max(counts, key=lambda k: counts[k]) if counts else "unknown"
