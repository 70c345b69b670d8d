"""Recipe models for what a cluster's admission policy asks of a pod (sidecars, volumes, affinity, ...).

Fragments that are Kubernetes objects (containers, volumes, env entries, node affinity, topology
spread constraints, resources) are written in Kubernetes' own shape and field names (camelCase), so
a platform team's snippets paste in unchanged; llmdeploy's own knobs keep snake_case. The fields we
place or cross-check are typed; nested parts we only pass on (probes, securityContext, volume
sources) are mappings the API server checks at apply time.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from llmdeploy.recipe.kubernetes_values import (
    DnsLabel,
    Labels,
    QualifiedKey,
    Quantity,
    quantity_value,
)

_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
# containers and volumes llmdeploy itself puts in the pod
OWN_CONTAINERS = frozenset({"engine", "fetch-model"})
OWN_VOLUMES = frozenset({"model-cache", "dshm", "tmp"})
STANDARD_RESOURCES = frozenset({"cpu", "memory", "ephemeral-storage"})


class KubeShape(BaseModel):
    """A fragment in Kubernetes' own shape: its field names, unknown fields refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    def to_kube(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True, by_alias=True)


class ResourceRequirements(KubeShape):
    requests: dict[QualifiedKey, Quantity] = Field(
        default_factory=dict, description="e.g. {cpu: '4', memory: 32Gi}"
    )
    limits: dict[QualifiedKey, Quantity] = Field(default_factory=dict, description="e.g. {memory: 48Gi}")

    @model_validator(mode="after")
    def _requests_within_limits(self) -> ResourceRequirements:
        for name in [*self.requests, *self.limits]:
            if "/" not in name and name not in STANDARD_RESOURCES and not name.startswith("hugepages-"):
                raise ValueError(
                    f"{name!r} is not a resource Kubernetes knows: use cpu, memory, ephemeral-storage, "
                    "hugepages-<size>, or a vendor resource with its domain (example.com/device)"
                )
        for name, limit in self.limits.items():
            request = self.requests.get(name)
            if request is not None and quantity_value(str(request)) > quantity_value(str(limit)):
                raise ValueError(
                    f"the {name} request ({request}) exceeds its limit ({limit}): raise the limit or "
                    "lower the request"
                )
        return self


class EnvVar(KubeShape):
    name: str = Field(description="variable name")
    value: str | None = Field(default=None, description="a literal value")
    valueFrom: dict[str, Any] | None = Field(
        default=None, description="secretKeyRef, configMapKeyRef, fieldRef or resourceFieldRef"
    )

    @field_validator("name")
    @classmethod
    def _env_name(cls, value: str) -> str:
        if not _ENV_NAME.match(value):
            raise ValueError(f"{value!r} is not an environment variable name: use letters, digits and '_'")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> EnvVar:
        if self.value is not None and self.valueFrom is not None:
            raise ValueError(f"env {self.name}: give value or valueFrom, not both")
        return self


class VolumeMount(KubeShape):
    name: DnsLabel = Field(description="a volume of the pod (target.volumes, or model-cache / tmp)")
    mountPath: str = Field(description="absolute path inside the container")
    readOnly: bool | None = None
    subPath: str | None = None
    subPathExpr: str | None = None
    mountPropagation: Literal["None", "HostToContainer", "Bidirectional"] | None = None
    recursiveReadOnly: Literal["Disabled", "IfPossible", "Enabled"] | None = None

    @field_validator("mountPath")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError(f"mountPath {value!r} must be an absolute path, e.g. /etc/certs")
        return value


class ContainerPort(KubeShape):
    containerPort: int = Field(ge=1, le=65535)
    name: Annotated[str, Field(max_length=15)] | None = None
    protocol: Literal["TCP", "UDP", "SCTP"] | None = None
    hostPort: int | None = Field(default=None, ge=1, le=65535)
    hostIP: str | None = None


