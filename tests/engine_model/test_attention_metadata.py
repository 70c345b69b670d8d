"""Per-step decode metadata: int32 context lengths built once per step (kernels do not reduce
decode_mask in every layer) and the host flag saying the decodes are the first tokens, in order."""

from __future__ import annotations

import torch
from llmdeploy_engine.core.forward_batch import ForwardBatch
from llmdeploy_engine.kernels.attention import AttentionMetadata, build_attention_metadata

BLOCK_SIZE = 4


def make_batch(seqs: list[tuple[int, int]]) -> ForwardBatch:
    """(cached tokens, new tokens) per sequence, blocks allocated in order."""
    positions: list[int] = []
    starts: list[int] = []
    tables: list[list[int]] = []
    next_block = 0
    for cached, new in seqs:
        num_blocks = -(-(cached + new) // BLOCK_SIZE)
        tables.append(list(range(next_block, next_block + num_blocks)))
        next_block += num_blocks
        starts.append(len(positions))
        positions += list(range(cached, cached + new))
    slots = [0] * len(positions)
    return ForwardBatch(
        [0] * len(positions),
        positions,
        slots,
        starts,
        [s[1] for s in seqs],
        [sum(s) for s in seqs],
        tables,
        list(range(len(seqs))),
    )


def test_decode_only_batch_is_in_order_with_int32_lengths() -> None:
    seqs = [(5, 1), (12, 1), (1, 1), (30, 1)]
    meta = build_attention_metadata(make_batch(seqs), BLOCK_SIZE, torch.device("cpu"))
    assert meta.decodes_in_order and meta.num_decodes == 4
    lengths = meta.decode_context_lens()
    assert lengths.dtype == torch.int32
    assert lengths.tolist() == [6, 13, 2, 31]
    # the same figures the mask holds (what kernels reduced per layer before)
    assert torch.equal(meta.decode_mask.view(4, -1).sum(-1), lengths.long())


def test_mixed_batch_decodes_out_of_order() -> None:
    # a prefill first: the decodes are tokens 7 and 8, not 0 and 1
    seqs = [(0, 7), (5, 1), (9, 1)]
    meta = build_attention_metadata(make_batch(seqs), BLOCK_SIZE, torch.device("cpu"))
    assert meta.decode_token_index.tolist() == [7, 8]
    assert not meta.decodes_in_order
    assert meta.decode_context_lens().tolist() == [6, 10]


def test_decodes_first_then_prefill_are_in_order() -> None:
    seqs = [(5, 1), (9, 1), (0, 3)]
    meta = build_attention_metadata(make_batch(seqs), BLOCK_SIZE, torch.device("cpu"))
    assert meta.decode_token_index.tolist() == [0, 1]
    assert meta.decodes_in_order
    assert meta.decode_context_lens().tolist() == [6, 10]


def test_lengths_fall_back_to_the_mask() -> None:
    lengths = torch.tensor([3, 8])
    mask = torch.arange(8)[None, :] < lengths[:, None]
    meta = AttentionMetadata(
        slot_mapping=torch.zeros(2, dtype=torch.long),
        decode_token_index=torch.arange(2),
        decode_blocks=torch.zeros(4, dtype=torch.long),
        decode_mask=mask[:, None, None, :],
        prefills=(),
    )
    assert meta.decode_context_lens().tolist() == [3, 8]
    assert not meta.decodes_in_order  # the safe default: gather through decode_token_index


def test_pack_aligned_parts_start_on_16_byte_boundaries() -> None:
    """Triton specialises pointer arguments on 16-byte alignment: every part of a packed metadata
    buffer must be aligned whatever the part lengths, or kernels compile new variants mid-serving."""
    from llmdeploy_engine.kernels.attention import pack_aligned

    for dtype in (torch.int32, torch.long):
        for n in range(1, 10):
            parts = [list(range(n)), list(range(100, 100 + n)), [7] * (2 * n + 1), []]
            got = pack_aligned(parts, dtype, torch.device("cpu"))
            assert [t.tolist() for t in got] == parts
            assert all(t.dtype == dtype and t.data_ptr() % 16 == 0 for t in got)


def test_varlen_metadata_pointers_aligned_for_every_batch_size() -> None:
    from llmdeploy_engine.kernels.attention import build_varlen_metadata

    for n in range(1, 10):
        batch = make_batch([(3 * i, 2 + i % 3) for i in range(n)])
        meta = build_varlen_metadata(batch, BLOCK_SIZE, torch.device("cpu"))
        parts = (meta.query_start, meta.query_len, meta.context_len, meta.block_tables)
        assert all(t.data_ptr() % 16 == 0 for t in parts), n
        assert meta.query_len.tolist() == batch.query_len and meta.query_start.tolist() == batch.query_start
        assert meta.context_len.tolist() == batch.context_len
        assert meta.block_tables.shape[0] == n
