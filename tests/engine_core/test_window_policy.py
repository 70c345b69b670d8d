"""WindowPolicy (core/window_policy.py) and WindowSizer (core/window_sizing.py) on their own, without an
engine or a runner: which settings turn windows on, which scheduled steps run as windows and how long,
which rows a follow-on continues, how many steps fit the free blocks. The engine-level behaviour (the
tokens of one step per call) is in test_multi_step_core.py."""

from __future__ import annotations

import pytest
from llmdeploy_engine.core.block_manager import BlockManager
from llmdeploy_engine.core.request_state import RequestState, window_kind
from llmdeploy_engine.core.scheduler_output import ScheduledSeq, SchedulerOutput
from llmdeploy_engine.core.sequence import Sequence, SequenceStatus
from llmdeploy_engine.core.window_policy import WindowPolicy, steps_that_fit, window_slots
from llmdeploy_engine.core.window_sizing import ARRIVAL_WINDOW_STEPS, AUTO_MAX_WINDOW_STEPS, WindowSizer
from llmdeploy_engine.outputs import RequestMetrics
from llmdeploy_engine.sampling_params import SamplingParams


class Checker:
    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens


def request(
    rid: str, prompt: list[int], params: SamplingParams, outputs: int = 1
) -> tuple[RequestState, Sequence]:
    seq = Sequence(rid, prompt, params)
    for t in range(outputs):
        seq.append_token(t)
    req = RequestState(
        request_id=rid,
        prompt=None,
        prompt_token_ids=list(prompt),
        params=params,
        seqs=[seq],
        checkers=[Checker(params.max_tokens or 100)],  # type: ignore[list-item]
        generators=[None],
        metrics=RequestMetrics(arrival_time=0.0),
        logprobs=[None],
        cumulative_logprobs=[0.0],
        sent=[(0, 0, 0)],
        needs_history=False,
        window_kind=window_kind(params),
    )
    return req, seq


def step_of(*reqs: tuple[RequestState, Sequence]) -> tuple[SchedulerOutput, dict[str, RequestState]]:
    scheduled = [ScheduledSeq(seq, 1, True) for _, seq in reqs]
    return SchedulerOutput(scheduled, None, []), {r.request_id: r for r, _ in reqs}  # type: ignore[arg-type]


def policy(steps: int = 8, async_windows: bool = False, sampling: bool = True, **kw) -> WindowPolicy:  # type: ignore[no-untyped-def]
    return WindowPolicy(steps, async_windows, sampling, max_num_seqs=8, max_model_len=64, **kw)


def choose(steps: int | None, asked: bool | None, **kw) -> WindowPolicy:  # type: ignore[no-untyped-def]
    caps = dict(runs_windows=True, launches_windows=True, sampling=True, on_gpu=False, speculating=False)
    return WindowPolicy.choose(steps, asked, **{**caps, **kw}, max_num_seqs=8, max_model_len=64)


def test_settings_turn_windows_on_and_off() -> None:
    assert not choose(1, None).enabled  # one step, the CPU: ordinary steps
    fixed = choose(4, None)
    assert fixed.num_scheduler_steps == 4 and fixed.async_windows and fixed.sizer is None
    assert not choose(4, False).async_windows and choose(4, False).enabled
    one_step_gpu = choose(1, None, on_gpu=True)
    assert one_step_gpu.async_windows and one_step_gpu.num_scheduler_steps == 1 and one_step_gpu.enabled
    auto = choose(None, None, on_gpu=True)
    assert auto.sizer is not None and auto.num_scheduler_steps == AUTO_MAX_WINDOW_STEPS
    assert choose(None, None).sizer is None and not choose(None, None).enabled  # auto on the CPU: one step
    for ignored in (dict(speculating=True), dict(runs_windows=False, launches_windows=False)):
        p = choose(4, True, **ignored)
        assert p.num_scheduler_steps == 1 and not p.async_windows and not p.enabled
    assert not choose(4, True, launches_windows=False).async_windows  # synchronous windows only


def test_plan_grants_windows_to_device_chosen_tokens_only() -> None:
    greedy = request("g", [1, 2], SamplingParams(temperature=0, max_tokens=20))
    sampled = request("s", [3], SamplingParams(temperature=0.8, max_tokens=20))
    out, reqs = step_of(greedy, sampled)
    assert policy().plan(out, reqs, 2) == (8, True)
    assert policy(sampling=False).plan(out, reqs, 2) == (0, False)  # the runner only takes argmax
    out, reqs = step_of(greedy)
    assert policy().plan(out, reqs, 1) == (8, False)
    for params in (
        SamplingParams(temperature=0.8, seed=1, max_tokens=20),
        SamplingParams(temperature=0, logprobs=1, max_tokens=20),
        SamplingParams(temperature=0, repetition_penalty=1.2, max_tokens=20),
        SamplingParams(temperature=0, min_tokens=5, max_tokens=20),
    ):
        out, reqs = step_of(greedy, request("x", [4], params))
        assert policy().plan(out, reqs, 2) == (0, False), params
    out, reqs = step_of(
        request("m", [4], SamplingParams(temperature=0, min_tokens=5, max_tokens=20), outputs=5)
    )
    assert policy().plan(out, reqs, 1)[0] == 8  # min_tokens met


