"""What one benchmark run asks for: load shape, lengths, warm-up and SLOs.

Built once from a recipe's `bench` section or from CLI flags; everything downstream reads this frozen
value. Names follow vLLM's serving benchmark (`num_prompts` is `num_requests` here, `max_concurrency`
is one entry of `concurrency`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from llmdeploy.recipe.schema import BenchSection, LengthRange, SLOs

Endpoint = Literal["completions", "chat"]


@dataclass(frozen=True)
class LengthSpec:
    """A token length, fixed (min == max) or drawn uniformly from [min, max]."""

    min_tokens: int
    max_tokens: int

    def __post_init__(self) -> None:
        if not 1 <= self.min_tokens <= self.max_tokens:
            raise ValueError(
                f"length range must satisfy 1 <= min <= max, got {self.min_tokens}..{self.max_tokens}"
            )

    @classmethod
    def parse(cls, value: int | str | LengthRange) -> LengthSpec:
        """Accept 128, "128", "64:256" (a uniform range) or a recipe `LengthRange`."""
        if isinstance(value, LengthRange):
            return cls(value.min, value.max)
        if isinstance(value, int):
            return cls(value, value)
        low, sep, high = value.partition(":")
        if not sep:
            return cls(int(low), int(low))
        return cls(int(low), int(high))

    @property
    def fixed(self) -> bool:
        return self.min_tokens == self.max_tokens

    def __str__(self) -> str:
        return str(self.min_tokens) if self.fixed else f"{self.min_tokens}:{self.max_tokens}"


@dataclass(frozen=True)
class BenchOptions:
    num_requests: int = 64
    concurrency: tuple[int, ...] = (1, 8)
    request_rate: float | None = None  # Poisson arrivals per second; None: send as fast as concurrency allows
    input_len: LengthSpec = field(default_factory=lambda: LengthSpec(128, 128))
    output_len: LengthSpec = field(default_factory=lambda: LengthSpec(128, 128))
    dataset: str | None = None  # JSONL file: {"prompt": ..., "output_len": optional}
    ignore_eos: bool = True
    warmup_requests: int = 2
    seed: int = 0
    endpoint: Endpoint = "completions"
    api_key: str | None = None
    request_timeout_s: float = 600.0
    slo: SLOs = field(default_factory=SLOs)

    def __post_init__(self) -> None:
        if self.num_requests < 1:
            raise ValueError(f"num_requests must be at least 1, got {self.num_requests}")
        if not self.concurrency or min(self.concurrency) < 1:
            raise ValueError(f"concurrency levels must be at least 1, got {list(self.concurrency)}")
        if self.request_rate is not None and self.request_rate <= 0:
            raise ValueError(f"request_rate must be positive, got {self.request_rate}")

    @classmethod
    def from_section(cls, section: BenchSection, **overrides: object) -> BenchOptions:
        """Options from a recipe's `bench` section; keyword overrides (CLI flags) win when not None."""
        values: dict[str, object] = {
            "num_requests": section.num_requests,
            "concurrency": tuple(section.concurrency),
            "request_rate": section.request_rate,
            "input_len": LengthSpec.parse(section.input_len),
            "output_len": LengthSpec.parse(section.output_len),
            "dataset": section.dataset,
            "ignore_eos": section.ignore_eos,
            "warmup_requests": section.warmup_requests,
            "seed": section.seed,
            "slo": section.slo,
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)  # type: ignore[arg-type]
