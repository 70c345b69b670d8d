"""Multi-step decoding (num_scheduler_steps > 1) over the fake paged runner: the scheduler's window
reservation and the engine's per-token path after a window give exactly the outputs, metrics and
block accounting of one step per call, with asynchronous scheduling (the next window launched
before the last one's tokens are processed, its first inputs taken from the last one's ids) and
without. The fake runner checks every KV read through the block tables, so a wrong slot, a missing
reservation or garbage KV read back fails here; it runs a window when it is launched, as a device
runs it before anything launched later."""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest
from core_fakes import FakeRunner, FakeSampler, FakeTokenizer, check_invariants, mixing_rule, successor_rule
from llmdeploy_engine.config import EngineConfig
from llmdeploy_engine.core.block_manager import BlockManager
from llmdeploy_engine.core.forward_batch import ForwardBatch
from llmdeploy_engine.core.scheduler import Scheduler, SchedulerConfig
from llmdeploy_engine.core.sequence import Sequence
from llmdeploy_engine.core.window_sizing import ARRIVAL_WINDOW_STEPS, AUTO_MAX_WINDOW_STEPS
from llmdeploy_engine.llm_engine import LLMEngine
from llmdeploy_engine.outputs import RequestOutput
from llmdeploy_engine.runner.multi_step import check_decode_window, check_follow_rows, step_batch
from llmdeploy_engine.sampling_params import RequestOutputKind, SamplingParams


class FakeWindow:
    """What the fake runner's launch returns: the ids, already there (DecodeWindow's interface)."""

    def __init__(self, sampled: list[list[int]]) -> None:
        self.sampled = np.array(sampled, dtype=np.int64)
        self.num_steps = len(sampled)

    @property
    def last_ids(self) -> np.ndarray:
        return self.sampled[-1]

    def result(self) -> list[list[int]]:
        return self.sampled.tolist()  # type: ignore[no-any-return]


class MultiStepFakeRunner(FakeRunner):
    """FakeRunner plus a decode window: each step through `execute` (checked KV reads), fed the
    previous step's argmax; records every window's length and whether it followed another."""

    def __init__(self, **kw):  # type: ignore[no-untyped-def]
        super().__init__(**kw)
        self.windows: list[int] = []
        self.followed: list[bool] = []

    def launch_multi_step(  # type: ignore[no-untyped-def]
        self, batch: ForwardBatch, num_steps: int, params=None, seed=None, follow=None, follow_rows=None
    ) -> FakeWindow:
        cap = self.max_model_len - 1  # as the real runners: positions stop at the longest context
        check_decode_window(batch, num_steps, self.block_size, cap)
        check_follow_rows(follow, follow_rows, batch.num_seqs)
        self.windows.append(num_steps)
        self.followed.append(follow is not None)
        if follow is None:
            ids = list(batch.input_ids)
        else:
            assert batch.input_ids == [-1] * batch.num_seqs, "a follow-on's ids are not known on the host"
            ids = [int(follow.last_ids[r]) for r in follow_rows]
        sampled = []
        for k in range(num_steps):
            step = step_batch(batch, k, self.block_size, cap)
            rows = self.execute(ForwardBatch(**{**vars(step), "input_ids": ids}))
            ids = [max(range(len(r)), key=r.__getitem__) for r in rows]
            sampled.append(ids)
        return FakeWindow(sampled)

    def execute_multi_step(self, batch: ForwardBatch, num_steps: int) -> list[list[int]]:
        return self.launch_multi_step(batch, num_steps).result()


def engine(steps: int, rule=mixing_rule, **kw) -> tuple[LLMEngine, MultiStepFakeRunner]:  # type: ignore[no-untyped-def]
    runner_kw = ("num_kv_blocks", "block_size", "max_model_len")
    cfg_kw = {k: kw.pop(k) for k in list(kw) if k in EngineConfig.__dataclass_fields__ and k not in runner_kw}
    runner = MultiStepFakeRunner(rule=rule, **kw)
    cfg = EngineConfig(model="fake", num_scheduler_steps=steps, **cfg_kw)
    return LLMEngine(cfg, runner=runner, tokenizer=FakeTokenizer(), sampler=FakeSampler()), runner


def run_all(
    eng: LLMEngine, add_at: dict[int, list[tuple[str, list[int], SamplingParams]]] | None = None
) -> tuple[dict[str, RequestOutput], dict[str, list[RequestOutput]]]:
    final: dict[str, RequestOutput] = {}
    stream: dict[str, list[RequestOutput]] = {}
    live = lambda: [s for s in (*eng.scheduler.running, *eng.scheduler.waiting)]  # noqa: E731
    for n_step in range(10_000):
        for rid, prompt, params in (add_at or {}).get(n_step, []):
            eng.add_request(rid, prompt, params)
        if not eng.has_unfinished_requests() and n_step > max(add_at or {0: None}):
            break
        for out in eng.step():
            stream.setdefault(out.request_id, []).append(out)
            if out.finished:
                final[out.request_id] = out
        check_invariants(eng.block_manager, live())
    assert not eng.has_unfinished_requests()
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks
    return final, stream


