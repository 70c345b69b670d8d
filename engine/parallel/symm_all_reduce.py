"""The symmetric-memory all-reduces of decode-sized tensors (distributed.py picks one): each rank's
buffer is mapped by every peer over NVLink (torch symmetric memory); `p2p` and `push` sum through this
project's Triton kernels (triton_allreduce.py), `symm_mem` through torch's one-shot all-reduce."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from llmdeploy_engine.parallel.distributed import ParallelState

SYMM_MEM_MAX_BYTES = 1 << 20
# the p2p and push all-reduces' buffer slots, by caller: two all-reduces in a row never share one (a forward runs
# embedding, then attention and MLP per layer: 2, 0, 1, 0, 1, ..., 0, 1; the next forward starts at 2)
REDUCE_SLOTS = 3
ATTENTION_SLOT, MLP_SLOT, EMBED_SLOT = 0, 1, 2
_FAST_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


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
        from llmdeploy_engine.kernels import ops

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
        from llmdeploy_engine.kernels import triton_allreduce

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
        from llmdeploy_engine.kernels import triton_allreduce

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
