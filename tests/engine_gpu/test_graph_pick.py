"""CPU: which captured CUDA graph (batch size, context bucket) a batch replays, and which batches
fall back to the eager runner. No capture happens here."""

from __future__ import annotations

from llmdeploy_engine.cuda_graph_runner import CudaGraphRunner
from llmdeploy_engine.forward_batch import ForwardBatch


def picker() -> CudaGraphRunner:
    r = CudaGraphRunner.__new__(CudaGraphRunner)
    r.block_size = 16
    r.batch_sizes = (1, 2, 4, 8)
    r.block_buckets = (8, 16, 32)
    r.graphs = {(b, nb): (b, nb) for b in r.batch_sizes for nb in r.block_buckets}  # type: ignore[misc]
    return r


def decode(contexts: list[int]) -> ForwardBatch:
    n = len(contexts)
    return ForwardBatch(
        input_ids=[1] * n,
        positions=[c - 1 for c in contexts],
        slot_mapping=list(range(n)),
        query_start=list(range(n)),
        query_len=[1] * n,
        context_len=contexts,
        block_tables=[[0] * -(-c // 16) for c in contexts],
        sample_indices=list(range(n)),
    )


def test_pure_decode_picks_smallest_fitting_graph() -> None:
    r = picker()
    assert r._pick(decode([5])) == (1, 8)
    assert r._pick(decode([5, 200, 129])) == (4, 16)
    assert r._pick(decode([512] * 8)) == (8, 32)


def test_other_batches_run_eagerly() -> None:
    r = picker()
    assert r._pick(decode([10] * 9)) is None  # more sequences than the largest graph
    assert r._pick(decode([513])) is None  # context beyond the largest bucket
    prefill = decode([30, 40])
    mixed = ForwardBatch(**{**vars(prefill), "query_len": [1, 5]})
    assert r._pick(mixed) is None
    first_token = decode([1, 40])  # context 1: a one-token prompt's prefill
    assert r._pick(first_token) is None
    partial = ForwardBatch(**{**vars(prefill), "sample_indices": [1]})  # a chunk that samples nothing
    assert r._pick(partial) is None
