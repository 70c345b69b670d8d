"""OpenAI request bodies, parsed once at the border.

Unknown fields are ignored (as vLLM does), so clients that send newer OpenAI fields keep working;
fields we know but cannot honour (tools, logit_bias, suffix, best_of > n, non-text response_format)
are refused with 400 rather than silently dropped.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, model_validator

NonNegInt = Annotated[StrictInt, Field(ge=0)]
StopField = str | list[str] | None


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


class StreamOptions(_Body):
    include_usage: bool = False


class _SamplingFields(_Body):
    """Fields shared by both endpoints, including vLLM's extras."""

    model: str | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    n: int = Field(default=1, ge=1, le=128)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: StopField = None
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1)
    presence_penalty: float = Field(default=0.0, ge=-2, le=2)
    frequency_penalty: float = Field(default=0.0, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # vLLM extras
    top_k: int | None = Field(default=None, ge=-1)
    min_p: float | None = Field(default=None, ge=0, le=1)
    repetition_penalty: float | None = Field(default=None, gt=0)
    ignore_eos: bool = False
    min_tokens: int = Field(default=0, ge=0)
    stop_token_ids: list[NonNegInt] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True

    @model_validator(mode="after")
    def _supported(self) -> _SamplingFields:
        if self.logit_bias:
            raise ValueError("logit_bias is not supported by this server")
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed together with stream=true")
        if isinstance(self.stop, list) and len(self.stop) > 16:
            raise ValueError("at most 16 stop sequences are allowed")
        return self

    def sampling_kwargs(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "n": self.n,
            "temperature": 1.0 if self.temperature is None else self.temperature,
            "top_p": 1.0 if self.top_p is None else self.top_p,
            "top_k": -1 if self.top_k is None else self.top_k,
            "min_p": 0.0 if self.min_p is None else self.min_p,
            "seed": self.seed,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "repetition_penalty": 1.0 if self.repetition_penalty is None else self.repetition_penalty,
            "stop": self.stop,
            "stop_token_ids": self.stop_token_ids,
            "ignore_eos": self.ignore_eos,
            "min_tokens": self.min_tokens,
            "include_stop_str_in_output": self.include_stop_str_in_output,
            "skip_special_tokens": self.skip_special_tokens,
        }
        return out

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


PromptField = str | list[StrictInt] | list[str] | list[list[StrictInt]]


class CompletionRequest(_SamplingFields):
    prompt: PromptField
    max_tokens: int | None = Field(default=16, ge=1)
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False
    best_of: int | None = Field(default=None, ge=1)
    suffix: str | None = None

    @model_validator(mode="after")
    def _completion_supported(self) -> CompletionRequest:
        if self.suffix:
            raise ValueError("suffix is not supported by this server")
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError("best_of different from n is not supported by this server")
        if isinstance(self.prompt, list) and not self.prompt:
            raise ValueError("prompt must not be empty")
        if self.echo and self.logprobs is not None:
            raise ValueError("echo together with logprobs is not supported (no prompt logprobs)")
        return self

    def prompts(self) -> list[str | list[int]]:
        """The prompt field as a list of prompts (text or token ids)."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if all(isinstance(x, int) for x in p):
            return [[int(x) for x in p]]  # type: ignore[union-attr]
        return list(p)  # type: ignore[arg-type]


class TextPart(_Body):
    type: Literal["text"]
    text: str


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ResponseFormat(_Body):
    type: str


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    response_format: ResponseFormat | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False

    @model_validator(mode="after")
    def _chat_supported(self) -> ChatCompletionRequest:
        if self.tools:
            raise ValueError("tools are not supported by this server")
        if self.tool_choice not in (None, "none", "auto"):
            raise ValueError("tool_choice is not supported by this server")
        if self.response_format is not None and self.response_format.type != "text":
            raise ValueError(f"response_format {self.response_format.type!r} is not supported (only 'text')")
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs=true")
        return self

    @property
    def completion_budget(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None
