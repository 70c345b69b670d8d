"""A `ModelSpec` from a Hugging Face `config.json` (and the safetensors headers beside it).

Only facts the config states are used; an architecture whose shape cannot be read is an error,
never a guess. The files are outside input: the shape facts are checked one by one
(`shape_checks`), and a value of a shape nothing here expects still ends as a `UserError` naming
the file, never a traceback.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from llmdeploy.catalog.config_defaults import with_defaults
from llmdeploy.catalog.model_spec import LayerKind, ModelSpec, ParamCount, build_spec
from llmdeploy.catalog.safetensors_header import safetensors_totals
from llmdeploy.catalog.shape_checks import checked_facts, layer_types_problem
from llmdeploy.catalog.vision_tower import vision_tower_params
from llmdeploy.errors import UserError

# what reading an unexpected value raises (int() of a list, .get on a number, a zero divisor, ...)
_SHAPE_ERRORS = (
    TypeError,
    ValueError,
    KeyError,
    IndexError,
    AttributeError,
    ZeroDivisionError,
    OverflowError,
)
# a config.json is a few KiB
_MAX_CONFIG_BYTES = 16 << 20

# config.json key -> ModelSpec field, first present wins
_KEYS: dict[str, tuple[str, ...]] = {
    "num_layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "num_attention_heads": ("num_attention_heads", "n_head"),
    "num_kv_heads": ("num_key_value_heads", "num_kv_heads", "multi_query_group_num"),
    "head_dim": ("head_dim",),
    # Llama 4 names its dense MLP width intermediate_size_mlp (its intermediate_size is the experts')
    "intermediate_size": ("intermediate_size_mlp", "intermediate_size", "ffn_hidden_size", "n_inner"),
    "vocab_size": ("vocab_size", "padded_vocab_size"),
    "max_position_embeddings": ("max_position_embeddings", "n_positions", "seq_length"),
    "rope_theta": ("rope_theta",),
    "rope_scaling": ("rope_scaling",),
    "rope_local_base_freq": ("rope_local_base_freq",),
    "partial_rotary_factor": ("partial_rotary_factor",),
    "rms_norm_eps": ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon"),
    "attention_bias": ("attention_bias", "qkv_bias"),
    "sliding_window": ("sliding_window",),
    "attention_chunk_size": ("attention_chunk_size",),
    "linear_num_key_heads": ("linear_num_key_heads",),
    "linear_num_value_heads": ("linear_num_value_heads",),
    "linear_key_head_dim": ("linear_key_head_dim",),
    "linear_value_head_dim": ("linear_value_head_dim",),
    "linear_conv_kernel_dim": ("linear_conv_kernel_dim",),
    "num_experts": ("num_local_experts", "num_experts", "n_routed_experts"),
    "num_experts_per_tok": ("num_experts_per_tok", "experts_per_token", "moe_topk"),
    "moe_intermediate_size": ("moe_intermediate_size",),
    "num_shared_experts": ("n_shared_experts",),
    "shared_expert_intermediate_size": ("shared_expert_intermediate_size",),
    "first_k_dense_replace": ("first_k_dense_replace",),
    "moe_layer_step": ("interleave_moe_layer_step", "decoder_sparse_step"),
    "kv_lora_rank": ("kv_lora_rank",),
    "q_lora_rank": ("q_lora_rank",),
    "qk_rope_head_dim": ("qk_rope_head_dim",),
    "qk_nope_head_dim": ("qk_nope_head_dim",),
    "v_head_dim": ("v_head_dim",),
    "torch_dtype": ("torch_dtype", "dtype"),
}

# keys that expand into a per-layer pattern
_PATTERN_KEYS = ("sliding_window_pattern", "full_attention_interval", "no_rope_layer_interval")
_REQUIRED = ("num_layers", "hidden_size", "num_attention_heads", "vocab_size")
# the shape of a linear-attention (Gated DeltaNet) layer's recurrent state
_LINEAR_STATE = (
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_conv_kernel_dim",
)

# Per-architecture facts a config does not spell out (they are fixed by the modelling code).
_ARCH_FACTS: dict[str, dict[str, Any]] = {
    "Qwen2ForCausalLM": {"attention_bias": True},
    "Qwen2MoeForCausalLM": {"attention_bias": True, "shared_expert_gate": True},
    "Qwen3ForCausalLM": {"qk_norm": True},
    "Qwen3MoeForCausalLM": {"qk_norm": True},
    "Gemma2ForCausalLM": {"norms_per_layer": 4, "layer_types": {"full_every": 2}},
    "Gemma3ForCausalLM": {"norms_per_layer": 4, "qk_norm": True},
    "PhiForCausalLM": {
        "norm_type": "layernorm",
        "norms_per_layer": 1,
        "attention_bias": True,
        "attention_out_bias": True,
        "mlp_gated": False,
        "mlp_bias": True,
        "lm_head_bias": True,
    },
    "GptOssForCausalLM": {
        "attention_bias": True,
        "attention_out_bias": True,
        "attention_sinks": True,
        "expert_bias": True,
        "router_bias": True,
    },
    "DeepseekV3ForCausalLM": {"router_bias": True},
    "Qwen3NextForCausalLM": {"qk_norm": True, "shared_expert_gate": True, "attention_output_gate": True},
}


def spec_from_config(config: Mapping[str, Any], hf_id: str = "local") -> ModelSpec:
    """Map a `config.json` mapping to a spec (multimodal configs: the `text_config` part), with
    the architecture's defaults for the keys the file leaves out."""
    where = f"config.json of {hf_id!r}"
    fix = "restore config.json from the model's original files (or use a catalog model id)"
    if not isinstance(config, Mapping):
        raise UserError.one(f"{where} is not a JSON object", fix=fix)
    if not isinstance(config.get("text_config") or {}, Mapping):
        raise UserError.one(f"{where}: text_config must be a JSON object", fix=fix)
    try:
        return _spec_from_config(config, hf_id, where)
    except _SHAPE_ERRORS as e:
        raise UserError.one(
            f"{where}: a field holds a value of a type or shape no model uses ({type(e).__name__}: {e})",
            fix=fix,
        ) from None