def outputs(final: dict[str, RequestOutput]) -> dict[str, list[tuple[list[int], str, str | None]]]:
    return {
        rid: [(c.token_ids, c.text, c.finish_reason) for c in out.outputs]
        for rid, out in sorted(final.items())
    }


def compare(requests: list[tuple[str, list[int], SamplingParams]], steps=(1, 4, 8), **kw) -> list[int]:  # type: ignore[no-untyped-def]
    """Run the requests with one step per call and with each window size, with asynchronous
    scheduling and without (1 step with it: windows of one step launched ahead); returns the window
    lengths the last (asynchronous) run used."""
    ref_eng, runner = engine(1, async_scheduling=False, **kw)
    ref_final, _ = run_all(ref_eng, {0: requests})
    assert not runner.windows
    ref_stats = ref_eng.stats()
    windows: list[int] = []
    for n, asynchronous in itertools.product(steps, (False, True)):
        if n == 1 and not asynchronous:
            continue  # the reference
        eng, runner = engine(n, async_scheduling=asynchronous, **kw)
        final, _ = run_all(eng, {0: requests})
        assert outputs(final) == outputs(ref_final), f"num_scheduler_steps={n}, async {asynchronous}"
        if not asynchronous or len(runner.windows) < 2:
            assert not any(runner.followed)
        stats = eng.stats()
        assert stats.generation_tokens_total == ref_stats.generation_tokens_total
        assert stats.prompt_tokens_total == ref_stats.prompt_tokens_total
        assert stats.num_requests_finished == ref_stats.num_requests_finished
        windows = runner.windows
        # a synchronous engine runs a one-step window as an ordinary step
        assert all((1 if asynchronous else 2) <= w <= n for w in windows)
    return windows


def greedy(**kw) -> SamplingParams:  # type: ignore[no-untyped-def]
    return SamplingParams(temperature=0, **kw)


def test_windows_give_the_tokens_of_single_steps() -> None:
    prompts = [[(7 * i + j) % 29 + 1 for j in range(3 + 4 * i)] for i in range(8)]
    reqs = [(str(i), p, greedy(max_tokens=5 + 3 * i, ignore_eos=True)) for i, p in enumerate(prompts)]
    windows = compare(reqs, max_num_batched_tokens=40, num_kv_blocks=64)
    assert windows and max(windows) == 8


def test_max_tokens_not_a_multiple_of_the_window() -> None:
    eng, runner = engine(8)
    eng.add_request("r", [1, 2, 3], greedy(max_tokens=13, ignore_eos=True))
    final, _ = run_all(eng)
    assert len(final["r"].outputs[0].token_ids) == 13
    # the prefill step samples token 1; then windows of 8 and 4 (cut to what is left)
    assert runner.windows == [8, 4]


def test_stops_inside_a_window() -> None:
    reqs = [
        ("eos", [24], greedy(max_tokens=20)),  # "x" -> "yz ab\n" then EOS
        ("ids", [1], greedy(max_tokens=20, stop_token_ids=[7])),
        ("str", [1], greedy(max_tokens=20, stop=["fgh"])),
        ("str-in", [1], greedy(max_tokens=20, stop="ij", include_stop_str_in_output=True)),
        ("len", [3], greedy(max_tokens=11, ignore_eos=True)),
    ]
    compare(reqs, rule=successor_rule)
    eng, _ = engine(8, rule=successor_rule)
    final, _ = run_all(eng, {0: reqs})
    assert final["ids"].outputs[0].token_ids == [2, 3, 4, 5, 6, 7]
    assert final["ids"].outputs[0].stop_reason == 7
    assert final["str"].outputs[0].text == "bcde"
    assert final["eos"].outputs[0].finish_reason == "stop"


def test_n_outputs_prefix_cache_and_a_request_added_mid_run() -> None:
    shared = [(5 * j) % 29 + 1 for j in range(13)]
    first = [("a", [*shared, 3], greedy(max_tokens=17, n=3, ignore_eos=True))]
    later = [("b", [*shared, 4, 5], greedy(max_tokens=9, ignore_eos=True))]
    results = []
    for n in (1, 4, 8):
        eng, _ = engine(n, num_kv_blocks=64)
        final, _ = run_all(eng, {0: first, 5: later})
        results.append((outputs(final), eng.stats()))
    for got, stats in results[1:]:
        assert got == results[0][0]
        assert stats.prefix_cache_hits_tokens == results[0][1].prefix_cache_hits_tokens > 0
        assert stats.generation_tokens_total == results[0][1].generation_tokens_total == 3 * 17 + 9


def test_small_pool_with_preemption() -> None:
    prompts = [[(3 * i + j) % 29 + 1 for j in range(10)] for i in range(4)]
    reqs = [(str(i), p, greedy(max_tokens=20, ignore_eos=True)) for i, p in enumerate(prompts)]
    compare(reqs, num_kv_blocks=16, block_size=4, max_model_len=32)


