"""Server-side apply, diff, prune, delete and rollout against a real kube-apiserver 1.20."""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import manifests as m
import pytest
import yaml
from kube_cluster import KubeCluster, make_client_cert

from llmdeploy.apply.capacity import CAPACITY_ANNOTATION, Capacity
from llmdeploy.apply.discovery import Discovery
from llmdeploy.apply.kube_api import APPLY_PATCH, KubeClient
from llmdeploy.apply.kube_connect import connect
from llmdeploy.apply.kube_target import (
    ApplyOptions,
    apply_kubernetes,
    delete_kubernetes,
    diff_kubernetes,
    status_kubernetes,
)
from llmdeploy.apply.kubernetes import Instance, compute_changes, prepare
from llmdeploy.errors import UserError

pytestmark = pytest.mark.cluster

CAP = Capacity(kv_cache_tokens=100_000, max_concurrency=12.2, num_gpus=1)


class Recorder:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, line: str) -> None:
        self.lines.append(line)

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


def _apply(
    client: KubeClient,
    instance: Instance,
    objects: list[dict[str, Any]],
    *,
    wait: bool = False,
    dry_run: bool = False,
    capacity: Capacity | None = CAP,
    force: bool = False,
) -> Recorder:
    out = Recorder()
    options = ApplyOptions(dry_run=dry_run, wait=wait, timeout_s=120, force_conflicts=force)
    rc = apply_kubernetes(client, instance, objects, capacity, options, lambda _q: True, out)
    assert rc == 0, out.text
    return out


def _live(
    client: KubeClient, discovery: Discovery, api_version: str, kind: str, name: str, namespace: str
) -> dict[str, Any] | None:
    rt = discovery.resolve(api_version, kind)
    assert rt is not None
    return client.get(rt, name, namespace)


def _versions(client: KubeClient, discovery: Discovery, namespace: str) -> dict[str, tuple[str, int]]:
    """kind -> (resourceVersion, generation). Controllers write the status of Deployments and PDBs
    (a new resourceVersion), so for those only the generation tells whether we changed them."""
    out = {}
    for api_version, kind in [
        ("v1", "ConfigMap"),
        ("v1", "Service"),
        ("apps/v1", "Deployment"),
        ("policy/v1", "PodDisruptionBudget"),
        ("autoscaling/v2", "HorizontalPodAutoscaler"),
    ]:
        live = _live(
            client, discovery, api_version, kind, "demo-config" if kind == "ConfigMap" else "demo", namespace
        )
        assert live is not None, kind
        rv = "" if kind in ("Deployment", "PodDisruptionBudget") else live["metadata"]["resourceVersion"]
        out[kind] = (rv, live["metadata"].get("generation", 0))
    return out


def test_apply_creates_everything_and_deployment_becomes_available(
    client: KubeClient, discovery: Discovery, instance: Instance
) -> None:
    out = _apply(client, instance, [*m.full_set(), m.scaled_object()], wait=True)
    assert "Deployment demo is Available" in out.text
    assert "skipped: ScaledObject demo: the cluster does not serve keda.sh/v1alpha1" in out.text
    dep = _live(client, discovery, "apps/v1", "Deployment", "demo", instance.namespace)
    assert dep is not None
    assert dep["status"]["availableReplicas"] == 1
    assert dep["metadata"]["annotations"][CAPACITY_ANNOTATION] == CAP.to_annotation()
    managers = {f["manager"] for f in dep["metadata"]["managedFields"] if f["operation"] == "Apply"}
    assert managers == {"llmdeploy"}
    # 1.20 serves neither policy/v1 nor autoscaling/v2: discovery picked the older schema-twins
    pdb = _live(client, discovery, "policy/v1", "PodDisruptionBudget", "demo", instance.namespace)
    hpa = _live(client, discovery, "autoscaling/v2", "HorizontalPodAutoscaler", "demo", instance.namespace)
    assert pdb is not None and pdb["apiVersion"] == "policy/v1beta1"
    assert hpa is not None and hpa["apiVersion"] == "autoscaling/v2beta2"


