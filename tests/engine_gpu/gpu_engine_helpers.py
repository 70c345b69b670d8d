"""Shared by the GPU engine tests (no CUDA needed to import): a ForwardBatch from per-sequence tokens,
a runner of the random Qwen2.5-0.5B."""

from __future__ import annotations

from typing import Any

from llmdeploy_engine.config import EngineConfig
from llmdeploy_engine.core.forward_batch import ForwardBatch
from llmdeploy_engine.runner.model_runner import ModelRunner


def qwen_runner(max_model_len: int, max_num_seqs: int, dtype: str = "bfloat16", **config: Any) -> ModelRunner:
    """A ModelRunner of random Qwen2.5-0.5B weights on the GPU, 30 % of its memory."""
    return ModelRunner(
        EngineConfig(
            model="random:Qwen/Qwen2.5-0.5B",
            device=config.pop("device", "cuda"),
            dtype=dtype,
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
            gpu_memory_utilization=0.3,
            **config,
        )
    )


def batch_for(tokens: list[list[int]], starts: list[int], tables: list[list[int]], bs: int) -> ForwardBatch:
    """Each sequence feeds `tokens[i]` from position `starts[i]` through block table `tables[i]` (block
    size bs) and samples once."""
    ids: list[int] = []
    pos: list[int] = []
    slots: list[int] = []
    qstart: list[int] = []
    for toks, start, table in zip(tokens, starts, tables, strict=True):
        qstart.append(len(ids))
        ids += toks
        pos += list(range(start, start + len(toks)))
        slots += [table[p // bs] * bs + p % bs for p in range(start, start + len(toks))]
    return ForwardBatch(
        input_ids=ids,
        positions=pos,
        slot_mapping=slots,
        query_start=qstart,
        query_len=[len(t) for t in tokens],
        context_len=[s + len(t) for s, t in zip(starts, tokens, strict=True)],
        block_tables=tables,
        sample_indices=list(range(len(tokens))),
    )
