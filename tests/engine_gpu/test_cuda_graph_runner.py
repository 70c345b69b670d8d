"""On a CUDA GPU: decode steps replayed from CUDA graphs give the eager runner's logits and touch no
other sequence's KV cache."""

from __future__ import annotations

import pytest
import torch
from gpu_engine_helpers import batch_for, qwen_runner
from llmdeploy_engine.config import EngineConfig
from llmdeploy_engine.core.forward_batch import ForwardBatch
from llmdeploy_engine.runner.cuda_graph_runner import CudaGraphRunner
from llmdeploy_engine.runner.model_runner import ModelRunner

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max())


@pytest.mark.parametrize("dtype,tol", [("float32", 1e-4), ("bfloat16", 3e-2)])
def test_graph_decode_matches_eager(dtype: str, tol: float) -> None:
    runner = ModelRunner(
        EngineConfig(
            model="random:Qwen/Qwen2.5-0.5B",
            device="cuda",
            dtype=dtype,
            max_model_len=512,
            max_num_seqs=8,
            gpu_memory_utilization=0.3,
        )
    )
    graphs = CudaGraphRunner(runner, batch_sizes=(1, 2, 4, 8))
    assert graphs.report.num_graphs == 4 * len(graphs.block_buckets)
    bs = runner.block_size
    gen = torch.Generator().manual_seed(1)
    lengths = [5, 17, 40, 130, 300]
    prompts = [torch.randint(0, 1000, (n,), generator=gen).tolist() for n in lengths]
    per_seq = -(-(max(lengths) + 16) // bs)
    # interleaved block ids, so a wrong table or slot lands in another sequence's blocks
    tables = [list(range(i, 5 * per_seq, 5)) for i in range(5)]
    logits = graphs.execute(batch_for(prompts, [0] * 5, tables, bs))  # prefill: eager fallback
    assert graphs.num_replays == 0
    last = [int(t) for t in logits.argmax(-1).tolist()]
    ctx = list(lengths)
    for step, active in enumerate([[0, 1, 2, 3, 4], [1, 3, 4], [2], [0, 1, 2, 3, 4]]):
        batch = batch_for(
            [[last[i]] for i in active], [ctx[i] for i in active], [tables[i] for i in active], bs
        )
        idle = [b for i in range(5) if i not in active for b in tables[i]]
        before = [(k[idle].clone(), v[idle].clone()) for k, v in runner.kv_caches]
        ours = graphs.execute(batch)
        assert graphs.num_replays == step + 1
        for (k, v), (k0, v0) in zip(runner.kv_caches, before, strict=True):
            assert torch.equal(k[idle], k0) and torch.equal(v[idle], v0), "graph wrote outside its batch"
        ref = runner.execute(batch)  # eager, same inputs (rewrites the same slots)
        assert ours.shape == ref.shape and torch.isfinite(ours).all()
        assert rel_err(ours, ref) < tol, (step, rel_err(ours, ref))
        for j, i in enumerate(active):
            last[i] = int(ref[j].argmax())
            ctx[i] += 1


@pytest.mark.parametrize("logits_max_batch", [64, 2])  # logits inside every graph / only the small ones
def test_uniform_multi_token_steps_replay_and_match_eager(logits_max_batch: int) -> None:
    """Speculative-verification shape: every sequence feeds q tokens and wants all q logits."""
    runner = ModelRunner(
        EngineConfig(
            model="random:Qwen/Qwen2.5-0.5B",
            device="cuda",
            dtype="bfloat16",
            max_model_len=512,
            max_num_seqs=8,
            gpu_memory_utilization=0.3,
        )
    )
    graphs = CudaGraphRunner(
        runner, batch_sizes=(1, 2, 4, 8), logits_max_batch=logits_max_batch, multi_token_rows=True
    )
    bs = runner.block_size
    gen = torch.Generator().manual_seed(2)
    lengths = [9, 40, 130]
    prompts = [torch.randint(0, 1000, (n,), generator=gen).tolist() for n in lengths]
    per_seq = -(-(max(lengths) + 32) // bs)
    tables = [list(range(i, 3 * per_seq, 3)) for i in range(3)]
    graphs.execute(batch_for(prompts, [0] * 3, tables, bs))  # prefill: eager
    ctx = list(lengths)
    for step, (active, q) in enumerate([([0, 1, 2], 2), ([1, 2], 4), ([0], 3), ([0, 1], 1)]):
        tokens = [torch.randint(0, 1000, (q,), generator=gen).tolist() for _ in active]
        batch = batch_for(tokens, [ctx[i] for i in active], [tables[i] for i in active], bs)
        batch = ForwardBatch(**{**vars(batch), "num_logits": [q] * len(active)})
        idle = [b for i in range(3) if i not in active for b in tables[i]]
        before = [(k[idle].clone(), v[idle].clone()) for k, v in runner.kv_caches]
        ours = graphs.execute(batch).clone()
        assert graphs.num_replays == step + 1
        for (k, v), (k0, v0) in zip(runner.kv_caches, before, strict=True):
            assert torch.equal(k[idle], k0) and torch.equal(v[idle], v0), "graph wrote outside its batch"
        ref = runner.execute(batch)  # eager prefill-with-context chunks, same slots rewritten
        assert ours.shape == ref.shape == (len(active) * q, runner.model_config.vocab_size)
        assert rel_err(ours, ref) < 3e-2, (step, rel_err(ours, ref))
        for i in active:
            ctx[i] += q


def test_graphs_without_multi_token_rows_send_verification_steps_to_the_eager_runner() -> None:
    """Graphs captured for one token per sequence fuse the KV store into the decode kernel, where a
    row cannot read the K/V another row stores: q > 1 steps must not replay them."""
    runner = qwen_runner(max_model_len=512, max_num_seqs=4)
    graphs = CudaGraphRunner(runner, batch_sizes=(1, 2, 4))
    assert not graphs.multi_token_rows  # no speculative_config
    bs = runner.block_size
    prompts = [[5, 6, 7, 8, 9], [10, 11, 12]]
    tables = [[0, 2, 4], [1, 3, 5]]
    graphs.execute(batch_for(prompts, [0, 0], tables, bs))
    batch = batch_for([[1, 2], [3, 4]], [5, 3], tables, bs)
    batch = ForwardBatch(**{**vars(batch), "num_logits": [2, 2]})
    ours = graphs.execute(batch).clone()
    assert graphs.num_replays == 0
    ref = runner.execute(batch)
    assert torch.equal(ours, ref)
    graphs.execute(batch_for([[int(ours[1].argmax())], [int(ours[3].argmax())]], [7, 5], tables, bs))
    assert graphs.num_replays == 1


@pytest.mark.parametrize("dtype,tol", [("float32", 1e-4), ("bfloat16", 3e-2)])
def test_short_prefill_replays_its_graph_and_matches_eager(dtype: str, tol: float) -> None:
    """One-token decode graphs plus the short-prefill graphs: a 12-token prompt (and two 7-token
    ones) prefill in one replay of the 16-row graph, give the eager runner's last-token logits, touch
    no other sequence's blocks, and the decode step after it matches the eager path."""
    runner = qwen_runner(max_model_len=512, max_num_seqs=16, dtype=dtype)
    graphs = CudaGraphRunner(runner, batch_sizes=(1, 2, 4, 8, 16))
    assert not graphs.multi_token_rows and graphs.prefill_rows == (16,)
    assert graphs.report.num_prefill_graphs == 1 and (16, 8) in graphs.prefill_graphs
    bs = runner.block_size
    gen = torch.Generator().manual_seed(3)
    for lengths in ([12], [7, 7]):
        n = len(lengths)
        prompts = [torch.randint(0, 1000, (k,), generator=gen).tolist() for k in lengths]
        tables = [list(range(i, 2 * 4, 2)) for i in range(n)]  # interleaved, 4 blocks each
        idle = [b for b in range(8, 16)]
        before = [(k[idle].clone(), v[idle].clone()) for k, v in runner.kv_caches]
        replays = graphs.num_replays
        ours = graphs.execute(batch_for(prompts, [0] * n, tables, bs)).clone()
        assert graphs.num_replays == replays + 1
        for (k, v), (k0, v0) in zip(runner.kv_caches, before, strict=True):
            assert torch.equal(k[idle], k0) and torch.equal(v[idle], v0), "graph wrote outside its batch"
        ref = runner.execute(batch_for(prompts, [0] * n, tables, bs))  # eager, same slots rewritten
        assert ours.shape == ref.shape == (n, runner.model_config.vocab_size)
        assert rel_err(ours, ref) < tol, rel_err(ours, ref)
        nxt = [[int(t)] for t in ref.argmax(-1).tolist()]
        step = batch_for(nxt, lengths, tables, bs)
        ours = graphs.execute(step).clone()
        assert graphs.num_replays == replays + 2  # the decode graph
        assert rel_err(ours, runner.execute(step)) < tol


def test_start_up_compiles_every_prefill_attention_variant() -> None:
    """After CudaGraphRunner's start-up, eager steps mixing a prefill whose length falls in any of
    varlen_attention's BLOCK_M classes with decode rows (paged_decode) compile no attention kernel
    (before the warm-up, the first step of a new class compiled for ~0.5 s in the middle of
    serving); the warm-up writes only the padding block."""
    from llmdeploy_engine.kernels import attention
    from triton import knobs

    runner = qwen_runner(512, 4)
    graphs = CudaGraphRunner(runner, batch_sizes=(1, 2, 4))
    mc = runner.model_config
    group = mc.num_attention_heads // mc.num_key_value_heads
    limit = min(runner.max_num_batched_tokens, runner.max_model_len)
    assert graphs.warm_prefill_lens == attention.warm_query_lens(group, limit)
    classes = {attention.default_block_m(q * group) for q in graphs.warm_prefill_lens}
    assert classes == {16, 32, 64}
    # the warm-up again, the pool compared bit for bit (never-written blocks may hold NaN patterns)
    blocks = runner.num_kv_blocks
    before = [
        (k[:blocks].view(torch.int16).clone(), v[:blocks].view(torch.int16).clone())
        for k, v in runner.kv_caches
    ]
    graphs._warm_eager_prefill()
    for (k, v), (k0, v0) in zip(runner.kv_caches, before, strict=True):
        assert torch.equal(k[:blocks].view(torch.int16), k0), "the warm-up wrote a pool block"
        assert torch.equal(v[:blocks].view(torch.int16), v0), "the warm-up wrote a pool block"
    compiled: list[str] = []
    previous = knobs.runtime.jit_post_compile_hook

    def hook(**kwargs: object) -> object:
        compiled.append(kwargs["fn"].name)  # type: ignore[attr-defined]
        return previous(**kwargs) if previous is not None else None

    knobs.runtime.jit_post_compile_hook = hook
    try:
        bs = runner.block_size
        gen = torch.Generator().manual_seed(3)
        # a prefill of each length (and the lengths one past each class edge) with 1-3 decode rows
        # of contexts up to the longest (paged_decode's splits vary with both)
        for q in sorted({*graphs.warm_prefill_lens, *(n + 1 for n in graphs.warm_prefill_lens)}):
            for contexts in ([31], [200, 17], [500, 300, 64], [256, 255, 2]):
                prompts = [
                    torch.randint(0, 1000, (n,), generator=gen).tolist() for n in (q, *([1] * len(contexts)))
                ]
                per_seq = -(-512 // bs)
                tables = [list(range(i * per_seq, (i + 1) * per_seq)) for i in range(len(prompts))]
                graphs.execute(batch_for(prompts, [0, *(c - 1 for c in contexts)], tables, bs))
        torch.cuda.synchronize()
    finally:
        knobs.runtime.jit_post_compile_hook = previous
    assert not {"_varlen_kernel", "_paged_decode_kernel", "_merge_splits_kernel"} & set(compiled), compiled
