"""Prompts of a chosen token length, made from a list of common English words.

Most of these words are one token in Llama, Qwen and Mistral vocabularies once a space precedes them;
the exact ratio is measured against the endpoint (`PromptCalibration`) and the real prompt length is
always read back from the response's `usage` field.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import cache
from importlib import resources


@cache
def word_list() -> tuple[str, ...]:
    text = resources.files("llmdeploy.bench").joinpath("words.txt").read_text(encoding="utf-8")
    return tuple(w for w in text.split() if w)


def random_words(num_words: int, rng: random.Random) -> str:
    words = word_list()
    return " ".join(rng.choice(words) for _ in range(max(1, num_words)))


@dataclass(frozen=True)
class PromptCalibration:
    """prompt_tokens ~= overhead_tokens + tokens_per_word x words, fitted from two probe requests."""

    overhead_tokens: float = 0.0
    tokens_per_word: float = 1.0
    measured: bool = False

    def words_for(self, num_tokens: int) -> int:
        return max(1, round((num_tokens - self.overhead_tokens) / self.tokens_per_word))

    @classmethod
    def fit(cls, short: tuple[int, int], long: tuple[int, int]) -> PromptCalibration:
        """From two (words, prompt_tokens) points; falls back to 1 token per word on nonsense input."""
        (w1, t1), (w2, t2) = short, long
        if w2 == w1 or t2 <= t1:
            return cls()
        slope = (t2 - t1) / (w2 - w1)
        return cls(overhead_tokens=max(0.0, t1 - slope * w1), tokens_per_word=slope, measured=True)