def test_windows_stop_at_max_model_len() -> None:
    eng, runner = engine(8, max_model_len=20)
    eng.add_request("r", [1] * 6, greedy(max_tokens=None, ignore_eos=True))
    final, _ = run_all(eng)
    assert len(final["r"].outputs[0].token_ids) == 14 and final["r"].outputs[0].finish_reason == "length"
    assert sum(runner.windows) == 13


def test_a_sequence_at_max_model_len_does_not_shorten_the_others_window() -> None:
    """ "a" fills the context (max_model_len 40) three tokens into the second window while "b" runs on:
    the window stays 8 long ("a"'s later steps repeat its last position), outputs as single steps."""
    reqs = [
        ("a", [(3 * j) % 29 + 1 for j in range(28)], greedy(max_tokens=None, ignore_eos=True)),
        ("b", [2, 4, 6], greedy(max_tokens=30, ignore_eos=True)),
    ]
    windows = compare(reqs, steps=(8,), max_model_len=40, num_kv_blocks=64)
    # prefill samples each one's first token; b's other 29 come in windows of 8, 8, 8, 5
    assert windows == [8, 8, 8, 5]


def test_delta_stream_concatenates_and_final_only_has_one_output() -> None:
    reqs = [
        ("d", [1], greedy(max_tokens=20, output_kind=RequestOutputKind.DELTA, stop="pq")),
        ("f", [2], greedy(max_tokens=20, output_kind=RequestOutputKind.FINAL_ONLY, ignore_eos=True)),
    ]
    ref, _ = run_all(engine(1, rule=successor_rule)[0], {0: reqs})
    ref_stream = run_all(engine(1, rule=successor_rule)[0], {0: reqs})[1]
    _, stream = run_all(engine(8, rule=successor_rule)[0], {0: reqs})
    text = "".join(o.outputs[0].text for o in stream["d"])
    assert text == "".join(o.outputs[0].text for o in ref_stream["d"]) == "bcdefghijklmno"
    tokens = list(itertools.chain.from_iterable(o.outputs[0].token_ids for o in stream["d"]))
    assert tokens == ref["d"].outputs[0].token_ids or tokens == list(range(2, 18))
    assert len(stream["d"]) < len(ref_stream["d"])  # several tokens per output
    assert len(stream["f"]) == 1 and stream["f"][0].finished


def test_sampled_logprob_and_min_tokens_requests_run_single_steps() -> None:
    for params in (
        SamplingParams(temperature=0.8, max_tokens=6, seed=3),
        greedy(max_tokens=6, logprobs=1),
        greedy(max_tokens=6, repetition_penalty=1.2),
    ):
        eng, runner = engine(8)
        eng.add_request("r", [1, 2], params)
        run_all(eng)
        assert runner.windows == []
    eng, runner = engine(8)
    eng.add_request("r", [1, 2], greedy(max_tokens=12, min_tokens=5, ignore_eos=True))
    run_all(eng)
    assert runner.windows and sum(runner.windows) <= 12 - 5  # windows start once min_tokens is met


def test_runner_without_the_method_and_speculation_fall_back() -> None:
    cfg = EngineConfig(model="fake", num_scheduler_steps=4)
    eng = LLMEngine(cfg, runner=FakeRunner(), tokenizer=FakeTokenizer(), sampler=FakeSampler())
    assert eng.num_scheduler_steps == 1
    eng.add_request("r", [1], greedy(max_tokens=5))
    assert run_all(eng)[0]["r"].outputs[0].finish_reason == "length"


@pytest.mark.parametrize("bad", [0, -2, 1.5, True])
def test_num_scheduler_steps_is_validated(bad: object) -> None:
    with pytest.raises(ValueError, match="num_scheduler_steps must be a whole number >= 1"):
        EngineConfig(model="fake", num_scheduler_steps=bad)  # type: ignore[arg-type]


# ---- scheduler alone ------------------------------------------------------------------------------


def _decode_ready(sched: Scheduler, prompt_len: int) -> Sequence:
    seq = Sequence("r", list(range(1, prompt_len + 1)), greedy(max_tokens=100))
    sched.add(seq)
    out = sched.schedule()
    sched.update_computed(out)
    seq.append_token(5)
    return seq


def test_window_is_cut_to_the_free_blocks_and_never_preempts() -> None:
    bm = BlockManager(num_blocks=3, block_size=4, enable_prefix_caching=False)
    sched = Scheduler(SchedulerConfig(8, 64, 64), bm)
    seq = _decode_ready(sched, 7)  # 7 computed, token 8 to feed: 2 blocks held, 1 free
    out, steps = sched.reserve_decode_window(sched.schedule(), 8)
    assert steps == 5 and len(seq.block_table) == 3  # slots for positions 7..11 fill the last block
    assert out.batch.block_tables == [seq.block_table]
    assert sched.num_preemptions == 0


def test_no_window_when_a_waiting_request_is_due_to_join() -> None:
    """A request waits with a slot free and is due at the next step (admission_interval 2, one
    decode step since the last admission): that step runs alone, no window."""
    bm = BlockManager(num_blocks=16, block_size=4)
    sched = Scheduler(SchedulerConfig(2, 64, 64, admission_interval=2), bm)
    _decode_ready(sched, 5)
    sched.add(Sequence("w", [1, 2, 3], greedy()))
    out = sched.schedule()
    assert len(out.scheduled) == 1 and len(sched.waiting) == 1 and sched.admission_due()
    assert sched.reserve_decode_window(out, 8) == (out, 0)


