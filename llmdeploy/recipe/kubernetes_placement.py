"""Pod placement and lifecycle fields every Kubernetes-backed target section shares: tolerations,
the model-cache volume, probe timing. Their own module, so platform sections reuse them without
importing the `Target` union that lists those sections."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from llmdeploy.recipe.field_types import INT32_MAX, ObjectName
from llmdeploy.recipe.serving_schema import Section


class Toleration(Section):
    key: str = Field(description="taint key, e.g. nvidia.com/gpu")
    operator: Literal["Exists", "Equal"] = "Exists"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None


class ModelCache(Section):
    size_gib: float | None = Field(
        default=None, gt=0, le=2**30, allow_inf_nan=False, description="default: weights size x 1.5"
    )
    storage_class: ObjectName | None = Field(
        default=None, description="storage class of the model-cache volume claim"
    )
    existing_claim: ObjectName | None = Field(
        default=None, description="use this existing PersistentVolumeClaim instead of creating one"
    )


class Probes(Section):
    startup_budget_s: int | None = Field(
        default=None, ge=10, le=INT32_MAX, description="default: derived from weight size"
    )
    period_s: int = Field(default=10, ge=1, le=INT32_MAX, description="seconds between probes")
