"""What the engine keeps per request, and the counters it reports: plain values of the batching core
(no torch)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from llmdeploy_engine.core.sequence import Sequence
from llmdeploy_engine.core.stop_checker import StopChecker
from llmdeploy_engine.outputs import Logprob, RequestMetrics
from llmdeploy_engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class EngineStats:
    num_requests_running: int
    num_requests_waiting: int
    kv_cache_usage: float  # fraction of KV blocks held by live sequences, 0..1
    num_kv_blocks: int
    num_free_kv_blocks: int
    prefix_cache_queries_tokens: int
    prefix_cache_hits_tokens: int
    num_preemptions: int
    prompt_tokens_total: int
    generation_tokens_total: int
    num_requests_finished: int
    startup_report: Any = None
    # speculative decoding (vLLM's spec_decode_* counters); zeros when it is off
    spec_decode_num_drafts: int = 0
    spec_decode_num_draft_tokens: int = 0
    spec_decode_num_accepted_tokens: int = 0
    spec_decode_num_accepted_tokens_per_pos: tuple[int, ...] = ()


@dataclass
class RequestState:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    seqs: list[Sequence]
    checkers: list[StopChecker]
    generators: list[Any]
    metrics: RequestMetrics
    logprobs: list[list[dict[int, Logprob]] | None] = field(default_factory=list)
    cumulative_logprobs: list[float] = field(default_factory=list)
    # DELTA outputs: per sequence, (characters of text, tokens, logprob entries) already handed out
    sent: list[tuple[int, int, int]] = field(default_factory=list)
    needs_history: bool = False  # the sampler reads the sequences' tokens (penalties, min_tokens)
    # its tokens can be chosen on the device once min_tokens is met: 1 greedy, 2 unseeded sampling
    window_kind: int = 0
    # structured outputs: per sequence, its position in the request's grammar (structured_output.py)
    matchers: list[Any] | None = None

    @property
    def finished(self) -> bool:
        return all(s.is_finished for s in self.seqs)


def window_kind(params: SamplingParams) -> int:
    """How a multi-step window can choose the request's tokens on the device (once min_tokens is
    met; nothing else may be read from the logits): 1 greedy (argmax), 2 unseeded sampling (the
    runner's `WindowSampler`), 0 not at all (logprobs, penalties, a seed, a grammar: its mask needs
    the host between steps, so a batch with a constrained sequence runs one step at a time)."""
    plain = (
        params.structured_outputs is None
        and params.logprobs is None
        and params.repetition_penalty == 1.0
        and params.frequency_penalty == 0.0
        and params.presence_penalty == 0.0
    )
    if not plain:
        return 0
    if params.greedy:
        return 1
    return 2 if params.seed is None else 0
