"""TGI request bodies (`{"inputs", "parameters", "stream"}`), parsed once at the border.

Unknown fields are ignored; known TGI features this engine lacks (watermark, adapters, typical_p < 1,
best_of > 1) are refused with 400. `grammar` is TGI's `{"type": "json" | "regex", "value": ...}`
(a JSON schema as an object or its text; a regular expression), served through structured outputs.
"""

from __future__ import annotations

from typing import Any, Literal

from llmdeploy_engine.sampling_params import StructuredOutputsParams
from pydantic import BaseModel, ConfigDict, Field, model_validator

# TGI's default when max_new_tokens is not given (its router's long-standing default).
DEFAULT_MAX_NEW_TOKENS = 100


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


class TGIGrammar(_Body):
    type: Literal["json", "regex"]
    value: dict[str, Any] | str

    def constraint(self) -> StructuredOutputsParams:
        """ValueError for a value of the wrong kind."""
        if self.type == "json":
            return StructuredOutputsParams.from_json_schema(self.value)
        if not isinstance(self.value, str):
            raise ValueError("grammar of type regex needs a string value")
        return StructuredOutputsParams(regex=self.value)


class TGIParameters(_Body):
    best_of: int | None = Field(default=None, ge=1)
    decoder_input_details: bool = False
    details: bool = False
    do_sample: bool = False
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    grammar: TGIGrammar | None = None
    max_new_tokens: int | None = Field(default=None, ge=1)
    repetition_penalty: float | None = Field(default=None, gt=0)
    return_full_text: bool | None = None
    seed: int | None = Field(default=None, ge=0, le=2**63 - 1)
    stop: list[str] = Field(default_factory=list, max_length=16)
    temperature: float | None = Field(default=None, gt=0)
    top_k: int | None = Field(default=None, gt=0)
    top_n_tokens: int | None = Field(default=None, ge=0, le=5)
    top_p: float | None = Field(default=None, gt=0, le=1)
    truncate: int | None = Field(default=None, ge=1)
    typical_p: float | None = Field(default=None, gt=0, le=1)
    watermark: bool = False
    adapter_id: str | None = None

    @model_validator(mode="after")
    def _supported(self) -> TGIParameters:
        if self.watermark:
            raise ValueError("watermark is not supported by this server")
        if self.adapter_id:
            raise ValueError("adapter_id is not supported by this server")
        if self.typical_p is not None and self.typical_p < 1:
            raise ValueError("typical_p is not supported by this server")
        if self.best_of is not None and self.best_of > 1:
            raise ValueError("best_of > 1 is not supported by this server")
        return self

    @property
    def sampling(self) -> bool:
        # TGI samples when asked to, or when any sampling warper is set.
        return self.do_sample or any(
            (
                self.temperature is not None and self.temperature != 1.0,
                self.top_k is not None,
                self.top_p is not None and self.top_p < 1.0,
            )
        )

    def sampling_kwargs(self) -> dict[str, Any]:
        sampling = self.sampling
        return {
            "temperature": (self.temperature if self.temperature is not None else 1.0) if sampling else 0.0,
            "top_p": self.top_p if sampling and self.top_p is not None else 1.0,
            "top_k": self.top_k if sampling and self.top_k is not None else -1,
            "seed": self.seed,
            "repetition_penalty": self.repetition_penalty if self.repetition_penalty is not None else 1.0,
            "frequency_penalty": self.frequency_penalty or 0.0,
            "stop": list(self.stop) or None,
            "logprobs": self.top_n_tokens or 0,
        }


class TGIRequest(_Body):
    inputs: str = Field(min_length=1)
    parameters: TGIParameters = Field(default_factory=TGIParameters)
    stream: bool = False
