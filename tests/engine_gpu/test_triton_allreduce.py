"""The one-shot all-reduce kernel (triton_allreduce.py) of P2PAllReduce, one process: rank 0 of a
world of two whose "peer" buffers and flags are tensors of this process, with the peer's signal set
beforehand. The sum (rank order, float32) and the flag protocol: this rank signals the peer's flag for
it in each program and consumes its own. The two-GPU version runs in test_tensor_parallel_gpu.py."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import DEVICE, INTERPRET, TRITON_TEST_MARKS

pytestmark = TRITON_TEST_MARKS


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("numel", [8, 896, 4096 * 3, 70_000])
def test_one_shot_sums_both_buffers_and_hands_the_flags_over(dtype: torch.dtype, numel: int) -> None:
    from llmdeploy_engine.kernels import triton_allreduce as ar

    world, slot_offset = 2, 128
    gen = torch.Generator().manual_seed(numel)
    own = torch.zeros(slot_offset + numel + 64, dtype=dtype)
    peer = torch.zeros_like(own)
    own[slot_offset : slot_offset + numel] = torch.randn(numel, generator=gen).to(dtype)
    peer[slot_offset : slot_offset + numel] = torch.randn(numel, generator=gen).to(dtype)
    own, peer = own.to(DEVICE), peer.to(DEVICE)
    programs = min(ar.MAX_PROGRAMS, -(-numel // ar.BLOCK))
    own_flags = torch.zeros(ar.MAX_PROGRAMS * world, dtype=torch.int32)
    own_flags.view(-1, world)[:programs, 1] = 1  # the peer has signalled every program
    own_flags = own_flags.to(DEVICE)
    peer_flags = torch.zeros(ar.MAX_PROGRAMS * world, dtype=torch.int32, device=DEVICE)
    buf_ptrs = torch.tensor([own.data_ptr(), peer.data_ptr()], dtype=torch.int64, device=DEVICE)
    flag_ptrs = torch.tensor([own_flags.data_ptr(), peer_flags.data_ptr()], dtype=torch.int64, device=DEVICE)

    out = ar.one_shot_all_reduce(buf_ptrs, flag_ptrs, 0, world, slot_offset, numel, dtype)

    window = slice(slot_offset, slot_offset + numel)
    want = (own[window].float().cpu() + peer[window].float().cpu()).to(dtype)
    assert out.dtype == dtype and out.shape == (numel,)
    if INTERPRET and dtype != torch.float32:  # the interpreter's bf16 rounding: within one ulp
        ulp = torch.finfo(dtype).eps * want.float().abs().clamp_min(torch.finfo(dtype).tiny)
        assert bool(((out.cpu().float() - want.float()).abs() <= ulp).all())
    else:
        assert torch.equal(out.cpu(), want)
    assert int(own_flags.sum()) == 0  # every signal consumed
    signalled = peer_flags.view(-1, world).cpu()
    assert signalled[:programs, 0].tolist() == [1] * programs and int(signalled.sum()) == programs


def _clean(numel_bytes: int) -> torch.Tensor:
    """A receive buffer as PushAllReduce leaves it: every 16-bit half the sentinel."""
    from llmdeploy_engine.kernels import triton_allreduce as ar

    return torch.full((numel_bytes // 2,), ar.SENTINEL_HALF, dtype=torch.int16, device=DEVICE)


def _sent_as_zero(x: torch.Tensor) -> torch.Tensor:
    """x as the exchange sends it: elements whose bits are the sentinel go over as +0.0."""
    from llmdeploy_engine.kernels import triton_allreduce as ar

    bits, sentinel = ar.bits_dtype(x.dtype)
    b = x.view(bits)
    return torch.where(b == sentinel, torch.zeros_like(b), b).view(x.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("numel", [8, 896, 4096 * 3, 70_000])
def test_push_exchange_sums_and_leaves_both_buffers_clean(dtype: torch.dtype, numel: int) -> None:
    """Rank 0 then rank 1 of a world of two in one process (each rank's buffer a tensor here): rank
    0 pushes into rank 1's buffer, reads rank 1's part (pushed there beforehand, as rank 1 would) and
    cleans it; rank 1 then finds rank 0's part. Both sums have the same bits; both buffers end clean.
    Partial sums holding the sentinel's bits go over as +0.0."""
    from llmdeploy_engine.kernels import triton_allreduce as ar

    world, region = 2, 256  # region in elements of dtype; parts numel apart
    bits, sentinel = ar.bits_dtype(dtype)
    gen = torch.Generator().manual_seed(numel)
    parts = [torch.randn(numel, generator=gen).to(dtype) for _ in range(world)]
    parts[0].view(bits)[::7] = sentinel
    parts[1].view(bits)[3::11] = sentinel
    parts = [p.to(DEVICE) for p in parts]
    bufs = [_clean((region + world * numel + 64) * dtype.itemsize) for _ in range(world)]
    ptrs = torch.tensor([b.data_ptr() for b in bufs], dtype=torch.int64, device=DEVICE)
    bufs[0].view(dtype)[region + numel : region + 2 * numel] = _sent_as_zero(parts[1])  # rank 1's push

    out0 = ar.push_exchange(parts[0], ptrs, 0, world, region, numel)
    assert bool((bufs[0] == ar.SENTINEL_HALF).all())  # rank 0 read rank 1's part and cleaned it
    arrived = bufs[1].view(dtype)[region : region + numel]
    assert torch.equal(arrived.view(bits).cpu(), _sent_as_zero(parts[0]).view(bits).cpu())
    out1 = ar.push_exchange(parts[1], ptrs, 1, world, region, numel)
    assert bool((bufs[1] == ar.SENTINEL_HALF).all())

    sent = [_sent_as_zero(p).float().cpu() for p in parts]
    want = (sent[0] + sent[1]).to(dtype)
    assert torch.equal(out0.cpu().view(bits), out1.cpu().view(bits))  # the same bits on both ranks
    if INTERPRET and dtype != torch.float32:
        ulp = torch.finfo(dtype).eps * want.float().abs().clamp_min(torch.finfo(dtype).tiny)
        assert bool(((out0.cpu().float() - want.float()).abs() <= ulp).all())
    else:
        assert torch.equal(out0.cpu(), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,cols", [(1, 8), (1, 2000), (3, 4100), (8, 9000)])
def test_push_exchange_gathers_rows(dtype: torch.dtype, rows: int, cols: int) -> None:
    """The all-gather form: [rows, cols] on each rank -> [rows, 2 * cols], rank 0's columns first."""
    from llmdeploy_engine.kernels import triton_allreduce as ar

    world, numel = 2, rows * cols
    gen = torch.Generator().manual_seed(rows * cols)
    parts = [torch.randn(rows, cols, generator=gen).to(dtype).to(DEVICE) for _ in range(world)]
    bufs = [_clean((world * numel + 16) * dtype.itemsize) for _ in range(world)]
    ptrs = torch.tensor([b.data_ptr() for b in bufs], dtype=torch.int64, device=DEVICE)
    bufs[0].view(dtype)[numel : 2 * numel] = parts[1].reshape(-1)  # rank 1's push
    out0 = ar.push_exchange(parts[0], ptrs, 0, world, 0, numel, gather_cols=cols)
    assert bool((bufs[0] == ar.SENTINEL_HALF).all())
    out1 = ar.push_exchange(parts[1], ptrs, 1, world, 0, numel, gather_cols=cols)
    assert bool((bufs[1] == ar.SENTINEL_HALF).all())
    want = torch.cat([p.cpu() for p in parts], dim=1)
    assert torch.equal(out0.cpu(), want) and torch.equal(out1.cpu(), want)
