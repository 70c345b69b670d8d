"""Fields every serving-platform target section shares: where its objects go and how its pods are
placed. Kubernetes-shaped fragments keep Kubernetes' field names."""

from __future__ import annotations

from pydantic import Field

from llmdeploy.recipe.field_types import DnsLabel, LabelKey, LabelValue, UserLabelKey
from llmdeploy.recipe.kubernetes_placement import Probes, Toleration
from llmdeploy.recipe.kubernetes_values import Annotations
from llmdeploy.recipe.serving_schema import Section


class PlatformSection(Section):
    namespace: DnsLabel = Field(default="default", description="namespace of every object")
    image: str | None = Field(default=None, description="engine image; default: the engine's pinned image")
    node_selector: dict[LabelKey, LabelValue] = Field(
        default_factory=dict,
        description="pod nodeSelector, e.g. {nvidia.com/gpu.product: NVIDIA-A100-SXM4-80GB}",
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, description="pod tolerations, e.g. for tainted GPU nodes"
    )
    probes: Probes = Field(default_factory=Probes)
    labels: dict[UserLabelKey, LabelValue] = Field(
        default_factory=dict, description="extra labels on every object"
    )
    annotations: Annotations = Field(default_factory=dict, description="extra annotations on every object")
