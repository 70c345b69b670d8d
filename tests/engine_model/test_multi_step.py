"""Multi-step decoding on the default GGUF (CPU, float32, the real ModelRunner): greedy outputs with
num_scheduler_steps 4 and 8 are token-identical to one step per call (different lengths, stops inside
a window, n > 1, a request added mid-run, prefix-cache hits, a preemption-prone pool), block
accounting returns to all-free, token counters match, and DELTA streams concatenate to the same text.
The runner-level check compares a window with single `execute` steps plus the sampler's argmax."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from engine_model_helpers import BlockPlan, make_batch
from llmdeploy_engine.config import EngineConfig
from llmdeploy_engine.llm_engine import LLMEngine
from llmdeploy_engine.loading.tokenizer import Tokenizer
from llmdeploy_engine.outputs import RequestOutput
from llmdeploy_engine.runner.model_runner import ModelRunner
from llmdeploy_engine.runner.multi_step import step_batch
from llmdeploy_engine.sampling_params import RequestOutputKind, SamplingParams

pytestmark = pytest.mark.slow  # the model is loaded: seconds a test on 2 cores

SHARED = "You are a careful assistant. Answer briefly and precisely. " * 3
PROMPTS = ["Hello, my name is", "The capital of France is", SHARED + "What is 2 + 2?", "def add(a, b):\n"]
MAX_TOKENS = [13, 21, 9, 17]  # none a multiple of 4 or 8


class Recording:
    """The shared session runner, recording each window's length; with num_kv_blocks, seen through a
    smaller block pool (the engine's block manager only hands out the first num_kv_blocks blocks)."""

    def __init__(self, runner: ModelRunner, num_kv_blocks: int | None = None) -> None:
        self.runner = runner
        self.windows: list[int] = []
        self.followed: list[bool] = []
        if num_kv_blocks is not None:
            self.num_kv_blocks = num_kv_blocks
            self.max_model_len = num_kv_blocks * runner.block_size

    def __getattr__(self, name: str) -> Any:
        return getattr(self.runner, name)

    def execute_multi_step(self, batch: Any, num_steps: int, *sampling: Any) -> list[list[int]]:
        self.windows.append(num_steps)
        self.followed.append(False)
        return self.runner.execute_multi_step(batch, num_steps, *sampling)

    def launch_multi_step(self, batch: Any, num_steps: int, *args: Any) -> Any:
        self.windows.append(num_steps)
        self.followed.append(len(args) > 2 and args[2] is not None)
        return self.runner.launch_multi_step(batch, num_steps, *args)


def make_engine(runner: Any, tokenizer: Tokenizer, gguf: Path, steps: int, **kw: Any) -> LLMEngine:
    config = EngineConfig(
        model=str(gguf), device="cpu", max_num_batched_tokens=256, num_scheduler_steps=steps, **kw
    )
    return LLMEngine(config, runner=runner, tokenizer=tokenizer)


def run(
    engine: LLMEngine,
    requests: list[tuple[str, Any, SamplingParams]],
    later: list[tuple[str, Any, SamplingParams]] = (),  # type: ignore[assignment]
    add_later_at: int = 3,
) -> tuple[dict[str, RequestOutput], dict[str, list[RequestOutput]]]:
    for rid, prompt, params in requests:
        engine.add_request(rid, prompt, params)
    final: dict[str, RequestOutput] = {}
    stream: dict[str, list[RequestOutput]] = {}
    n_step = 0
    while engine.has_unfinished_requests() or (n_step <= add_later_at and bool(later)):
        if n_step == add_later_at:
            for rid, prompt, params in later:
                engine.add_request(rid, prompt, params)
        n_step += 1
        for out in engine.step():
            stream.setdefault(out.request_id, []).append(out)
            if out.finished:
                final[out.request_id] = out
    bm = engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks, "KV blocks leaked"
    return final, stream


def summary(final: dict[str, RequestOutput]) -> dict[str, list[tuple[Any, ...]]]:
    return {
        rid: [(c.token_ids, c.text, c.finish_reason, c.stop_reason) for c in out.outputs]
        for rid, out in sorted(final.items())
    }


def greedy(max_tokens: int, **kw: Any) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, **kw)


@pytest.fixture(scope="module")
def reference_text(runner: ModelRunner, tokenizer: Tokenizer, gguf_path: Path) -> list[RequestOutput]:
    engine = make_engine(runner, tokenizer, gguf_path, 1)
    final, _ = run(engine, [(f"r{i}", p, greedy(24, ignore_eos=True)) for i, p in enumerate(PROMPTS)])
    return [final[f"r{i}"] for i in range(len(PROMPTS))]