class Container(KubeShape):
    """A sidecar or init container, as in a Kubernetes pod spec."""

    name: DnsLabel
    image: str = Field(min_length=1, description="container image")
    command: list[str] | None = None
    args: list[str] | None = None
    workingDir: str | None = None
    ports: list[ContainerPort] | None = None
    env: list[EnvVar] | None = None
    envFrom: list[dict[str, Any]] | None = None
    resources: ResourceRequirements | None = None
    volumeMounts: list[VolumeMount] | None = None
    volumeDevices: list[dict[str, Any]] | None = None
    restartPolicy: Literal["Always"] | None = Field(
        default=None, description="Always on an init container: a native sidecar (Kubernetes 1.29+)"
    )
    resizePolicy: list[dict[str, Any]] | None = None
    livenessProbe: dict[str, Any] | None = None
    readinessProbe: dict[str, Any] | None = None
    startupProbe: dict[str, Any] | None = None
    lifecycle: dict[str, Any] | None = None
    securityContext: dict[str, Any] | None = Field(
        default=None, description="default: llmdeploy's restricted one (non-root, read-only root)"
    )
    imagePullPolicy: Literal["Always", "IfNotPresent", "Never"] | None = None
    terminationMessagePath: str | None = None
    terminationMessagePolicy: Literal["File", "FallbackToLogsOnError"] | None = None
    stdin: bool | None = None
    stdinOnce: bool | None = None
    tty: bool | None = None


# the volume sources of a Kubernetes pod spec; exactly one per volume
VOLUME_SOURCES = (
    "awsElasticBlockStore",
    "azureDisk",
    "azureFile",
    "cephfs",
    "cinder",
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "fc",
    "flexVolume",
    "flocker",
    "gcePersistentDisk",
    "gitRepo",
    "glusterfs",
    "hostPath",
    "image",
    "iscsi",
    "nfs",
    "persistentVolumeClaim",
    "photonPersistentDisk",
    "portworxVolume",
    "projected",
    "quobyte",
    "rbd",
    "scaleIO",
    "secret",
    "storageos",
    "vsphereVolume",
)


def _volume_schema(schema: dict[str, Any]) -> None:
    # the sources are read as extra fields (checked below); list them so editors complete them
    properties = schema.setdefault("properties", {})
    for source in VOLUME_SOURCES:
        properties[source] = {"type": "object", "description": f"Kubernetes' {source} volume source"}
    schema["additionalProperties"] = False


class Volume(KubeShape):
    """A pod volume: a name and one source (configMap, secret, persistentVolumeClaim, csi, ...)."""

    model_config = ConfigDict(extra="allow", frozen=True, json_schema_extra=_volume_schema)
    name: DnsLabel

    @model_validator(mode="after")
    def _one_source(self) -> Volume:
        sources = list(self.model_extra or {})
        unknown = [s for s in sources if s not in VOLUME_SOURCES]
        if unknown:
            raise ValueError(
                f"volume {self.name}: unknown field(s) {', '.join(unknown)}; a volume has a name and "
                f"one source: {', '.join(VOLUME_SOURCES)}"
            )
        if len(sources) != 1:
            raise ValueError(
                f"volume {self.name}: give exactly one source (e.g. configMap, secret, "
                f"persistentVolumeClaim, emptyDir), not {len(sources)}"
            )
        if not isinstance((self.model_extra or {})[sources[0]], dict):
            raise ValueError(f"volume {self.name}: {sources[0]} must be a mapping, e.g. {sources[0]}: {{}}")
        return self


class NodeSelectorRequirement(KubeShape):
    key: QualifiedKey
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
    values: list[str] | None = None

    @model_validator(mode="after")
    def _values_fit_operator(self) -> NodeSelectorRequirement:
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(f"{self.key}: operator {self.operator} takes no values")
        if self.operator in ("In", "NotIn") and not self.values:
            raise ValueError(f"{self.key}: operator {self.operator} needs at least one value")
        if self.operator in ("Gt", "Lt") and (
            not self.values or len(self.values) != 1 or not self.values[0].lstrip("-").isdigit()
        ):
            raise ValueError(f"{self.key}: operator {self.operator} needs exactly one integer value")
        return self


class NodeSelectorTerm(KubeShape):
    matchExpressions: list[NodeSelectorRequirement] | None = None
    matchFields: list[NodeSelectorRequirement] | None = None


