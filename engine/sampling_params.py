"""Per-request sampling settings, shaped like vLLM's `SamplingParams` so user code moves over."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import Any


class RequestOutputKind(enum.Enum):
    """What each RequestOutput of a request carries (vLLM's names).

    CUMULATIVE: everything generated so far, every step. DELTA: only what is new since the request's
    previous output. FINAL_ONLY: one output, when the request finishes (the engine then skips per-step
    outputs and, without stop strings, decodes the text once at the end).
    """

    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


@dataclass(frozen=True)
class StructuredOutputsParams:
    """One constraint on a request's output (vLLM's `StructuredOutputsParams`; exactly one field set).

    json: a JSON schema, as JSON text (`from_json_schema` accepts a dict); json_object: any JSON
    object; regex: a regular expression the whole output matches; choice: the output is exactly one
    of these strings; grammar: an EBNF grammar (xgrammar's dialect, GBNF-like, rule `root`);
    structural_tag: xgrammar's structural-tag JSON."""

    json: str | None = None
    json_object: bool = False
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None
    structural_tag: str | None = None  # xgrammar's structural-tag JSON (forced tool calls: tool_calls.py)

    def __post_init__(self) -> None:
        given = [
            name
            for name, value in (
                ("json", self.json),
                ("json_object", self.json_object or None),
                ("regex", self.regex),
                ("choice", self.choice),
                ("grammar", self.grammar),
                ("structural_tag", self.structural_tag),
            )
            if value is not None
        ]
        if len(given) != 1:
            raise ValueError(
                "give exactly one structured output constraint (json, json_object, regex, choice or "
                f"grammar); got {', '.join(given) or 'none'}"
            )
        if self.choice is not None and not self.choice:
            raise ValueError("choice must list at least one string")

    @classmethod
    def from_json_schema(cls, schema: Any) -> StructuredOutputsParams:
        """From a schema given as a dict or as JSON text (a cache key: the same schema, one text)."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as e:
                raise ValueError(f"the JSON schema is not valid JSON: {e}") from e
        if not isinstance(schema, dict):
            raise ValueError(f"a JSON schema must be an object, got {type(schema).__name__}")
        # key order kept: xgrammar writes properties in the order the schema lists them
        return cls(json=json.dumps(schema, ensure_ascii=False))

    @property
    def kind(self) -> str:
        for name in ("json", "regex", "choice", "grammar", "structural_tag"):
            if getattr(self, name) is not None:
                return name
        return "json_object"


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 (or 0): off
    min_p: float = 0.0
    seed: int | None = None
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    max_tokens: int | None = 16  # None: up to max_model_len
    min_tokens: int = 0
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    logprobs: int | None = None  # number of top logprobs per generated token (0: only the chosen token)
    skip_special_tokens: bool = True
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    # a constraint on the output (structured_output.py); None: free text
    structured_outputs: StructuredOutputsParams | None = None
    stop_strings: list[str] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        if self.stop is None:
            self.stop_strings = []
        elif isinstance(self.stop, str):
            self.stop_strings = [self.stop]
        else:
            self.stop_strings = list(self.stop)
        if self.top_k == 0:
            self.top_k = -1
        self.verify()

    def verify(self) -> None:
        """Raise ValueError with a user-facing message for out-of-range values."""
        if self.n < 1:
            raise ValueError(f"n must be at least 1, got {self.n}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be non-negative, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1 (disable) or at least 1, got {self.top_k}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be positive, got {self.repetition_penalty}")
        if not -2 <= self.presence_penalty <= 2:
            raise ValueError(f"presence_penalty must be in [-2, 2], got {self.presence_penalty}")
        if not -2 <= self.frequency_penalty <= 2:
            raise ValueError(f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens must be non-negative, got {self.min_tokens}")
        if not isinstance(self.output_kind, RequestOutputKind):
            raise ValueError(f"output_kind must be a RequestOutputKind, got {self.output_kind!r}")
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            raise ValueError(f"logprobs must be in [0, 20], got {self.logprobs}")

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-5

    @property
    def needs_token_history(self) -> bool:
        """Whether sampling reads the sequence's tokens (penalties, min_tokens masking)."""
        return (
            self.repetition_penalty != 1.0
            or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
            or self.min_tokens > 0
        )