def _spec_from_config(config: Mapping[str, Any], hf_id: str, where: str) -> ModelSpec:
    config = with_defaults(config)
    architectures = config.get("architectures") or ["unknown"]
    arch = str(architectures[0] if isinstance(architectures, list) else architectures)
    text = config.get("text_config") or config
    facts: dict[str, Any] = {"hf_id": hf_id, "architecture": arch, "source": "config"}
    facts["family"] = str(config.get("model_type", "unknown"))
    spelled: dict[str, str] = {}
    for name, keys in _KEYS.items():
        for key in keys:
            if text.get(key) is not None:
                facts[name] = text[key]
                spelled[name] = key
                break
    patterns = {k: text[k] for k in _PATTERN_KEYS if text.get(k) is not None}
    facts = checked_facts(facts, spelled, where)
    checked_facts(patterns, {}, where)
    if "layer_types" in text and isinstance(facts.get("num_layers"), int):
        problem = layer_types_problem(text["layer_types"], facts["num_layers"], "layer_types", where)
        if problem is not None:
            raise UserError([problem])
    missing = [n for n in _REQUIRED if n not in facts]
    if missing:
        raise UserError.one(
            f"config.json of {hf_id!r} lacks {', '.join(missing)}; cannot derive the architecture",
            fix="use a catalog model id or set model.architecture to a catalog name",
        )
    facts.setdefault("intermediate_size", facts.get("moe_intermediate_size", 4 * facts["hidden_size"]))
    facts.setdefault("max_position_embeddings", 2048)
    facts["tie_word_embeddings"] = bool(
        config.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
    )
    facts.update(
        {
            k: v
            for k, v in _ARCH_FACTS.get(arch, {}).items()
            if k != "attention_bias" or "attention_bias" not in facts
        }
    )
    if not isinstance(facts.get("torch_dtype"), str):
        facts.pop("torch_dtype", None)
    if "layer_types" in text:
        facts["layer_types"] = [_layer_kind(str(t)) for t in text["layer_types"]]
    elif "sliding_window_pattern" in text and facts.get("sliding_window"):
        facts["layer_types"] = {"full_every": int(text["sliding_window_pattern"])}
    elif "full_attention_interval" in text and "linear_num_value_heads" in text:
        period = int(text["full_attention_interval"])
        n = int(facts["num_layers"])
        facts["layer_types"] = ["full" if (i + 1) % period == 0 else "linear" for i in range(n)]
    if "intermediate_size_mlp" in text and facts.get("num_experts"):
        # Llama 4: experts and the one shared expert are intermediate_size wide
        facts["moe_intermediate_size"] = text["intermediate_size"]
        facts["shared_expert_intermediate_size"] = text["intermediate_size"]
    if "layer_types" not in text and text.get("attention_chunk_size"):
        facts["layer_types"] = _chunked_layer_types(text, int(facts["num_layers"]))
    if facts.get("num_experts") and not facts.get("moe_intermediate_size"):
        facts["moe_intermediate_size"] = facts["intermediate_size"]
    if facts.get("kv_lora_rank"):
        facts["head_dim"] = facts.get("qk_nope_head_dim", 0) + facts.get("qk_rope_head_dim", 0)
    if not facts.get("sliding_window") or text.get("use_sliding_window") is False:
        facts["sliding_window"] = None
        kinds = facts.get("layer_types")
        if not isinstance(kinds, list) or not {"chunked", "linear"} & set(kinds):
            facts.pop("layer_types", None)
        else:  # a declared window that is switched off: those layers attend to everything
            facts["layer_types"] = ["full" if k == "sliding" else k for k in kinds]
    if not facts.get("attention_chunk_size") or "chunked" not in (facts.get("layer_types") or ()):
        facts.pop("attention_chunk_size", None)
    if "linear" in (facts.get("layer_types") or ()):
        absent = [name for name in _LINEAR_STATE if not facts.get(name)]
        if absent:
            raise UserError.one(
                f"config.json of {hf_id!r} has linear-attention layers but lacks {', '.join(absent)}; "
                "their per-request state cannot be sized",
                fix="add the keys to config.json, or set model.architecture to a catalog name",
            )
    extra = vision_tower_params(config, int((config.get("text_config") or config).get("hidden_size") or 0))
    if extra:
        facts["extra_params"] = extra
    return build_spec(facts)