def test_window_while_requests_wait_with_every_slot_taken() -> None:
    """max_num_seqs 1: the waiting request cannot join before the running one ends, so the decode
    window runs (before v15 nothing ran as a window while anything waited)."""
    bm = BlockManager(num_blocks=16, block_size=4)
    sched = Scheduler(SchedulerConfig(1, 64, 64), bm)
    _decode_ready(sched, 5)
    sched.add(Sequence("w", [1, 2, 3], greedy()))
    out = sched.schedule()
    assert len(out.scheduled) == 1 and len(sched.waiting) == 1
    assert sched.reserve_decode_window(out, 8)[1] == 8


def test_admission_interval_lets_requests_join_every_n_steps() -> None:
    """admission_interval 4: a request that arrives while another decodes joins at the 4th step
    after the last admission; the decode windows before it end by that step."""
    bm = BlockManager(num_blocks=64, block_size=4)
    sched = Scheduler(SchedulerConfig(8, 64, 64, admission_interval=4), bm)
    first = _decode_ready(sched, 5)  # its prompt joined at step 0 (an admission)
    sched.add(Sequence("w", [1, 2, 3], greedy()))
    joined_at = None
    for step in range(1, 8):
        out = sched.schedule()
        if any(e.seq.request_id == "w" for e in out.scheduled):
            joined_at = step
            break
        assert [e.seq for e in out.scheduled] == [first]
        sched.update_computed(out)
        first.append_token(7)
    assert joined_at == 4
    # with windows: the first step after an admission may run a window of at most 3 steps
    sched2 = Scheduler(
        SchedulerConfig(8, 64, 64, admission_interval=4), BlockManager(num_blocks=64, block_size=4)
    )
    _decode_ready(sched2, 5)
    sched2.add(Sequence("w", [1, 2, 3], greedy()))
    out, steps = sched2.reserve_decode_window(sched2.schedule(), 8)
    assert steps == 3 and len(sched2.waiting) == 1
    assert sched2.admission_due()  # the next scheduled step admits it


def test_admission_interval_one_admits_every_step() -> None:
    bm = BlockManager(num_blocks=64, block_size=4)
    sched = Scheduler(SchedulerConfig(8, 64, 64), bm)
    first = _decode_ready(sched, 5)
    sched.add(Sequence("w", [1, 2, 3], greedy()))
    out = sched.schedule()
    assert {e.seq.request_id for e in out.scheduled} == {first.request_id, "w"}


@pytest.mark.parametrize("kind", [RequestOutputKind.CUMULATIVE, RequestOutputKind.FINAL_ONLY])
def test_blocks_filled_inside_a_window_are_registered_for_later_hits(kind: RequestOutputKind) -> None:
    """(FINAL_ONLY: through the one-call path of StopChecker.on_window_tokens.)"""
    prompt = [(5 * j) % 29 + 1 for j in range(6)]
    hits = []
    for n in (1, 8):
        eng, _ = engine(n, num_kv_blocks=64)
        eng.add_request("a", prompt, greedy(max_tokens=17, ignore_eos=True, output_kind=kind))
        first = run_all(eng)[0]["a"].outputs[0].token_ids
        eng.add_request("b", prompt + first, greedy(max_tokens=3, ignore_eos=True))
        run_all(eng)
        hits.append(eng.stats().prefix_cache_hits_tokens)
    # 6 + 17 tokens, the last one never computed: 22 computed, 5 full blocks of 4
    assert hits == [20, 20]


class SamplingFakeRunner(MultiStepFakeRunner):
    """A runner that declares on-device sampling: records what each window was given (the fake
    'samples' by argmax, so the tokens stay those of the greedy rule)."""

    multi_step_sampling = True

    def __init__(self, **kw):  # type: ignore[no-untyped-def]
        super().__init__(**kw)
        self.given: list[tuple[list[float], int | None]] = []

    def launch_multi_step(self, batch, num_steps, params=None, seed=None, follow=None, follow_rows=None):  # type: ignore[no-untyped-def]
        self.given.append(([p.temperature for p in params] if params else [], seed))
        return super().launch_multi_step(batch, num_steps, None, None, follow, follow_rows)

    def execute_multi_step(self, batch, num_steps, params=None, seed=None):  # type: ignore[no-untyped-def]
        return self.launch_multi_step(batch, num_steps, params, seed).result()


