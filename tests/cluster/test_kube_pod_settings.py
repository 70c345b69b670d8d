"""Every pod setting of a Kubernetes target, and the patches, reach the objects the API server stores."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from render.pod_settings import pod_settings

from llmdeploy.apply.discovery import Discovery
from llmdeploy.apply.kube_api import KubeClient

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]


def _llmdeploy(*args: str, kubeconfig: Path, namespace: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "llmdeploy.cli.main", *args, "--kubeconfig", str(kubeconfig),
            "--set", f"target.namespace={namespace}"]  # fmt: skip
    return subprocess.run(
        argv, capture_output=True, text=True, cwd=ROOT, timeout=300, stdin=subprocess.DEVNULL
    )


def _stored(client: KubeClient, discovery: Discovery, api_version: str, kind: str, name: str, ns: str) -> Any:
    rt = discovery.resolve(api_version, kind)
    assert rt is not None
    obj = client.get(rt, name, ns)
    assert obj is not None, f"{kind} {name} was not stored"
    return obj


def test_pod_settings_and_patches_are_stored_by_the_api_server(
    kubeconfig: Path, namespace: str, client: KubeClient, discovery: Discovery, tmp_path: Path
) -> None:
    recipe = tmp_path / "pods.yaml"
    recipe.write_text(
        yaml.safe_dump({"extends": str(ROOT / "recipes" / "production.yaml"), "target": pod_settings("pods")})
    )
    applied = _llmdeploy(
        "apply", str(recipe), "--yes", "--no-wait", kubeconfig=kubeconfig, namespace=namespace
    )
    assert applied.returncode == 0, applied.stderr

    deployment = _stored(client, discovery, "apps/v1", "Deployment", "pods", namespace)
    assert deployment["metadata"]["annotations"]["owner.example.com/contact"] == "ml-platform@example.com"
    assert deployment["metadata"]["labels"]["cost-center"] == "c-42"
    template = deployment["spec"]["template"]
    assert template["metadata"]["labels"]["sidecar.istio.io/inject"] == "false"
    assert template["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    pod = template["spec"]
    assert pod["serviceAccountName"] == "llm-engine"
    assert pod["automountServiceAccountToken"] is False
    assert pod["imagePullSecrets"] == [{"name": "registry-creds"}]
    assert pod["priorityClassName"] == "llm-serving"
    node_affinity = pod["affinity"]["nodeAffinity"]
    terms = node_affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms[0]["matchExpressions"] == [
        {"key": "node.example.com/pool", "operator": "In", "values": ["gpu"]}
    ]
    assert node_affinity["preferredDuringSchedulingIgnoredDuringExecution"][0]["weight"] == 50
    (spread,) = pod["topologySpreadConstraints"]
    assert spread["topologyKey"] == "topology.kubernetes.io/zone"
    assert spread["labelSelector"]["matchLabels"]["app.kubernetes.io/instance"] == "pods"
    containers = {c["name"]: c for c in pod["containers"]}
    engine, sidecar = containers["engine"], containers["log-shipper"]
    assert engine["resources"]["requests"] == {"cpu": "4", "memory": "32Gi", "nvidia.com/gpu": "1"}
    assert engine["resources"]["limits"] == {"cpu": "8", "memory": "48Gi", "nvidia.com/gpu": "1"}
    env = {e["name"]: e for e in engine["env"]}
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert env["OTEL_SERVICE_NAME"]["value"] == "llm"
    assert {"name": "certs", "mountPath": "/etc/corp-ca", "readOnly": True} in engine["volumeMounts"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["certs"]["configMap"]["name"] == "corp-ca"
    assert sidecar["image"] == "example.com/log-shipper:1.2"
    assert sidecar["args"] == ["--input", "/tmp/engine.log"]
    assert sidecar["resources"]["limits"] == {"memory": "128Mi"}
    assert [c["name"] for c in pod["initContainers"]] == ["wait-for-proxy"]
    # the strategic-merge patch of the Deployment and the JSON 6902 patch of the Service
    assert pod["dnsPolicy"] == "ClusterFirst" and pod["enableServiceLinks"] is False
    service = _stored(client, discovery, "v1", "Service", "pods", namespace)
    assert service["metadata"]["annotations"]["lb.example.com/internal"] == "true"
    assert [p["name"] for p in service["spec"]["ports"]] == ["web"]

    same = _llmdeploy("diff", str(recipe), kubeconfig=kubeconfig, namespace=namespace)
    assert same.returncode == 0 and "no changes" in same.stdout, same.stdout + same.stderr
    changed = _llmdeploy(
        "diff",
        str(recipe),
        "--set",
        "target.patches.0.patch.spec.template.spec.dnsPolicy=Default",
        "--set",
        "limits.max_num_seqs=64",
        kubeconfig=kubeconfig,
        namespace=namespace,
    )
    assert changed.returncode == 1, changed.stdout + changed.stderr
    assert '~ spec.template.spec.dnsPolicy: "ClusterFirst" -> "Default"' in changed.stdout
    assert '"128" -> "64"  (after --max-num-seqs)' in changed.stdout
