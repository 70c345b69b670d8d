"""The recipe's `target` section for KubeAI: one Model object (kubeai.org/v1).

KubeAI places the pods itself (node selector, tolerations and GPU count come from the named
resource profile of its install), so the section has no pod placement of its own.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from llmdeploy.recipe.field_types import INT32_MAX, DnsLabel, LabelValue, ObjectName, UserLabelKey
from llmdeploy.recipe.kubernetes_placement import Probes
from llmdeploy.recipe.kubernetes_values import Annotations
from llmdeploy.recipe.serving_schema import Section


class KubeAIAutoscaling(Section):
    min_replicas: int = Field(default=1, ge=0, le=INT32_MAX, description="fewest pods (0 scales to zero)")
    max_replicas: int = Field(default=4, ge=1, le=INT32_MAX, description="most pods")
    target_requests: int = Field(
        default=100, ge=1, le=INT32_MAX, description="active requests per pod KubeAI's autoscaler aims for"
    )

    @model_validator(mode="after")
    def _min_le_max(self) -> KubeAIAutoscaling:
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"autoscaling.min_replicas ({self.min_replicas}) exceeds max_replicas ({self.max_replicas})"
            )
        return self


class KubeAITarget(Section):
    type: Literal["kubeai"]
    namespace: DnsLabel = Field(default="default", description="namespace of the Model")
    image: str | None = Field(default=None, description="engine image; default: the engine's pinned image")
    resource_profile: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        description="a resource profile of your KubeAI install, e.g. nvidia-gpu-l4 (the count is the "
        "GPUs per pod); default: cpu on a CPU recipe",
    )
    cache_profile: ObjectName | None = Field(
        default=None, description="a KubeAI cache profile to keep the weights on shared storage"
    )
    autoscaling: KubeAIAutoscaling | None = Field(
        default=None, description="let KubeAI scale on active requests; omit for parallelism.replicas pods"
    )
    probes: Probes = Field(default_factory=Probes)
    labels: dict[UserLabelKey, LabelValue] = Field(
        default_factory=dict, description="extra labels on the Model"
    )
    annotations: Annotations = Field(default_factory=dict, description="extra annotations on the Model")
