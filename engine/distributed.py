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

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"bad tensor-parallel rank {self.rank} of world size {self.world_size}")

    @property
    def is_parallel(self) -> bool:
        return self.world_size > 1


SINGLE = ParallelState()
COLLECTIVE_TIMEOUT_S = 300


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
    return state


def destroy_parallel(state: ParallelState) -> None:
    if state.is_parallel and dist.is_initialized():
        dist.destroy_process_group()


def all_reduce(x: torch.Tensor, state: ParallelState) -> torch.Tensor:
    """Sum over ranks, in place; returns x. No-op at world size 1."""
    if state.is_parallel:
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
