"""Programmatic dependent launch (PDL) for the decode path's Triton kernels (Hopper and later).

A CUDA graph of a batch-1 decode step is ~180-235 small kernels back to back; between two of them
the GPU idles while the next grid is launched and its programs start (about a microsecond), and a
memory-bound kernel's last wave leaves most SMs idle. With PDL a kernel tells the GPU early that its
successor may start (`griddepcontrol.launch_dependents`); the successor's programs become resident
while it runs, do the work that does not read its output (a GEMV's first weight tile), then wait in
`griddepcontrol.wait` until the predecessor has finished and its writes are visible.

The contract for every kernel launched with `launch_pdl=True`: it executes `gdc_wait` before it reads
anything an earlier kernel wrote and before it writes anything. Then ordering is transitive (a kernel
finishes only after its own wait, so the wait also covers every kernel before), and a kernel launched
without PDL (cuBLAS, torch) is ordered as usual. Kernels here call `gdc_launch_dependents` first thing:
the successor still starts only once every program of this kernel has started, so it never takes an
SM from this kernel's programs.

It is always on where it can be (it saved 0.4-0.7 us a kernel boundary on an H200: a 0.5B model's
single stream 1,260 -> 1,395 tok/s); the Triton interpreter and GPUs before sm_90 never use it.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch
import triton
import triton.language as tl


@functools.cache
def _switched_on() -> bool:
    """False under the Triton interpreter, which has no griddepcontrol."""
    return os.environ.get("TRITON_INTERPRET") != "1"


@functools.cache
def _capable(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index)[0] >= 9


def enabled(t: torch.Tensor) -> bool:
    """Whether kernels on t's device launch with PDL."""
    if t.device.type != "cuda" or not _switched_on():
        return False
    index = t.device.index if t.device.index is not None else torch.cuda.current_device()
    return _capable(index)


def launch_args(t: torch.Tensor) -> dict[str, Any]:
    """The kernel keywords for a launch on t's device: USE_PDL (the kernel's constexpr) and, where
    PDL is on, Triton's launch_pdl option."""
    on = enabled(t)
    return {"USE_PDL": True, "launch_pdl": True} if on else {"USE_PDL": False}


@triton.jit
def trigger(USE_PDL: tl.constexpr):
    """Let the successor's programs start (no-op without PDL)."""
    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def wait(USE_PDL: tl.constexpr):
    """Wait until the predecessor has finished and its writes are visible (no-op without PDL)."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()


@triton.jit
def start(USE_PDL: tl.constexpr):
    """trigger then wait: the opening of a kernel whose every load depends on its predecessor."""
    trigger(USE_PDL)
    wait(USE_PDL)