class NodeSelector(KubeShape):
    nodeSelectorTerms: list[NodeSelectorTerm] = Field(min_length=1, description="any one term must match")


class PreferredSchedulingTerm(KubeShape):
    weight: int = Field(ge=1, le=100)
    preference: NodeSelectorTerm


class NodeAffinity(KubeShape):
    requiredDuringSchedulingIgnoredDuringExecution: NodeSelector | None = None
    preferredDuringSchedulingIgnoredDuringExecution: list[PreferredSchedulingTerm] | None = None


class LabelSelectorRequirement(KubeShape):
    key: QualifiedKey
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[str] | None = None


class LabelSelector(KubeShape):
    matchLabels: Labels | None = None
    matchExpressions: list[LabelSelectorRequirement] | None = None


class TopologySpreadConstraint(KubeShape):
    maxSkew: int = Field(ge=1, description="most pods one domain may have above the emptiest")
    topologyKey: QualifiedKey = Field(
        description="node label defining a domain, e.g. topology.kubernetes.io/zone"
    )
    whenUnsatisfiable: Literal["DoNotSchedule", "ScheduleAnyway"]
    labelSelector: LabelSelector | None = Field(default=None, description="default: this recipe's pods")
    minDomains: int | None = Field(default=None, ge=1)
    matchLabelKeys: list[str] | None = None
    nodeAffinityPolicy: Literal["Honor", "Ignore"] | None = None
    nodeTaintsPolicy: Literal["Honor", "Ignore"] | None = None


# labels llmdeploy sets on every object: prune, diff and the Service selector rely on them
RESERVED_LABELS = frozenset(
    {"app.kubernetes.io/managed-by", "app.kubernetes.io/instance", "app.kubernetes.io/name"}
)
GPU_RESOURCE = "nvidia.com/gpu"


def check_pod_settings(
    *,
    label_sets: dict[str, dict[str, str]],
    resources: ResourceRequirements,
    volumes: list[Volume],
    volume_mounts: list[VolumeMount],
    containers: dict[str, list[Container]],
) -> None:
    """Cross-field rules of the pod settings; each failure names the field and the fix."""
    for field, labels in label_sets.items():
        reserved = sorted(RESERVED_LABELS & set(labels))
        if reserved:
            raise ValueError(
                f"target.{field}: {', '.join(reserved)} is set by llmdeploy (prune and the Service "
                "selector rely on it); remove it"
            )
    for part in ("requests", "limits"):
        if GPU_RESOURCE in getattr(resources, part):
            raise ValueError(
                f"target.resources.{part}: {GPU_RESOURCE} comes from parallelism and hardware.nodes; "
                "remove it here"
            )
    names = [v.name for v in volumes]
    clash = sorted((OWN_VOLUMES & set(names)) | {n for n in names if names.count(n) > 1})
    if clash:
        raise ValueError(
            f"target.volumes: the name(s) {', '.join(clash)} are used twice or by llmdeploy's own "
            f"volumes ({', '.join(sorted(OWN_VOLUMES))}); rename them"
        )
    known = OWN_VOLUMES | set(names)
    mounts = {"volume_mounts": volume_mounts}
    seen: set[str] = set()
    for field, listed in containers.items():
        for i, container in enumerate(listed):
            if container.name in OWN_CONTAINERS or container.name in seen:
                raise ValueError(
                    f"target.{field}[{i}]: the container name {container.name!r} is taken (llmdeploy "
                    f"uses {', '.join(sorted(OWN_CONTAINERS))}); rename it"
                )
            seen.add(container.name)
            mounts[f"{field}[{i}].volumeMounts"] = list(container.volumeMounts or [])
    for where, listed_mounts in mounts.items():
        paths = [m.mountPath for m in listed_mounts]
        for mount in listed_mounts:
            if mount.name not in known:
                raise ValueError(
                    f"target.{where}: no volume named {mount.name!r}; add it to target.volumes "
                    f"(known: {', '.join(sorted(known))})"
                )
            if paths.count(mount.mountPath) > 1:
                raise ValueError(f"target.{where}: mountPath {mount.mountPath} is mounted twice")
