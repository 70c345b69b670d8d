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
    from llmdeploy_engine import triton_allreduce as ar

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
