"""CPU: which captured CUDA graph (batch size, context bucket) a batch replays, and which batches
fall back to the eager runner. No capture happens here."""

from __future__ import annotations

import torch
from llmdeploy_engine.core.forward_batch import ForwardBatch
from llmdeploy_engine.runner.cuda_graph_runner import CudaGraphRunner, spaced_rows


def picker(multi_token_rows: bool = True) -> CudaGraphRunner:
    r = CudaGraphRunner.__new__(CudaGraphRunner)
    r.multi_token_rows = multi_token_rows
    r.block_size = 16
    r.batch_sizes = (1, 2, 4, 8)
    r.block_buckets = (8, 16, 32)
    r.graphs = {(b, nb): (b, nb) for b in r.batch_sizes for nb in r.block_buckets}  # type: ignore[misc]
    r.prefill_rows = ()
    r.prefill_graphs = {}
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


def three_decodes() -> ForwardBatch:
    """Three sequences decoding one token each, at positions 20, 40 and 5."""
    return ForwardBatch(
        input_ids=[11, 12, 13],
        positions=[20, 40, 5],
        slot_mapping=[100, 200, 300],
        query_start=[0, 1, 2],
        query_len=[1, 1, 1],
        context_len=[21, 41, 6],
        block_tables=[[7, 8], [3, 4, 5], [9]],
        sample_indices=[0, 1, 2],
    )


def test_pack_decode_inputs_pads_rows_and_tables() -> None:
    import numpy as np
    from llmdeploy_engine.runner.graph_inputs import pack_decode_inputs

    batch = three_decodes()
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


def test_pack_decode_inputs_sends_padding_rows_to_the_padding_block() -> None:
    """With the runner's padding block, padding rows read and write only that block: position 0, its
    first slot, one key, a table of that block; the real rows are packed as before."""
    import numpy as np
    from llmdeploy_engine.runner.graph_inputs import pack_decode_inputs

    batch = three_decodes()
    out = np.full(6 * 7, -1, dtype=np.int64)
    b, nb = 6, 3
    assert pack_decode_inputs(out, batch, b, nb, padding_block=50, block_size=16) == b * (4 + nb)
    assert out[:6].tolist() == [11, 12, 13, 11, 11, 11]
    assert out[6:12].tolist() == [20, 40, 5, 0, 0, 0]
    assert out[12:18].tolist() == [100, 200, 300, 800, 800, 800]
    assert out[18:24].tolist() == [21, 41, 6, 1, 1, 1]
    assert out[24:].reshape(6, 3).tolist() == [[7, 8, 0], [3, 4, 5], [9, 0, 0]] + [[50, 50, 50]] * 3


