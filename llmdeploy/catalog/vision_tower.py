"""Parameters of a multimodal checkpoint's vision encoder and projector, from its `vision_config`.

One function per encoder family, following the shapes of transformers' modelling code: SigLIP
(Gemma 3, with Gemma 3's projector), Pixtral (Mistral 3 / Mistral-Small-3.x, with its patch-merger
projector) and Llama 4's vision model (with its pixel-shuffle adapter and projector). vLLM builds
the same modules and loads their weights unless `--limit-mm-per-prompt` sets every modality of the
tower to 0 (or `--language-model-only`), so the planner counts them as weights (`ParamCount.extra`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from llmdeploy.errors import UserError


def _int(config: Mapping[str, Any], key: str, default: int | None = None) -> int:
    value = config.get(key, default)
    if value is None:
        raise UserError.one(
            f"vision_config lacks {key!r}; the vision tower cannot be counted",
            fix="add the key to config.json's vision_config, or use a catalog model id",
        )
    return int(value)


def _siglip(v: Mapping[str, Any], text_hidden: int) -> int:
    """SigLIP encoder (conv patch embedding, learned positions, pre-norm layers with biased
    projections, post layernorm, the attention-pooling head unless `vision_use_head` is false, as
    in Gemma 3) + Gemma 3's projector (RMSNorm, one matrix to the text width)."""
    d, inter, p = _int(v, "hidden_size"), _int(v, "intermediate_size"), _int(v, "patch_size")
    channels = _int(v, "num_channels", 3)
    positions = (_int(v, "image_size") // p) ** 2
    mlp = (d * inter + inter) + (inter * d + d)
    layer = 4 * (d * d + d) + 4 * d + mlp
    encoder = channels * p * p * d + d + positions * d + _int(v, "num_hidden_layers") * layer + 2 * d
    if v.get("vision_use_head", True):  # probe, multi-head attention pooling, layernorm, MLP
        encoder += d + 4 * (d * d + d) + 2 * d + mlp
    return encoder + d + d * text_hidden


def _pixtral(v: Mapping[str, Any], text_hidden: int, merge: int, bias: bool) -> int:
    """Pixtral encoder (bias-free conv patch embedding, RMSNorm pre-norm, gated MLP) + Mistral 3's
    projector (RMSNorm, a patch merger of merge x merge patches, two linear layers)."""
    d, inter, p = _int(v, "hidden_size"), _int(v, "intermediate_size"), _int(v, "patch_size")
    channels = _int(v, "num_channels", 3)
    layer = 4 * d * d + 3 * d * inter + 2 * d
    encoder = channels * p * p * d + d + _int(v, "num_hidden_layers") * layer
    projector = d + d * merge * merge * d + d * text_hidden + text_hidden * text_hidden
    return encoder + projector + ((2 * text_hidden) if bias else 0)


def _llama4(v: Mapping[str, Any], text_hidden: int) -> int:
    """Llama 4 vision model (unfolded patch projection, class token, learned positions, layernorms,
    biased attention and MLP) + its pixel-shuffle MLP adapter + the projector to the text width."""
    d, inter, p = _int(v, "hidden_size"), _int(v, "intermediate_size"), _int(v, "patch_size")
    channels = _int(v, "num_channels", 3)
    positions = (_int(v, "image_size") // p) ** 2 + 1
    layer = 4 * (d * d + d) + (d * inter + inter) + (inter * d + d) + 4 * d
    encoder = channels * p * p * d + d + positions * d + 4 * d + _int(v, "num_hidden_layers") * layer
    projector_in, projector_out = _int(v, "projector_input_dim"), _int(v, "projector_output_dim")
    adapter = inter * projector_in + projector_out * projector_out
    return encoder + adapter + _int(v, "vision_output_dim") * text_hidden


def vision_tower_params(config: Mapping[str, Any], text_hidden: int) -> int | None:
    """Vision encoder + projector parameters of a multimodal `config.json` (0 without a
    `vision_config`), or None for an encoder family not listed here (never a guess)."""
    vision = config.get("vision_config")
    if not isinstance(vision, Mapping):
        return 0
    kind = str(vision.get("model_type") or _DEFAULT_TOWER.get(str(config.get("model_type")), ""))
    counters: dict[str, Callable[[], int]] = {
        "siglip_vision_model": lambda: _siglip(vision, text_hidden),
        "pixtral": lambda: _pixtral(
            vision,
            text_hidden,
            int(config.get("spatial_merge_size", 2)),
            bool(config.get("multimodal_projector_bias", False)),
        ),
        "llama4_vision_model": lambda: _llama4(vision, text_hidden),
    }
    counter = counters.get(kind)
    return counter() if counter is not None else None


# the tower a composite config uses when its vision_config does not name its type
_DEFAULT_TOWER = {"gemma3": "siglip_vision_model", "mistral3": "pixtral", "llama4": "llama4_vision_model"}
