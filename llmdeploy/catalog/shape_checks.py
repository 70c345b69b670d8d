"""Checks of the shape facts a model file states (config.json, GGUF metadata) before they are used.

A model file is outside input: a field can be cut short, hold a string or a list where a number
belongs, or state dimensions no model has (a billion layers would make the planner count forever).
Each fact is checked against its type and a bound far past any real model, and every bad one is
reported at once, naming the file, the key as the file spells it and a fix.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from llmdeploy.errors import Problem, UserError

# upper bounds far past any released model (the largest have ~200 layers, 2^14-wide hidden states,
# ~2^18 vocabularies, 10M-token contexts and 2^9 experts); past them a value is a corrupt file
_INT_BOUNDS: dict[str, tuple[int, int]] = {
    "num_layers": (1, 10_000),
    "hidden_size": (1, 1 << 20),
    "num_attention_heads": (1, 1 << 16),
    "num_kv_heads": (1, 1 << 16),
    "head_dim": (1, 1 << 16),
    "intermediate_size": (0, 1 << 24),
    "vocab_size": (1, 1 << 26),
    "max_position_embeddings": (1, 1 << 34),
    "sliding_window": (0, 1 << 34),
    "attention_chunk_size": (0, 1 << 34),
    "linear_num_key_heads": (0, 1 << 16),
    "linear_num_value_heads": (0, 1 << 16),
    "linear_key_head_dim": (0, 1 << 16),
    "linear_value_head_dim": (0, 1 << 16),
    "linear_conv_kernel_dim": (0, 1 << 16),
    "num_experts": (0, 1 << 16),
    "num_experts_per_tok": (0, 1 << 16),
    "moe_intermediate_size": (0, 1 << 24),
    "num_shared_experts": (0, 1 << 16),
    "shared_expert_intermediate_size": (0, 1 << 24),
    "first_k_dense_replace": (0, 10_000),
    "moe_layer_step": (1, 10_000),
    "kv_lora_rank": (0, 1 << 20),
    "q_lora_rank": (0, 1 << 20),
    "qk_rope_head_dim": (0, 1 << 16),
    "qk_nope_head_dim": (0, 1 << 16),
    "v_head_dim": (0, 1 << 16),
    # layer patterns of config.json (not facts themselves; they expand into `layer_types`)
    "sliding_window_pattern": (1, 10_000),
    "full_attention_interval": (1, 10_000),
    "no_rope_layer_interval": (1, 10_000),
}
_FLOATS = ("rope_theta", "rope_local_base_freq", "partial_rotary_factor", "rms_norm_eps")
_BOOLS = ("attention_bias",)
_MAPPINGS = ("rope_scaling",)


def checked_facts(facts: Mapping[str, Any], keys: Mapping[str, str], where: str) -> dict[str, Any]:
    """`facts` with whole numbers as ints; one `UserError` naming every fact of the wrong type or
    out of bounds. `keys` maps a fact to the key the file spells it with; `where` names the file."""
    problems = [
        p
        for name, value in facts.items()
        if (p := _problem(name, value, keys.get(name, name), where)) is not None
    ]
    if problems:
        raise UserError(problems)
    return {k: _whole(v) if k in _INT_BOUNDS and v is not None else v for k, v in facts.items()}


def _problem(name: str, value: Any, key: str, where: str) -> Problem | None:
    fix = "restore the value from the model's original config (or use a catalog model id)"
    if value is None:
        return Problem(f"{where} lacks {key}", fix=fix)
    if name in _INT_BOUNDS:
        low, high = _INT_BOUNDS[name]
        number = _whole(value)
        if number is None:
            return Problem(
                f"{where}: {key} must be a whole number", value=_short(value), has_value=True, fix=fix
            )
        if name == "sliding_window" and number == 0:
            return None
        if not low <= number <= high:
            return Problem(
                f"{where}: {key} must be between {low} and {high:,}; no model has this dimension",
                value=number,
                has_value=True,
                fix=fix,
            )
    elif name in _FLOATS:
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or value < 0
        ):
            return Problem(
                f"{where}: {key} must be a finite number >= 0", value=_short(value), has_value=True, fix=fix
            )
    elif name in _BOOLS and not isinstance(value, bool):
        return Problem(f"{where}: {key} must be true or false", value=_short(value), has_value=True, fix=fix)
    elif name in _MAPPINGS and not isinstance(value, Mapping):
        return Problem(f"{where}: {key} must be a JSON object", value=_short(value), has_value=True, fix=fix)
    return None


def _whole(value: Any) -> int | None:
    """An integer, or a float with an integral value (some exporters write 4096.0); else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return None


def _short(value: Any) -> Any:
    text = repr(value)
    return value if len(text) <= 60 else f"{text[:57]}..."


def layer_types_problem(value: Any, num_layers: int, key: str, where: str) -> Problem | None:
    """Why a `layer_types` list cannot describe the model's layers, or None."""
    if isinstance(value, list) and len(value) == num_layers and all(isinstance(t, str) for t in value):
        return None
    return Problem(
        f"{where}: {key} must list one layer type (a string) for each of the {num_layers} layers",
        value=_short(value),
        has_value=True,
        fix="restore the list from the model's original config",
    )
