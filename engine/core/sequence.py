"""One generation stream: its token ids, where it stands in the KV cache and why it ended.

Plain Python, no torch. A request with n > 1 owns n sequences; each is scheduled on its own.
Tokens [0, num_computed_tokens) have KV in the cache; the rest are fed to the model next. A decode
step therefore feeds exactly one token (the last one sampled).
"""

from __future__ import annotations

import enum
import itertools

from llmdeploy_engine.sampling_params import SamplingParams

_seq_counter = itertools.count()


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"

    @property
    def is_finished(self) -> bool:
        return self not in UNFINISHED

    @property
    def finish_reason(self) -> str | None:
        return self.value if self.is_finished else None


UNFINISHED = (SequenceStatus.WAITING, SequenceStatus.RUNNING)  # statuses of a sequence not yet ended


class Sequence:
    """Mutable state of one sequence; the scheduler and block manager update it in place."""

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        index: int = 0,
        arrival_time: float = 0.0,
        parent: Sequence | None = None,
    ) -> None:
        assert prompt_token_ids, "a sequence needs at least one prompt token"
        self.seq_id = next(_seq_counter)
        self.request_id = request_id
        self.index = index  # position among the request's n outputs
        self.token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.params = params
        self.arrival_time = arrival_time
        self.status = SequenceStatus.WAITING
        self.block_table: list[int] = []
        self.num_computed_tokens = 0  # tokens whose KV is in the cache
        self.num_cached_tokens = 0  # prompt tokens served by the prefix cache (or a fork) at admission
        # n > 1: children wait until the parent's prompt is computed, then share its full blocks
        self.parent = parent
        self.block_hashes: list[int] = []  # chained hashes of this sequence's full blocks, in order
        # full blocks BlockManager.cache_full_blocks has already looked at (registered, or left out as
        # a copy of a registered block); the next call starts there
        self.num_registered_blocks = 0
        self.num_preemptions = 0
        self.stop_reason: int | str | None = None
        # speculative decoding: tokens proposed for this step, fed after the last sampled one; the
        # scheduler consumes them (they never enter token_ids until verified)
        self.spec_token_ids: list[int] = []

    # ---- derived views ------------------------------------------------------------------------
    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_prefill(self) -> bool:
        """True while more than the last sampled token is missing from the cache."""
        return self.num_uncomputed_tokens > 1 or self.num_output_tokens == 0

    @property
    def is_finished(self) -> bool:
        return self.status not in UNFINISHED  # SequenceStatus.is_finished, one lookup (per token)

    @property
    def waits_for_parent(self) -> bool:
        return self.parent is not None

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)

    def __repr__(self) -> str:
        return (
            f"Sequence(id={self.seq_id}, request={self.request_id!r}, index={self.index}, "
            f"status={self.status.name}, tokens={self.num_tokens}, computed={self.num_computed_tokens}, "
            f"blocks={self.block_table})"
        )