def test_unseeded_sampling_runs_windows_only_on_runners_that_sample() -> None:
    sampled = SamplingParams(temperature=0.7, top_p=0.9, max_tokens=12, ignore_eos=True)
    eng, runner = engine(4)  # argmax-only runner: sampled requests run single steps
    eng.add_request("s", [1, 2], sampled)
    run_all(eng)
    assert runner.windows == []

    fake = SamplingFakeRunner()
    eng = LLMEngine(
        EngineConfig(model="fake", num_scheduler_steps=4),
        runner=fake,
        tokenizer=FakeTokenizer(),
        sampler=SeededFakeSampler(),
    )
    eng.add_request("s", [1, 2], sampled)
    eng.add_request("g", [3, 4], greedy(max_tokens=12, ignore_eos=True))
    eng.add_request("seeded", [5], SamplingParams(temperature=0.7, max_tokens=3, seed=1, ignore_eos=True))
    run_all(eng)
    # windows only after the seeded request finished; each got every row's params and a seed
    assert fake.windows and all(temps == [0.7, 0.0] and seed == 42 for temps, seed in fake.given)
    # all-greedy windows pass no params or seed
    fake = SamplingFakeRunner()
    eng = LLMEngine(
        EngineConfig(model="fake", num_scheduler_steps=4),
        runner=fake,
        tokenizer=FakeTokenizer(),
        sampler=FakeSampler(),
    )
    eng.add_request("g", [3, 4], greedy(max_tokens=12, ignore_eos=True))
    run_all(eng)
    assert fake.windows and fake.given == [([], None)] * len(fake.windows)


class SeededFakeSampler(FakeSampler):
    def window_seed(self) -> int:
        return 42


def test_num_scheduler_steps_flag() -> None:
    from llmdeploy_engine.cli_args import build_parser, config_from_args

    parser = build_parser()
    args = parser.parse_args(["serve", "--model", "m.gguf", "--num-scheduler-steps", "8"])
    assert config_from_args(args, parser).num_scheduler_steps == 8
    args = parser.parse_args(["serve", "--model", "m.gguf"])
    assert config_from_args(args, parser).num_scheduler_steps is None  # auto: the engine chooses
    assert config_from_args(args, parser).async_scheduling is None  # auto: on with N > 1 or on CUDA
    args = parser.parse_args(["serve", "--model", "m.gguf", "--num-scheduler-steps", "AUTO"])
    assert config_from_args(args, parser).num_scheduler_steps is None
    args = parser.parse_args(["serve", "--model", "m.gguf", "--async-scheduling"])
    assert config_from_args(args, parser).async_scheduling is True
    args = parser.parse_args(["serve", "--model", "m.gguf", "--no-async-scheduling"])
    assert config_from_args(args, parser).async_scheduling is False
    with pytest.raises(ValueError, match="async_scheduling must be"):
        EngineConfig(model="m", async_scheduling="yes")  # type: ignore[arg-type]
    for bad in ("0", "often", "1.5"):
        with pytest.raises(SystemExit):
            parser.parse_args(["serve", "--model", "m.gguf", "--num-scheduler-steps", bad])


def test_admission_interval_flag() -> None:
    from llmdeploy_engine.cli_args import build_parser, config_from_args

    parser = build_parser()
    args = parser.parse_args(["serve", "--model", "m.gguf"])
    assert config_from_args(args, parser).admission_interval == 1
    args = parser.parse_args(["serve", "--model", "m.gguf", "--admission-interval", "8"])
    assert config_from_args(args, parser).admission_interval == 8
    for bad in ("0", "-2", "often"):
        with pytest.raises(SystemExit):
            parser.parse_args(["serve", "--model", "m.gguf", "--admission-interval", bad])
    for bad_value in (0, True, 2.0):
        with pytest.raises(ValueError, match="admission_interval must be"):
            EngineConfig(model="m", admission_interval=bad_value)  # type: ignore[arg-type]


def test_final_only_windows_take_each_sequences_tokens_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """FINAL_ONLY requests without stop strings go through StopChecker.on_window_tokens (a window's
    tokens per sequence in one call): the same outputs, stop reasons, counters and registered
    blocks as one step per call, for EOS, stop token ids (kept with include_stop_str_in_output),
    max_tokens, max_model_len, prefix-cache hits and preemption in a small pool."""
    from llmdeploy_engine.core.stop_checker import StopChecker

    calls = []
    original = StopChecker.on_window_tokens

    def counted(self, tokens, num_output_tokens, num_tokens):  # type: ignore[no-untyped-def]
        calls.append(len(tokens))
        return original(self, tokens, num_output_tokens, num_tokens)

    monkeypatch.setattr(StopChecker, "on_window_tokens", counted)
    final = RequestOutputKind.FINAL_ONLY
    reqs = [
        ("eos", [24], greedy(max_tokens=20, output_kind=final)),  # "x" -> "yz ab\n" then EOS
        ("ids", [1], greedy(max_tokens=20, stop_token_ids=[7], output_kind=final)),
        (
            "ids-in",
            [1],
            greedy(max_tokens=20, stop_token_ids=[5], include_stop_str_in_output=True, output_kind=final),
        ),
        ("len", [3], greedy(max_tokens=11, ignore_eos=True, output_kind=final)),
        ("ctx", [2] * 20, greedy(max_tokens=None, ignore_eos=True, output_kind=final)),
        ("same", [24], greedy(max_tokens=20, output_kind=final)),  # a prefix hit on "eos"'s blocks
    ]
    compare(reqs, rule=successor_rule, max_model_len=40, num_kv_blocks=64, block_size=4)
    assert calls and max(calls) == 8
    prompts = [[(3 * i + j) % 29 + 1 for j in range(10)] for i in range(4)]
    small = [
        (str(i), p, greedy(max_tokens=20, ignore_eos=True, output_kind=final)) for i, p in enumerate(prompts)
    ]
    compare(small, num_kv_blocks=16, block_size=4, max_model_len=32)
    eng, _ = engine(8, rule=successor_rule)
    done, _ = run_all(eng, {0: reqs[:3]})
    assert done["ids"].outputs[0].token_ids == [2, 3, 4, 5, 6, 7] and done["ids"].outputs[0].stop_reason == 7
    assert done["ids-in"].outputs[0].token_ids == [2, 3, 4, 5] and done["ids-in"].outputs[0].stop_reason == 5
    assert done["eos"].outputs[0].finish_reason == "stop"


