"""CPU: the plumbing both symmetric-memory all-reduces share (symm_all_reduce._OneShotAllReduce), through
P2PAllReduce's slots with its GPU sum replaced by a stand-in (two ranks holding the same partial
sums: the sum is twice the staging view). The kernels themselves run in tests/engine_gpu."""

from __future__ import annotations

import pytest
import torch
from llmdeploy_engine.kernels import ops
from llmdeploy_engine.parallel.symm_all_reduce import REDUCE_SLOTS, P2PAllReduce


class _TwoEqualRanks(P2PAllReduce):
    def _sum(self, staging: torch.Tensor, slot: int) -> torch.Tensor:
        return staging * 2


def reducer(max_bytes: int = 256) -> _TwoEqualRanks:
    r = _TwoEqualRanks.__new__(_TwoEqualRanks)  # no process group, no symmetric memory
    r.max_bytes = max_bytes
    r.buffer = torch.zeros(REDUCE_SLOTS * max_bytes, dtype=torch.uint8)
    return r


def slot_view(r: _TwoEqualRanks, slot: int, like: torch.Tensor) -> torch.Tensor:
    start = slot * r.max_bytes
    return r.buffer[start : start + like.numel() * like.element_size()].view(like.dtype).view(like.shape)


def test_a_copy_goes_into_the_callers_slot() -> None:
    r = reducer()
    x = torch.randn(2, 8)
    for slot in range(REDUCE_SLOTS):
        assert torch.equal(r(x + slot, slot), (x + slot) * 2)
        assert torch.equal(slot_view(r, slot, x), x + slot)
    with pytest.raises(ValueError, match="slot"):
        r(x, REDUCE_SLOTS)


def test_the_row_parallel_product_is_written_into_the_slot() -> None:
    r = reducer()
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(2, 8, generator=gen), torch.randn(4, 8, generator=gen)
    got = r.linear(x, w, slot=1)
    assert got is not None and torch.equal(got, ops.linear(x, w) * 2)
    assert torch.equal(slot_view(r, 1, got), ops.linear(x, w))
    gate_up = torch.randn(2, 16, generator=gen)
    got = r.linear(gate_up, w, silu_mul=True, slot=0)
    assert got is not None and torch.equal(got, ops.silu_mul_linear(gate_up, w) * 2)


def test_what_does_not_fit_goes_back_to_the_caller() -> None:
    r = reducer(max_bytes=256)
    assert r.fits(torch.zeros(64)) and not r.fits(torch.zeros(65))
    assert not r.fits(torch.zeros(4, dtype=torch.float64))
    w = torch.randn(4, 8)
    assert r.linear(torch.randn(17, 8), w) is None  # 17 x 4 float32 = 272 bytes
    assert r.linear(torch.randn(2, 8).double(), w.double()) is None
    assert r.linear(torch.randn(2, 8), w.half()) is None
