"""Per-sequence detokenization and stop conditions: EOS, stop token ids, stop strings, length.

Order for each new token, as in vLLM: nothing but length can stop a sequence before `min_tokens`
outputs; then EOS (unless `ignore_eos`) and `stop_token_ids` (their text is left out of the output
unless `include_stop_str_in_output`); then stop strings, searched only in the tail that the new text can
complete, so a stop string split over several tokens is caught; then `max_tokens` and `max_model_len`.
A matched stop string is cut from the text (kept with `include_stop_str_in_output`). While a sequence
runs, the last `len(longest stop) - 1` characters are held back so a stream never shows a prefix of a
stop string that later turns out to end the text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from llmdeploy_engine.core.sequence import SequenceStatus
from llmdeploy_engine.sampling_params import RequestOutputKind, SamplingParams


class TextDecoder(Protocol):
    def add(self, new_ids: list[int]) -> str: ...

    def flush(self) -> str: ...


def find_stop_string(text: str, num_new_chars: int, stops: list[str]) -> tuple[str, int] | None:
    """The earliest stop string that ends inside the last `num_new_chars` characters, and its start."""
    best: tuple[str, int] | None = None
    for stop in stops:
        if not stop:
            continue
        start = max(0, len(text) - num_new_chars - len(stop) + 1)
        idx = text.find(stop, start)
        if idx != -1 and (best is None or idx < best[1]):
            best = (stop, idx)
    return best


class StopChecker:
    def __init__(
        self,
        params: SamplingParams,
        decoder: TextDecoder,
        eos_token_ids: set[int],
        max_tokens: int,
        max_model_len: int,
    ) -> None:
        self.params = params
        self.decoder = decoder
        self.eos_token_ids = eos_token_ids
        self.stop_token_ids = set(params.stop_token_ids or [])
        # what ends a sequence in a decode window (on_window_tokens), built once
        self._window_stops = self.stop_token_ids if params.ignore_eos else self.stop_token_ids | eos_token_ids
        self.max_tokens = max_tokens
        self.max_model_len = max_model_len
        self.text = ""
        self.stop_reason: int | str | None = None
        stops = [s for s in params.stop_strings if s]
        hold = max((len(s) for s in stops), default=0) - 1
        self._holdback_chars = 0 if params.include_stop_str_in_output else max(hold, 0)
        self.deferred = params.output_kind is RequestOutputKind.FINAL_ONLY and not stops
        self._pending: list[int] = []  # deferred mode: ids not yet given to the decoder

    def _materialize(self) -> None:
        if self._pending:
            self.text += self.decoder.add(self._pending)
            self._pending = []

    def visible_text(self, finished: bool) -> str:
        self._materialize()
        if finished or not self._holdback_chars:
            return self.text
        return self.text[: max(0, len(self.text) - self._holdback_chars)]

    def on_token(self, token_id: int, num_output_tokens: int, num_tokens: int) -> SequenceStatus | None:
        """Account for a token already appended to the sequence; return a finished status or None."""
        p = self.params
        may_stop = num_output_tokens >= p.min_tokens
        is_stop_token = may_stop and (
            (not p.ignore_eos and token_id in self.eos_token_ids) or token_id in self.stop_token_ids
        )
        if self.deferred:
            return self._on_token_deferred(token_id, is_stop_token, num_output_tokens, num_tokens)
        if is_stop_token:
            if p.include_stop_str_in_output:
                self.text += self.decoder.add([token_id])
            if token_id in self.stop_token_ids:
                self.stop_reason = token_id
            return SequenceStatus.FINISHED_STOPPED

        delta = self.decoder.add([token_id])
        self.text += delta
        if may_stop and delta and p.stop_strings:
            found = find_stop_string(self.text, len(delta), p.stop_strings)
            if found is not None:
                stop, idx = found
                self.text = self.text[: idx + len(stop)] if p.include_stop_str_in_output else self.text[:idx]
                self.stop_reason = stop
                return SequenceStatus.FINISHED_STOPPED
        if num_output_tokens >= self.max_tokens or num_tokens >= self.max_model_len:
            self.text += self.decoder.flush()
            return SequenceStatus.FINISHED_LENGTH
        return None

    def on_window_tokens(
        self, tokens: Sequence[int], num_output_tokens: int, num_tokens: int
    ) -> tuple[int, SequenceStatus | None]:
        """A decode window's tokens for this sequence at once, in deferred mode (no stop strings,
        FINAL_ONLY) and past min_tokens (windows start there): (how many the sequence keeps, its
        finished status or None), what `on_token` on each in turn gives, which keeps the tokens up
        to the one that stops the sequence. num_output_tokens / num_tokens: the counts before the
        window's first token is appended."""
        assert self.deferred and num_output_tokens >= self.params.min_tokens
        p = self.params
        # the k-th token (from 1) ends the sequence by length
        length_k = max(1, min(self.max_tokens - num_output_tokens, self.max_model_len - num_tokens))
        n = min(len(tokens), length_k)
        stops = self._window_stops
        if stops:
            for k in range(n):
                token_id = tokens[k]
                if token_id in stops:
                    self._pending.extend(tokens[:k])
                    if p.include_stop_str_in_output:
                        self._pending.append(token_id)
                    if token_id in self.stop_token_ids:
                        self.stop_reason = token_id
                    self._finish_deferred(flush=False)
                    return k + 1, SequenceStatus.FINISHED_STOPPED
        self._pending.extend(tokens[:n])
        if n == length_k:
            self._finish_deferred(flush=True)
            return n, SequenceStatus.FINISHED_LENGTH
        return n, None

    def _on_token_deferred(
        self, token_id: int, is_stop_token: bool, num_output_tokens: int, num_tokens: int
    ) -> SequenceStatus | None:
        """on_token without stop strings, with the decoding left until the text is needed."""
        if is_stop_token:
            if self.params.include_stop_str_in_output:
                self._pending.append(token_id)
            if token_id in self.stop_token_ids:
                self.stop_reason = token_id
            self._finish_deferred(flush=False)
            return SequenceStatus.FINISHED_STOPPED
        self._pending.append(token_id)
        if num_output_tokens >= self.max_tokens or num_tokens >= self.max_model_len:
            self._finish_deferred(flush=True)
            return SequenceStatus.FINISHED_LENGTH
        return None

    def _finish_deferred(self, flush: bool) -> None:
        self._materialize()
        rest = self.decoder.flush()
        # a stop token ends the text without the held-back tail of an incomplete character, as the
        # per-token path does (it never flushes on a stop token); a length stop keeps it
        self.text += rest if flush else rest.rstrip("\ufffd")
