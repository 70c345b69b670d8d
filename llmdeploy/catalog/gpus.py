"""The GPU catalog (`gpus.json`): memory as CUDA reports it, the driver's total (nvidia-smi) and where a
public output shows it, bandwidth, tensor rates, fp8 support, vendor."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

from llmdeploy.errors import UserError


@dataclass(frozen=True)
class GPUSpec:
    name: str
    memory_gib: float  # as CUDA reports it (what vLLM logs as total GPU memory)
    marketing_gb: int
    bandwidth_gb_s: float
    bf16_tflops: float
    fp8_tflops: float | None
    fp8_support: bool
    compute_capability: str
    aliases: tuple[str, ...] = ()
    vendor: str = "nvidia"  # "amd": listed for lookups; the planner's rules are the CUDA builds'
    driver_total_mib: int | None = None  # the total nvidia-smi prints, where a public output shows it
    driver_source: str | None = None  # that output
    memory_note: str | None = None  # how memory_gib was inferred where CUDA's total is not on record

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * 2**30)


def _norm(name: str) -> str:
    s = re.sub(r"[\s_]+", "-", name.strip().lower()).removeprefix("nvidia-")
    return s.replace("geforce-", "")


@cache
def list_gpus() -> tuple[GPUSpec, ...]:
    raw = json.loads(resources.files("llmdeploy.catalog").joinpath("gpus.json").read_text())
    return tuple(GPUSpec(**{**g, "aliases": tuple(g.get("aliases", ()))}) for g in raw["gpus"])


# names sold in more than one memory size: the plan would differ, so the recipe says which
_AMBIGUOUS = {
    "a100": ("A100-40GB", "A100-80GB"),
    "a100-sxm4": ("A100-40GB", "A100-80GB"),
    "v100": ("V100-16GB", "V100-32GB"),
    "tesla-v100": ("V100-16GB", "V100-32GB"),
}


def resolve_gpu(name: str) -> GPUSpec:
    """Forgiving lookup: case, spaces/underscores, an 'NVIDIA ' prefix and common aliases; a name
    sold in several memory sizes (`A100`) is refused with the choices."""
    wanted = _norm(name)
    compact = wanted.replace("-", "")
    choices = _AMBIGUOUS.get(wanted) or _AMBIGUOUS.get(compact)
    if choices:
        raise UserError.one(
            f"GPU {name!r} is ambiguous: it is sold as {' and '.join(choices)}, which plan differently",
            path="hardware.gpu",
            value=name,
            fix=f"name the card: {' or '.join(f'hardware.gpu: {c}' for c in choices)}",
        )
    for gpu in list_gpus():
        for candidate in (gpu.name, *gpu.aliases):
            c = _norm(candidate)
            if wanted == c or compact == c.replace("-", ""):
                return gpu
    names = ", ".join(g.name for g in list_gpus())
    raise UserError.one(
        f"unknown GPU {name!r}",
        path="hardware.gpu",
        value=name,
        fix=f"use one of: {names}; or give hardware.gpu_memory_gib / --gpu-memory-gib (memory as CUDA reports it)",
    )
