"""Tensor-parallel process group: set-up, rank/world facts and the collectives the model layers use.

One process per rank (rank 0 runs the LLMEngine, ranks 1..N-1 are `llmdeploy_engine.tp_worker`
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
SYMM_MEM_MAX_BYTES = 1 << 20
# the p2p and push all-reduces' buffer slots, by caller: two all-reduces in a row never share one (a forward runs
# embedding, then attention and MLP per layer: 2, 0, 1, 0, 1, ..., 0, 1; the next forward starts at 2)
REDUCE_SLOTS = 3
ATTENTION_SLOT, MLP_SLOT, EMBED_SLOT = 0, 1, 2
_FAST_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
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


class _OneShotAllReduce:
    """What both symmetric-memory all-reduces share: the partial sums are written into a staging view
    of this rank's symmetric buffer (copied there, or written there by the row-parallel GEMV itself),
    then one kernel sums every rank's staging view. Subclasses give the view (`_staging`) and the sum
    (`_sum`); `slot` is the caller's (P2PAllReduce: two all-reduces in a row must not share one)."""

    dtypes: tuple[torch.dtype, ...] = _FAST_DTYPES
    max_bytes: int
    gather_bytes = 0  # one rank's part of the largest all-gather taken (0: all-gathers go to NCCL)

    def _staging(self, slot: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
        raise NotImplementedError

    def _sum(self, staging: torch.Tensor, slot: int) -> torch.Tensor:
        raise NotImplementedError

    def fits_gather(self, x: torch.Tensor) -> bool:
        return x.dtype in self.dtypes and x.numel() * x.element_size() <= self.gather_bytes

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} has no all-gather (gather_bytes is 0)")

    def fits(self, x: torch.Tensor) -> bool:
        return x.dtype in self.dtypes and x.numel() * x.element_size() <= self.max_bytes

    def __call__(self, x: torch.Tensor, slot: int = 0) -> torch.Tensor:
        staging = self._staging(slot, x.numel(), x.dtype)
        staging.copy_(x.reshape(-1))
        return self._sum(staging, slot).view(x.shape)

    def linear(
        self, x: torch.Tensor, weight: torch.Tensor, silu_mul: bool = False, slot: int = 0
    ) -> torch.Tensor | None:
        """all-reduce of x @ weight.T (with `silu_mul`: of SiLU(gate) * up @ weight.T, x the merged
        gate_up output), the product written by its kernel into the staging view (no copy); None when
        it does not fit (the caller goes through NCCL)."""
        from llmdeploy_engine import ops

        rows, cols = x.shape[0], weight.shape[0]
        if (
            x.dtype != weight.dtype
            or x.dtype not in self.dtypes
            or rows * cols * x.element_size() > self.max_bytes
        ):
            return None
        staging = self._staging(slot, rows * cols, x.dtype)
        product = staging.view(rows, cols)
        if silu_mul:
            ops.silu_mul_linear(x, weight, out=product)
        else:
            ops.linear(x, weight, out=product)
        return self._sum(staging, slot).view(rows, cols)