def test_reapply_unchanged_changes_nothing(
    client: KubeClient, discovery: Discovery, instance: Instance
) -> None:
    _apply(client, instance, m.full_set())
    before = _versions(client, discovery, instance.namespace)
    owned_before = _our_managed_fields(client, discovery, instance.namespace)
    out = _apply(client, instance, m.full_set())
    assert "no changes (5 object(s) up to date)" in out.text
    assert "applied" not in out.text
    assert _versions(client, discovery, instance.namespace) == before
    assert _our_managed_fields(client, discovery, instance.namespace) == owned_before


def _our_managed_fields(client: KubeClient, discovery: Discovery, namespace: str) -> list[dict[str, Any]]:
    dep = _live(client, discovery, "apps/v1", "Deployment", "demo", namespace)
    assert dep is not None
    return [f for f in dep["metadata"]["managedFields"] if f["manager"] == "llmdeploy"]


def test_changing_a_knob_changes_only_that_field(
    client: KubeClient, discovery: Discovery, instance: Instance
) -> None:
    _apply(client, instance, m.full_set(max_num_seqs=64))
    before = _versions(client, discovery, instance.namespace)
    planned, skipped = prepare(discovery, m.full_set(max_num_seqs=32), instance, CAP)
    changes = compute_changes(client, discovery, planned, skipped, instance, CAP)
    assert [(c.action, c.obj.rt.kind) for c in changes.pending] == [("update", "Deployment")]
    fields = changes.pending[0].fields
    assert [(f.op, f.path, f.before, f.after) for f in fields] == [
        ("~", "spec.template.spec.containers[name=engine].args[3]", "64", "32")
    ]
    _apply(client, instance, m.full_set(max_num_seqs=32))
    after = _versions(client, discovery, instance.namespace)
    for kind in ("ConfigMap", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler"):
        assert after[kind] == before[kind], kind
    assert after["Deployment"][1] == before["Deployment"][1] + 1


def test_dry_run_persists_nothing(client: KubeClient, discovery: Discovery, instance: Instance) -> None:
    out = _apply(client, instance, m.full_set(), dry_run=True)
    assert "+ Deployment" in out.text and "nothing was changed" in out.text
    for api_version, kind, name in [
        ("v1", "ConfigMap", "demo-config"),
        ("apps/v1", "Deployment", "demo"),
        ("policy/v1", "PodDisruptionBudget", "demo"),
    ]:
        assert _live(client, discovery, api_version, kind, name, instance.namespace) is None
    # a dry run of a change leaves the live object as it was
    _apply(client, instance, m.full_set())
    before = _versions(client, discovery, instance.namespace)
    _apply(client, instance, m.full_set(max_num_seqs=8), dry_run=True)
    assert _versions(client, discovery, instance.namespace) == before


def test_dry_run_reports_server_side_validation_errors(client: KubeClient, instance: Instance) -> None:
    bad = m.deployment()
    bad["spec"]["template"]["metadata"]["labels"] = {"other": "labels"}  # selector no longer matches
    with pytest.raises(UserError, match="selector"):
        _apply(client, instance, [bad], dry_run=True)


def test_diff_shows_fields_objects_and_capacity(client: KubeClient, instance: Instance) -> None:
    _apply(client, instance, m.full_set(max_num_seqs=64))
    new_cap = Capacity(kv_cache_tokens=150_000, max_concurrency=18.3, num_gpus=2)
    objects = [
        m.config_map(),
        m.service(),
        m.deployment(max_num_seqs=128, gpus=2),
        m.pdb(),
        m.config_map(name="demo-extra"),
    ]
    out = Recorder()
    assert diff_kubernetes(client, instance, objects, new_cap, out) == 1
    text = out.text
    assert f"~ Deployment {instance.namespace}/demo (update)" in text
    assert (
        '~ spec.template.spec.containers[name=engine].args[3]: "64" -> "128"  (after --max-num-seqs)' in text
    )
    assert '~ spec.template.spec.containers[name=engine].resources.limits.nvidia.com/gpu: "1" -> "2"' in text
    assert f"+ ConfigMap {instance.namespace}/demo-extra (create)" in text
    assert f"- HorizontalPodAutoscaler {instance.namespace}/demo (prune)" in text
    assert "ConfigMap " + instance.namespace + "/demo-config" not in text  # unchanged objects stay quiet
    assert (
        "capacity: KV cache tokens 100,000 -> 150,000 (+50,000), max concurrency 12.2 -> 18.3 (+6.1), "
        "GPUs 1 -> 2 (+1)"
    ) in text
    same = Recorder()
    assert diff_kubernetes(client, instance, m.full_set(max_num_seqs=64), CAP, same) == 0
    assert "no changes" in same.text


def test_prune_removes_only_our_leftovers(
    client: KubeClient, discovery: Discovery, instance: Instance
) -> None:
    cm_rt = discovery.resolve("v1", "ConfigMap")
    assert cm_rt is not None
    ns = instance.namespace
    other_instance = m.config_map(instance="other", name="other-config")
    hand_made = m.config_map(name="hand-made")
    hand_made["metadata"]["labels"]["app.kubernetes.io/managed-by"] = "someone-else"
    for obj in (other_instance, hand_made):
        client.apply(cm_rt, {**obj, "metadata": {**obj["metadata"], "namespace": ns}})
    _apply(client, instance, [*m.full_set(), m.config_map(name="demo-old")])
    out = _apply(client, instance, m.full_set())
    assert f"pruned ConfigMap {ns}/demo-old" in out.text
    assert client.get(cm_rt, "demo-old", ns) is None
    assert client.get(cm_rt, "demo-config", ns) is not None
    assert client.get(cm_rt, "other-config", ns) is not None
    assert client.get(cm_rt, "hand-made", ns) is not None


def test_delete_removes_the_instance_only(
    client: KubeClient, discovery: Discovery, instance: Instance
) -> None:
    cm_rt = discovery.resolve("v1", "ConfigMap")
    assert cm_rt is not None
    ns = instance.namespace
    client.apply(
        cm_rt,
        {
            **m.config_map(instance="other", name="other-config"),
            "metadata": {
                **m.config_map(instance="other")["metadata"],
                "name": "other-config",
                "namespace": ns,
            },
        },
    )
    _apply(client, instance, m.full_set())
    out = Recorder()
    assert delete_kubernetes(client, instance, lambda _q: True, out) == 0
    assert f"deleted Deployment {ns}/demo" in out.text
    for api_version, kind, name in [
        ("v1", "ConfigMap", "demo-config"),
        ("v1", "Service", "demo"),
        ("apps/v1", "Deployment", "demo"),
        ("policy/v1", "PodDisruptionBudget", "demo"),
        ("autoscaling/v2", "HorizontalPodAutoscaler", "demo"),
    ]:
        assert _live(client, discovery, api_version, kind, name, ns) is None, kind
    assert client.get(cm_rt, "other-config", ns) is not None
    again = Recorder()
    assert delete_kubernetes(client, instance, lambda _q: True, again) == 0
    assert "nothing to delete" in again.text


def test_conflict_names_the_other_manager_and_force_takes_over(
    client: KubeClient, discovery: Discovery, instance: Instance
) -> None:
    _apply(client, instance, [m.config_map(data={"mode": "a"})])
    cm_rt = discovery.resolve("v1", "ConfigMap")
    assert cm_rt is not None
    other = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "demo-config", "namespace": instance.namespace},
        "data": {"mode": "b"},
    }
    client.request(
        "PATCH",
        cm_rt.path(instance.namespace, "demo-config"),
        what="apply as ops-team",
        params={"fieldManager": "ops-team", "force": "true"},
        body=other,
        content_type=APPLY_PATCH,
    )
    with pytest.raises(UserError) as err:
        _apply(client, instance, [m.config_map(data={"mode": "c"})])
    assert "ops-team" in str(err.value) and "--force-conflicts" in str(err.value)
    _apply(client, instance, [m.config_map(data={"mode": "c"})], force=True)
    live = client.get(cm_rt, "demo-config", instance.namespace)
    assert live is not None and live["data"]["mode"] == "c"


