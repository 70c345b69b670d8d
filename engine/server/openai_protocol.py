"""OpenAI request bodies, parsed once at the border.

Unknown fields are ignored (as vLLM does), so clients that send newer OpenAI fields keep working;
fields we know but cannot honour (logit_bias, suffix, best_of > n) are refused with 400 rather than
silently dropped.

Structured outputs come as OpenAI's `response_format` (`json_object`, `json_schema`), vLLM's
`structured_outputs` object (`json`, `regex`, `choice`, `grammar`, `json_object`) or its older
`guided_json` / `guided_regex` / `guided_choice` / `guided_grammar` extras; at most one constraint a
request (`structured_outputs_params`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from llmdeploy_engine.sampling_params import StructuredOutputsParams
from pydantic import BaseModel, ConfigDict, Field, StrictInt, model_validator

NonNegInt = Annotated[StrictInt, Field(ge=0)]
StopField = str | list[str] | None


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


class StreamOptions(_Body):
    include_usage: bool = False


class JsonSchemaFormat(_Body):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, populate_by_name=True)

    name: str | None = None
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None  # the schema is always enforced (through the grammar), strict or not


class ResponseFormat(_Body):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and (self.json_schema is None or self.json_schema.json_schema is None):
            raise ValueError("response_format json_schema needs json_schema.schema")
        return self


class StructuredOutputsField(_Body):
    """vLLM's `structured_outputs` request field."""

    json_: dict[str, Any] | str | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | None = None  # xgrammar's structural-tag JSON, as vLLM passes it on


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
    # structured outputs
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsField | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None

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

    def structured_outputs_params(self) -> tuple[StructuredOutputsParams | None, str | None]:
        """(the request's output constraint or None, the field it came from); ValueError for a bad
        or doubled one."""
        found: list[tuple[str, dict[str, Any]]] = []
        rf = self.response_format
        if rf is not None and rf.type == "json_object":
            found.append(("response_format", {"json_object": True}))
        elif rf is not None and rf.type == "json_schema":
            assert rf.json_schema is not None
            found.append(("response_format", {"json": rf.json_schema.json_schema}))
        so = self.structured_outputs
        if so is not None:
            given = {
                k: v
                for k, v in (
                    ("json", so.json_),
                    ("regex", so.regex),
                    ("choice", so.choice),
                    ("grammar", so.grammar),
                    ("structural_tag", so.structural_tag),
                )
                if v is not None
            }
            if so.json_object:
                given["json_object"] = True
            if len(given) != 1:
                raise ValueError(
                    "structured_outputs must set exactly one of json, regex, choice, grammar, json_object, "
                    "structural_tag"
                )
            found.append(("structured_outputs", given))
        for name, key in (
            ("guided_json", "json"),
            ("guided_regex", "regex"),
            ("guided_choice", "choice"),
            ("guided_grammar", "grammar"),
        ):
            value = getattr(self, name)
            if value is not None:
                found.append((name, {key: value}))
        if not found:
            return None, None
        if len(found) > 1:
            raise ValueError(
                f"give one structured output constraint, not several ({', '.join(n for n, _ in found)})"
            )
        field, spec = found[0]
        return structured_outputs_from(spec), field

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


def structured_outputs_from(spec: dict[str, Any]) -> StructuredOutputsParams:
    """One constraint, from a {kind: value} dict (json: a schema dict or its JSON text)."""
    (kind, value), *_ = spec.items()
    if kind == "json":
        return StructuredOutputsParams.from_json_schema(value)
    if kind == "choice":
        return StructuredOutputsParams(choice=tuple(value))
    return StructuredOutputsParams(**{kind: value})


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


class ToolCallFunction(_Body):
    name: str
    arguments: str = "{}"  # JSON text, as OpenAI sends it


class ToolCall(_Body):
    id: str | None = None
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool", "ipython"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant turn that called tools
    tool_call_id: str | None = None  # a tool result: the call it answers

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class FunctionDefinition(_Body):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Body):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Body):
    name: str


class NamedToolChoice(_Body):
    type: Literal["function"]
    function: NamedFunction


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False

    @model_validator(mode="after")
    def _chat_supported(self) -> ChatCompletionRequest:
        if self.tool_choice is not None and self.tool_choice != "none" and not self.tools:
            raise ValueError("tool_choice needs tools")
        if isinstance(self.tool_choice, NamedToolChoice) and self.tools:
            names = [t.function.name for t in self.tools]
            if self.tool_choice.function.name not in names:
                raise ValueError(
                    f"tool_choice names the function {self.tool_choice.function.name!r}, which is not in tools "
                    f"({', '.join(names)})"
                )
        if self.tools and len({t.function.name for t in self.tools}) != len(self.tools):
            raise ValueError("tools: two functions have the same name")
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs=true")
        return self

    @property
    def tool_mode(self) -> str:
        """none (no tools, or tool_choice none), auto, required or named."""
        if not self.tools or self.tool_choice == "none":
            return "none"
        if isinstance(self.tool_choice, NamedToolChoice):
            return "named"
        return "required" if self.tool_choice == "required" else "auto"

    @property
    def completion_budget(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None