# ---- asynchronous scheduling ----------------------------------------------------------------------


def test_async_windows_follow_each_other_to_the_last_token() -> None:
    """After the prefill each window is launched before the last one's tokens are processed and
    takes its first inputs from it; the follow-on may be one step long (a synchronous engine runs
    that last token as a single step)."""
    req = [("r", [1, 2, 3], greedy(max_tokens=30, ignore_eos=True))]
    ref, _ = run_all(engine(1)[0], {0: req})
    eng, runner = engine(4)
    final, _ = run_all(eng, {0: req})
    assert outputs(final) == outputs(ref)
    assert runner.windows == [4] * 7 + [1]
    assert runner.followed == [False] + [True] * 7
    eng, runner = engine(4, async_scheduling=False)
    run_all(eng, {0: req})
    assert runner.windows == [4] * 7 and not any(runner.followed)


def test_async_scheduling_with_one_step_windows() -> None:
    """num_scheduler_steps 1 with async_scheduling on: every decode step is a one-step window launched
    before the last one's token is processed (the host's work overlaps the device), with the tokens
    of ordinary steps. Auto (None) turns it on for a CUDA runner only; a runner that cannot launch
    windows falls back to ordinary steps."""
    req = [("r", [1, 2, 3], greedy(max_tokens=12, ignore_eos=True))]
    ref, _ = run_all(engine(1)[0], {0: req})
    eng, runner = engine(1, async_scheduling=True)
    final, _ = run_all(eng, {0: req})
    assert outputs(final) == outputs(ref)
    assert runner.windows == [1] * 11 and runner.followed == [False] + [True] * 10
    for auto_or_off in (None, False):  # auto: off on the CPU (the fake runner has no device: CPU)
        eng, runner = engine(1, async_scheduling=auto_or_off)
        run_all(eng, {0: req})
        assert not runner.windows
    eng, _ = engine(4, async_scheduling=None)
    assert eng.window_policy.async_windows
    # auto on a CUDA runner: one-step windows (the attribute is all the policy reads)
    gpu = MultiStepFakeRunner(rule=mixing_rule)
    gpu.device = "cuda:0"  # type: ignore[attr-defined]
    eng = LLMEngine(
        EngineConfig(model="fake", num_scheduler_steps=1),
        runner=gpu,
        tokenizer=FakeTokenizer(),
        sampler=FakeSampler(),
    )
    assert eng.window_policy.async_windows
    final, _ = run_all(eng, {0: req})
    assert outputs(final) == outputs(ref) and gpu.windows == [1] * 11
    plain = LLMEngine(
        EngineConfig(model="fake", async_scheduling=True),
        runner=FakeRunner(rule=mixing_rule),
        tokenizer=FakeTokenizer(),
        sampler=FakeSampler(),
    )
    assert not plain.window_policy.async_windows
    final, _ = run_all(plain, {0: req})
    assert outputs(final) == outputs(ref)


def test_a_sequence_reaching_max_tokens_keeps_the_chain_of_windows() -> None:
    """Sequences that end inside the window in flight (max_tokens) are left out of its follow-on, and
    the others' windows keep following each other (the chain used to break each time one ended: the
    next window then waited for the host). Same tokens as ordinary steps."""
    reqs = [(f"r{i}", [1 + i, 2, 3], greedy(max_tokens=n, ignore_eos=True)) for i, n in enumerate((5, 9, 14))]
    ref, _ = run_all(engine(1)[0], {0: reqs})
    for steps in (1, 4):
        eng, runner = engine(steps, async_scheduling=True)
        final, _ = run_all(eng, {0: reqs})
        assert outputs(final) == outputs(ref)
        assert runner.followed[0] is False and all(runner.followed[1:]), (steps, runner.followed)
        assert sum(runner.windows) == 13  # the longest's 13 decode steps, none run twice


