"""Batched sampling with per-request SamplingParams.

Order per row, as in vLLM: min_tokens masks the stop/eos ids, then repetition, frequency and
presence penalties; greedy rows take the argmax of those logits; the others are divided by the
temperature, filtered by top-k, top-p and min-p, and sampled.

Logprobs follow vLLM's default (`logprobs_mode="raw_logprobs"`): the log-softmax of the model's raw
logits, before penalties, temperature and filtering. Each row's dict holds the chosen token plus the
top-N, with 1-based ranks in that raw distribution.

Fast path: a batch of greedy rows without penalties, active min_tokens masks or logprobs is one
argmax on the device and one `.tolist()` (the general path gives the same ids: same argmax, same
tie-breaking). Otherwise the rows are processed batched (temperature, top-k/top-p/min-p as tensors);
only penalties, min_tokens masks and seeded draws loop over the rows that have them.

Structured outputs: the step's grammar mask (structured_output.py) is applied to the constrained
rows' logits first, so every later stage (and the logprobs) sees the forbidden tokens at -inf; min_tokens
does not mask the stop tokens of a constrained row (the grammar decides where it may end).

Seeded requests draw their noise from their own torch.Generator, one full-vocabulary draw per step,
so their tokens do not depend on which other requests share the batch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from llmdeploy_engine.outputs import Logprob
from llmdeploy_engine.sampling_params import SamplingParams

_TokenRows = list[list[int]]  # token ids per batch row


@dataclass(frozen=True)
class SamplerOutput:
    token_ids: list[int]
    logprobs: list[dict[int, Logprob] | None]


class Sampler:
    def __init__(self, eos_token_ids: set[int], device: torch.device | str = "cpu") -> None:
        self.eos_token_ids = set(eos_token_ids)
        self.device = torch.device(device)

    def window_seed(self) -> int:
        """A seed for a multi-step window's sampling noise, from torch's (seeded) CPU generator."""
        return int(torch.randint(0, 2**62, (1,)).item())

    def make_generator(self, seed: int) -> torch.Generator:
        """The per-request generator for a seeded request, on the sampler's device."""
        return torch.Generator(device=self.device).manual_seed(seed)

    def sample(
        self,
        logits: torch.Tensor,
        params: list[SamplingParams],
        prompt_token_ids: list[list[int]],
        output_token_ids: list[list[int]],
        generators: list[torch.Generator | None],
        grammar: Any = None,
    ) -> SamplerOutput:
        """`grammar`: a structured_output.GrammarMask for the constrained rows (their forbidden tokens'
        logits become -inf, in place, before anything reads them), or None."""
        num_rows, vocab = logits.shape
        assert len(params) == len(prompt_token_ids) == len(output_token_ids) == len(generators) == num_rows
        if grammar is not None:
            grammar.apply(logits)
        if all(plain_greedy(p, len(out)) for p, out in zip(params, output_token_ids, strict=True)):
            return SamplerOutput(logits.argmax(dim=-1).tolist(), [None] * num_rows)
        raw = logits.float()
        x = self._penalized(raw, params, prompt_token_ids, output_token_ids)
        chosen = x.argmax(dim=-1)
        if not all(p.greedy for p in params):
            greedy = torch.tensor([p.greedy for p in params], device=x.device)
            temps = torch.tensor([1.0 if p.greedy else p.temperature for p in params], device=x.device)
            x = x / temps[:, None]
            x = _filter(x, params)
            probs = torch.softmax(x, dim=-1)
            noise = torch.empty_like(probs)
            unseeded = [i for i, g in enumerate(generators) if g is None]
            if unseeded:
                noise[unseeded] = torch.empty(len(unseeded), vocab, device=x.device).exponential_()
            for i, g in enumerate(generators):
                if g is not None:
                    noise[i] = torch.empty(vocab, device=g.device).exponential_(generator=g).to(x.device)
            # Gumbel-style trick: argmax(p / Exp(1)) is a draw from p
            sampled = (probs / noise).argmax(dim=-1)
            chosen = torch.where(greedy, chosen, sampled)

        token_ids = [int(t) for t in chosen.tolist()]
        return SamplerOutput(token_ids, self._logprobs(raw, params, token_ids))

    def processed_probs(
        self,
        logits: torch.Tensor,
        params: list[SamplingParams],
        prompt_token_ids: list[list[int]],
        output_token_ids: list[list[int]],
    ) -> torch.Tensor:
        """Per row, the distribution `sample` draws from (speculative decoding verifies against it):
        min_tokens, penalties, temperature, top-k/top-p/min-p. Greedy rows are one-hot at `sample`'s argmax."""
        x = self._penalized(logits.float(), params, prompt_token_ids, output_token_ids)
        temps = torch.tensor([1.0 if p.greedy else p.temperature for p in params], device=x.device)
        probs = torch.softmax(_filter(x / temps[:, None], params), dim=-1)
        greedy = [i for i, p in enumerate(params) if p.greedy]
        if greedy:
            top = x[greedy].argmax(dim=-1, keepdim=True)
            probs[greedy] = torch.zeros_like(probs[greedy]).scatter_(1, top, 1.0)
        return probs

    def raw_logprobs(
        self, logits: torch.Tensor, params: list[SamplingParams], token_ids: list[int]
    ) -> list[dict[int, Logprob] | None]:
        """The logprobs `sample` reports for already chosen tokens (speculative decoding)."""
        return self._logprobs(logits.float(), params, token_ids)

    def _penalized(
        self, raw: torch.Tensor, params: list[SamplingParams], prompts: _TokenRows, outputs: _TokenRows
    ) -> torch.Tensor:
        """A copy of the float32 logits with min_tokens' masks and the penalties applied."""
        x = raw.clone()
        self._mask_min_tokens(x, params, outputs)
        self._apply_penalties(x, params, prompts, outputs)
        return x

    def _mask_min_tokens(
        self, x: torch.Tensor, params: list[SamplingParams], outputs: list[list[int]]
    ) -> None:
        for i, p in enumerate(params):
            # a grammar decides where a constrained output may end (masking its stop tokens too could
            # leave no token allowed)
            if len(outputs[i]) < p.min_tokens and p.structured_outputs is None:
                ids = set(p.stop_token_ids or [])
                if not p.ignore_eos:
                    ids |= self.eos_token_ids
                ids = {t for t in ids if 0 <= t < x.shape[1]}
                if ids:
                    x[i, sorted(ids)] = -float("inf")

    def _apply_penalties(
        self,
        x: torch.Tensor,
        params: list[SamplingParams],
        prompts: list[list[int]],
        outputs: list[list[int]],
    ) -> None:
        vocab = x.shape[1]
        for i, p in enumerate(params):
            if p.repetition_penalty != 1.0:
                seen = torch.tensor(
                    sorted(set(prompts[i]) | set(outputs[i])), dtype=torch.long, device=x.device
                )
                seen = seen[seen < vocab]
                vals = x[i, seen]
                x[i, seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
            if (p.frequency_penalty != 0.0 or p.presence_penalty != 0.0) and outputs[i]:
                ids = torch.tensor(outputs[i], dtype=torch.long, device=x.device)
                counts = torch.zeros(vocab, device=x.device).scatter_add_(
                    0, ids, torch.ones_like(ids, dtype=x.dtype)
                )
                x[i] -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(x.dtype)

    def _logprobs(
        self, raw: torch.Tensor, params: list[SamplingParams], token_ids: list[int]
    ) -> list[dict[int, Logprob] | None]:
        rows = [i for i, p in enumerate(params) if p.logprobs is not None]
        result: list[dict[int, Logprob] | None] = [None] * len(params)
        if not rows:
            return result
        lp = torch.log_softmax(raw[rows], dim=-1)
        max_n = max(params[i].logprobs or 0 for i in rows)
        top_vals, top_ids = lp.topk(max(max_n, 1), dim=-1)
        chosen = torch.tensor([token_ids[i] for i in rows], device=raw.device)
        chosen_lp = lp.gather(1, chosen[:, None]).squeeze(1)
        chosen_rank = (lp > chosen_lp[:, None]).sum(dim=-1) + 1
        for j, i in enumerate(rows):
            n = params[i].logprobs or 0
            entry = {token_ids[i]: Logprob(float(chosen_lp[j]), int(chosen_rank[j]))}
            for r in range(n):
                tid = int(top_ids[j, r])
                if tid not in entry:
                    entry[tid] = Logprob(float(top_vals[j, r]), r + 1)
            result[i] = entry
        return result


def plain_greedy(p: SamplingParams, num_output_tokens: int, logprobs: bool = True) -> bool:
    """Greedy with nothing that changes the logits or (when `logprobs`: a draft model's proposals need
    none) needs them back, for a sequence with `num_output_tokens` so far: the argmax is the token."""
    return (
        p.greedy
        and (p.logprobs is None or not logprobs)
        and p.repetition_penalty == 1.0
        and p.frequency_penalty == 0.0
        and p.presence_penalty == 0.0
        and num_output_tokens >= p.min_tokens
    )


def _filter(x: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """top-k, top-p, min-p over temperature-scaled logits; masked entries become -inf."""
    limits = _filter_limits(params, x.shape[1], x.device)
    return x if limits is None else _apply_filter(x, limits)


def _filter_limits(
    params: list[SamplingParams], vocab: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """Per-row top-k, top-p and min-p as device columns [n, 1], or None when no row filters."""
    top_k = [p.top_k if 0 < p.top_k < vocab else vocab for p in params]
    # top_p 1.0 is off: never compare against it (cumulative sums can round past 1.0)
    top_p = [p.top_p if p.top_p < 1.0 else 2.0 for p in params]
    min_p = [p.min_p for p in params]
    if all(k == vocab for k in top_k) and all(p > 1.0 for p in top_p) and all(m <= 0 for m in min_p):
        return None
    return (
        torch.tensor(top_k, device=device)[:, None],
        torch.tensor(top_p, device=device)[:, None],
        torch.tensor(min_p, device=device)[:, None],
    )


def _apply_filter(x: torch.Tensor, limits: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> torch.Tensor:
    top_k, top_p, min_p = limits
    vocab = x.shape[1]
    sorted_x, order = x.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab, device=x.device)[None, :]
    remove = ranks >= top_k
    sorted_x = sorted_x.masked_fill(remove, -float("inf"))
    probs = torch.softmax(sorted_x, dim=-1)
    # drop a token when the tokens ranked above it already reach top_p (the first one always stays)
    before = probs.cumsum(dim=-1) - probs
    remove = remove | (before >= top_p)
    remove = remove | (probs < min_p * probs[:, :1])
    remove[:, 0] = False
    sorted_x = sorted_x.masked_fill(remove, -float("inf"))
    return torch.empty_like(x).scatter_(1, order, sorted_x)


class WindowSampler:
    """Sampling inside a multi-step decode window (llm_engine.py), on the device, without reading
    anything back: greedy rows take the argmax; the other rows (unseeded; no penalties, logprobs or
    min_tokens masks, which the engine rules out) are divided by their temperature, filtered by
    top-k/top-p/min-p and drawn as `Sampler.sample` draws them (argmax of p / Exp(1) noise), the
    noise coming from one generator seeded per window: tensor-parallel ranks given the same seed
    draw the same tokens. Every per-row tensor is built once, when the window starts."""

    def __init__(
        self, params: list[SamplingParams] | None, vocab: int, device: torch.device, seed: int | None
    ) -> None:
        self.random = params is not None and not all(p.greedy for p in params)
        if not self.random:
            return
        assert params is not None and seed is not None, "a window with sampled rows needs its seed"
        self.greedy = torch.tensor([p.greedy for p in params], device=device)
        self.temperatures = torch.tensor([1.0 if p.greedy else p.temperature for p in params], device=device)[
            :, None
        ]
        self.limits = _filter_limits(params, vocab, device)
        self.generator = torch.Generator(device=device).manual_seed(seed)

    def sample(self, logits: torch.Tensor, out: torch.Tensor) -> None:
        """Write one token per row of float32 logits [n, vocab] into out [n] (long, same device)."""
        if not self.random:
            fast = fast_argmax_rows() if logits.is_cuda else None
            if fast is not None and logits.stride(-1) == 1:
                fast(logits, out)
            else:
                torch.argmax(logits, dim=-1, out=out)
            return
        chosen = logits.argmax(dim=-1)
        x = logits / self.temperatures
        if self.limits is not None:
            x = _apply_filter(x, self.limits)
        probs = torch.softmax(x, dim=-1)
        noise = torch.empty_like(probs).exponential_(generator=self.generator)
        torch.where(self.greedy, chosen, (probs / noise).argmax(dim=-1), out=out)


@functools.cache
def fast_argmax_rows() -> Callable[..., Any] | None:
    """triton_ops.argmax_rows (the greedy pick in two launches over the whole GPU; torch's argmax
    reduces a 128k-entry row on few SMs: ~27 us for an 8B's 128k-entry logits on an H200, and a 0.5B
    model's greedy single stream ran ~9-15 % faster with this one) where Triton is installed."""
    try:
        from llmdeploy_engine.kernels import triton_ops
    except ImportError:
        return None
    return triton_ops.argmax_rows
