"""The recipe's `smoke` and `bench` sections: the checks run against a started endpoint."""

from __future__ import annotations

from pydantic import Field, model_validator

from llmdeploy.recipe.field_types import (
    COUNT_MAX,
    INT32_MAX,
    Count,
)
from llmdeploy.recipe.serving_schema import (
    Section,
)


class SmokePrompt(Section):
    prompt: str | None = Field(default=None, description="a completion prompt (/v1/completions)")
    messages: list[dict[str, str]] | None = Field(
        default=None, description="chat messages [{role, content}] (/v1/chat/completions)"
    )
    expect: list[str] = Field(default_factory=list, description="substrings the reply must contain")
    max_tokens: int = Field(default=32, ge=1, le=COUNT_MAX, description="tokens to generate")

    @model_validator(mode="after")
    def _one_input(self) -> SmokePrompt:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of prompt and messages")
        return self


class SmokeSection(Section):
    startup_timeout_s: int = Field(
        default=900, ge=1, le=INT32_MAX, description="how long to wait for /health"
    )
    prompts: list[SmokePrompt] = Field(
        default_factory=list, description="prompts sent after start-up, each with expected substrings"
    )
    kv_tolerance: float = Field(
        default=0.10,
        ge=0,
        le=100,
        allow_inf_nan=False,
        description="warn when actual KV tokens differ by more",
    )


class LengthRange(Section):
    min: int = Field(ge=1, le=COUNT_MAX, description="shortest, in tokens")
    max: int = Field(ge=1, le=COUNT_MAX, description="longest, in tokens")

    @model_validator(mode="after")
    def _min_le_max(self) -> LengthRange:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) exceeds max ({self.max})")
        return self


class SLOs(Section):
    p99_ttft_ms: float | None = Field(
        default=None, gt=0, le=1e9, allow_inf_nan=False, description="99th percentile time to first token"
    )
    p99_tpot_ms: float | None = Field(
        default=None, gt=0, le=1e9, allow_inf_nan=False, description="99th percentile time per output token"
    )
    p99_itl_ms: float | None = Field(
        default=None, gt=0, le=1e9, allow_inf_nan=False, description="99th percentile inter-token latency"
    )
    p99_e2el_ms: float | None = Field(
        default=None, gt=0, le=1e9, allow_inf_nan=False, description="99th percentile end-to-end latency"
    )
    min_output_tok_s: float | None = Field(
        default=None,
        gt=0,
        le=1e9,
        allow_inf_nan=False,
        description="lowest acceptable output throughput, tokens/s",
    )
    max_failed_fraction: float = Field(
        default=0.0,
        ge=0,
        le=1,
        allow_inf_nan=False,
        description="highest acceptable fraction of failed requests",
    )


class BenchSection(Section):
    num_requests: int = Field(default=64, ge=1, le=COUNT_MAX, description="requests per concurrency level")
    concurrency: list[Count] = Field(default_factory=lambda: [1, 8], min_length=1, description="a sweep")
    request_rate: float | None = Field(
        default=None,
        gt=0,
        le=1_000_000,
        allow_inf_nan=False,
        description="Poisson arrivals per second instead",
    )
    input_len: Count | LengthRange = Field(default=128, description="prompt tokens: a number or {min, max}")
    output_len: Count | LengthRange = Field(default=128, description="output tokens: a number or {min, max}")
    dataset: str | None = Field(default=None, description="JSONL file of prompts")
    ignore_eos: bool = Field(
        default=True,
        description="keep generating past end-of-sequence so every request has output_len tokens",
    )
    warmup_requests: int = Field(
        default=2, ge=0, le=COUNT_MAX, description="requests sent first and not measured"
    )
    seed: int = Field(
        default=0, ge=-(2**63), le=2**63 - 1, description="seed of the prompt and arrival generator"
    )
    slo: SLOs = Field(default_factory=SLOs)
