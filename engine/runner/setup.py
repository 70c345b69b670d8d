"""ModelRunner's start-up checks and choices that need no model: the device, the dtype, the
quantization flag against the checkpoint, the tensor-parallel split, the model's shape."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from llmdeploy_engine.config import ModelConfig

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


# --quantization values: None / auto read the checkpoint's config; the others must agree with it
QUANTIZATION_FLAGS = (None, "auto", "gguf", "awq", "gptq", "fp8", "compressed-tensors")


def check_quantization(flag: str | None, model: ModelConfig, device: torch.device) -> None:
    """The flag agrees with the checkpoint's stored format; fp8 weights need an fp8-capable GPU."""
    spec = model.quantization
    stored = spec.method if spec is not None else None
    if flag not in (None, "auto", "gguf") and stored != ("fp8" if flag == "compressed-tensors" else flag):
        raise ValueError(
            f"--quantization {flag} but the checkpoint is "
            + (f"{stored}-quantized" if stored else "not quantized")
            + "; leave --quantization unset to use the checkpoint's own format"
        )
    if stored == "fp8" and device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9):
        raise ValueError(
            "fp8 weights need a GPU of compute capability 8.9 or newer (Ada, Hopper); "
            "use a 16-bit or int4 (AWQ/GPTQ) checkpoint on this GPU"
        )


# what reading a damaged model file raises besides ValueError (int() of a list, a missing key, ...)
_DAMAGED_FILE_ERRORS = (
    TypeError,
    KeyError,
    IndexError,
    AttributeError,
    ZeroDivisionError,
    OverflowError,
    EOFError,
)
# far past any real model; past them a shape is a corrupt file, and building it would never finish
_SHAPE_BOUNDS = {
    "vocab_size": 1 << 26,
    "hidden_size": 1 << 20,
    "intermediate_size": 1 << 24,
    "num_hidden_layers": 10_000,
    "num_attention_heads": 1 << 16,
    "num_key_value_heads": 1 << 16,
    "head_dim": 1 << 16,
    "max_position_embeddings": 1 << 34,
}


def load_model_config(model: str) -> ModelConfig:
    """Shape of a GGUF file, a checkpoint folder or `random:<catalog id>`, without loading weights.
    A damaged or implausible file is a ValueError naming the file (the serve command prints it)."""
    from llmdeploy_engine.loading import random_weights

    if random_weights.is_random(model):
        return random_weights.random_model_config(model)
    try:
        config = _read_model_config(model)
    except UnicodeDecodeError as e:
        raise ValueError(f"model {model!r}: config.json is not UTF-8 text ({e.reason})") from None
    except json.JSONDecodeError as e:
        raise ValueError(
            f"model {model!r}: config.json line {e.lineno} is not valid JSON ({e.msg})"
        ) from None
    except (*_DAMAGED_FILE_ERRORS, RecursionError) as e:
        raise ValueError(
            f"model {model!r}: a field of its config (config.json or GGUF metadata) is missing or of the "
            f"wrong type ({type(e).__name__}: {e}); restore the file from the model's original files"
        ) from None
    except ValueError as e:  # the loaders' own wording (an unsupported model_type, a cut GGUF, ...)
        if model in str(e):
            raise
        raise ValueError(f"model {model!r}: {e}") from None
    for name, bound in _SHAPE_BOUNDS.items():
        value = getattr(config, name)
        if not 1 <= value <= bound:
            raise ValueError(
                f"model {model!r}: {name} = {value} is outside 1..{bound:,}; no model has this shape, "
                "so the file is damaged: restore it from the model's original files"
            )
    return config


def _read_model_config(model: str) -> ModelConfig:
    if Path(model).is_file() and model.endswith(".gguf"):
        from llmdeploy_engine.loading.gguf_header_check import check_gguf_header
        from llmdeploy_engine.loading.gguf_loader import load_gguf_config

        check_gguf_header(model)  # before gguf-py, which trusts the header's counts
        return load_gguf_config(model)
    if Path(model).is_dir():
        from llmdeploy_engine.loading.hf_loader import load_hf_config

        return load_hf_config(model)
    raise ValueError(f"model {model!r}: not a .gguf file, a checkpoint folder or random:<catalog id>")


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device cuda requested but no CUDA GPU is visible")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if name not in _DTYPES:
        raise ValueError(f"dtype {name!r}: use auto, float16, bfloat16 or float32")
    return _DTYPES[name]


def check_tensor_parallel(mc: ModelConfig, tp: int) -> None:
    """Clear errors for a tensor_parallel_size the model's shape cannot be split by."""
    if tp < 1:
        raise ValueError(f"tensor_parallel_size must be >= 1, got {tp}")
    problems = []
    if mc.num_attention_heads % tp:
        problems.append(f"the {mc.num_attention_heads} attention heads")
    kv = mc.num_key_value_heads
    if (kv >= tp and kv % tp) or (kv < tp and tp % kv):
        problems.append(f"the {kv} KV heads (nor is it a multiple of them)")
    if mc.intermediate_size % tp:
        problems.append(f"the MLP width {mc.intermediate_size}")
    if problems:
        raise ValueError(
            f"tensor_parallel_size {tp} does not divide {' and '.join(problems)}; "
            "pick a tensor_parallel_size that divides the attention heads"
        )


def local_kv_heads(num_kv_heads: int, tp: int) -> int:
    """KV heads each rank holds: a share of them, or one replicated head when tp > num_kv_heads."""
    return max(1, num_kv_heads // tp)
