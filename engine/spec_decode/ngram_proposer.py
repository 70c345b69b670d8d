"""N-gram (prompt lookup) proposals: continue the sequence the way it continued last time.

Plain Python, no torch. The last n tokens (n from prompt_lookup_max down to prompt_lookup_min,
longest first) are searched for earlier in the prompt + generated tokens; at the most recent earlier
occurrence, the k tokens that followed it are the proposal (a copy that runs into the end of the
sequence continues through what it has copied, as a periodic sequence would). The proposal is deterministic, so
the rejection sampler treats its distribution as one-hot.

`NgramIndex` keeps, per sequence, where each n-gram last ended, and adds the n-grams of the tokens
appended since its last call: O(lookup_max - lookup_min + 1) dictionary updates a token and one
lookup per n a step, where a scan of the whole sequence cost O(length) every step (at 8k-token
contexts and 32 sequences, tens of ms of host time a step). `propose_ngram` is the one-off form.
"""

from __future__ import annotations

from collections.abc import Sequence


class NgramIndex:
    """Prompt-lookup state of one sequence whose tokens only grow (speculative steps append accepted
    tokens only; a rejected proposal never enters the sequence)."""

    def __init__(self, lookup_min: int, lookup_max: int) -> None:
        assert 1 <= lookup_min <= lookup_max
        self.lookup_min = lookup_min
        self.lookup_max = lookup_max
        # _ends[n - lookup_min]: n-gram -> the position of its last token, latest occurrence
        self._ends: list[dict[tuple[int, ...], int]] = [{} for _ in range(lookup_min, lookup_max + 1)]
        self._indexed = 0  # the n-grams ending before this position are in _ends

    def propose(self, token_ids: Sequence[int], k: int) -> list[int]:
        """Up to k proposed next tokens, or [] when no suffix of length lookup_min..lookup_max recurs
        earlier in token_ids (the same answer as `propose_ngram`)."""
        num = len(token_ids)
        if num < self._indexed:  # not the sequence this index has seen: start over
            self._ends = [{} for _ in self._ends]
            self._indexed = 0
        lo = self.lookup_min
        # an occurrence must end before the last token (the suffix itself ends there)
        for end in range(self._indexed, num - 1):
            for n in range(lo, min(self.lookup_max, end + 1) + 1):
                self._ends[n - lo][tuple(token_ids[end - n + 1 : end + 1])] = end
        self._indexed = max(self._indexed, num - 1)
        if k < 1:
            return []
        for n in range(min(self.lookup_max, num - 1), lo - 1, -1):
            end = self._ends[n - lo].get(tuple(token_ids[num - n :]))
            if end is not None:
                return _continuation(token_ids, end + 1, k)
        return []


def propose_ngram(token_ids: Sequence[int], k: int, lookup_min: int, lookup_max: int) -> list[int]:
    """Up to k proposed next tokens, or [] when no suffix of length lookup_min..lookup_max recurs."""
    return NgramIndex(lookup_min, lookup_max).propose(token_ids, k)


def _continuation(tokens: Sequence[int], begin: int, k: int) -> list[int]:
    """k tokens copied from `begin` on; a copy that reaches the end goes on through its own output, so
    a periodic tail (the match overlapping the suffix) yields a full proposal."""
    out: list[int] = []
    num = len(tokens)
    for j in range(k):
        src = begin + j
        out.append(tokens[src] if src < num else out[src - num])
    return out