def test_runner_window_equals_single_steps(runner: ModelRunner) -> None:
    plan = BlockPlan(runner, per_seq_tokens=64, first_block=0)
    prompts = [[1, 504, 3458, 314, 253], [1, 2000, 42, 7, 9, 11, 13, 99, 105]]
    prefill = make_batch(plan, [0, 1], prompts, [0, 0])
    first = runner.execute(prefill).argmax(dim=-1).tolist()
    lengths = [len(p) for p in prompts]
    decode = make_batch(plan, [0, 1], [[t] for t in first], lengths)
    num_steps = 6
    window = runner.execute_multi_step(decode, num_steps)
    caches = [(k.clone(), v.clone()) for k, v in runner.kv_caches]
    # the same steps one at a time (they rewrite the same slots with the same values)
    ids = first
    expected = []
    for k in range(num_steps):
        step = make_batch(plan, [0, 1], [[t] for t in ids], [p + k for p in lengths])
        assert step.slot_mapping == step_batch(decode, k, runner.block_size).slot_mapping
        ids = runner.execute(step).argmax(dim=-1).tolist()
        expected.append(ids)
    assert window == expected
    for (k0, v0), (k1, v1) in zip(caches, runner.kv_caches, strict=True):
        assert torch.equal(k0, k1) and torch.equal(v0, v1)


