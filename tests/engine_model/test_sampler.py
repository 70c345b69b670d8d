"""Sampler features one by one, on small hand-made logits."""

from __future__ import annotations

import math

import pytest
import torch
from llmdeploy_engine.model.sampler import Sampler
from llmdeploy_engine.sampling_params import SamplingParams

V = 8


def sample_many(sampler: Sampler, logits: torch.Tensor, params: SamplingParams, n: int = 400) -> list[int]:
    rows = logits.expand(n, -1).clone()
    out = sampler.sample(rows, [params] * n, [[]] * n, [[]] * n, [None] * n)
    return out.token_ids


def one(sampler: Sampler, logits: list[float], params: SamplingParams, prompt=(), output=()) -> int:
    out = sampler.sample(torch.tensor([logits]), [params], [list(prompt)], [list(output)], [None])
    return out.token_ids[0]


def test_greedy_takes_argmax() -> None:
    s = Sampler(set())
    assert one(s, [0, 1, 5, 2, 0, 0, 0, 0], SamplingParams(temperature=0)) == 2


def test_temperature_sampling_follows_the_distribution() -> None:
    torch.manual_seed(0)
    logits = torch.log(torch.tensor([0.5, 0.3, 0.2] + [1e-9] * (V - 3)))
    toks = sample_many(Sampler(set()), logits, SamplingParams(temperature=1.0), n=4000)
    freq = [toks.count(i) / len(toks) for i in range(3)]
    assert freq == pytest.approx([0.5, 0.3, 0.2], abs=0.04)


def test_low_temperature_sharpens() -> None:
    torch.manual_seed(0)
    logits = torch.tensor([1.0, 0.8] + [0.0] * (V - 2))
    toks = sample_many(Sampler(set()), logits, SamplingParams(temperature=0.05))
    assert toks.count(0) / len(toks) > 0.95


def test_top_k_keeps_only_k_tokens() -> None:
    torch.manual_seed(0)
    logits = torch.zeros(V)
    logits[:4] = torch.tensor([3.0, 2.9, 2.8, 2.7])
    toks = sample_many(Sampler(set()), logits, SamplingParams(temperature=1.0, top_k=2))
    assert set(toks) == {0, 1}


def test_top_p_keeps_the_nucleus() -> None:
    torch.manual_seed(0)
    logits = torch.log(torch.tensor([0.4, 0.3, 0.2, 0.1] + [1e-9] * (V - 4)))
    toks = sample_many(Sampler(set()), logits, SamplingParams(temperature=1.0, top_p=0.65))
    assert set(toks) == {0, 1}


def test_min_p_drops_unlikely_tokens() -> None:
    torch.manual_seed(0)
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05] + [1e-9] * (V - 4)))
    toks = sample_many(Sampler(set()), logits, SamplingParams(temperature=1.0, min_p=0.25))
    assert set(toks) == {0, 1, 2}


def test_seeded_requests_do_not_depend_on_batch_mates() -> None:
    s = Sampler(set())
    torch.manual_seed(1)
    logits = torch.randn(6, 50)
    seeded = SamplingParams(temperature=1.0, seed=7)
    alone = s.sample(logits[:1], [seeded], [[]], [[]], [s.make_generator(7)]).token_ids[0]
    mates = [SamplingParams(temperature=0.9)] * 5
    gens = [s.make_generator(7)] + [None] * 5
    together = s.sample(logits, [seeded, *mates], [[]] * 6, [[]] * 6, gens).token_ids[0]
    assert alone == together
    # and the same seed gives the same sequence of draws across steps
    g1, g2 = s.make_generator(3), s.make_generator(3)
    a = [s.sample(logits[2:3], [seeded], [[]], [[]], [g1]).token_ids[0] for _ in range(10)]
    b = [s.sample(logits[2:3], [seeded], [[]], [[]], [g2]).token_ids[0] for _ in range(10)]
    assert a == b and len(set(a)) > 1


def test_repetition_penalty_divides_positive_and_multiplies_negative() -> None:
    s = Sampler(set())
    p = SamplingParams(temperature=0, repetition_penalty=2.0)
    # token 0 (seen in the prompt) 3.0 -> 1.5 loses to token 1 (2.0)
    assert one(s, [3.0, 2.0] + [0.0] * (V - 2), p, prompt=[0]) == 1
    # a seen negative logit gets more negative: token 2 (-0.1 -> -0.2) loses to unseen zeros
    assert one(s, [-1.0, -1.0, -0.1] + [-0.15] * (V - 3), p, output=[2]) == 3


def test_frequency_penalty_counts_output_tokens() -> None:
    s = Sampler(set())
    p = SamplingParams(temperature=0, frequency_penalty=0.5)
    logits = [2.0, 1.2] + [0.0] * (V - 2)
    assert one(s, logits, p, output=[0]) == 0  # 2.0 - 0.5 = 1.5 > 1.2
    assert one(s, logits, p, output=[0, 0]) == 1  # 2.0 - 1.0 = 1.0 < 1.2
    assert one(s, logits, p, prompt=[0, 0, 0]) == 0  # prompt tokens are not counted


def test_presence_penalty_is_flat() -> None:
    s = Sampler(set())
    p = SamplingParams(temperature=0, presence_penalty=0.5)
    logits = [2.0, 1.6] + [0.0] * (V - 2)
    assert one(s, logits, p, output=[0]) == 1
    assert one(s, [2.0, 1.4] + [0.0] * (V - 2), p, output=[0, 0, 0]) == 0


