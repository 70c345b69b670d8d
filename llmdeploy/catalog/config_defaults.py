"""A `config.json` completed with its architecture's defaults, as transformers would read it.

A checkpoint's config.json omits every key whose value is the config class's default (Gemma's
`tie_word_embeddings`, `head_dim` 256 and `rope_theta`; Mistral's `sliding_window`; ...), so
reading the file alone gets those models wrong. transformers' own config classes hold the defaults;
for the families the catalog covers, `DOCUMENTED_DEFAULTS` holds the values of the keys the planner
reads (a test checks it against transformers' classes), because importing transformers also
imports torch: 4-7 s on a small machine, for a `plan` that otherwise answers in a fraction of one.
Any other `model_type` asks transformers when it is installed (the `engine` extra), imported here
only; catalog hits never read a config.json. Keys the file states always win.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

# model_type -> defaults of the keys the planner reads (transformers' config classes, 5.x)
DOCUMENTED_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {"tie_word_embeddings": False, "rope_theta": 10000.0},
    "mistral": {"tie_word_embeddings": False, "rope_theta": 10000.0, "sliding_window": 4096},
    "mixtral": {"tie_word_embeddings": False, "rope_theta": 1000000.0},
    "qwen2": {"tie_word_embeddings": False, "rope_theta": 10000.0},
    "qwen2_moe": {"tie_word_embeddings": False, "rope_theta": 10000.0},
    "qwen3": {"tie_word_embeddings": False, "rope_theta": 10000.0, "head_dim": 128},
    "qwen3_moe": {"tie_word_embeddings": False, "rope_theta": 10000.0},
    "gemma": {"tie_word_embeddings": True, "rope_theta": 10000.0, "head_dim": 256},
    "gemma2": {"tie_word_embeddings": True, "rope_theta": 10000.0, "head_dim": 256, "sliding_window": 4096},
    "gemma3_text": {
        "tie_word_embeddings": True,
        "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0,
        "head_dim": 256,
        "sliding_window": 4096,
    },
    "phi": {"tie_word_embeddings": False, "rope_theta": 10000.0},
    "phi3": {"tie_word_embeddings": False, "rope_theta": 10000.0},
    "granite": {"tie_word_embeddings": False, "rope_theta": 10000.0},
    "granitemoe": {"tie_word_embeddings": False, "rope_theta": 10000.0},
    "gpt_oss": {"tie_word_embeddings": False, "rope_theta": 150000.0, "head_dim": 64, "sliding_window": 128},
    "deepseek_v3": {"tie_word_embeddings": False, "rope_theta": 10000.0},
}
# the text part of a multimodal config, when its text_config does not name its own type
_TEXT_TYPES = {"gemma3": "gemma3_text", "mistral3": "mistral", "llama4": "llama4_text"}


def with_defaults(config: Mapping[str, Any]) -> dict[str, Any]:
    """`config` with absent keys (top level and `text_config`) filled from its architecture."""
    model_type = config.get("model_type")
    if not isinstance(model_type, str):
        return dict(config)
    if model_type in DOCUMENTED_DEFAULTS or _TEXT_TYPES.get(model_type) in DOCUMENTED_DEFAULTS:
        return _table_view(model_type, config)
    return transformers_view(config) or _table_view(model_type, config)


def transformers_view(config: Mapping[str, Any]) -> dict[str, Any] | None:
    """`config` completed by transformers' config class for its model_type, or None."""
    model_type = str(config.get("model_type"))
    full = _transformers_view(model_type, config)
    if full is None:
        return None
    out = {**full, **config}
    raw_text = config.get("text_config")
    if isinstance(raw_text, Mapping) and isinstance(full.get("text_config"), Mapping):
        text = {**full["text_config"], **raw_text}
        _rope_from_parameters(text, raw_text)
        out["text_config"] = text
        # a composite config's own tie flag is a class default; the language model's is the fact
        if "tie_word_embeddings" not in config and "tie_word_embeddings" in text:
            out["tie_word_embeddings"] = text["tie_word_embeddings"]
    _rope_from_parameters(out, config)
    return out


def _transformers_view(model_type: str, config: Mapping[str, Any]) -> dict[str, Any] | None:
    try:
        from transformers import AutoConfig
    except ImportError:
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            kwargs = {k: v for k, v in config.items() if k != "model_type"}
            parsed = AutoConfig.for_model(model_type, **kwargs)
        data = parsed.to_dict()
    except Exception:  # an unknown model_type or a config transformers rejects: the file alone
        return None
    return data if isinstance(data, dict) else None


def _rope_from_parameters(out: dict[str, Any], raw: Mapping[str, Any]) -> None:
    """transformers 5 keeps RoPE settings in `rope_parameters` (per layer type for Gemma 3)."""
    params = out.get("rope_parameters")
    if not isinstance(params, Mapping):
        return
    full = params.get("full_attention", params)
    local = params.get("sliding_attention")
    if "rope_theta" not in raw and isinstance(full, Mapping) and "rope_theta" in full:
        out["rope_theta"] = full["rope_theta"]
    if "partial_rotary_factor" not in raw and isinstance(full, Mapping) and "partial_rotary_factor" in full:
        out["partial_rotary_factor"] = full["partial_rotary_factor"]
    if "rope_scaling" not in raw and isinstance(full, Mapping):
        kind = full.get("rope_type", "default")
        if kind != "default":
            out["rope_scaling"] = {k: v for k, v in full.items() if k != "rope_theta"}
    if "rope_local_base_freq" not in raw and isinstance(local, Mapping) and "rope_theta" in local:
        out["rope_local_base_freq"] = local["rope_theta"]


def _table_view(model_type: str, config: Mapping[str, Any]) -> dict[str, Any]:
    out = {**DOCUMENTED_DEFAULTS.get(model_type, {}), **config}
    raw_text = config.get("text_config")
    if isinstance(raw_text, Mapping):
        text_type = raw_text.get("model_type") or _TEXT_TYPES.get(model_type, "")
        text = {**DOCUMENTED_DEFAULTS.get(str(text_type), {}), **raw_text}
        out["text_config"] = text
        if "tie_word_embeddings" not in config and "tie_word_embeddings" in text:
            out["tie_word_embeddings"] = text["tie_word_embeddings"]
    return out
