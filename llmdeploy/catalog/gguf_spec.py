"""A `ModelSpec` from a GGUF file's own metadata and tensor table (header only, no torch)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from llmdeploy.catalog.gguf_header import GGUFHeader, GGUFTensor, read_gguf_header
from llmdeploy.catalog.model_spec import ModelSpec, ParamCount, build_spec
from llmdeploy.catalog.shape_checks import checked_facts
from llmdeploy.errors import UserError

# what reading an unexpected value raises (int() of a string, a missing tensor, a zero divisor, ...)
_SHAPE_ERRORS = (
    TypeError,
    ValueError,
    KeyError,
    IndexError,
    AttributeError,
    ZeroDivisionError,
    OverflowError,
)

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
    if not isinstance(arch, str) or arch not in _ARCHITECTURES:
        raise UserError.one(
            f"GGUF architecture {arch!r} of {path.name} is not supported",
            fix=f"supported: {', '.join(sorted(_ARCHITECTURES))}",
        )
    try:
        return _spec(path, header, arch)
    except _SHAPE_ERRORS as e:
        raise UserError.one(
            f"GGUF file {path}: metadata or tensor table of a type or shape no model uses "
            f"({type(e).__name__}: {e})",
            fix="the file is damaged or not a model llmdeploy reads: download it again",
        ) from None


def _spec(path: Path, header: GGUFHeader, arch: str) -> ModelSpec:
    fields = header.fields
    where = f"GGUF file {path}"

    def meta(key: str, default: Any = None) -> Any:
        value = fields.get(f"{arch}.{key}")
        return default if value is None else value

    tensors = {t.name: t for t in header.tensors}
    if "token_embd.weight" not in tensors or len(tensors["token_embd.weight"].shape) < 2:
        raise UserError.one(
            f"{where} has no two-dimensional token_embd.weight tensor; it is not a complete model",
            fix="download the file again",
        )
    embd = tensors["token_embd.weight"]
    spelled = {
        "hidden_size": "token_embd.weight (shape)",
        "num_attention_heads": f"{arch}.attention.head_count",
        "head_dim": f"{arch}.attention.key_length",
    }
    shape = checked_facts(
        {"hidden_size": embd.shape[0], "num_attention_heads": meta("attention.head_count")}, spelled, where
    )
    hidden, vocab, heads = shape["hidden_size"], int(embd.shape[1]), shape["num_attention_heads"]
    head_dim = meta("attention.key_length") or hidden // heads
    facts: dict[str, Any] = {
        "hf_id": path.stem,
        "aliases": [str(fields["general.name"])] if fields.get("general.name") else [],
        "family": str(fields.get("general.basename") or arch),
        "architecture": _ARCHITECTURES[arch],
        "num_layers": meta("block_count"),
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_kv_heads": meta("attention.head_count_kv", heads),
        "head_dim": head_dim,
        "intermediate_size": meta("feed_forward_length"),
        "vocab_size": meta("vocab_size", vocab),
        "max_position_embeddings": meta("context_length"),
        "tie_word_embeddings": "output.weight" not in tensors,
        "rope_theta": meta("rope.freq_base", 10000.0),
        "rms_norm_eps": meta("attention.layer_norm_rms_epsilon", 1e-5),
        "attention_bias": "blk.0.attn_q.bias" in tensors,
        "qk_norm": "blk.0.attn_q_norm.weight" in tensors,
        "sliding_window": meta("attention.sliding_window"),
        "source": "gguf",
    }
    if facts["sliding_window"] is None:
        facts.pop("sliding_window")
    experts = meta("expert_count")
    if experts:
        facts["num_experts"] = experts
        facts["num_experts_per_tok"] = meta("expert_used_count", 0)
        facts["moe_intermediate_size"] = meta("expert_feed_forward_length", facts["intermediate_size"])
    spelled.update(
        {
            name: f"{arch}.{key}"
            for name, key in (
                ("num_layers", "block_count"),
                ("num_kv_heads", "attention.head_count_kv"),
                ("intermediate_size", "feed_forward_length"),
                ("vocab_size", "vocab_size"),
                ("max_position_embeddings", "context_length"),
                ("sliding_window", "attention.sliding_window"),
                ("num_experts", "expert_count"),
                ("num_experts_per_tok", "expert_used_count"),
                ("moe_intermediate_size", "expert_feed_forward_length"),
                ("rope_theta", "rope.freq_base"),
                ("rms_norm_eps", "attention.layer_norm_rms_epsilon"),
            )
        }
    )
    spec = build_spec(checked_facts(facts, spelled, where))

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
