"""`speculative_config`, with vLLM's keys: `{"method": "ngram", "num_speculative_tokens": k,
"prompt_lookup_max": M, "prompt_lookup_min": m}` or `{"model": "<draft>", "num_speculative_tokens": k}`.

Parsed once at the border into a frozen value; plain Python, no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

METHODS = ("ngram", "draft_model")
MAX_SPECULATIVE_TOKENS = 32
_KEYS = {"method", "model", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min"}
# vLLM's default n-gram window when neither bound is given
_DEFAULT_LOOKUP = 5


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str  # ngram | draft_model
    num_speculative_tokens: int
    prompt_lookup_max: int = _DEFAULT_LOOKUP  # ngram: longest suffix matched
    prompt_lookup_min: int = _DEFAULT_LOOKUP  # ngram: shortest suffix matched
    model: str | None = None  # draft_model: GGUF file, checkpoint folder or random:<catalog id>

    def __post_init__(self) -> None:
        problems = []
        if self.method not in METHODS:
            problems.append(f"method {self.method!r} is not supported; use one of {', '.join(METHODS)}")
        k = self.num_speculative_tokens
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= MAX_SPECULATIVE_TOKENS:
            problems.append(
                f"num_speculative_tokens must be an integer in 1..{MAX_SPECULATIVE_TOKENS}, got {k!r}"
            )
        if self.method == "ngram":
            lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
            for name, v in (("prompt_lookup_min", lo), ("prompt_lookup_max", hi)):
                if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                    problems.append(f"{name} must be an integer >= 1, got {v!r}")
            if isinstance(lo, int) and isinstance(hi, int) and lo > hi:
                problems.append(f"prompt_lookup_min ({lo}) exceeds prompt_lookup_max ({hi})")
            if self.model is not None:
                problems.append("model is only used with method draft_model (drop it for ngram)")
        if self.method == "draft_model" and not (isinstance(self.model, str) and self.model):
            problems.append("method draft_model needs model (a GGUF file, checkpoint folder or random:<id>)")
        if problems:
            raise ValueError("speculative_config: " + "; ".join(problems))

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> SpeculativeConfig:
        """Build from vLLM-style keys; "method" defaults to draft_model when a "model" is given."""
        if not isinstance(raw, Mapping):
            raise ValueError(f"speculative_config must be a mapping (JSON object), got {type(raw).__name__}")
        unknown = sorted(set(raw) - _KEYS)
        if unknown:
            raise ValueError(
                f"speculative_config: unknown keys {unknown}; the built-in engine reads {sorted(_KEYS)}"
            )
        method = raw.get("method") or ("draft_model" if raw.get("model") else None)
        if method is None:
            raise ValueError('speculative_config needs "method": "ngram" or a draft "model"')
        if "num_speculative_tokens" not in raw:
            raise ValueError("speculative_config needs num_speculative_tokens")
        lo, hi = raw.get("prompt_lookup_min"), raw.get("prompt_lookup_max")
        if method == "ngram":
            lo = hi if lo is None else lo
            hi = lo if hi is None else hi
        elif lo is not None or hi is not None:
            raise ValueError("speculative_config: prompt_lookup_min/max are only used with method ngram")
        return cls(
            method=str(method),
            num_speculative_tokens=raw["num_speculative_tokens"],
            prompt_lookup_max=_DEFAULT_LOOKUP if hi is None else hi,
            prompt_lookup_min=_DEFAULT_LOOKUP if lo is None else lo,
            model=raw.get("model"),
        )


def parse_speculative_config(value: SpeculativeConfig | Mapping[str, Any] | None) -> SpeculativeConfig | None:
    if value is None or isinstance(value, SpeculativeConfig):
        return value
    return SpeculativeConfig.from_dict(value)
