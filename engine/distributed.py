"""Tensor-parallel process group: set-up, rank/world facts and the collectives the model layers use.

One process per rank (rank 0 runs the LLMEngine, ranks 1..N-1 are `llmdeploy_engine.tp_worker`
processes it starts). The group is NCCL on CUDA and gloo on CPU. A `ParallelState` is handed to the
model's layers at construction; at world size 1 every collective here is a no-op and no
torch.distributed call is made, so single-device runs never need a process group.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

# NVLink multicast (NCCL NVLS, symmetric-memory multimem) stays off: see the device notes; a worker
# started with its own environment must keep these too.
SAFE_NCCL_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


@dataclass(frozen=True)
class ParallelState:
    rank: int = 0
    world_size: int = 1
    group: Any = None  # torch.distributed ProcessGroup when world_size > 1
    # small-message all-reduce over symmetric memory (opt-in, CUDA), else NCCL
    fast_all_reduce: Any = None

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"bad tensor-parallel rank {self.rank} of world size {self.world_size}")

    @property
    def is_parallel(self) -> bool:
        return self.world_size > 1


SINGLE = ParallelState()
COLLECTIVE_TIMEOUT_S = 300
# LLMDEPLOY_TP_ALLREDUCE=symm_mem: decode-sized all-reduces (up to this many bytes) as one kernel that
# reads every peer's buffer over NVLink (torch symmetric memory, no multicast); default: NCCL only
ALLREDUCE_ENV = "LLMDEPLOY_TP_ALLREDUCE"
SYMM_MEM_MAX_BYTES = 1 << 20


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def init_parallel(rank: int, world_size: int, port: int, device: torch.device) -> ParallelState:
    """Join (rank 0: create) the tensor-parallel group on 127.0.0.1:port; returns the state for layers."""
    if world_size == 1:
        return SINGLE
    for key, value in SAFE_NCCL_ENV.items():
        os.environ.setdefault(key, value)
    if dist.is_initialized():
        raise RuntimeError("a torch.distributed process group already exists in this process")
    kwargs: dict[str, Any] = {}
    if device.type == "cuda":
        torch.cuda.set_device(device)
        # eager NCCL communicator creation (bound to this device): ready before any graph capture
        kwargs["device_id"] = device
    dist.init_process_group(
        backend_for(device),
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
        # a rank that never joins or never answers fails the others after this long
        timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S),
        **kwargs,
    )
    state = ParallelState(rank, world_size, dist.group.WORLD)
    # one collective now: the communicator exists before CUDA graphs capture any collective
    probe = torch.ones(1, device=device)
    all_reduce(probe, state)
    if int(probe.item()) != world_size:
        raise RuntimeError(f"tensor-parallel group check failed: all-reduce gave {probe.item()}")
    choice = os.environ.get(ALLREDUCE_ENV, "nccl")
    if choice not in ("nccl", "symm_mem"):
        raise ValueError(f"{ALLREDUCE_ENV}={choice!r}: use nccl or symm_mem")
    if choice == "symm_mem":
        if device.type != "cuda":
            raise ValueError(f"{ALLREDUCE_ENV}=symm_mem needs CUDA devices")
        state = ParallelState(rank, world_size, state.group, SymmMemAllReduce(state, device))
        probe = torch.ones(8, device=device)
        if float(all_reduce(probe, state).sum()) != 8 * world_size:
            raise RuntimeError("tensor-parallel symmetric-memory all-reduce check failed")
    return state


class SymmMemAllReduce:
    """One-shot all-reduce of small tensors: copy into this rank's symmetric buffer, then one kernel
    sums every rank's buffer (barriers on both sides, so the buffer is reusable right after)."""

    def __init__(
        self, state: ParallelState, device: torch.device, max_bytes: int = SYMM_MEM_MAX_BYTES
    ) -> None:
        import torch.distributed._symmetric_memory as symm_mem

        self.group_name = state.group.group_name
        enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
        if enable is not None:
            enable(self.group_name)
        self.max_bytes = max_bytes
        self.buffer = symm_mem.empty(max_bytes, dtype=torch.uint8, device=device)
        symm_mem.rendezvous(self.buffer, self.group_name)

    def fits(self, x: torch.Tensor) -> bool:
        return x.dtype in (torch.bfloat16, torch.float32) and x.numel() * x.element_size() <= self.max_bytes

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        staging = self.buffer[: x.numel() * x.element_size()].view(x.dtype)
        staging.copy_(x.reshape(-1))
        out: torch.Tensor = torch.ops.symm_mem.one_shot_all_reduce(staging, "sum", self.group_name)
        return out.view(x.shape)


def destroy_parallel(state: ParallelState) -> None:
    if state.is_parallel and dist.is_initialized():
        dist.destroy_process_group()


def all_reduce(x: torch.Tensor, state: ParallelState) -> torch.Tensor:
    """Sum over ranks; use the result (NCCL sums x in place and returns it, the symmetric-memory path
    returns a new tensor). x itself at world size 1."""
    if not state.is_parallel:
        return x
    fast = state.fast_all_reduce
    if fast is not None and x.is_cuda and fast.fits(x):
        result: torch.Tensor = fast(x)
        return result
    dist.all_reduce(x, group=state.group)
    return x


def all_gather(x: torch.Tensor, state: ParallelState, dim: int = -1) -> torch.Tensor:
    """Concatenate every rank's x along dim (rank order). x itself at world size 1."""
    if not state.is_parallel:
        return x
    x = x.contiguous()
    if x.device.type == "cuda":
        out = torch.empty((state.world_size, *x.shape), dtype=x.dtype, device=x.device)
        dist.all_gather_into_tensor(out, x, group=state.group)
        parts = list(out.unbind(0))
    else:  # gloo has no single-tensor all-gather
        parts = [torch.empty_like(x) for _ in range(state.world_size)]
        dist.all_gather(parts, x, group=state.group)
    return torch.cat(parts, dim=dim % x.dim())


def all_reduce_min(value: int, state: ParallelState, device: torch.device) -> int:
    """The smallest of every rank's value (e.g. the KV block count all ranks can hold)."""
    if not state.is_parallel:
        return value
    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=state.group)
    return int(t.item())