def test_min_tokens_masks_eos_and_stop_ids() -> None:
    s = Sampler({5})
    logits = [0.0] * V
    logits[5], logits[6], logits[1] = 9.0, 8.0, 7.0
    p = SamplingParams(temperature=0, min_tokens=2, stop_token_ids=[6])
    assert one(s, logits, p, output=[3]) == 1
    assert one(s, logits, p, output=[3, 3]) == 5


def test_logprobs_are_raw_log_softmax_with_top_n() -> None:
    s = Sampler(set())
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    p = SamplingParams(temperature=0, logprobs=2, repetition_penalty=2.0)
    out = s.sample(logits, [p], [[1]], [[]], [None])
    # the penalty makes token 2 the choice, logprobs stay those of the raw logits
    assert out.token_ids == [2]
    lp = out.logprobs[0]
    assert lp is not None
    raw = torch.log_softmax(logits[0], dim=-1)
    assert set(lp) == {1, 2}
    assert lp[2].logprob == pytest.approx(float(raw[2])) and lp[2].rank == 2
    assert lp[1].logprob == pytest.approx(float(raw[1])) and lp[1].rank == 1
    assert math.exp(lp[1].logprob) > math.exp(lp[2].logprob)


def test_logprobs_zero_gives_only_the_chosen_token_and_none_without_request() -> None:
    s = Sampler(set())
    logits = torch.tensor([[1.0, 3.0, 2.0, 0, 0, 0, 0, 0], [0.0] * V])
    out = s.sample(
        logits,
        [SamplingParams(temperature=0, logprobs=0), SamplingParams(temperature=0)],
        [[], []],
        [[], []],
        [None, None],
    )
    assert out.logprobs[1] is None
    assert out.logprobs[0] is not None and set(out.logprobs[0]) == {1}


def test_mixed_batch_greedy_and_random_rows() -> None:
    torch.manual_seed(0)
    s = Sampler(set())
    logits = torch.tensor([[0.0, 5.0] + [0.0] * (V - 2)] * 2)
    out = s.sample(
        logits,
        [SamplingParams(temperature=0), SamplingParams(temperature=1.0, top_k=1)],
        [[], []],
        [[], []],
        [None, None],
    )
    assert out.token_ids == [1, 1]


def test_unfiltered_rows_keep_the_whole_tail_when_batch_mates_filter() -> None:
    torch.manual_seed(0)
    s = Sampler(set())
    vocab = 50_000
    n = 200
    logits = torch.zeros(n + 1, vocab)
    params = [SamplingParams(temperature=1.0)] * n + [SamplingParams(temperature=1.0, top_k=1)]
    out = s.sample(logits, params, [[]] * (n + 1), [[]] * (n + 1), [None] * (n + 1))
    tail = [t for t in out.token_ids[:n] if t >= vocab * 9 // 10]
    assert len(tail) > 5  # ~10% expected; cumulative-sum rounding must not cut the tail off


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_fast_path_matches_the_general_path_and_float64(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(37, 501, generator=gen).to(dtype)
    logits[5, 10] = logits[5, 20] = logits[5].max() + 1  # a tie: the first index wins on both paths
    n = logits.shape[0]
    plain = [SamplingParams(temperature=0)] * n
    with_logprobs = [SamplingParams(temperature=0, logprobs=0)] * n  # forces the general path
    sampler = Sampler({0})
    fast = sampler.sample(logits, plain, [[]] * n, [[]] * n, [None] * n)
    general = sampler.sample(logits, with_logprobs, [[]] * n, [[]] * n, [None] * n)
    reference = logits.double().argmax(dim=-1).tolist()
    assert fast.token_ids == general.token_ids == reference
    assert fast.token_ids[5] == 10 and all(isinstance(t, int) for t in fast.token_ids)
    assert fast.logprobs == [None] * n


def test_greedy_fast_path_is_left_when_a_row_needs_processing(monkeypatch: pytest.MonkeyPatch) -> None:
    sampler = Sampler({0})
    logits = torch.tensor([[0.0, 5.0, 1.0], [0.0, 1.0, 5.0]])
    calls: list[int] = []
    original = sampler._mask_min_tokens
    monkeypatch.setattr(sampler, "_mask_min_tokens", lambda *a: calls.append(1) or original(*a))
    greedy = SamplingParams(temperature=0)
    assert sampler.sample(logits, [greedy, greedy], [[1], [1]], [[], []], [None, None]).token_ids == [1, 2]
    assert calls == []  # fast path
    # min_tokens still active on row 0: EOS (id 1 here) is masked, so the general path runs
    sampler.eos_token_ids = {1}
    masked = SamplingParams(temperature=0, min_tokens=2)
    assert sampler.sample(logits, [masked, greedy], [[1], [1]], [[], []], [None, None]).token_ids == [2, 2]
    assert calls == [1]
    # penalties also leave the fast path: repetition penalty on the seen id 2 of row 1
    pen = SamplingParams(temperature=0, repetition_penalty=10.0)
    assert sampler.sample(logits, [greedy, pen], [[1], [2]], [[], []], [None, None]).token_ids == [1, 1]