def _stalled_deployment(progress_deadline_s: int) -> dict[str, Any]:
    dep = m.deployment()
    dep["spec"]["progressDeadlineSeconds"] = progress_deadline_s
    dep["spec"]["template"]["metadata"]["annotations"] = {"fake-kubelet.llmdeploy.io/never-ready": "true"}
    return dep


def test_rollout_failure_reports_the_progressing_condition(client: KubeClient, instance: Instance) -> None:
    out = Recorder()
    options = ApplyOptions(wait=True, timeout_s=60)
    with pytest.raises(UserError) as err:
        apply_kubernetes(client, instance, [_stalled_deployment(2)], None, options, lambda _q: True, out)
    text = str(err.value)
    assert f"Deployment {instance.namespace}/demo: rollout failed (1/1 updated, 0/1 available)" in text
    assert "Progressing=False (ProgressDeadlineExceeded)" in text and "has timed out progressing" in text


def test_rollout_timeout_reports_conditions_as_they_stand(client: KubeClient, instance: Instance) -> None:
    options = ApplyOptions(wait=True, timeout_s=3)
    with pytest.raises(UserError) as err:
        apply_kubernetes(
            client, instance, [_stalled_deployment(600)], None, options, lambda _q: True, Recorder()
        )
    text = str(err.value)
    assert "rollout not finished after 3 s" in text
    assert "Available=False (MinimumReplicasUnavailable)" in text


