"""On a CUDA GPU: multi-step decode windows replayed from CUDA graphs give the tokens of single graph
steps (float32 random Qwen2.5-0.5B), including windows whose last step needs a larger context bucket
and batches padded to the graph's size, write no other sequence's KV, and through the engine give the
same greedy outputs as num_scheduler_steps 1, with asynchronous scheduling and without, and with the
engine choosing the windows' lengths (auto). An
asynchronous window fed the last ids of the window before it on the device gives the same tokens, and
its ids can be read before the windows launched after it have run."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from gpu_engine_helpers import batch_for
from llmdeploy_engine.config import EngineConfig
from llmdeploy_engine.core.forward_batch import ForwardBatch
from llmdeploy_engine.llm_engine import LLMEngine
from llmdeploy_engine.loading.tokenizer import Tokenizer
from llmdeploy_engine.runner.cuda_graph_runner import CudaGraphRunner
from llmdeploy_engine.runner.model_runner import ModelRunner
from llmdeploy_engine.sampling_params import SamplingParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

MODEL = "random:Qwen/Qwen2.5-0.5B"


def config(steps: int | None, asynchronous: bool = True) -> EngineConfig:
    # float32: graph steps over different context buckets agree to the last bit that decides a token
    return EngineConfig(
        model=MODEL, device="cuda", dtype="float32", max_model_len=512, max_num_seqs=8,
        gpu_memory_utilization=0.3, num_scheduler_steps=steps, async_scheduling=asynchronous,
    )  # fmt: skip


@pytest.fixture(scope="module")
def runner() -> Iterator[ModelRunner]:
    yield ModelRunner(config(1))
    torch.cuda.empty_cache()


@pytest.mark.parametrize("logits_max_batch", [64, 2])  # logits inside the graph / computed after it
def test_graph_windows_match_graph_single_steps(runner: ModelRunner, logits_max_batch: int) -> None:
    graphs = CudaGraphRunner(runner, batch_sizes=(1, 2, 4, 8), logits_max_batch=logits_max_batch)
    bs = runner.block_size
    gen = torch.Generator().manual_seed(3)
    # 125 + 8 crosses the 128-token bucket inside the window; 6 sequences, five decode (padded to 8)
    lengths = [5, 17, 40, 125, 250, 60]
    prompts = [torch.randint(0, 1000, (n,), generator=gen).tolist() for n in lengths]
    per_seq = -(-(max(lengths) + 24) // bs)
    tables = [list(range(i, 6 * per_seq, 6)) for i in range(6)]  # interleaved blocks
    first = graphs.execute(batch_for(prompts, [0] * 6, tables, bs)).argmax(-1).tolist()  # eager prefill
    active = [0, 1, 2, 3, 4]
    idle = [b for b in tables[5]]
    num_steps = 8
    decode = batch_for(
        [[first[i]] for i in active], [lengths[i] for i in active], [tables[i] for i in active], bs
    )
    before_idle = [(k[idle].clone(), v[idle].clone()) for k, v in runner.kv_caches]
    replays = graphs.num_replays
    window = graphs.execute_multi_step(decode, num_steps)
    assert graphs.num_replays == replays + num_steps
    assert len(window) == num_steps and all(len(row) == len(active) for row in window)
    for (k, v), (k0, v0) in zip(runner.kv_caches, before_idle, strict=True):
        assert torch.equal(k[idle], k0) and torch.equal(v[idle], v0), "a window wrote outside its batch"
    after_window = [(k.clone(), v.clone()) for k, v in runner.kv_caches]
    # the same steps one graph replay at a time (they rewrite the same slots)
    ids = [first[i] for i in active]
    single = []
    for k in range(num_steps):
        step = batch_for(
            [[t] for t in ids], [lengths[i] + k for i in active], [tables[i] for i in active], bs
        )
        ids = graphs.execute(step).argmax(-1).tolist()
        single.append(ids)
    assert window == single
    # the pool's blocks (the padding block past them is the padding rows' scratch)
    pool = runner.num_kv_blocks
    assert runner.padding_block == pool and runner.kv_caches[0][0].shape[0] == pool + 1
    for (k1, v1), (k0, v0) in zip(runner.kv_caches, after_window, strict=True):
        torch.testing.assert_close(k1[:pool], k0[:pool], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(v1[:pool], v0[:pool], rtol=1e-4, atol=1e-5)
    # and the eager window (the fallback for batches no graph serves) agrees too
    assert runner.execute_multi_step(decode, num_steps) == single
    # sampled rows: the graph window and the eager window draw the same tokens from the same seed
    params = [
        SamplingParams(temperature=0.8, top_p=0.9),
        SamplingParams(temperature=0),
        SamplingParams(temperature=1.2, top_k=20, min_p=0.01),
        SamplingParams(temperature=0.5),
        SamplingParams(temperature=0),
    ]
    drawn = graphs.execute_multi_step(decode, num_steps, params, 1234)
    assert drawn == runner.execute_multi_step(decode, num_steps, params, 1234)
    assert [row[1] for row in drawn] == [row[1] for row in single]  # greedy rows: argmax as before
    # asynchronous: 3 steps, then 5 more whose rows come in another order (padded to 8), launched
    # behind a long kernel: the first window's ids are read while the second has not run
    order = [4, 2, 0, 1, 3]
    first_window = graphs.launch_multi_step(decode, 3)
    torch.cuda._sleep(2_000_000_000)  # ~1 s of GPU clock cycles
    follow = batch_for(
        [[-1]] * len(order), [lengths[active[i]] + 3 for i in order], [tables[active[i]] for i in order], bs
    )
    second = graphs.launch_multi_step(follow, 5, follow=first_window, follow_rows=order)
    assert first_window.result() == single[:3]
    assert second._ready is not None and not second._ready.query(), "result() waited for a later window"
    assert second.result() == [[row[i] for i in order] for row in single[3:]]


def test_engine_windows_give_single_step_outputs(runner: ModelRunner) -> None:
    graphs = CudaGraphRunner(runner, batch_sizes=(1, 2, 4, 8))
    tokenizer = Tokenizer.from_model(MODEL)
    vocab = tokenizer.vocab_size
    prompts = [[(37 * i + 11 * j) % (vocab - 10) + 5 for i in range(n)] for j, n in enumerate((9, 120, 33))]
    max_tokens = [37, 50, 21]

    def generate(steps: int | None, asynchronous: bool = True) -> tuple[list[list[int]], list[int]]:
        engine = LLMEngine(config(steps, asynchronous), runner=graphs, tokenizer=tokenizer)
        windows: list[int] = []
        name = "launch_multi_step" if asynchronous else "execute_multi_step"
        inner = getattr(graphs, name)

        def counting(batch: ForwardBatch, n: int, *args: Any) -> Any:
            windows.append(n)
            return inner(batch, n, *args)

        setattr(graphs, name, counting)
        try:
            for i, (p, m) in enumerate(zip(prompts, max_tokens, strict=True)):
                engine.add_request(f"r{i}", p, SamplingParams(temperature=0, max_tokens=m, ignore_eos=True))
            done: dict[str, list[int]] = {}
            while engine.has_unfinished_requests():
                for out in engine.step():
                    if out.finished:
                        done[out.request_id] = out.outputs[0].token_ids
        finally:
            delattr(graphs, name)
        assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
        assert engine.stats().generation_tokens_total == sum(max_tokens)
        return [done[f"r{i}"] for i in range(len(prompts))], windows

    base, no_windows = generate(1, False)
    assert not no_windows
    one, one_step_windows = generate(1, True)  # asynchronous scheduling of one-step windows
    assert one_step_windows and max(one_step_windows) == 1
    assert one == base
    for asynchronous in (False, True):
        multi, windows = generate(8, asynchronous)
        assert windows and max(windows) == 8
        assert multi == base
    auto, auto_windows = generate(None, True)  # num_scheduler_steps auto: the engine's lengths
    assert auto_windows and max(auto_windows) <= 8
    assert auto == base