def test_plan_cuts_to_the_longest_output_left() -> None:
    short = request("a", [1], SamplingParams(temperature=0, max_tokens=4), outputs=1)
    shorter = request("b", [1], SamplingParams(temperature=0, max_tokens=3), outputs=1)
    out, reqs = step_of(short, shorter)
    assert policy().plan(out, reqs, 2) == (3, False)
    last = request("c", [1], SamplingParams(temperature=0, max_tokens=2), outputs=1)
    out, reqs = step_of(last)
    assert policy().plan(out, reqs, 1) == (0, False)  # one step left: an ordinary step when synchronous
    assert policy(async_windows=True).plan(out, reqs, 1) == (1, False)  # a one-step window when not


def test_auto_windows_shorten_while_requests_arrive() -> None:
    sizer = WindowSizer()
    sizer.steps = AUTO_MAX_WINDOW_STEPS
    p = policy(async_windows=True, sizer=sizer)
    assert p.window_steps(1) == AUTO_MAX_WINDOW_STEPS
    p.note_arrival()
    assert p.window_steps(1) == ARRIVAL_WINDOW_STEPS
    assert p.window_steps(8) == AUTO_MAX_WINDOW_STEPS  # every max_num_seqs slot taken
    p.arrived_while_decoding -= 10.0  # ARRIVAL_HOLD_S later
    assert p.window_steps(1) == AUTO_MAX_WINDOW_STEPS
    assert policy(steps=4).window_steps(1) == 4  # a fixed length ignores arrivals


def test_follow_rows_leave_out_the_sequences_the_window_ends() -> None:
    ends = request("e", [1], SamplingParams(temperature=0, max_tokens=5), outputs=1)  # 4 left
    goes_on = request("g", [1], SamplingParams(temperature=0, max_tokens=20), outputs=1)  # 19 left
    samples = request("s", [1], SamplingParams(temperature=0.8, max_tokens=9), outputs=1)  # 8 left
    stopped = request("x", [1], SamplingParams(temperature=0, max_tokens=20), outputs=1)
    stopped[1].status = SequenceStatus.FINISHED_STOPPED
    out, reqs = step_of(ends, goes_on, samples, stopped)
    assert policy().follow_rows(out, 4, reqs) == ([1, 2], 1, 15, True)
    at_context = request("c", list(range(60)), SamplingParams(temperature=0, max_tokens=None), outputs=1)
    out, reqs = step_of(at_context)
    assert policy().follow_rows(out, 3, reqs) == ([], 1, 0, False)  # 61 + 3 tokens reach max_model_len 64


def test_steps_that_fit_the_free_blocks() -> None:
    bm = BlockManager(num_blocks=6, block_size=4, enable_prefix_caching=False)
    seqs = []
    for n in (3, 7):  # 1 and 2 blocks held, 3 left free
        seq = Sequence(str(n), list(range(n)), SamplingParams())
        assert bm.allocate_slots(seq, n)
        seq.num_computed_tokens = n
        seqs.append(seq)
    assert steps_that_fit(seqs, 0, 1, 4, 64, bm.num_free_blocks) == 1  # slots 3 and 7 in held blocks
    # 8 steps: 3 + 8 = 11 tokens (3 blocks: 2 more), 7 + 8 = 15 (4 blocks: 2 more); 4 > 3 free
    assert steps_that_fit(seqs, 0, 8, 4, 64, bm.num_free_blocks) == 5
    assert steps_that_fit(seqs, 4, 8, 4, 64, bm.num_free_blocks) == 1  # 4 steps already reserved
    assert steps_that_fit(seqs, 0, 8, 4, 64, 0) == 1
    assert steps_that_fit(seqs, 2, 8, 4, 64, 0) == 0
    assert steps_that_fit(seqs, 0, 8, 4, 9, 0) == 1  # max_model_len 9: no slot past it
    assert window_slots(7, 0, 8, 9) == 2 and window_slots(3, 2, 4, 64) == 6


def test_window_sizer_decisions() -> None:
    """WindowSizer: per span of windows, the median window's share of time the host waited for ids
    doubles the length below grow_below (up to max_steps), halves it above shrink_above (down to 1),
    keeps it between; one outlying window does not move the median."""
    sizer = WindowSizer(max_steps=8, span=2, grow_below=0.15, shrink_above=0.6)
    assert sizer.steps == 1
    seen = [sizer.observe(0.0001, 0.004) for _ in range(8)]
    assert seen == [1, 2, 2, 4, 4, 8, 8, 8]
    assert [sizer.observe(0.004, 0.01) for _ in range(2)] == [8, 8]  # 40 %: held
    assert [sizer.observe(0.009, 0.01) for _ in range(4)] == [8, 4, 4, 2]  # 90 %: halved each span
    assert [sizer.observe(0.009, 0.01) for _ in range(6)] == [2, 1, 1, 1, 1, 1]
    assert sizer.observe(0.0, 0.0) == 1 and sizer.observe(0.0, 0.0) == 1  # no time: counted as waiting
    with pytest.raises(AssertionError):
        WindowSizer(grow_below=0.7, shrink_above=0.6)
    sizer = WindowSizer(max_steps=8, span=5)  # the defaults' thresholds: grow below 0.5, shrink above 0.75
    assert [sizer.observe(w, 0.01) for w in (0.009, 0.009, 0.0, 0.009, 0.009)] == [1] * 5  # one stall: held
    assert [sizer.observe(w, 0.01) for w in (0.001, 0.002, 0.009, 0.003, 0.001)][-1] == 2  # median 0.2
    sizer.steps = 4
    assert [sizer.observe(w, 0.01) for w in (0.008, 0.009, 0.0, 0.0, 0.009)][-1] == 2  # median 0.8
