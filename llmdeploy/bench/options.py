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
Workload = Literal["random", "shared-prefix", "multi-turn"]
WORKLOADS: tuple[Workload, ...] = ("random", "shared-prefix", "multi-turn")


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
    # Poisson arrivals per second, one sweep point per rate and concurrency; empty: as fast as
    # concurrency allows
    request_rates: tuple[float, ...] = ()
    input_len: LengthSpec = field(default_factory=lambda: LengthSpec(128, 128))
    output_len: LengthSpec = field(default_factory=lambda: LengthSpec(128, 128))
    # JSONL file, one {"prompt": ..., "output_len": optional} or ShareGPT {"conversations": [...]} a line
    dataset: str | None = None
    workload: Workload = "random"  # generated requests when no dataset is given
    num_prefixes: int = 4  # shared-prefix: N prefixes ...
    suffixes_per_prefix: int = 8  # ... x M suffixes (input_len tokens each)
    prefix_len: int = 256  # shared-prefix: tokens of each prefix
    num_turns: int = 4  # multi-turn: user turns per session, each resending the history
    override_dataset_output_len: bool = False  # output_len beats the lengths a dataset file gives
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
        if any(not rate > 0 for rate in self.request_rates):
            raise ValueError(f"request rates must be positive, got {list(self.request_rates)}")
        if self.dataset is not None and self.workload != "random":
            raise ValueError(
                f"a dataset file replaces the generated workload; drop --workload {self.workload}"
            )
        if self.workload == "multi-turn" and self.endpoint != "chat":
            raise ValueError("the multi-turn workload resends a chat history: use --endpoint chat")
        counts = {
            "num_prefixes": self.num_prefixes,
            "suffixes_per_prefix": self.suffixes_per_prefix,
            "prefix_len": self.prefix_len,
            "num_turns": self.num_turns,
        }
        for name, value in counts.items():
            if value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")

    @property
    def points(self) -> tuple[tuple[int, float | None], ...]:
        """The sweep: (max concurrency, request rate or None), every concurrency at every rate."""
        rates: tuple[float | None, ...] = self.request_rates or (None,)
        return tuple((c, r) for r in rates for c in self.concurrency)

    @classmethod
    def from_section(cls, section: BenchSection, **overrides: object) -> BenchOptions:
        """Options from a recipe's `bench` section; keyword overrides (CLI flags) win when not None."""
        values: dict[str, object] = {
            "num_requests": section.num_requests,
            "concurrency": tuple(section.concurrency),
            "request_rates": () if section.request_rate is None else (section.request_rate,),
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
