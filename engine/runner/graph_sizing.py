"""What ModelRunner's decode CUDA graphs need sized at start-up: the memory set aside for them (the
planner's rule, facts.cuda_graph_bytes), the symmetric buffer and the logits all-gather region their
tensor-parallel collectives use, and the rows whose logits they compute inside the graph. Plain
functions of the config, the model's shape, the dtypes and the parallel state."""

from __future__ import annotations

import importlib.util
from typing import Any

import torch
from llmdeploy_engine.facts import CUDA_GRAPH_LOGITS_MAX_BATCH, cuda_graph_batch_sizes


def largest_graph(max_num_seqs: int) -> int:
    return max(cuda_graph_batch_sizes(max_num_seqs))


def symm_mem_bytes(max_num_seqs: int, hidden_size: int) -> int:
    """Bytes of the largest all-reduce inside a decode CUDA graph (rows of the largest graph x
    hidden size, float32 at most): the symmetric-memory buffer must take every one of them."""
    return largest_graph(max_num_seqs) * hidden_size * 4


def local_vocab(vocab_size: int, tp: int) -> int:
    return -(-vocab_size // tp)  # as the vocabulary-parallel layers split it


def gather_bytes(max_num_seqs: int, vocab_size: int, tp: int, dtype: torch.dtype) -> int:
    """One rank's logits (model dtype) for the decode graphs that compute them inside the graph:
    what the push path's all-gather region must take."""
    rows = min(CUDA_GRAPH_LOGITS_MAX_BATCH, largest_graph(max_num_seqs))
    return rows * local_vocab(vocab_size, tp) * dtype.itemsize


def graph_logits_rows(parallel: Any, vocab_size: int, dtype: torch.dtype) -> int:
    """Rows up to which decode CUDA graphs compute the logits inside the graph (CudaGraphRunner's
    logits_max_batch; the same on every rank). At tp > 1 only with an all-gather that runs inside
    a graph (the push path), as many rows as its region takes; else 0 (logits after the replay)."""
    if not parallel.is_parallel:
        return CUDA_GRAPH_LOGITS_MAX_BATCH
    fast = parallel.fast_all_reduce
    region_bytes = 0 if fast is None else fast.gather_bytes
    row_bytes = local_vocab(vocab_size, parallel.world_size) * dtype.itemsize
    return min(CUDA_GRAPH_LOGITS_MAX_BATCH, region_bytes // row_bytes)


def graphs_with_tensor_parallel(parallel: Any) -> bool:
    """Whether decode steps may be captured in CUDA graphs at this tensor-parallel size: always at
    tp 1; at tp > 1 only with the symmetric-memory all-reduce (no NCCL inside a graph)."""
    return not parallel.is_parallel or parallel.fast_all_reduce is not None


def cuda_graph_reserve(
    config: Any,
    model_config: Any,
    device: torch.device,
    dtype: torch.dtype,
    kv_dtype: torch.dtype,
    model_len: int,
) -> int:
    """Bytes the decode CUDA graphs (captured after the KV cache, see cuda_graph_runner) will take,
    by the planner's builtin rule; 0 when none will be captured."""
    if device.type != "cuda" or config.enforce_eager:
        return 0
    from llmdeploy_engine import facts

    mc = model_config
    # with Triton installed, 16-bit decode attention reads the cache in place (a cache of the
    # model's dtype or fp8); otherwise the pure-torch path gathers copies of the context
    in_place = (
        importlib.util.find_spec("triton") is not None
        and dtype in (torch.bfloat16, torch.float16)
        and (kv_dtype == dtype or kv_dtype.itemsize == 1)  # fp8: read in place too
    )
    return facts.cuda_graph_bytes(
        max_num_seqs=config.max_num_seqs,
        max_model_len=model_len,
        block_size=config.block_size,
        hidden_size=mc.hidden_size,
        intermediate_size=mc.intermediate_size,
        q_size=mc.q_size,
        kv_size=mc.kv_size,
        vocab_size=mc.vocab_size,
        dtype_bytes=dtype.itemsize,
        gathered_kv=not in_place,
    )
