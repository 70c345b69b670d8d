"""One-shot all-reduce over peer-to-peer memory in one Triton kernel (tensor parallelism, decode).

Every rank holds a symmetric buffer (torch symmetric memory: each rank's buffer is mapped into every
other rank's address space over NVLink; no multicast) cut into `distributed.REDUCE_SLOTS` slots. A row-parallel layer
writes its partial sum into its slot of this rank's buffer (its GEMV writes there directly); the
kernel then, in each program:

1. opens as every PDL kernel here does (triton_pdl.start): the kernel that wrote the slot is done;
2. signals the same program on every peer (a compare-and-swap 0 -> 1 of the peer's flag for this
   rank, release, system scope; it spins while the previous signal is still unconsumed) and waits for
   every peer's signal (compare-and-swap 1 -> 0 of its own flag, acquire): every rank's slot holds
   this call's partial sums;
3. sums its chunk of every rank's slot in rank order in float32 (so every rank gets the same bits)
   into a fresh output tensor.

There is no closing barrier. A rank writes a slot again only two all-reduces later: after its next
all-reduce, whose barrier needs every peer to have started that one, and so finished this one. That
holds when two all-reduces in a row never share a slot: the model gives the embedding slot 2 and
each decoder layer's attention output slot 0 and its MLP output slot 1 (2, 0, 1, 0, 1, ..., 0, 1, 2).

Compared with torch's `symm_mem.one_shot_all_reduce` (two barriers, launched without PDL, so it
breaks the chain of early-launched kernels on both sides), this kernel is one barrier and a PDL
link. The flags reset themselves, so CUDA graphs replay it as captured.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from llmdeploy_engine import triton_pdl

BLOCK = 2048  # elements a program sums per round
MAX_PROGRAMS = 32  # programs per call (each with its own flags); larger tensors loop


@triton.jit
def _one_shot_kernel(buf_ptrs, flag_ptrs, out_ptr, slot_offset, n, rank, WORLD: tl.constexpr,
                     BLOCK: tl.constexpr, MAX_PROGRAMS: tl.constexpr, USE_PDL: tl.constexpr):  # fmt: skip
    triton_pdl.start(USE_PDL)
    pid = tl.program_id(0)
    dtype = out_ptr.dtype.element_ty
    own_flags = tl.load(flag_ptrs + rank).to(tl.pointer_type(tl.int32))
    for r in tl.static_range(WORLD):
        if r != rank:
            peer_flag = tl.load(flag_ptrs + r).to(tl.pointer_type(tl.int32)) + pid * WORLD + rank
            while tl.atomic_cas(peer_flag, 0, 1, sem="release", scope="sys") != 0:
                pass
    for r in tl.static_range(WORLD):
        if r != rank:
            while tl.atomic_cas(own_flags + pid * WORLD + r, 1, 0, sem="acquire", scope="sys") != 1:
                pass
    tl.debug_barrier()
    for start in tl.range(pid * BLOCK, n, MAX_PROGRAMS * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        live = offs < n
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for r in tl.static_range(WORLD):
            base = tl.load(buf_ptrs + r).to(tl.pointer_type(dtype))
            acc += tl.load(base + slot_offset + offs, mask=live, other=0.0, volatile=True).to(tl.float32)
        tl.store(out_ptr + offs, acc.to(dtype), mask=live)


def one_shot_all_reduce(
    buf_ptrs: torch.Tensor,
    flag_ptrs: torch.Tensor,
    rank: int,
    world: int,
    slot_offset: int,
    n: int,
    dtype: torch.dtype,
) -> torch.Tensor:
    """The sum over ranks of the n elements at `slot_offset` (in elements of dtype) of every rank's
    buffer; buf_ptrs / flag_ptrs: int64 [world] device tensors of every rank's buffer and flag
    addresses as mapped in this process (flags: int32 [MAX_PROGRAMS, world], zero at start)."""
    out = torch.empty(n, dtype=dtype, device=buf_ptrs.device)
    programs = min(MAX_PROGRAMS, triton.cdiv(n, BLOCK))
    _one_shot_kernel[(programs,)](
        buf_ptrs,
        flag_ptrs,
        out,
        slot_offset,
        n,
        rank,
        WORLD=world,
        BLOCK=BLOCK,
        MAX_PROGRAMS=MAX_PROGRAMS,
        num_warps=8,
        **triton_pdl.launch_args(out),
    )
    return out