class P2PAllReduce(_OneShotAllReduce):
    """One-shot all-reduce of small tensors (triton_allreduce.py): the partial sums go into one of
    `REDUCE_SLOTS` slots of this rank's symmetric buffer, then one Triton kernel with one barrier sums
    every rank's slot. Two all-reduces in a row must not share a slot (the model: embedding 2,
    attention 0, MLP 1)."""

    def __init__(
        self, state: ParallelState, device: torch.device, max_bytes: int = SYMM_MEM_MAX_BYTES
    ) -> None:
        import torch.distributed._symmetric_memory as symm_mem
        from llmdeploy_engine import triton_allreduce

        self.kernels = triton_allreduce
        self.rank, self.world_size = state.rank, state.world_size
        self.max_bytes = -(-max_bytes // 256) * 256
        group = state.group.group_name
        self.buffer = symm_mem.empty(REDUCE_SLOTS * self.max_bytes, dtype=torch.uint8, device=device)
        self.flags = symm_mem.empty(
            triton_allreduce.MAX_PROGRAMS * state.world_size, dtype=torch.int32, device=device
        )
        self.flags.zero_()
        addresses = []
        for t in (self.buffer, self.flags):
            handle = symm_mem.rendezvous(t, group)
            offset = t.data_ptr() - handle.buffer_ptrs[state.rank]  # t may start inside the block
            addresses.append([base + offset for base in handle.buffer_ptrs])
        self.buf_ptrs = torch.tensor(addresses[0], dtype=torch.int64, device=device)
        self.flag_ptrs = torch.tensor(addresses[1], dtype=torch.int64, device=device)
        torch.cuda.synchronize(device)
        dist.barrier(group=state.group)  # every rank's flags are zero before any signal

    def _staging(self, slot: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
        _check_slot(slot)
        start = slot * self.max_bytes
        return self.buffer[start : start + numel * dtype.itemsize].view(dtype)

    def _sum(self, staging: torch.Tensor, slot: int) -> torch.Tensor:
        offset = (staging.data_ptr() - self.buffer.data_ptr()) // staging.element_size()
        return self.kernels.one_shot_all_reduce(
            self.buf_ptrs, self.flag_ptrs, self.rank, self.world_size, offset, staging.numel(), staging.dtype
        )


def _check_slot(slot: int) -> None:
    if not 0 <= slot < REDUCE_SLOTS:
        raise ValueError(f"all-reduce slot {slot} outside 0..{REDUCE_SLOTS - 1}")


class PushAllReduce(_OneShotAllReduce):
    """All-reduce (and all-gather) of small tensors without flags (triton_allreduce.push_exchange):
    each rank writes its part into every peer's symmetric buffer, which starts filled with a sentinel;
    each rank polls its own buffer until no element is the sentinel, sums (or places) every part in
    rank order, and writes the sentinel back. The buffer has one region per all-reduce slot and one
    for all-gathers, each with a part per rank; two collectives in a row must not share a region (the
    model: embedding 2, attention 0, MLP 1; the logits' all-gather its own). The partial sums stay
    where their kernel wrote them (no staging copy)."""

    def __init__(
        self,
        state: ParallelState,
        device: torch.device,
        max_bytes: int = SYMM_MEM_MAX_BYTES,
        gather_bytes: int = 0,
    ) -> None:
        import torch.distributed._symmetric_memory as symm_mem
        from llmdeploy_engine import triton_allreduce

        self.kernels = triton_allreduce
        self.rank, self.world_size = state.rank, state.world_size
        self.max_bytes = -(-max_bytes // 256) * 256
        self.gather_bytes = -(-gather_bytes // 256) * 256
        self.gather_at = REDUCE_SLOTS * self.world_size * self.max_bytes  # byte offset of the gather region
        total = self.gather_at + self.world_size * self.gather_bytes
        self.buffer = symm_mem.empty(total, dtype=torch.uint8, device=device)
        self.buffer.view(torch.int16).fill_(triton_allreduce.SENTINEL_HALF)
        handle = symm_mem.rendezvous(self.buffer, state.group.group_name)
        offset = self.buffer.data_ptr() - handle.buffer_ptrs[state.rank]  # may start inside the block
        self.recv_ptrs = torch.tensor(
            [base + offset for base in handle.buffer_ptrs], dtype=torch.int64, device=device
        )
        torch.cuda.synchronize(device)
        dist.barrier(group=state.group)  # every rank's buffer is clean before any rank pushes

    def _staging(self, slot: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
        _check_slot(slot)  # any tensor will do: the kernel reads this rank's part where it lies
        return torch.empty(numel, dtype=dtype, device=self.buffer.device)

    def __call__(self, x: torch.Tensor, slot: int = 0) -> torch.Tensor:
        _check_slot(slot)
        return self._sum(x.contiguous().view(-1), slot).view(x.shape)

    def _sum(self, staging: torch.Tensor, slot: int) -> torch.Tensor:
        size = staging.element_size()
        return self.kernels.push_exchange(
            staging,
            self.recv_ptrs,
            self.rank,
            self.world_size,
            slot * self.world_size * self.max_bytes // size,
            self.max_bytes // size,
        )

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., cols] of every rank concatenated along the last dimension in rank order."""
        x = x.contiguous()
        cols, size = x.shape[-1], x.element_size()
        out = self.kernels.push_exchange(
            x.view(-1, cols),
            self.recv_ptrs,
            self.rank,
            self.world_size,
            self.gather_at // size,
            self.gather_bytes // size,
            gather_cols=cols,
        )
        return out.view(*x.shape[:-1], self.world_size * cols)


class SymmMemAllReduce(_OneShotAllReduce):
    """One-shot all-reduce of small tensors through torch's kernel (barriers on both sides, so the
    buffer is reusable right after; `slot` is accepted and not needed)."""

    dtypes = (torch.bfloat16, torch.float32)

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

    def _staging(self, slot: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
        return self.buffer[: numel * dtype.itemsize].view(dtype)

    def _sum(self, staging: torch.Tensor, slot: int) -> torch.Tensor:
        out: torch.Tensor = torch.ops.symm_mem.one_shot_all_reduce(staging, "sum", self.group_name)
        return out


def destroy_parallel(state: ParallelState) -> None:
    if state.is_parallel and dist.is_initialized():
        dist.destroy_process_group()


def _refuse_in_capture(what: str, x: torch.Tensor) -> None:
    if x.is_cuda and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            f"NCCL {what} of {tuple(x.shape)} {x.dtype} inside a CUDA graph capture: the process group "
            "could not be destroyed afterwards (see engine/distributed.py); the symmetric-memory buffer "
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
