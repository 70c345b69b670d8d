"""CPU: PushAllReduce's plumbing (distributed.py) with its kernel replaced by a recorder: which region
of the symmetric buffer each slot and the all-gather use, that this rank's part is read where it lies
(no staging copy), and how many decode-graph rows compute their logits inside the graph at tp > 1.
The kernel itself runs in tests/engine_gpu (Triton interpreter or GPU)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from llmdeploy_engine.kernels import ops
from llmdeploy_engine.parallel.distributed import ParallelState
from llmdeploy_engine.parallel.symm_all_reduce import REDUCE_SLOTS, PushAllReduce


class _Recorder:
    """Stands in for triton_allreduce: records each call; the 'sum' is 2x (two equal ranks), the
    'gather' this rank's columns twice."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def push_exchange(self, x: torch.Tensor, recv_ptrs: Any, rank: int, world: int, region: int,
                      part_stride: int, gather_cols: int = 0) -> torch.Tensor:  # fmt: skip
        self.calls.append(
            dict(x=x, rank=rank, world=world, region=region, stride=part_stride, cols=gather_cols)
        )
        if gather_cols:
            return torch.cat([x] * world, dim=-1)
        return x * 2


def reducer(max_bytes: int = 256, gather_bytes: int = 512) -> PushAllReduce:
    r = PushAllReduce.__new__(PushAllReduce)  # no process group, no symmetric memory
    r.kernels = _Recorder()
    r.rank, r.world_size = 1, 2
    r.max_bytes, r.gather_bytes = max_bytes, gather_bytes
    r.gather_at = REDUCE_SLOTS * 2 * max_bytes
    r.buffer = torch.zeros(r.gather_at + 2 * gather_bytes, dtype=torch.uint8)
    r.recv_ptrs = None
    return r


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_each_slot_has_its_own_region_with_a_part_per_rank(dtype: torch.dtype) -> None:
    r = reducer()
    x = torch.randn(2, 8).to(dtype)
    size = dtype.itemsize
    for slot in range(REDUCE_SLOTS):
        got = r(x + slot, slot)
        assert torch.equal(got, (x + slot) * 2) and got.shape == x.shape
        call = r.kernels.calls[-1]
        assert call["region"] * size == slot * 2 * 256  # slot s: bytes [s * world * max, ...)
        assert call["stride"] * size == 256 and call["rank"] == 1 and call["cols"] == 0
    with pytest.raises(ValueError, match="slot"):
        r(x, REDUCE_SLOTS)


def test_the_row_parallel_product_is_summed_where_its_kernel_wrote_it() -> None:
    r = reducer()
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(2, 8, generator=gen), torch.randn(4, 8, generator=gen)
    got = r.linear(x, w, slot=1)
    assert got is not None and torch.equal(got, ops.linear(x, w) * 2)
    call = r.kernels.calls[-1]
    assert call["region"] * 4 == 2 * 256 and torch.equal(call["x"], ops.linear(x, w).reshape(-1))
    assert r.linear(torch.randn(17, 8), w) is None  # 17 x 4 float32 = 272 bytes > 256


def test_the_gather_uses_the_region_after_the_slots() -> None:
    r = reducer(gather_bytes=512)
    x = torch.randn(2, 3, 40)  # 240 float32 = 960 bytes: too big
    assert not r.fits_gather(x)
    x = torch.randn(1, 3, 40)  # 480 bytes
    assert r.fits_gather(x)
    got = r.gather(x)
    assert got.shape == (1, 3, 80) and torch.equal(got, torch.cat([x, x], dim=-1))
    call = r.kernels.calls[-1]
    assert call["region"] * 4 == REDUCE_SLOTS * 2 * 256 and call["stride"] * 4 == 512 and call["cols"] == 40


def _runner(world: int, gather_bytes: int | None, vocab: int = 1000) -> Any:
    from llmdeploy_engine.runner.model_runner import ModelRunner

    runner = ModelRunner.__new__(ModelRunner)
    fast = None if gather_bytes is None else SimpleNamespace(gather_bytes=gather_bytes)
    runner.parallel = ParallelState(0, world, None, fast) if world > 1 else ParallelState()
    runner.model_config = SimpleNamespace(vocab_size=vocab)
    runner.dtype = torch.bfloat16
    return runner


def test_logits_inside_the_graphs_at_tp_2_only_as_far_as_the_gather_region_goes() -> None:
    from llmdeploy_engine.facts import CUDA_GRAPH_LOGITS_MAX_BATCH

    assert _runner(1, None).graph_logits_rows() == CUDA_GRAPH_LOGITS_MAX_BATCH
    assert _runner(2, None).graph_logits_rows() == 0  # NCCL only: eager, no graphs
    assert _runner(2, 0).graph_logits_rows() == 0  # p2p / symm_mem: the all-gather after the replay
    row = 500 * 2  # 1,000 tokens over 2 ranks, bf16
    assert _runner(2, 7 * row + 10).graph_logits_rows() == 7
    assert _runner(2, 10_000 * row).graph_logits_rows() == CUDA_GRAPH_LOGITS_MAX_BATCH
