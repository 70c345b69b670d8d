"""The recipe's opt-in NetworkPolicy (`target.network_policy`): who may reach the engine's port.

Without it no NetworkPolicy is rendered and the pods take traffic from anywhere the cluster's
network allows. With it, the rendered policy admits only the listed peers (by default: pods of the
same namespace) to the HTTP port, and, for a replica spanning nodes, the replica's own pods to each
other on every port (Ray and NCCL between leader and workers). The peers keep Kubernetes' shape.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from llmdeploy.recipe.kubernetes_pod import KubeShape


class IPBlock(KubeShape):
    cidr: str = Field(description="e.g. 10.0.0.0/8")
    except_: list[str] | None = Field(default=None, alias="except", description="CIDRs left out")


class NetworkPeer(KubeShape):
    podSelector: dict[str, Any] | None = Field(default=None, description="a label selector of pods")
    namespaceSelector: dict[str, Any] | None = Field(
        default=None, description="a label selector of namespaces, e.g. {matchLabels: {team: apps}}"
    )
    ipBlock: IPBlock | None = Field(default=None, description="addresses outside the cluster")

    @model_validator(mode="after")
    def _one_kind(self) -> NetworkPeer:
        if self.podSelector is None and self.namespaceSelector is None and self.ipBlock is None:
            raise ValueError("give podSelector, namespaceSelector or ipBlock")
        if self.ipBlock is not None and (self.podSelector is not None or self.namespaceSelector is not None):
            raise ValueError("ipBlock stands alone: give it in a peer of its own")
        return self


class NetworkPolicySettings(KubeShape):
    allow_from: list[NetworkPeer] = Field(
        default_factory=lambda: [NetworkPeer(podSelector={})],
        description="who may call the engine's port (Kubernetes NetworkPolicyPeer shape); "
        "default: pods of the same namespace. Add your Prometheus' namespace to keep /metrics scraped",
    )
