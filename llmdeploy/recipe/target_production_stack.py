"""The recipe's `target` section for vLLM production-stack: a values.yaml for its vllm-stack Helm chart."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from llmdeploy.recipe.field_types import ObjectName
from llmdeploy.recipe.target_platform_fields import PlatformSection

CHART_VERSION = "0.1.12"


class ProductionStackTarget(PlatformSection):
    type: Literal["production-stack"]
    pvc_storage_gib: float | None = Field(
        default=None,
        gt=0,
        le=2**30,
        allow_inf_nan=False,
        description="model-cache volume per model; default: weights size x 1.5",
    )
    storage_class: ObjectName | None = Field(default=None, description="storage class of that volume")