def uniform(contexts: list[int], q: int, num_logits: list[int] | None) -> ForwardBatch:
    """n sequences feeding q new tokens each (speculative verification shape)."""
    n = len(contexts)
    positions = [c - q + j for c in contexts for j in range(q)]
    return ForwardBatch(
        input_ids=[5 + p for p in positions],
        positions=positions,
        slot_mapping=[1000 + p for p in positions],
        query_start=[i * q for i in range(n)],
        query_len=[q] * n,
        context_len=contexts,
        block_tables=[[10 * (i + 1) + k for k in range(-(-c // 16))] for i, c in enumerate(contexts)],
        sample_indices=list(range(n)),
        num_logits=num_logits,
    )


def test_uniform_multi_token_batches_use_the_graph_of_n_times_q_rows() -> None:
    r = picker()
    assert r._pick(uniform([20, 40], 3, [3, 3])) == (8, 8)  # 6 rows
    assert r._pick(uniform([20], 2, [2])) == (2, 8)
    assert r._pick(uniform([20, 40], 2, None)) == (4, 8)  # only the last token's logits
    assert r._pick(uniform([20, 40, 50], 3, [3, 3, 3])) is None  # 9 rows > 8
    # no cached token before the first new one: a 3-token prompt's prefill, same rows
    assert r._pick(uniform([3, 40], 3, [3, 3])) == (8, 8)


def test_graphs_for_one_token_per_sequence_take_only_decodes() -> None:
    """Without multi-token rows the graphs fuse the KV store into the decode kernel (one token per
    sequence): speculative-verification shapes run eagerly, decodes still replay."""
    r = picker(multi_token_rows=False)
    assert r._pick(uniform([20, 40], 3, [3, 3])) is None
    assert r._pick(uniform([20], 2, [2])) is None
    assert r._pick(decode([5, 200, 129])) == (4, 16)


def test_pack_uniform_multi_token_rows() -> None:
    import numpy as np
    from llmdeploy_engine.runner.graph_inputs import pack_decode_inputs

    batch = uniform([20, 33], 2, [2, 2])
    out = np.full(8 * (4 + 4), -1, dtype=np.int64)
    b, nb = 8, 4
    pack_decode_inputs(out, batch, b, nb)
    rows = 4
    assert out[:b].tolist() == batch.input_ids + [batch.input_ids[0]] * (b - rows)
    assert out[b : 2 * b].tolist() == [18, 19, 31, 32] + [18] * 4
    assert out[2 * b : 3 * b].tolist() == [1018, 1019, 1031, 1032] + [1018] * 4
    assert out[3 * b : 4 * b].tolist() == [19, 20, 32, 33] + [19] * 4  # each token sees its own prefix
    tables = out[4 * b :].reshape(b, nb).tolist()
    assert tables[:4] == [[10, 11, 0, 0], [10, 11, 0, 0], [20, 21, 22, 0], [20, 21, 22, 0]]
    assert tables[4:] == [[10, 11, 0, 0]] * 4
    # a decode batch after it: no multi-token state is left behind in the rows it uses
    pack_decode_inputs(out, decode([5, 17]), 2, 4)
    assert out[8:16].reshape(2, 4).tolist() == [[0, 0, 0, 0], [0, 0, 0, 0]]  # decode() uses block 0


def test_short_prefills_replay_the_multi_token_row_graphs() -> None:
    """With one-token decode graphs, uniform multi-token steps (a prompt's prefill, a verification
    step) replay the short-prefill graphs of n * q rows where their contexts fit; decodes keep
    the decode graphs."""
    r = picker(multi_token_rows=False)
    r.prefill_rows = (16, 32)
    r.prefill_graphs = {(b, nb): ("prefill", b, nb) for b, nb in [(16, 8), (32, 8)]}  # type: ignore[misc]
    assert r._pick(uniform([12], 12, None)) == ("prefill", 16, 8)  # a 12-token prompt, last logits only
    assert r._pick(uniform([20, 20], 10, None)) == ("prefill", 32, 8)  # 10 new tokens after 10 cached
    assert r._pick(uniform([20, 40], 3, [3, 3])) == ("prefill", 16, 8)  # verification shape
    assert r._pick(uniform([40], 40, None)) is None  # 40 rows: more than the largest graph
    assert r._pick(uniform([200], 20, None)) is None  # a context past the captured buckets
    assert r._pick(decode([5, 200])) == (2, 16)
    r.prefill_rows = (16, 32, 256)
    assert r.prefill_keys() == [(16, 8), (32, 8), (256, 8), (256, 16)]


def test_spaced_rows_select_the_same_rows_as_an_index() -> None:
    """The logit rows a replay returns are a slice of the graph's output when evenly spaced (every
    token; the last of each sequence's q tokens), and only then."""
    table = torch.arange(40.0).view(20, 2)
    for rows in ([5], [0, 1, 2, 3], [3, 7, 11, 15], [15, 19], list(range(20))):
        picked = spaced_rows(rows)
        assert picked is not None, rows
        assert torch.equal(table[picked], table[torch.tensor(rows)]), rows
    for rows in ([], [0, 2, 3], [3, 1], [2, 2], [1, 4, 8]):
        assert spaced_rows(rows) is None, rows


def test_follow_on_tables_equal_a_full_packing() -> None:
    """A window that follows another packs its block tables from the other's packed rows, rewriting
    the rows whose tables grew: the same bytes as packing every table again, through row drops,
    reorders, appended blocks and a wider bucket (which packs them all)."""
    import random

    import numpy as np
    from gpu_engine_helpers import batch_for
    from llmdeploy_engine.runner.graph_inputs import pack_decode_inputs, packed_tables
    from llmdeploy_engine.runner.multi_step import DecodeWindow

    rng = random.Random(5)
    bs, b = 16, 16
    tables = [[rng.randrange(1000) for _ in range(rng.randint(1, 6))] for _ in range(12)]
    positions = [len(t) * bs - 1 - rng.randrange(bs) for t in tables]
    prev = None
    for step in range(40):
        n = len(tables)
        nb = 8 if step < 30 else 16
        batch = batch_for([[-1]] * n, positions, tables, bs)
        full = np.full(b * (4 + nb), -7, dtype=np.int64)
        pack_decode_inputs(full, batch, b, nb, padding_block=999, block_size=bs)
        out = np.full(b * (4 + nb), -7, dtype=np.int64)
        pack_decode_inputs(out, batch, b, nb, 999, bs, prev)
        assert (out == full).all(), step
        window = DecodeWindow(torch.zeros(1, n, dtype=torch.long))
        packed = packed_tables(window, out[4 * b : 4 * b + n * nb].reshape(n, nb), batch)
        # the next window: some rows end, the rest may come in another order, each advances one
        # position and takes a new block when it crosses into one
        keep = [i for i in range(n) if rng.random() > 0.1] or [0]
        if rng.random() < 0.3:
            rng.shuffle(keep)
        tables = [list(tables[i]) for i in keep]
        positions = [positions[i] + 1 for i in keep]
        for t, p in zip(tables, positions, strict=True):
            if p // bs >= len(t):
                t.append(rng.randrange(1000))
        prev = (packed, keep)
