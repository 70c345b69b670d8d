"""CudaGraphRunner's start-up warm-up of the eager prefill path, on the CPU runner: the prompts it
builds run through the real model and write only the padding block (the GPU test checks that no
attention kernel compiles afterwards)."""

from __future__ import annotations

import pytest
import torch
from llmdeploy_engine.kernels.attention import default_block_m, warm_query_lens
from llmdeploy_engine.runner import cuda_graph_runner as cgr
from llmdeploy_engine.runner.model_runner import ModelRunner


@pytest.mark.slow
def test_warm_up_prompts_write_only_the_padding_block(runner: ModelRunner) -> None:
    g_runner = object.__new__(cgr.CudaGraphRunner)  # no graphs: only the warm-up is exercised
    g_runner.runner = runner
    g_runner.block_size = runner.block_size
    pad = runner.kv_caches[0][0].shape[0] - 1  # the CPU pool's last block stands in for the padding one
    g_runner.padding_block = pad
    before = [(k[:pad].clone(), v[:pad].clone()) for k, v in runner.kv_caches]
    pad_before = runner.kv_caches[0][0][pad].clone()
    lens = g_runner._warm_eager_prefill()
    mc = runner.model_config
    group = mc.num_attention_heads // mc.num_key_value_heads
    assert lens == warm_query_lens(group, min(runner.max_num_batched_tokens, runner.max_model_len))
    assert len({default_block_m(q * group) for q in lens}) == len(lens) >= 3
    for (k, v), (k0, v0) in zip(runner.kv_caches, before, strict=True):
        assert torch.equal(k[:pad], k0) and torch.equal(v[:pad], v0), "the warm-up wrote a pool block"
    assert not torch.equal(runner.kv_caches[0][0][pad], pad_before)  # it did run the model into it


def test_no_padding_block_no_warm_up(runner: ModelRunner) -> None:
    g_runner = object.__new__(cgr.CudaGraphRunner)
    g_runner.runner = runner
    g_runner.padding_block = None
    assert g_runner._warm_eager_prefill() == []


@pytest.fixture(autouse=True)
def _restore_cache(runner: ModelRunner):  # type: ignore[no-untyped-def]
    saved = [(k.clone(), v.clone()) for k, v in runner.kv_caches]
    yield
    for (k, v), (k0, v0) in zip(runner.kv_caches, saved, strict=True):
        k.copy_(k0)
        v.copy_(v0)


def test_mixed_warm_up_batch_runs_and_writes_only_the_padding_block(runner: ModelRunner) -> None:
    """A prompt with decode rows (the mixed steps' warm-up on CUDA), through the CPU runner."""
    pad = runner.kv_caches[0][0].shape[0] - 1
    bs = runner.block_size
    batch = cgr.warm_up_batch(3, [40, 17, 2], pad, bs)
    assert batch.query_len == [3, 1, 1, 1] and batch.context_len == [3, 40, 17, 2]
    assert batch.positions == [0, 1, 2, 39, 16, 1]
    assert all(s // bs == pad for s in batch.slot_mapping)
    assert [len(t) for t in batch.block_tables] == [1, 3, 2, 1] and {
        b for t in batch.block_tables for b in t
    } == {pad}
    before = [(k[:pad].clone(), v[:pad].clone()) for k, v in runner.kv_caches]
    logits = runner.execute(batch)
    assert logits.shape[0] == 4 and torch.isfinite(logits).all()
    for (k, v), (k0, v0) in zip(runner.kv_caches, before, strict=True):
        assert torch.equal(k[:pad], k0) and torch.equal(v[:pad], v0)
