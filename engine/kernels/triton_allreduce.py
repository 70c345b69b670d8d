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
from llmdeploy_engine.kernels import triton_pdl

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


# ---------------------------------------------------------------------------------------------------
# Push exchange (PushAllReduce): no flags; the data marks its own arrival.
#
# Every rank's symmetric receive buffer starts filled with a sentinel bit pattern (every 16-bit half
# 0x8000: -0.0 in bf16/fp16, 0x80008000 in float32, a subnormal). A call writes this rank's n elements
# straight into its part of every peer's receive region (remote stores, posted: nothing waits for an
# answer), with any element whose bits equal the sentinel replaced by +0.0 (0 bits). Then each program
# polls its chunk of every peer's part in its own memory until no element is the sentinel, uses it,
# and writes the sentinel back (the region is clean again for the next call that uses it).
#
# Reuse: a peer writes a region again only two calls later (two calls in a row never share a region:
# the caller's slots, as for the p2p kernel), and only after it has finished the call in between,
# which needs this rank's data of that call, sent only after this rank's kernel for the earlier call
# (its reads and its clean-up) has finished (the PDL wait and stream order). So no write lands in a
# region still being read. The partial sums of this rank are read from x itself (local).
#
# Against the p2p kernel (a compare-and-swap round trip to every peer, then remote reads of every
# peer's slot), a call costs one one-way trip over NVLink: the receiver reads only its own memory.
# ---------------------------------------------------------------------------------------------------

SENTINEL_HALF = -32768  # 0x8000 as int16: the fill of every 16-bit half of a clean receive region
SENTINEL_WORD = -2147450880  # 0x80008000 as int32: the same fill read as 32-bit elements


def push_shape(n: int) -> tuple[int, int]:
    """(elements per program and round, warps) of a push exchange of n elements. Measured alone on 2
    H200s (`git show c2170a2:benchmarks/gpu_allreduce.py`, us per all-reduce of bf16 [rows, 4096]): 1 row 2.00 at
    (512, 4) against 2.46 at (2048, 8); 8 rows 2.40 at (1024, 4) against 2.68. Larger exchanges (the
    logits' all-gather, big batches) keep (2048, 8)."""
    if n <= 4096:
        return 512, 4
    if n <= 32768:
        return 1024, 4
    return BLOCK, 8


def bits_dtype(dtype: torch.dtype) -> tuple[torch.dtype, int]:
    """The integer type the exchange moves a dtype's elements as, and the sentinel in that type."""
    if dtype.itemsize == 2:
        return torch.int16, SENTINEL_HALF
    if dtype.itemsize == 4:
        return torch.int32, SENTINEL_WORD
    raise ValueError(f"the push exchange moves 2- and 4-byte elements, not {dtype}")


@triton.jit
def _push_exchange_kernel(x_ptr, recv_ptrs, out_ptr, region, part_stride, n, cols, rank,
                          WORLD: tl.constexpr, SENT: tl.constexpr, GATHER: tl.constexpr,
                          BLOCK: tl.constexpr, MAX_PROGRAMS: tl.constexpr, USE_PDL: tl.constexpr):  # fmt: skip
    triton_pdl.start(USE_PDL)
    pid = tl.program_id(0)
    bits_ty = x_ptr.dtype.element_ty
    val_ty = out_ptr.dtype.element_ty
    mine_at = region + rank * part_stride  # where this rank's elements land in every peer's buffer
    for start in tl.range(pid * BLOCK, n, MAX_PROGRAMS * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        live = offs < n
        mine = tl.load(x_ptr + offs, mask=live, other=0)
        mine = tl.where(mine == SENT, tl.zeros_like(mine), mine)
        for r in tl.static_range(WORLD):
            if r != rank:
                peer = tl.load(recv_ptrs + r).to(tl.pointer_type(bits_ty))
                tl.store(peer + mine_at + offs, mine, mask=live)
    own = tl.load(recv_ptrs + rank).to(tl.pointer_type(bits_ty))
    for start in tl.range(pid * BLOCK, n, MAX_PROGRAMS * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        live = offs < n
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for r in tl.static_range(WORLD):
            if r == rank:
                part = tl.load(x_ptr + offs, mask=live, other=0)
                part = tl.where(part == SENT, tl.zeros_like(part), part)
            else:
                src = own + region + r * part_stride + offs
                part = tl.load(src, mask=live, other=0, volatile=True)
                while tl.sum((part == SENT).to(tl.int32), axis=0) > 0:
                    part = tl.load(src, mask=live, other=0, volatile=True)
                tl.store(src, tl.full([BLOCK], SENT, bits_ty), mask=live)
            if GATHER:  # rows of `cols` elements: rank r's row i goes to out[i, r * cols : (r + 1) * cols]
                row = offs // cols
                tl.store(out_ptr + row * (WORLD * cols) + r * cols + (offs - row * cols),
                         part.to(val_ty, bitcast=True), mask=live)  # fmt: skip
            else:
                acc += part.to(val_ty, bitcast=True).to(tl.float32)
        if not GATHER:
            tl.store(out_ptr + offs, acc.to(val_ty), mask=live)


def push_exchange(
    x: torch.Tensor,
    recv_ptrs: torch.Tensor,
    rank: int,
    world: int,
    region: int,
    part_stride: int,
    gather_cols: int = 0,
    block: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """x (contiguous, this rank's part) pushed into every peer's receive buffer at
    `region + rank * part_stride` (in elements of x's dtype), then every peer's part read from this
    rank's own buffer. gather_cols 0: the sum over ranks (rank order, float32) shaped as x; else x is
    [rows, gather_cols] and the result [rows, world * gather_cols] (rank r's columns r * cols ...).
    recv_ptrs: int64 [world] device tensor of every rank's receive buffer as mapped in this process.
    block / num_warps: elements per program and round, warps per program (None: push_shape's)."""
    bits, sentinel = bits_dtype(x.dtype)
    n = x.numel()
    if block is None or num_warps is None:
        block, num_warps = push_shape(n)
    if gather_cols:
        rows = n // gather_cols
        out = torch.empty(rows, world * gather_cols, dtype=x.dtype, device=x.device)
    else:
        out = torch.empty_like(x)
    programs = max(1, min(MAX_PROGRAMS, triton.cdiv(n, block)))
    _push_exchange_kernel[(programs,)](
        x.view(bits),
        recv_ptrs,
        out,
        region,
        part_stride,
        n,
        max(gather_cols, 1),
        rank,
        WORLD=world,
        SENT=sentinel,
        GATHER=bool(gather_cols),
        BLOCK=block,
        MAX_PROGRAMS=MAX_PROGRAMS,
        num_warps=num_warps,
        **triton_pdl.launch_args(out),
    )
    return out
