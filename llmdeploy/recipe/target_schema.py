"""The recipe's `target` section: a local process, a Docker Compose project or Kubernetes objects."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from llmdeploy.recipe.field_types import (
    INT32_MAX,
    DnsLabel,
    KubernetesVersion,
    LabelKey,
    LabelValue,
    ObjectName,
    UserLabelKey,
)
from llmdeploy.recipe.kubernetes_network import NetworkPolicySettings
from llmdeploy.recipe.kubernetes_patch import Patch
from llmdeploy.recipe.kubernetes_placement import ModelCache, Probes, Toleration
from llmdeploy.recipe.kubernetes_pod import (
    Container,
    EnvVar,
    NodeAffinity,
    ResourceRequirements,
    TopologySpreadConstraint,
    Volume,
    VolumeMount,
    check_pod_settings,
)
from llmdeploy.recipe.kubernetes_values import Annotations, QualifiedKey
from llmdeploy.recipe.serving_schema import (
    Section,
)


class LocalTarget(Section):
    type: Literal["local"]
    state_dir: str | None = Field(default=None, description="where pid, port and log are kept")
    llm_d_router: bool = Field(
        default=False,
        description="also render llm-d's router files for this engine: llm-d/endpoints.yaml (the "
        "router's no-Kubernetes endpoints file, naming server.host:server.port) and "
        "llm-d/epp-config.yaml (the endpoint picker reading it from /etc/epp)",
    )


class DockerTarget(Section):
    type: Literal["docker"]
    image: str | None = Field(default=None, description="container image; default: the engine's pinned image")
    shm_size_gib: float | None = Field(
        default=None,
        gt=0,
        le=65536,
        allow_inf_nan=False,
        description="shared memory for the container (tensor parallelism needs several GiB)",
    )
    llm_d_router: bool = Field(
        default=False,
        description="also render llm-d's router files for this engine: llm-d/endpoints.yaml (the "
        "router's no-Kubernetes endpoints file, naming server.host:server.port) and "
        "llm-d/epp-config.yaml (the endpoint picker reading it from /etc/epp)",
    )


class Autoscaling(Section):
    kind: Literal["hpa", "keda"] = Field(
        default="hpa", description="hpa (HorizontalPodAutoscaler) or keda (ScaledObject)"
    )
    min_replicas: int = Field(
        default=1, ge=0, le=INT32_MAX, description="fewest pods (0 lets KEDA scale to zero)"
    )
    max_replicas: int = Field(default=4, ge=1, le=INT32_MAX, description="most pods")
    metric: Literal["queue_depth", "kv_usage"] = Field(
        default="queue_depth",
        description="queue_depth: waiting requests per pod; kv_usage: KV cache usage fraction",
    )
    target: float = Field(
        default=4,
        gt=0,
        le=1_000_000,
        allow_inf_nan=False,
        description="waiting requests per pod, or KV usage fraction",
    )

    @model_validator(mode="after")
    def _min_le_max(self) -> Autoscaling:
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"autoscaling.min_replicas ({self.min_replicas}) exceeds max_replicas ({self.max_replicas})"
            )
        if self.metric == "kv_usage" and self.target > 1:
            raise ValueError(
                f"autoscaling.target ({self.target:g}) is a KV cache usage fraction for metric kv_usage: "
                "at most 1, e.g. 0.8"
            )
        return self


class KubernetesTarget(Section):
    type: Literal["kubernetes"]
    namespace: DnsLabel = Field(default="default", description="namespace of every object")
    image: str | None = Field(default=None, description="default: the engine's pinned image")
    kubernetes_version: KubernetesVersion = Field(
        default="1.30", description="cluster version the manifests are checked against"
    )
    node_selector: dict[LabelKey, LabelValue] = Field(
        default_factory=dict,
        description="pod nodeSelector, e.g. {nvidia.com/gpu.product: NVIDIA-A100-SXM4-80GB}",
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, description="pod tolerations, e.g. for tainted GPU nodes"
    )
    model_cache: ModelCache = Field(default_factory=ModelCache)
    probes: Probes = Field(default_factory=Probes)
    autoscaling: Autoscaling | None = Field(
        default=None, description="scale replicas on queue depth or KV usage; omit for a fixed count"
    )
    network_policy: NetworkPolicySettings | None = Field(
        default=None,
        description="opt-in: a NetworkPolicy admitting only allow_from to the engine's port "
        "(needs a network plugin that enforces NetworkPolicy); omit for none",
    )
    labels: dict[UserLabelKey, LabelValue] = Field(
        default_factory=dict, description="extra labels on every object (and its pods)"
    )
    service_type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = Field(
        default="ClusterIP", description="type of the Service in front of the pods"
    )
    termination_grace_period_s: int = Field(
        default=60, ge=0, le=INT32_MAX, description="seconds a pod may drain in-flight requests"
    )
    # what cluster policies ask of a pod; Kubernetes-shaped fragments keep Kubernetes' field names
    annotations: Annotations = Field(default_factory=dict, description="extra annotations on every object")
    pod_labels: dict[QualifiedKey, LabelValue] = Field(
        default_factory=dict, description="extra labels on the pods only"
    )
    pod_annotations: Annotations = Field(
        default_factory=dict, description="extra annotations on the pods only, e.g. for sidecar injection"
    )
    service_account: ObjectName | None = Field(
        default=None, description="the pods' serviceAccountName; default: the namespace's default"
    )
    automount_service_account_token: bool = Field(
        default=False,
        description="mount the service account's API token into the pods (the engine never calls the API)",
    )
    image_pull_secrets: list[ObjectName] = Field(
        default_factory=list, description="Secrets (in the namespace) for pulling from private registries"
    )
    priority_class: ObjectName | None = Field(default=None, description="the pods' priorityClassName")
    node_affinity: NodeAffinity | None = Field(
        default=None, description="Kubernetes nodeAffinity (required / preferred node selector terms)"
    )
    topology_spread: list[TopologySpreadConstraint] = Field(
        default_factory=list,
        description="Kubernetes topologySpreadConstraints; labelSelector defaults to this recipe's pods",
    )
    resources: ResourceRequirements = Field(
        default_factory=ResourceRequirements,
        description="CPU / memory requests and limits of the engine container; GPUs come from hardware",
    )
    env: list[EnvVar] = Field(
        default_factory=list, description="extra engine env in Kubernetes' shape (value or valueFrom)"
    )
    volumes: list[Volume] = Field(default_factory=list, description="extra pod volumes (Kubernetes' shape)")
    volume_mounts: list[VolumeMount] = Field(
        default_factory=list, description="mounts of the engine container: target.volumes, model-cache, tmp"
    )
    sidecars: list[Container] = Field(
        default_factory=list, description="extra containers next to the engine (Kubernetes' shape)"
    )
    init_containers: list[Container] = Field(
        default_factory=list, description="containers run before the engine starts (Kubernetes' shape)"
    )
    patches: list[Patch] = Field(
        default_factory=list,
        description="kustomize-style patches of the rendered objects: strategic merge or JSON 6902",
    )

    @model_validator(mode="after")
    def _pod_settings(self) -> KubernetesTarget:
        check_pod_settings(
            label_sets={"labels": self.labels, "pod_labels": self.pod_labels},
            resources=self.resources,
            volumes=self.volumes,
            volume_mounts=self.volume_mounts,
            containers={"sidecars": self.sidecars, "init_containers": self.init_containers},
        )
        return self


# the serving platforms' sections, each in its own module (they reuse the sections above)
from llmdeploy.recipe.target_kserve import KServeTarget  # noqa: E402
from llmdeploy.recipe.target_kubeai import KubeAITarget  # noqa: E402
from llmdeploy.recipe.target_llm_d import LlmDTarget  # noqa: E402
from llmdeploy.recipe.target_production_stack import ProductionStackTarget  # noqa: E402

Target = Annotated[
    LocalTarget
    | DockerTarget
    | KubernetesTarget
    | KServeTarget
    | LlmDTarget
    | ProductionStackTarget
    | KubeAITarget,
    Field(discriminator="type"),
]
