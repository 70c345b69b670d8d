"""Weight quantization of a checkpoint folder, read from its config.json (`quantization_config`) or
the `quantize_config.json` that GPTQ tools write beside it.

Formats the engine keeps quantized in memory (the linear layers of the decoder; embedding, norms and
LM head stay 16-bit):
- `awq`: AutoAWQ's GEMM layout, 4-bit, zero points, groups along the input features;
- `gptq`: 4-bit, symmetric or with zero points, with or without act-order (`desc_act`, `g_idx`),
  checkpoint formats `gptq` (zeros stored minus one) and `gptq_v2` (zeros stored as they are);
- `fp8`: e4m3 weights with per-tensor or per-channel scales: compressed-tensors / llm-compressor
  (`quant_method: compressed-tensors`, `config_groups`) and the plain `quant_method: fp8` layout.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

INT4_METHODS = ("awq", "gptq")
METHODS = (*INT4_METHODS, "fp8")


@dataclass(frozen=True)
class QuantSpec:
    method: str  # awq | gptq | fp8
    bits: int = 4
    group_size: int = 128  # -1: one group over all input features (GPTQ per-channel)
    sym: bool = False  # GPTQ: zero point fixed at 2^(bits-1)
    desc_act: bool = False  # GPTQ act-order: g_idx maps each input feature to its group
    zeros_offset: int = 0  # GPTQ v1 stores zero - 1; the stored value + offset is the zero point
    fp8_strategy: str = "tensor"  # fp8: tensor | channel (the checkpoint's weight_scale)
    ignore: tuple[str, ...] = ()  # module names (or suffixes) left unquantized

    @property
    def is_int4(self) -> bool:
        return self.method in INT4_METHODS

    def group(self, in_features: int) -> int:
        return in_features if self.group_size == -1 else self.group_size


def _error(source: str, message: str) -> ValueError:
    return ValueError(f"{source}: {message}")


def quant_spec_from_dict(q: dict[str, Any], source: str = "quantization_config") -> QuantSpec:
    """QuantSpec from a `quantization_config` mapping (or a quantize_config.json)."""
    method = str(q.get("quant_method", "gptq" if "desc_act" in q else "")).lower()
    if method == "compressed-tensors":
        return _compressed_tensors(q, source)
    if method == "fp8":
        if q.get("weight_block_size"):
            raise _error(source, "block-wise fp8 weights (weight_block_size) are not supported; "
                         "use a per-tensor or per-channel fp8 checkpoint")  # fmt: skip
        return QuantSpec("fp8", bits=8, fp8_strategy="tensor", ignore=tuple(q.get("ignored_layers") or ()))
    if method not in INT4_METHODS:
        raise _error(source, f"quant_method {method!r} is not supported by the built-in engine; "
                     f"supported: {', '.join(METHODS)}, compressed-tensors (fp8)")  # fmt: skip
    bits = int(q.get("bits", q.get("w_bit", 4)))
    if bits != 4:
        raise _error(source, f"{method} with {bits} bits is not supported; only 4-bit")
    group = int(q.get("group_size", q.get("q_group_size", 128)))
    if group != -1 and (group < 8 or group % 8):
        raise _error(source, f"group_size {group} is not supported; use a multiple of 8 (or -1)")
    if method == "awq":
        version = str(q.get("version", "gemm")).lower()
        if version != "gemm":
            raise _error(source, f"AWQ version {version!r} is not supported; only the GEMM layout")
        if not q.get("zero_point", True):
            raise _error(source, "AWQ without zero points is not supported")
        ignore = tuple(q.get("modules_to_not_convert") or ())
        return QuantSpec("awq", group_size=group, ignore=ignore)
    fmt = str(q.get("checkpoint_format", "gptq")).lower()
    if fmt not in ("gptq", "gptq_v2"):
        raise _error(source, f"GPTQ checkpoint_format {fmt!r} is not supported; supported: gptq, gptq_v2")
    if q.get("lm_head"):
        raise _error(source, "a quantized lm_head is not supported; the engine keeps the LM head 16-bit")
    return QuantSpec(
        "gptq",
        group_size=group,
        sym=bool(q.get("sym", True)),
        desc_act=bool(q.get("desc_act", False)),
        zeros_offset=1 if fmt == "gptq" else 0,
    )


def _compressed_tensors(q: dict[str, Any], source: str) -> QuantSpec:
    groups = q.get("config_groups") or {}
    if len(groups) != 1:
        raise _error(source, f"compressed-tensors with {len(groups)} config_groups is not supported; "
                     "one group of fp8 Linear weights only")  # fmt: skip
    group = next(iter(groups.values()))
    w = group.get("weights") or {}
    if w.get("type") != "float" or int(w.get("num_bits", 0)) != 8:
        raise _error(source, "compressed-tensors weights other than 8-bit float are not supported "
                     f"(got type {w.get('type')!r}, num_bits {w.get('num_bits')!r})")  # fmt: skip
    strategy = str(w.get("strategy", "tensor"))
    if strategy not in ("tensor", "channel"):
        raise _error(source, f"fp8 weight strategy {strategy!r} is not supported; supported: tensor, channel")
    fmt = str(q.get("format", "float-quantized"))
    if fmt not in ("float-quantized", "naive-quantized"):
        raise _error(source, f"compressed-tensors format {fmt!r} is not supported; use float-quantized")
    return QuantSpec("fp8", bits=8, fp8_strategy=strategy, ignore=tuple(q.get("ignore") or ()))


def load_quant_spec(folder: str | Path, config: dict[str, Any] | None = None) -> QuantSpec | None:
    """The folder's quantization (None for a 16/32-bit checkpoint)."""
    folder = Path(folder)
    if config is None:
        config = json.loads((folder / "config.json").read_text())
    q = config.get("quantization_config")
    if q:
        return quant_spec_from_dict(dict(q), f"{folder / 'config.json'}: quantization_config")
    side = folder / "quantize_config.json"
    if side.is_file():
        return quant_spec_from_dict(json.loads(side.read_text()), str(side))
    return None


def is_ignored(spec: QuantSpec, module: str) -> bool:
    """Whether `module` (e.g. model.layers.0.mlp.down_proj) is left unquantized by the checkpoint."""
    for name in spec.ignore:
        if name.startswith("re:"):
            import re

            if re.match(name[3:], module):
                return True
        elif module == name or module.endswith("." + name) or module.split(".")[-1] == name:
            return True
    return False
