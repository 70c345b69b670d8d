"""build_varlen_metadata (plain torch, runs anywhere): every sequence's offsets, lengths and block
table, padded to the longest context, in one int32 tensor; built by build_attention_metadata only for
CUDA batches with prefill chunks."""

from __future__ import annotations

import torch
from llmdeploy_engine.core.forward_batch import ForwardBatch
from llmdeploy_engine.kernels.attention import build_attention_metadata, build_varlen_metadata


def batch() -> ForwardBatch:
    # a 5-token prefill after a 16-token prefix, a decode at context 40, a 2-token verification
    return ForwardBatch(
        input_ids=[1] * 8,
        positions=[16, 17, 18, 19, 20, 39, 7, 8],
        slot_mapping=[5 * 16 + 0, 81, 82, 83, 84, 2 * 16 + 7, 9 * 16 + 7, 9 * 16 + 8],
        query_start=[0, 5, 6],
        query_len=[5, 1, 2],
        context_len=[21, 40, 9],
        block_tables=[[4, 5], [1, 3, 2, 8], [9, 11]],  # the last table holds a block past its context
        sample_indices=[0, 1, 2],
    )


def test_varlen_metadata_fields() -> None:
    meta = build_varlen_metadata(batch(), 16, torch.device("cpu"))
    assert meta.query_start.tolist() == [0, 5, 6]
    assert meta.query_len.tolist() == [5, 1, 2]
    assert meta.context_len.tolist() == [21, 40, 9]
    # padded to ceil(40 / 16) = 3 blocks with block 0; blocks past a context are cut
    assert meta.block_tables.tolist() == [[4, 5, 0], [1, 3, 2], [9, 0, 0]]
    assert meta.max_query_len == 5
    assert all(t.dtype == torch.int32 for t in (meta.query_start, meta.block_tables))


def test_varlen_metadata_only_for_cuda_prefills() -> None:
    assert build_attention_metadata(batch(), 16, torch.device("cpu")).varlen is None
