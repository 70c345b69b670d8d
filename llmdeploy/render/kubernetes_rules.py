"""What a recipe must hold for its Kubernetes pods to work, beyond the schema: every pod of a
multi-node replica gets its share of GPUs, and the grace period covers the engine's drain
(the kubernetes target's `problems` refuses a recipe that breaks one, so `render` and `validate` do);
and what the rendered objects need of the cluster beyond plain Kubernetes (`cluster_needs`, shown
by `validate` and `plan` as notes).
"""

from __future__ import annotations

from typing import Any

from llmdeploy.engines import get_engine
from llmdeploy.errors import Problem, UserError
from llmdeploy.recipe.kubernetes_network import NetworkPolicySettings
from llmdeploy.recipe.schema import KubernetesTarget, Recipe
from llmdeploy.render.kubernetes_objects import PROMETHEUS_ADDRESS, scaling_metric, selector

# a pod needs a few seconds past the drain: the readiness probe turns away new traffic first
_DRAIN_MARGIN_S = 5


def pod_problems(recipe: Recipe, target: KubernetesTarget) -> list[Problem]:
    return [*_gpus_per_pod(recipe), *_grace_period(recipe, target)]


def _gpus_per_pod(recipe: Recipe) -> list[Problem]:
    nodes = recipe.hardware.nodes
    gpus = recipe.parallelism.tensor * recipe.parallelism.pipeline
    if recipe.hardware.device == "cpu" or nodes == 1 or (gpus >= nodes and gpus % nodes == 0):
        return []
    return [
        Problem(
            f"a replica spans hardware.nodes = {nodes} pods but tensor x pipeline = {gpus} GPUs "
            f"cannot be shared out evenly: {'some pods would request no GPU' if gpus < nodes else 'the pods would differ'}",
            path="hardware.nodes",
            value=nodes,
            has_value=True,
            fix=f"use hardware.nodes: 1, or parallelism with tensor x pipeline a multiple of {nodes} "
            f"(e.g. parallelism.pipeline: {nodes})",
        )
    ]


def _grace_period(recipe: Recipe, target: KubernetesTarget) -> list[Problem]:
    drain_s = get_engine(recipe.engine.type).drain_timeout_s
    if drain_s is None or target.termination_grace_period_s >= drain_s + _DRAIN_MARGIN_S:
        return []
    return [
        Problem(
            f"shorter than the {drain_s} s the engine drains in-flight requests after SIGTERM: "
            "Kubernetes would kill the pod mid-request",
            path="target.termination_grace_period_s",
            value=target.termination_grace_period_s,
            has_value=True,
            fix=f"use at least {drain_s + _DRAIN_MARGIN_S} (the drain plus {_DRAIN_MARGIN_S} s)",
        )
    ]


def model_cache_shared(recipe: Recipe, target: KubernetesTarget) -> bool:
    """Whether several pods mount the model cache at once (so its claim is ReadWriteMany)."""
    return recipe.parallelism.replicas > 1 or target.autoscaling is not None or recipe.hardware.nodes > 1


def cluster_needs(recipe: Recipe, target: KubernetesTarget) -> list[str]:
    """What the rendered objects need of the cluster beyond plain Kubernetes, one sentence each."""
    needs = []
    if target.model_cache.existing_claim is None and model_cache_shared(recipe, target):
        where = (
            f"storage class {target.model_cache.storage_class!r}"
            if target.model_cache.storage_class
            else "the default storage class"
        )
        needs.append(
            "the cluster needs ReadWriteMany storage: the pods share the model cache through one "
            f"ReadWriteMany PersistentVolumeClaim, and {where} must provide that access mode (NFS, "
            "CephFS, EFS, Filestore, ...; most block-storage classes do not): set "
            "target.model_cache.storage_class, or target.model_cache.existing_claim"
        )
    autoscaling = target.autoscaling
    if autoscaling is not None and autoscaling.kind == "hpa":
        try:
            metric = repr(scaling_metric(recipe, autoscaling.metric).replace(":", "_"))
        except UserError:  # render refuses the metric and says why; the need stands regardless
            metric = "of the queue or KV usage"
        needs.append(
            f"the cluster needs a Prometheus custom-metrics adapter (e.g. prometheus-adapter) serving the "
            f"pods metric {metric} to the HorizontalPodAutoscaler, and Prometheus scraping the pods; "
            "without it the autoscaler never scales (or use target.autoscaling.kind: keda)"
        )
    elif autoscaling is not None:
        needs.append(
            f"the cluster needs KEDA installed and Prometheus at {PROMETHEUS_ADDRESS} scraping the pods "
            "(the ScaledObject's trigger queries it)"
        )
    if recipe.hardware.nodes > 1:
        needs.append("the cluster needs the LeaderWorkerSet controller (leaderworkerset.x-k8s.io) installed")
    if target.network_policy is not None:
        needs.append(
            "the NetworkPolicy is enforced only by a network plugin that implements it (Calico, Cilium, ...); "
            "Prometheus must be in target.network_policy.allow_from to keep scraping /metrics"
        )
    return needs


def network_policy_spec(recipe: Recipe, settings: NetworkPolicySettings) -> dict[str, Any]:
    """Ingress to this instance's pods: the listed peers on the HTTP port; the replica's own pods
    to each other on any port when it spans nodes."""
    own = {"podSelector": {"matchLabels": selector(recipe)}}
    ingress: list[dict[str, Any]] = [
        {
            "from": [peer.to_kube() for peer in settings.allow_from],
            "ports": [{"protocol": "TCP", "port": recipe.server.port}],
        }
    ]
    if recipe.hardware.nodes > 1:
        ingress.append({"from": [own]})
    return {"podSelector": own["podSelector"], "policyTypes": ["Ingress"], "ingress": ingress}