LWS_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "leaderworkersets.leaderworkerset.x-k8s.io"},
    "spec": {
        "group": "leaderworkerset.x-k8s.io",
        "names": {
            "kind": "LeaderWorkerSet",
            "listKind": "LeaderWorkerSetList",
            "plural": "leaderworkersets",
            "singular": "leaderworkerset",
        },
        "scope": "Namespaced",
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                },
            }
        ],
    },
}


@pytest.fixture
def lws_crd(client: KubeClient) -> Iterator[None]:
    """A minimal LeaderWorkerSet CRD (schema-less), removed again so other tests see a bare cluster."""
    crd_rt = Discovery(client).resolve("apiextensions.k8s.io/v1", "CustomResourceDefinition")
    assert crd_rt is not None
    client.apply(crd_rt, LWS_CRD)
    deadline = time.monotonic() + 30
    while Discovery(client).resolve("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet") is None:
        assert time.monotonic() < deadline, "LeaderWorkerSet CRD never became served"
        time.sleep(0.2)
    yield
    client.delete(crd_rt, LWS_CRD["metadata"]["name"])
    deadline = time.monotonic() + 30
    while Discovery(client).resolve("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet") is not None:
        assert time.monotonic() < deadline, "LeaderWorkerSet CRD never went away"
        time.sleep(0.2)