def test_a_request_aborted_with_its_window_in_flight() -> None:
    """Aborting a request whose sequences are in the window in flight frees its blocks at once; the
    window's tokens for it are dropped and the others go on as if it had never run with them."""
    keep = ("keep", [5, 6, 7], greedy(max_tokens=25, ignore_eos=True))
    gone = ("gone", [8, 9], greedy(max_tokens=40, ignore_eos=True, n=2))
    ref, _ = run_all(engine(1)[0], {0: [keep]})
    eng, runner = engine(4)
    eng.add_request(*keep)
    eng.add_request(*gone)
    while eng.windows.inflight is None or len(runner.windows) < 3:
        eng.step()
    assert {e.seq.request_id for e in eng.windows.inflight.out.scheduled} == {"keep", "gone"}
    aborted = eng.abort_request("gone")
    assert aborted is not None and aborted.finished
    final, _ = run_all(eng)
    assert outputs(final) == outputs(ref)
    assert sum(runner.followed) >= 3


def test_follow_on_window_rules() -> None:
    """Scheduler.follow_decode_window: slots after the window in flight, cut to the free blocks, and
    nothing while a request waits or a running sequence is left out."""
    bm = BlockManager(num_blocks=5, block_size=4, enable_prefix_caching=False)
    sched = Scheduler(SchedulerConfig(8, 64, 64), bm)
    seq = _decode_ready(sched, 7)  # 7 computed, token 8 to feed: 2 blocks held
    window, steps = sched.reserve_decode_window(sched.schedule(), 4)  # positions 7..10: 3 blocks
    assert steps == 4 and len(seq.block_table) == 3
    followed = sched.follow_decode_window(window, 4, [0], 12)
    assert followed is not None
    out, steps = followed
    # positions 11.. after the window: the 2 free blocks end at position 19, so 9 of 12 steps fit
    assert steps == 9 and len(seq.block_table) == 5 and sched.num_preemptions == 0
    assert out.batch.positions == [11] and out.batch.context_len == [12] and out.batch.input_ids == [-1]
    assert out.batch.slot_mapping == [seq.block_table[2] * 4 + 3]
    assert out.batch.block_tables == [seq.block_table]
    assert sched.follow_decode_window(window, 4, [], 8) is None
    sched.add(Sequence("w", [1, 2, 3], greedy()))
    assert sched.follow_decode_window(window, 4, [0], 8) is None  # a request waits
    sched = Scheduler(SchedulerConfig(8, 64, 64), BlockManager(num_blocks=16, block_size=4))
    pair = [Sequence(r, [1, 2, 3, 4, 5], greedy(max_tokens=100)) for r in "ab"]
    for seq in pair:
        sched.add(seq)
    sched.update_computed(sched.schedule())  # both prompts in one step
    for seq in pair:
        seq.append_token(5)
    window, steps = sched.reserve_decode_window(sched.schedule(), 4)
    assert steps == 4 and len(window.scheduled) == 2
    assert sched.follow_decode_window(window, 4, [1], 8) is None  # the first sequence left out
    assert sched.follow_decode_window(window, 4, [0, 1], 8) is not None
    # the first sequence left out because the window ends it (it is still running until then)
    followed = sched.follow_decode_window(window, 4, [1], 8, ending=1)
    assert followed is not None and [e.seq for e in followed[0].scheduled] == [pair[1]]


class SlowWindow(FakeWindow):
    """A window whose ids take `seconds` to arrive, as a device busier than the host makes them."""

    def __init__(self, sampled: list[list[int]], seconds: float) -> None:
        super().__init__(sampled)
        self.seconds = seconds

    def result(self) -> list[list[int]]:
        time.sleep(self.seconds)
        return super().result()


def test_auto_window_length_follows_the_wait_for_ids() -> None:
    """num_scheduler_steps auto (the default) on a CUDA runner: windows start at one step and grow
    (to at most 8) while the host waits ~nothing for each window's ids (the fake runner's ids are
    there at launch: a device idle between windows); with ids that take 20 ms (a device with more
    work than the host) they stay at one step. Either way the tokens are one step per call's."""
    req = [("r", [1, 2, 3], greedy(max_tokens=160, ignore_eos=True))]
    ref, _ = run_all(engine(1, max_model_len=256)[0], {0: req})

    def auto_engine(runner: MultiStepFakeRunner) -> LLMEngine:
        runner.device = "cuda:0"  # type: ignore[attr-defined]
        return LLMEngine(
            EngineConfig(model="fake"), runner=runner, tokenizer=FakeTokenizer(), sampler=FakeSampler()
        )

    idle = MultiStepFakeRunner(rule=mixing_rule, max_model_len=256)
    eng = auto_engine(idle)
    assert eng.window_policy.sizer is not None and eng.num_scheduler_steps == AUTO_MAX_WINDOW_STEPS == 8
    final, _ = run_all(eng, {0: req})
    assert outputs(final) == outputs(ref)
    assert idle.windows[:10] == [1] * 10  # the first decision comes after 8 observed windows
    assert max(idle.windows) == 8 and idle.windows == sorted(idle.windows[:-1]) + idle.windows[-1:]
    assert sum(idle.windows) == 159 and eng.num_windows_by_steps[8] >= 10

    class Busy(MultiStepFakeRunner):
        def launch_multi_step(self, *args, **kw):  # type: ignore[no-untyped-def]
            return SlowWindow(super().launch_multi_step(*args, **kw).sampled.tolist(), 0.02)

    busy = Busy(rule=mixing_rule, max_model_len=128)
    short = [("r", [1, 2, 3], greedy(max_tokens=16, ignore_eos=True))]
    final, _ = run_all(auto_engine(busy), {0: short})
    assert outputs(final) == outputs(run_all(engine(1)[0], {0: short})[0])
    assert busy.windows == [1] * 15