def _chunked_layer_types(text: Mapping[str, Any], num_layers: int) -> list[LayerKind]:
    """Llama 4 without `layer_types`: the RoPE layers attend in chunks, the NoPE layers (every
    `no_rope_layer_interval`-th, or as `no_rope_layers` lists with 0) to everything (transformers'
    Llama4TextConfig)."""
    flags = text.get("no_rope_layers") or [
        int((i + 1) % int(text.get("no_rope_layer_interval", 4)) != 0) for i in range(num_layers)
    ]
    return ["chunked" if flag else "full" for flag in flags]


def _layer_kind(name: str) -> LayerKind:
    """A transformers `layer_types` entry ("sliding_attention", "chunked_attention", ...) as a kind."""
    for kind in ("sliding", "chunked", "linear"):
        if kind in name:
            return kind
    return "full"


def read_config_json(folder: Path) -> Any:
    """The parsed `config.json` of a checkpoint folder; a `UserError` when it cannot be read."""
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise UserError.one(
            f"no config.json in {folder}", fix="point model.path at a Hugging Face checkpoint folder"
        )
    fix = "restore config.json from the model's original files"
    try:
        with config_path.open("rb") as fh:
            raw = fh.read(_MAX_CONFIG_BYTES + 1)
        if len(raw) > _MAX_CONFIG_BYTES:
            raise UserError.one(
                f"{config_path} is larger than {_MAX_CONFIG_BYTES >> 20} MiB; not a config", fix=fix
            )
        return json.loads(raw.decode("utf-8"))
    except OSError as e:
        raise UserError.one(
            f"cannot read {config_path}: {e.strerror}", fix="check the file's permissions"
        ) from None
    except UnicodeDecodeError as e:
        raise UserError.one(f"{config_path} is not UTF-8 text ({e.reason})", fix=fix) from None
    except json.JSONDecodeError as e:
        raise UserError.one(
            f"not valid JSON: {e.msg}", file=str(config_path), line=e.lineno, fix=fix
        ) from None
    except RecursionError:
        raise UserError.one(f"{config_path} is nested too deeply to be a model config", fix=fix) from None


def spec_from_folder(folder: Path, hf_id: str | None = None) -> ModelSpec:
    config = read_config_json(folder)
    spec = spec_from_config(config, hf_id or str(folder))
    totals = safetensors_totals(folder)
    if totals is None:
        return spec
    count, size = totals
    p = spec.params
    if "quantization_config" in config or count < p.total - p.extra:
        # packed quantized tensors do not count parameters one per element
        return replace(spec, weights_bytes_on_disk=size)
    # The headers are the truth; any difference from the formula is put in `extra` (e.g. a vision tower).
    exact = ParamCount(p.embedding, p.layers, p.head, count - (p.total - p.extra), p.linear, p.active_layers)
    return replace(spec, params=exact, weights_bytes_on_disk=size)
