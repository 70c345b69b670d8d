"""The scheduler's values: its configuration, and what one scheduled step hands the runner and the
engine. Plain Python, no torch."""

from __future__ import annotations

from dataclasses import dataclass

from llmdeploy_engine.config import EngineConfig
from llmdeploy_engine.core.forward_batch import ForwardBatch
from llmdeploy_engine.core.sequence import Sequence
from llmdeploy_engine.facts import default_max_num_batched_tokens


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    enable_chunked_prefill: bool = True
    admission_interval: int = 1  # while sequences decode, waiting ones join every N decode steps

    @classmethod
    def from_engine(cls, config: EngineConfig, max_model_len: int) -> SchedulerConfig:
        budget = config.max_num_batched_tokens or default_max_num_batched_tokens(max_model_len)
        if not config.enable_chunked_prefill:
            budget = max(budget, max_model_len)  # a whole prompt must fit in one step
        return cls(
            config.max_num_seqs,
            budget,
            max_model_len,
            config.enable_chunked_prefill,
            config.admission_interval,
        )


@dataclass(frozen=True)
class ScheduledSeq:
    seq: Sequence
    num_new_tokens: int
    samples: bool  # the chunk reaches the sequence's last token, so a next token is sampled
    spec_token_ids: tuple[int, ...] = ()  # proposed tokens fed after the last one (counted in num_new_tokens)


@dataclass(frozen=True)
class SchedulerOutput:
    scheduled: list[ScheduledSeq]
    batch: ForwardBatch
    preempted: list[Sequence]

    @property
    def sampled_seqs(self) -> list[Sequence]:
        return [s.seq for s in self.scheduled if s.samples]

    @property
    def is_empty(self) -> bool:
        return not self.scheduled
