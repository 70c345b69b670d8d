"""N-gram (prompt lookup) proposals: continue the sequence the way it continued last time.

Plain Python, no torch. The last n tokens (n from prompt_lookup_max down to prompt_lookup_min,
longest first) are searched for earlier in the prompt + generated tokens; at the most recent earlier
occurrence, the k tokens that followed it are the proposal (a copy that runs into the end of the
sequence continues through what it has copied, as a periodic sequence would). The proposal is deterministic, so
the rejection sampler treats its distribution as one-hot.
"""

from __future__ import annotations

from collections.abc import Sequence


def propose_ngram(token_ids: Sequence[int], k: int, lookup_min: int, lookup_max: int) -> list[int]:
    """Up to k proposed next tokens, or [] when no suffix of length lookup_min..lookup_max recurs."""
    assert 1 <= lookup_min <= lookup_max
    num = len(token_ids)
    if k < 1 or num < lookup_min + 1:
        return []
    tokens = list(token_ids)
    for n in range(min(lookup_max, num - 1), lookup_min - 1, -1):
        suffix = tokens[num - n :]
        first = suffix[0]
        # an occurrence must end before the suffix starts being the sequence's own end
        start = num - n - 1
        while start >= 0:
            try:
                start = _rindex(tokens, first, start)
            except ValueError:
                break
            if tokens[start : start + n] == suffix:
                return _continuation(tokens, start + n, k)
            start -= 1
    return []


def _continuation(tokens: list[int], begin: int, k: int) -> list[int]:
    """k tokens copied from `begin` on; a copy that reaches the end goes on through its own output, so
    a periodic tail (the match overlapping the suffix) yields a full proposal."""
    out: list[int] = []
    num = len(tokens)
    for j in range(k):
        src = begin + j
        out.append(tokens[src] if src < num else out[src - num])
    return out


def _rindex(tokens: list[int], value: int, last: int) -> int:
    """Largest i <= last with tokens[i] == value (ValueError if none)."""
    for i in range(last, -1, -1):
        if tokens[i] == value:
            return i
    raise ValueError(value)
