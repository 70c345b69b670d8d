"""The recipe's `target` section for KServe: one LLMInferenceService (serving.kserve.io/v1alpha2)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from llmdeploy.recipe.target_platform_fields import PlatformSection


class KServeTarget(PlatformSection):
    type: Literal["kserve"]
    model_uri: str | None = Field(
        default=None,
        description="where KServe's storage initializer fetches the weights (hf://, s3://, pvc://, ...); "
        "default: hf://<model.id>",
    )
    router: bool = Field(
        default=True,
        description="let KServe manage the route, gateway and scheduler (the llm-d endpoint picker); "
        "false: the workload and its Service only",
    )