def test_leader_worker_set_with_its_crd_applies_waits_and_deletes(
    client: KubeClient, instance: Instance, lws_crd: None
) -> None:
    out = _apply(client, instance, [m.config_map(), m.leader_worker_set()])
    assert "skipped" not in out.text and f"applied LeaderWorkerSet {instance.namespace}/demo" in out.text
    again = _apply(client, instance, [m.config_map(), m.leader_worker_set()])
    assert "no changes (2 object(s) up to date)" in again.text

    lws_rt = Discovery(client).resolve("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet")
    assert lws_rt is not None
    # stand in for the LeaderWorkerSet controller: report the group ready
    status = {
        "status": {
            "readyReplicas": 1,
            "replicas": 1,
            "conditions": [
                {
                    "type": "Available",
                    "status": "True",
                    "reason": "AllGroupsReady",
                    "message": "All replicas are ready",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
            ],
        }
    }
    client.request(
        "PATCH",
        lws_rt.path(instance.namespace, "demo") + "/status",
        what="set LWS status",
        body=status,
        content_type="application/merge-patch+json",
    )
    waited = _apply(client, instance, [m.config_map(), m.leader_worker_set()], wait=True)
    assert "LeaderWorkerSet demo is Available" in waited.text

    status_out = Recorder()
    assert status_kubernetes(client, instance, status_out) == 0
    assert f"LeaderWorkerSet {instance.namespace}/demo: 1/1 groups ready" in status_out.text
    assert delete_kubernetes(client, instance, lambda _q: True, Recorder()) == 0
    assert client.get(lws_rt, "demo", instance.namespace) is None


def test_rendered_namespace_is_created_first_and_never_deleted(
    client: KubeClient, discovery: Discovery
) -> None:
    ns_rt = discovery.resolve("v1", "Namespace")
    cm_rt = discovery.resolve("v1", "ConfigMap")
    assert ns_rt is not None and cm_rt is not None
    name = f"t-new-{time.monotonic_ns() % 10**8}"
    instance = Instance("demo", name)
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    objects = [m.config_map(), namespace]  # out of order on purpose: Namespace ranks first
    try:
        out = _apply(client, instance, objects, dry_run=True)
        assert f"would apply ConfigMap {name}/demo-config (in a namespace this apply creates)" in out.text
        assert client.get(ns_rt, name) is None
        out = _apply(client, instance, objects)
        assert out.text.index(f"applied Namespace {name}") < out.text.index(f"applied ConfigMap {name}/")
        assert client.get(cm_rt, "demo-config", name) is not None
        assert delete_kubernetes(client, instance, lambda _q: True, Recorder()) == 0
        assert client.get(cm_rt, "demo-config", name) is None
        assert client.get(ns_rt, name) is not None  # namespaces hold other people's things too
    finally:
        client.delete(ns_rt, name)


def test_client_certificate_kubeconfig_with_inline_data(kube_cluster: KubeCluster, tmp_path: Path) -> None:
    pki = kube_cluster.workdir / "pki"
    crt, key = make_client_cert(pki, "cert-admin", "system:masters")
    b64 = lambda p: base64.b64encode(p.read_bytes()).decode()  # noqa: E731
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "c",
        "clusters": [
            {
                "name": "c",
                "cluster": {"server": kube_cluster.server, "certificate-authority-data": b64(pki / "ca.crt")},
            }
        ],
        "users": [{"name": "u", "user": {"client-certificate-data": b64(crt), "client-key-data": b64(key)}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(cfg))
    with connect(path) as client:
        assert Discovery(client).server_version() == "v1.20.2"
        ns_rt = Discovery(client).resolve("v1", "Namespace")
        assert ns_rt is not None and client.get(ns_rt, "default") is not None
    # credentials the cluster does not know are refused with a readable message
    cfg["users"][0]["user"] = {"token": "not-a-valid-token"}
    path.write_text(yaml.safe_dump(cfg))
    with connect(path) as client, pytest.raises(UserError) as err:
        Discovery(client).served_versions("apps")
    assert "HTTP 401" in str(err.value) and "credentials were rejected" in str(err.value)


def test_missing_workload_api_is_an_error_before_anything_is_written(
    client: KubeClient, discovery: Discovery, instance: Instance
) -> None:
    with pytest.raises(UserError) as err:
        _apply(client, instance, [m.config_map(), m.leader_worker_set()])
    assert "does not serve LeaderWorkerSet (leaderworkerset.x-k8s.io/v1)" in str(err.value)
    assert _live(client, discovery, "v1", "ConfigMap", "demo-config", instance.namespace) is None
