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


def test_pack_decode_inputs_pads_rows_and_tables() -> None:
    import numpy as np
    from llmdeploy_engine.cuda_graph_runner import pack_decode_inputs

    batch = ForwardBatch(
        input_ids=[11, 12, 13],
        positions=[20, 40, 5],
        slot_mapping=[100, 200, 300],
        query_start=[0, 1, 2],
        query_len=[1, 1, 1],
        context_len=[21, 41, 6],
        block_tables=[[7, 8], [3, 4, 5], [9]],
        sample_indices=[0, 1, 2],
    )
    out = np.full(64, -1, dtype=np.int64)  # stale values must not survive in the table region
    b, nb = 4, 4
    assert pack_decode_inputs(out, batch, b, nb) == b * (4 + nb)
    assert out[:4].tolist() == [11, 12, 13, 11]  # padding row repeats row 0
    assert out[4:8].tolist() == [20, 40, 5, 20]
    assert out[8:12].tolist() == [100, 200, 300, 100]
    assert out[12:16].tolist() == [21, 41, 6, 21]
    assert out[16:32].reshape(4, 4).tolist() == [[7, 8, 0, 0], [3, 4, 5, 0], [9, 0, 0, 0], [7, 8, 0, 0]]
    assert (out[32:] == -1).all()
    # tables longer than the bucket are cut to it
    long = ForwardBatch(**{**vars(batch), "block_tables": [[1, 2, 3], [4, 5, 6, 7, 8], [9]]})
    pack_decode_inputs(out, long, 4, 2)
    assert out[16:24].reshape(4, 2).tolist() == [[1, 2], [4, 5], [9, 0], [1, 2]]