def test_greedy_windows_are_token_identical(
    runner: ModelRunner, tokenizer: Tokenizer, gguf_path: Path, reference_text: list[RequestOutput]
) -> None:
    ref_ids = [r.outputs[0].token_ids for r in reference_text]
    stop_text = reference_text[1].outputs[0].text
    stop = stop_text[len(stop_text) // 2 : len(stop_text) // 2 + 3]
    assert stop.strip()
    requests = [
        ("len", PROMPTS[0], greedy(MAX_TOKENS[0], ignore_eos=True)),
        ("stop-str", PROMPTS[1], greedy(MAX_TOKENS[1], ignore_eos=True, stop=[stop])),
        ("stop-id", PROMPTS[0], greedy(MAX_TOKENS[1], stop_token_ids=[ref_ids[0][5]])),
        ("n2", PROMPTS[3], greedy(MAX_TOKENS[3], n=2, ignore_eos=True)),
        # the reference continues this with EOS a few tokens later
        ("eos", tokenizer.encode(PROMPTS[2]) + ref_ids[2][:7], greedy(30)),
    ]
    later = [("late", SHARED + "Name a colour.", greedy(11, ignore_eos=True))]
    results = {}
    for steps, asynchronous in ((1, False), (1, True), (4, False), (4, True), (8, True)):
        recording = Recording(runner)
        engine = make_engine(recording, tokenizer, gguf_path, steps, async_scheduling=asynchronous)
        final, _ = run(engine, requests, later)
        assert (max(recording.windows, default=1) == steps) and all(w <= steps for w in recording.windows)
        assert any(recording.followed) == asynchronous
        stats = engine.stats()
        results[steps, asynchronous] = (
            summary(final),
            stats.generation_tokens_total,
            stats.prompt_tokens_total,
        )
        assert final["late"].num_cached_tokens > 0  # a prefix-cache hit on the shared system prompt
    assert results[1, True] == results[1, False]  # one-step windows launched ahead
    assert results[4, False] == results[1, False]
    assert results[4, True] == results[1, False]
    assert results[8, True] == results[1, False]
    got = results[1, False][0]
    assert got["stop-id"][0][3] == ref_ids[0][5] and got["stop-id"][0][0] == ref_ids[0][:6]
    assert got["eos"][0][2] == "stop" and got["eos"][0][3] is None and 2 < len(got["eos"][0][0]) < 30
    assert got["stop-str"][0][2] == "stop" and got["stop-str"][0][3] == stop
    assert got["len"][0][0] == ref_ids[0][: MAX_TOKENS[0]]
    assert results[1, False][1] == sum(len(c[0]) for outs in got.values() for c in outs)


def test_windows_under_a_small_pool(runner: ModelRunner, tokenizer: Tokenizer, gguf_path: Path) -> None:
    pool = Recording(runner, num_kv_blocks=9)  # 144 slots for 4 x (prompt + 40) tokens
    requests = [(f"p{i}", p, greedy(40, ignore_eos=True)) for i, p in enumerate(PROMPTS[:2] + PROMPTS[3:])]
    requests.append(("p3", "Once upon a time", greedy(40, ignore_eos=True)))
    results = []
    for steps in (1, 8):
        engine = make_engine(pool, tokenizer, gguf_path, steps)
        final, _ = run(engine, requests)
        results.append((summary(final), engine.stats().generation_tokens_total))
        assert engine.stats().num_preemptions > 0
    assert results[1] == results[0]
    assert pool.windows and max(pool.windows) == 8


def test_delta_stream_concatenates_to_the_same_text(
    runner: ModelRunner, tokenizer: Tokenizer, gguf_path: Path, reference_text: list[RequestOutput]
) -> None:
    params = greedy(24, ignore_eos=True, output_kind=RequestOutputKind.DELTA)
    engine = make_engine(runner, tokenizer, gguf_path, 8)
    final, stream = run(engine, [("d", PROMPTS[1], params)])
    chunks = stream["d"]
    assert "".join(o.outputs[0].text for o in chunks) == reference_text[1].outputs[0].text
    assert [t for o in chunks for t in o.outputs[0].token_ids] == reference_text[1].outputs[0].token_ids
    assert [len(o.outputs[0].token_ids) for o in chunks] == [1, 8, 8, 7]  # the prefill's token, windows
    assert final["d"].finished


@pytest.mark.parametrize("padding_block", [None, 20])
@pytest.mark.parametrize("max_position", [None, 15])
def test_graph_window_packing_equals_each_steps_packing(
    max_position: int | None, padding_block: int | None
) -> None:
    """The CUDA-graph window layout (built on the CPU): step 0 as a single replay packs it, every later
    step's positions, slots and lengths of the real rows as a single replay of that step would pack
    them, and the gather index sending padding rows row 0's token. Padding rows repeat row 0 or, with
    a padding block, take its positions 0, 1, 2, ... (slots in that block, lengths position + 1). With
    a cap on positions (max_model_len - 1), the first row's steps past it repeat position 15 (slot,
    length)."""
    import numpy as np
    from llmdeploy_engine.runner.graph_inputs import pack_decode_inputs, pack_decode_window, window_size
    from llmdeploy_engine.runner.multi_step import NO_CAP

    cap = NO_CAP if max_position is None else max_position
    bs, b, nb, num_steps = 4, 4, 6, 5
    tables = [[9, 2, 14, 3, 7], [5, 11, 0, 8], [1, 12, 6]]
    positions = [13, 6, 2]  # 13 + 4 = 17: the window's last step is in the fifth block
    batch = make_batch_from_tables(tables, positions, ids=[101, 102, 103], bs=bs)
    out = np.full(window_size(b, nb, num_steps) + 3, -1, dtype=np.int64)
    size = pack_decode_window(out, batch, num_steps, b, nb, bs, cap, padding_block)
    assert size == window_size(b, nb, num_steps) and (out[size:] == -1).all()
    step0 = b * (4 + nb)
    single = np.zeros(step0, dtype=np.int64)
    assert pack_decode_inputs(single, batch, b, nb, padding_block, bs) == step0
    assert (out[:step0] == single).all()
    assert out[step0 : step0 + b].tolist() == [0, 1, 2, 0]
    later = out[step0 + b : size].reshape(num_steps - 1, 3, b)
    for k in range(1, num_steps):
        step = step_batch(batch, k, bs, cap)
        assert step.positions[0] == min(13 + k, cap) and step.context_len[0] == step.positions[0] + 1
        pack_decode_inputs(single, step, b, nb, padding_block, bs)
        expect = single[b : 4 * b].reshape(3, b)
        assert (later[k - 1][:, :3] == expect[:, :3]).all(), k
        if padding_block is None:
            assert (later[k - 1][:, 3] == expect[:, 3]).all(), k
        else:
            assert later[k - 1][:, 3].tolist() == [k, padding_block * bs + k % bs, k + 1], k


def make_batch_from_tables(tables: list[list[int]], positions: list[int], ids: list[int], bs: int) -> Any:
    from llmdeploy_engine.core.forward_batch import ForwardBatch

    n = len(tables)
    return ForwardBatch(
        input_ids=ids,
        positions=positions,
        slot_mapping=[t[p // bs] * bs + p % bs for t, p in zip(tables, positions, strict=True)],
        query_start=list(range(n)),
        query_len=[1] * n,
        context_len=[p + 1 for p in positions],
        block_tables=tables,
        sample_indices=list(range(n)),
    )


# ---- the CUDA-graph runner's window logic, on the CPU ----------------------------------------------


class _Replay:
    """Stands in for a captured CUDA graph: replay() runs the captured forward eagerly on the graph's
    static buffers (the same tensors a real replay reads and writes)."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def replay(self) -> None:
        self.fn()


class _NoEvent:
    def record(self) -> None: ...

    def synchronize(self) -> None: ...


def cpu_graph_runner(runner: ModelRunner, logits_max_batch: int, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A CudaGraphRunner over the CPU runner whose graphs replay eagerly (batch sizes 1, 2, 4, 8;
    context buckets of 8, 16, 32 blocks); everything else is the class's own code."""
    from llmdeploy_engine.runner import cuda_graph_runner as cgr
    from llmdeploy_engine.runner.graph_windows import GraphWindows

    class CpuGraphWindows(GraphWindows):
        def _window_buffer(self, size: int) -> Any:  # unpinned: no CUDA here
            if self._window_host.numel() < size:
                self._window_host = torch.zeros(size, dtype=torch.long)
            return self._window_host.numpy()

    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: None)
    g_runner = object.__new__(cgr.CudaGraphRunner)
    g_runner.runner = runner
    g_runner.multi_token_rows = True  # the CPU path has no fused decode: every shape replays
    g_runner.block_size = runner.block_size
    g_runner.padding_block = runner.padding_block  # as __init__ takes it (None on the CPU)
    g_runner.block_buckets = (8, 16, 32)
    g_runner.batch_sizes = (1, 2, 4, 8)
    g_runner.logits_max_batch = logits_max_batch
    g_runner.graphs = {}
    g_runner.num_replays = 0
    g_runner._host = torch.zeros(8 * (4 + 32), dtype=torch.long)
    g_runner._host_np = g_runner._host.numpy()
    g_runner._copied = _NoEvent()
    windows = object.__new__(CpuGraphWindows)
    windows.graphs = g_runner
    windows.block_size = runner.block_size
    windows._window_host = torch.zeros(0, dtype=torch.long)
    windows._window_dev = None
    windows._window_copied = _NoEvent()  # type: ignore[assignment]
    windows._packed = None
    g_runner.windows = windows
    vocab = runner.model_config.vocab_size
    g_runner._logits = torch.zeros(min(logits_max_batch, 8), vocab)
    for b in g_runner.batch_sizes:
        for nb in g_runner.block_buckets:
            g = cgr._DecodeGraph(b, nb, runner.block_size, runner.device, one_token_per_seq=False)
            g.hidden = torch.zeros(b, runner.model_config.hidden_size)
            if b <= logits_max_batch:
                g.logits = g_runner._logits[:b]

            def forward(g: Any = g) -> None:
                with torch.inference_mode():
                    g.hidden.copy_(runner.model(g.ids, g.positions, g.meta(), runner.kv_caches))
                    if g.logits is not None:
                        g.logits.copy_(runner.model.compute_logits(g.hidden))

            g.graph = _Replay(forward)
            g_runner.graphs[(b, nb)] = g
    return g_runner


@pytest.mark.parametrize("logits_max_batch", [8, 2])  # logits inside the "graph" / computed after it
def test_graph_runner_window_logic_on_cpu(
    runner: ModelRunner, logits_max_batch: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CudaGraphRunner.execute_multi_step with eager stand-in graphs: the window replays one graph
    picked for its last step's context (here crossing from the 8- to the 16-block bucket), feeds
    padding rows row 0's token, and gives the tokens of single graph replays and of the eager window;
    a sequence outside the batch keeps its KV."""
    graphs = cpu_graph_runner(runner, logits_max_batch, monkeypatch)
    plan = BlockPlan(runner, per_seq_tokens=160, first_block=0)
    lengths = [5, 30, 125, 60]  # 125 + 6 steps crosses 128 tokens = 8 blocks of 16
    prompts = [[(97 * i + 13 * j) % 4000 + 50 for i in range(n)] for j, n in enumerate(lengths)]
    first = runner.execute(make_batch(plan, [0, 1, 2, 3], prompts, [0] * 4)).argmax(-1).tolist()
    active = [0, 1, 2]  # three sequences: padded to the 4-row graph
    num_steps = 6
    decode = make_batch(plan, active, [[first[i]] for i in active], [lengths[i] for i in active])
    idle = plan.table(3)
    before = [(k[idle].clone(), v[idle].clone()) for k, v in runner.kv_caches]
    window = graphs.execute_multi_step(decode, num_steps)
    assert graphs.num_replays == num_steps
    for (k, v), (k0, v0) in zip(runner.kv_caches, before, strict=True):
        assert torch.equal(k[idle], k0) and torch.equal(v[idle], v0)
    ids = [first[i] for i in active]
    single = []
    for k in range(num_steps):
        step = make_batch(plan, active, [[t] for t in ids], [lengths[i] + k for i in active])
        ids = graphs.execute(step).argmax(-1).tolist()
        single.append(ids)
    assert graphs.num_replays == 2 * num_steps
    assert window == single
    assert runner.execute_multi_step(decode, num_steps) == single
    params = [
        SamplingParams(temperature=0.9, top_p=0.9),
        SamplingParams(temperature=0),
        SamplingParams(temperature=1.5),
    ]
    drawn = graphs.execute_multi_step(decode, num_steps, params, 99)
    assert drawn == runner.execute_multi_step(decode, num_steps, params, 99)
    assert [row[1] for row in drawn] == [row[1] for row in single]
    assert [row[2] for row in drawn] != [row[2] for row in single]  # temperature 1.5: it sampled
    # asynchronous windows: 2 steps, then 4 more launched before the first two are read, their rows
    # in another order (row 3 of the 4-row graph pads), fed the first window's last ids on the device
    first_window = graphs.launch_multi_step(decode, 2)
    order = [2, 0, 1]
    follow = make_batch(plan, [active[i] for i in order], [[-1]] * 3, [lengths[active[i]] + 2 for i in order])
    second = graphs.launch_multi_step(follow, 4, follow=first_window, follow_rows=order)
    assert first_window.result() == single[:2]
    assert second.result() == [[row[i] for i in order] for row in single[2:]]
    eager_first = runner.launch_multi_step(decode, 2)
    eager_second = runner.launch_multi_step(follow, 4, follow=eager_first, follow_rows=order)
    assert eager_second.result() == second.result()


# ---- sampling inside a window ----------------------------------------------------------------------

CHI2_DF5_P001 = 20.515  # chi-square critical value, 5 degrees of freedom, significance 0.001


def test_window_sampler_draws_from_the_samplers_distribution() -> None:
    from llmdeploy_engine.model.sampler import Sampler, WindowSampler

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 6, generator=gen) * 2
    params = [
        SamplingParams(temperature=0.7),
        SamplingParams(temperature=1.3, top_k=4),
        SamplingParams(temperature=1.0, top_p=0.8, min_p=0.05),
        SamplingParams(temperature=0),
    ]
    want = Sampler(set()).processed_probs(logits, params, [[]] * 4, [[]] * 4).double()
    sampler = WindowSampler(params, 6, torch.device("cpu"), seed=7)
    trials = 20_000
    counts = torch.zeros(4, 6, dtype=torch.float64)
    out = torch.empty(4, dtype=torch.long)
    for _ in range(trials):
        sampler.sample(logits, out)
        counts[torch.arange(4), out] += 1
    assert counts[3, int(logits[3].argmax())] == trials  # the greedy row
    for row in range(3):
        support = want[row] > 0
        assert (counts[row][~support] == 0).all(), "drew a filtered token"
        expected = want[row][support] * trials
        chi2 = float(((counts[row][support] - expected) ** 2 / expected).sum())
        assert chi2 < CHI2_DF5_P001, (row, chi2)
    # the same seed gives the same draws (every tensor-parallel rank gets the window's seed)
    a, b = WindowSampler(params, 6, torch.device("cpu"), 3), WindowSampler(params, 6, torch.device("cpu"), 3)
    draws = []
    for s in (a, b):
        rows = []
        for _ in range(20):
            s.sample(logits, out)
            rows.append(out.tolist())
        draws.append(rows)
    assert draws[0] == draws[1]


def test_sampled_and_greedy_requests_share_windows(
    runner: ModelRunner, tokenizer: Tokenizer, gguf_path: Path, reference_text: list[RequestOutput]
) -> None:
    sampled = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=24, ignore_eos=True)
    requests = [("g", PROMPTS[1], greedy(24, ignore_eos=True)), ("s", PROMPTS[0], sampled)]
    runs = []
    for _ in range(2):
        torch.manual_seed(11)
        recording = Recording(runner)
        engine = make_engine(recording, tokenizer, gguf_path, 8)
        final, _ = run(engine, requests)
        assert recording.windows and max(recording.windows) == 8
        runs.append(summary(final))
    # the greedy row is unchanged by sharing windows with a sampled one
    assert runs[0]["g"][0][0] == reference_text[1].outputs[0].token_ids
    s = runs[0]["s"][0]
    assert len(s[0]) == 24 and s[2] == "length"
    assert s[0] != reference_text[0].outputs[0].token_ids  # it sampled (greedy would repeat the reference)
    assert runs[1] == runs[0]  # the window seeds come from torch's seeded generator