def test_auto_windows_stay_short_while_requests_arrive() -> None:
    """Window length auto: once the sizer has grown the windows to 8 steps, a request added while a
    sequence decodes caps them at ARRIVAL_WINDOW_STEPS (it waits for the windows in flight) until
    ARRIVAL_HOLD_S has passed; with every max_num_seqs slot taken (the newcomer cannot join anyway)
    they stay long. The tokens are those of one-step decoding either way."""

    def auto_engine(max_num_seqs: int = 256) -> tuple[LLMEngine, MultiStepFakeRunner]:
        runner = MultiStepFakeRunner(rule=mixing_rule, num_kv_blocks=128, max_model_len=512)
        runner.device = "cuda:0"  # type: ignore[attr-defined]
        cfg = EngineConfig(model="fake", max_num_seqs=max_num_seqs)
        return LLMEngine(cfg, runner=runner, tokenizer=FakeTokenizer(), sampler=FakeSampler()), runner

    first = ("a", [1, 2, 3], greedy(max_tokens=300, ignore_eos=True))
    late = ("b", [4, 5], greedy(max_tokens=60, ignore_eos=True))
    ref, _ = run_all(engine(1, num_kv_blocks=128, max_model_len=512)[0], {0: [first]})
    ref_late, _ = run_all(engine(1, num_kv_blocks=128, max_model_len=512)[0], {0: [late]})
    for max_num_seqs, capped in ((256, True), (1, False)):
        eng, runner = auto_engine(max_num_seqs)
        eng.add_request(*first)
        final: dict[str, RequestOutput] = {}
        while not runner.windows or runner.windows[-1] < AUTO_MAX_WINDOW_STEPS:  # the sizer grows them
            final.update({o.request_id: o for o in eng.step() if o.finished})
        eng.add_request(*late)
        seen = len(runner.windows)
        for _ in range(6):
            final.update({o.request_id: o for o in eng.step() if o.finished})
        after = runner.windows[seen + 1 :]  # the one launched with the arrival's step may be long
        assert after, runner.windows
        if capped:
            assert max(after) <= ARRIVAL_WINDOW_STEPS, runner.windows
        else:
            assert min(after) == AUTO_MAX_WINDOW_STEPS, runner.windows
        eng.window_policy.arrived_while_decoding -= 10.0  # ARRIVAL_HOLD_S later
        seen = len(runner.windows)
        while eng.has_unfinished_requests():
            final.update({o.request_id: o for o in eng.step() if o.finished})
        assert max(runner.windows[seen + 1 :]) == AUTO_MAX_WINDOW_STEPS, runner.windows
        assert outputs(final) == outputs(ref) | outputs(ref_late)


@pytest.mark.parametrize("asynchronous", [False, True])
def test_admission_interval_keeps_every_token(asynchronous: bool) -> None:
    """admission_interval 5: requests that arrive while others decode join at the interval's steps,
    so fewer prefill steps run (two prompts share one), and every request gets the tokens it gets
    when requests join every step, with one-step and with 4-step windows (cut to end there)."""
    reqs = {
        0: [("a", [1, 2, 3], greedy(max_tokens=40, ignore_eos=True))],
        3: [("b", [4, 5], greedy(max_tokens=20, ignore_eos=True))],
        4: [("c", [6, 7, 8, 9], greedy(max_tokens=25, ignore_eos=True))],
        9: [("d", [2, 4], greedy(max_tokens=10, ignore_eos=True))],
    }
    ref, _ = run_all(engine(1)[0], reqs)
    prefill_steps = []
    results = []
    for interval in (1, 5):
        # one-step windows: the requests arriving at steps 3 and 4 join apart, or together at step 5
        eng, runner = engine(1, async_scheduling=asynchronous, admission_interval=interval)
        assert eng.scheduler.config.admission_interval == interval
        schedule, count = eng.scheduler.schedule, [0]

        def counted(schedule=schedule, count=count):  # type: ignore[no-untyped-def]
            out = schedule()
            count[0] += any(e.num_new_tokens > 1 for e in out.scheduled)
            return out

        eng.scheduler.schedule = counted  # type: ignore[method-assign]
        results.append(outputs(run_all(eng, reqs)[0]))
        prefill_steps.append(count[0])
    assert results[0] == results[1] == outputs(ref)
    if not asynchronous:  # (asynchronous windows already join b and c at one window's end)
        assert prefill_steps[1] < prefill_steps[0]  # b and c share a step
    eng, runner = engine(4, async_scheduling=asynchronous, admission_interval=5)
    assert outputs(run_all(eng, reqs)[0]) == outputs(ref)
    assert runner.windows and max(runner.windows) <= 4
