"""The recipe's `target` section for llm-d: the model-server Deployment behind an InferencePool
(inference.networking.k8s.io/v1) and the llm-d router's endpoint picker (EPP) with its config."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from llmdeploy.recipe.kubernetes_placement import ModelCache
from llmdeploy.recipe.target_platform_fields import PlatformSection

EPP_IMAGE = "ghcr.io/llm-d/llm-d-router-endpoint-picker:v0.9.0"


class LlmDTarget(PlatformSection):
    type: Literal["llm-d"]
    model_cache: ModelCache = Field(default_factory=ModelCache)
    epp_image: str = Field(default=EPP_IMAGE, description="the llm-d router's endpoint-picker image")
    failure_mode: Literal["FailOpen", "FailClose"] = Field(
        default="FailOpen",
        description="what the gateway does when the endpoint picker does not answer (InferencePool)",
    )
