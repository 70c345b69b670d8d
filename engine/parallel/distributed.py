"""Tensor-parallel process group: set-up, rank/world facts and the collectives the model layers use.

One process per rank (rank 0 runs the LLMEngine, ranks 1..N-1 are `llmdeploy_engine.runner.tp_worker`
processes it starts). The group is NCCL on CUDA and gloo on CPU. A `ParallelState` is handed to the
model's layers at construction; at world size 1 every collective here is a no-op and no
torch.distributed call is made, so single-device runs never need a process group.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from llmdeploy_engine.config import ALLREDUCE_CHOICES
from llmdeploy_engine.parallel.symm_all_reduce import (
    ATTENTION_SLOT as ATTENTION_SLOT,  # the slots callers name (model.py, parallel_layers.py)
)
from llmdeploy_engine.parallel.symm_all_reduce import (
    EMBED_SLOT as EMBED_SLOT,
)
from llmdeploy_engine.parallel.symm_all_reduce import (
    MLP_SLOT as MLP_SLOT,
)
from llmdeploy_engine.parallel.symm_all_reduce import (
    SYMM_MEM_MAX_BYTES,
    P2PAllReduce,
    PushAllReduce,
    SymmMemAllReduce,
    _OneShotAllReduce,
)

logger = logging.getLogger("llmdeploy_engine")

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
# EngineConfig.tp_all_reduce (`--tp-all-reduce`, ALLREDUCE_CHOICES) picks the all-reduce of
# decode-sized tensors (up to the symmetric buffer's bytes), each over NVLink between buffers every rank
# maps (torch symmetric memory, no multicast): `auto` (default) = on CUDA `push` when it sets up, else
# `p2p`, else `symm_mem`, else NCCL; `push` = this project's flagless Triton kernel (each rank writes
# its part into every peer's buffer, the data marks its own arrival; triton_allreduce.py), which also
# gathers the logits inside CUDA graphs, or fail; `p2p` = this project's one-barrier kernel (reads
# every peer's buffer), or fail; `symm_mem` = torch's `one_shot_all_reduce` (two barriers, no PDL) or
# fail; `nccl` = NCCL only. The Triton kernels launch with PDL. Larger tensors (prefill steps) always
# go through NCCL.
# CUDA graphs of tensor-parallel decode steps need the symmetric-memory path: on 2 H200s (torch 2.11,
# NCCL 2.28) graphs with NCCL collectives inside replayed correctly but destroy_process_group() never
# returned afterwards, so collectives are refused during a capture (`all_reduce`/`all_gather` raise)
# and the engine runs eagerly without the fast path.
_symm_mem_set_up = False  # whether this process has set up a symmetric-memory all-reduce


def symm_mem_set_up() -> bool:
    """Whether this process has set up a symmetric-memory all-reduce (a later tensor-parallel group
    in it gets NCCL only: see init_parallel)."""
    return _symm_mem_set_up


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def init_parallel(
    rank: int,
    world_size: int,
    port: int,
    device: torch.device,
    symm_mem_bytes: int = SYMM_MEM_MAX_BYTES,
    gather_bytes: int = 0,
    all_reduce_kind: str = "auto",
) -> ParallelState:
    """Join (rank 0: create) the tensor-parallel group on 127.0.0.1:port; returns the state for layers.
    symm_mem_bytes: size of the symmetric buffer (the largest all-reduce the fast path takes);
    gather_bytes: one rank's part of the largest all-gather the push path takes (0: none);
    all_reduce_kind: one of ALLREDUCE_CHOICES (EngineConfig.tp_all_reduce)."""
    global _symm_mem_set_up
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
    choice = all_reduce_kind
    if choice not in ALLREDUCE_CHOICES:
        raise ValueError(f"tp_all_reduce={choice!r}: use {', '.join(ALLREDUCE_CHOICES)}")
    if choice in ("symm_mem", "p2p", "push") and device.type != "cuda":
        raise ValueError(f"tp_all_reduce={choice} needs CUDA devices")
    if choice == "nccl" or device.type != "cuda":
        return state
    # a second tensor-parallel group with symmetric memory in one process hung on 2 H200s (torch 2.11):
    # any rank whose process has set one up before makes every rank use NCCL alone
    seen = torch.tensor([int(_symm_mem_set_up)], device=device)
    dist.all_reduce(seen, op=dist.ReduceOp.MAX, group=state.group)
    if int(seen.item()):
        if choice != "auto":
            raise RuntimeError(
                f"tp_all_reduce={choice}: a tensor-parallel group with symmetric memory was already set "
                "up in this process, and a second one hangs; start the engine in a new process"
            )
        logger.warning(
            "symmetric memory was set up by an earlier tensor-parallel engine in this process (a second "
            "set-up hangs); this engine uses NCCL only and runs eagerly at tp > 1"
        )
        return state
    kinds = {"auto": ("push", "p2p", "symm_mem")}.get(choice, (choice,))
    _symm_mem_set_up = True
    for kind in kinds:
        try:
            size = max(symm_mem_bytes, 8 * 4)
            fast: _OneShotAllReduce
            if kind == "push":
                fast = PushAllReduce(state, device, size, gather_bytes)
            else:
                fast = (P2PAllReduce if kind == "p2p" else SymmMemAllReduce)(state, device, size)
            fast_state = ParallelState(rank, world_size, state.group, fast)
            probe = torch.ones(8, device=device)
            ok = float(all_reduce(probe, fast_state).sum()) == 8 * world_size
            if ok and fast.gather_bytes:
                part = torch.full((1, 8), float(rank), device=device)
                gathered = all_gather(part, fast_state)
                ok = gathered.shape == (1, 8 * world_size) and gathered[0, ::8].tolist() == list(
                    map(float, range(world_size))
                )
        except Exception as exc:  # every rank fails the same way (same build, same devices)
            if choice != "auto":
                raise
            logger.warning("tensor-parallel all-reduce %s unavailable (%s)", kind, exc)
            continue
        if not ok:
            raise RuntimeError(f"tensor-parallel {kind} all-reduce check failed")
        logger.info("tensor-parallel all-reduce of decode-sized tensors: %s", kind)
        return fast_state
    logger.warning("no symmetric-memory all-reduce; using NCCL only")
    return state


def destroy_parallel(state: ParallelState) -> None:
    if state.is_parallel and dist.is_initialized():
        dist.destroy_process_group()


def _refuse_in_capture(what: str, x: torch.Tensor) -> None:
    if x.is_cuda and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            f"NCCL {what} of {tuple(x.shape)} {x.dtype} inside a CUDA graph capture: the process group "
            "could not be destroyed afterwards (see engine/parallel/distributed.py); the symmetric-memory buffer "
            "must cover every captured all-reduce"
        )


def all_reduce(x: torch.Tensor, state: ParallelState, slot: int = 0) -> torch.Tensor:
    """Sum over ranks; use the result (NCCL sums x in place and returns it, the symmetric-memory paths
    return a new tensor). x itself at world size 1. `slot`: the symmetric buffer's slot (P2PAllReduce:
    two all-reduces in a row must not share one)."""
    if not state.is_parallel:
        return x
    fast = state.fast_all_reduce
    if fast is not None and x.is_cuda and fast.fits(x):
        result: torch.Tensor = fast(x, slot)
        return result
    _refuse_in_capture("all-reduce", x)
    dist.all_reduce(x, group=state.group)
    return x


def all_gather(x: torch.Tensor, state: ParallelState, dim: int = -1) -> torch.Tensor:
    """Concatenate every rank's x along dim (rank order). x itself at world size 1."""
    if not state.is_parallel:
        return x
    x = x.contiguous()
    fast = state.fast_all_reduce
    last = dim % x.dim() == x.dim() - 1
    if fast is not None and fast.gather_bytes and x.is_cuda and last and fast.fits_gather(x):
        gathered: torch.Tensor = fast.gather(x)
        return gathered
    _refuse_in_capture("all-gather", x)
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
