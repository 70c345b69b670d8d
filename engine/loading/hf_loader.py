"""Hugging Face checkpoint folders: config.json + safetensors (one file or a sharded index), dense or
quantized (AWQ, GPTQ, fp8: quant_config.py reads which, the layers keep them quantized)."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

import torch
from llmdeploy_engine.config import ModelConfig, RopeScaling
from llmdeploy_engine.model.quant_config import QuantSpec, load_quant_spec

logger = logging.getLogger(__name__)

# config.json model_type -> ours
_MODEL_TYPES = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3"}


def is_hf_folder(path: str | Path) -> bool:
    return (Path(path) / "config.json").is_file()


def config_from_dict(cfg: dict[str, Any]) -> ModelConfig:
    """ModelConfig from the values of a config.json (also used for architectures built from presets)."""
    model_type = cfg.get("model_type")
    if model_type not in _MODEL_TYPES:
        raise ValueError(f"model_type {model_type!r} is not supported; supported: {', '.join(_MODEL_TYPES)}")
    arch = _MODEL_TYPES[model_type]
    heads = int(cfg["num_attention_heads"])
    hidden = int(cfg["hidden_size"])
    head_dim = cfg.get("head_dim") or hidden // heads
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    rope_theta = float(cfg.get("rope_theta", rope.get("rope_theta", 10000.0)))
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    scaling = RopeScaling()
    if rope_type == "linear":
        scaling = RopeScaling(rope_type="linear", factor=float(rope["factor"]))
    elif rope_type == "llama3":
        scaling = RopeScaling(
            rope_type="llama3",
            factor=float(rope["factor"]),
            low_freq_factor=float(rope["low_freq_factor"]),
            high_freq_factor=float(rope["high_freq_factor"]),
            original_max_position_embeddings=int(rope["original_max_position_embeddings"]),
        )
    elif rope_type != "default":
        raise ValueError(f"rope type {rope_type!r} is not supported; supported: default, linear, llama3")
    # no sliding-window attention here: exact only up to the window, so the context stops there
    max_positions = int(cfg.get("max_position_embeddings", 4096))
    window = cfg.get("sliding_window")
    if window and (arch in ("llama", "mistral") or cfg.get("use_sliding_window")):
        max_positions = min(max_positions, int(window))
    eos = cfg.get("eos_token_id")
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    return ModelConfig(
        architecture=arch,
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(cfg["intermediate_size"]),
        num_hidden_layers=int(cfg["num_hidden_layers"]),
        num_attention_heads=heads,
        num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(head_dim),
        max_position_embeddings=max_positions,
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=rope_theta,
        rope_scaling=scaling,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=arch == "qwen2" or bool(cfg.get("attention_bias", False)),
        qk_norm=arch == "qwen3",
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_id=eos,
    )


def load_hf_config(folder: str | Path) -> ModelConfig:
    cfg = json.loads((Path(folder) / "config.json").read_text())
    return dataclasses.replace(config_from_dict(cfg), quantization=load_quant_spec(folder, cfg))


def safetensors_files(folder: str | Path) -> list[Path]:
    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        return [folder / name for name in sorted(set(weight_map.values()))]
    single = folder / "model.safetensors"
    if single.is_file():
        return [single]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ValueError(
            f"{folder}: no model.safetensors, model.safetensors.index.json or *.safetensors found"
        )
    return files


def load_hf(folder: str | Path) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """(config, state dict as stored) from a checkpoint folder."""
    from safetensors.torch import load_file

    config = load_hf_config(folder)
    weights: dict[str, torch.Tensor] = {}
    for file in safetensors_files(folder):
        weights.update(load_file(str(file)))
    if config.quantization is not None:
        weights = normalize_quantized(config.quantization, weights)
    return config, weights


def normalize_quantized(spec: QuantSpec, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The tensors the layers take: fp8 scales flat, static activation scales dropped (the engine
    scales activations per token), a plain g_idx where a GPTQ file has none."""
    out: dict[str, torch.Tensor] = {}
    dropped = 0
    for name, t in weights.items():
        if name.endswith(".input_scale"):
            dropped += 1
            continue
        if name.endswith(".weight_scale"):
            t = t.flatten()
        out[name] = t
        if spec.method == "gptq" and name.endswith(".qweight"):
            g_idx = name.removesuffix(".qweight") + ".g_idx"
            if g_idx not in weights:
                k = t.shape[0] * 8
                out[g_idx] = (torch.arange(k) // spec.group(k)).to(torch.int32)
    if dropped:
        logger.info(
            "fp8 checkpoint: %d static input_scale tensors not used (activations are scaled per token)",
            dropped,
        )
    return out
