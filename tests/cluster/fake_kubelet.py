"""A stand-in for kubelet and scheduler on a cluster without a container runtime.

It registers one Node with GPU capacity and keeps its Ready condition fresh, binds every
unscheduled Pod to that node (no real scheduling decisions: one node, so there is nothing to
choose), reports bound Pods as Running and Ready (except Pods annotated
fake-kubelet.llmdeploy.io/never-ready: "true", which stay Pending), and finishes the deletion of Pods that are
terminating (the real kubelet's job once containers stop).

    python tests/cluster/fake_kubelet.py --kubeconfig PATH [--node NAME] [--gpus N]
"""

from __future__ import annotations

import argparse
import datetime as dt
import ssl
import time
from typing import Any

import httpx
import yaml

POLL_S = 0.5
HEARTBEAT_S = 10.0
NEVER_READY_ANNOTATION = "fake-kubelet.llmdeploy.io/never-ready"


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _client(kubeconfig: str) -> httpx.Client:
    with open(kubeconfig) as f:
        cfg = yaml.safe_load(f)
    ctx_name = cfg["current-context"]
    ctx = next(c["context"] for c in cfg["contexts"] if c["name"] == ctx_name)
    cluster = next(c["cluster"] for c in cfg["clusters"] if c["name"] == ctx["cluster"])
    user = next(u["user"] for u in cfg["users"] if u["name"] == ctx["user"])
    return httpx.Client(
        base_url=cluster["server"],
        verify=ssl.create_default_context(cafile=cluster["certificate-authority"]),
        headers={"Authorization": f"Bearer {user['token']}"},
        timeout=10,
    )


def _node_status(gpus: int) -> dict[str, Any]:
    capacity = {
        "cpu": "64",
        "memory": "512Gi",
        "pods": "110",
        "nvidia.com/gpu": str(gpus),
        "ephemeral-storage": "1Ti",
    }
    now = _now()
    return {
        "capacity": capacity,
        "allocatable": capacity,
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "KubeletReady",
                "message": "fake kubelet is posting ready status",
                "lastHeartbeatTime": now,
                "lastTransitionTime": now,
            }
        ],
        "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
        "nodeInfo": {
            "machineID": "fake",
            "systemUUID": "fake",
            "bootID": "fake",
            "kernelVersion": "fake",
            "osImage": "fake",
            "containerRuntimeVersion": "fake://0",
            "kubeletVersion": "v1.20.2",
            "kubeProxyVersion": "v1.20.2",
            "operatingSystem": "linux",
            "architecture": "amd64",
        },
    }


def register_node(api: httpx.Client, name: str, gpus: int) -> None:
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "nvidia.com/gpu.present": "true",
            },
        },
    }
    r = api.post("/api/v1/nodes", json=node)
    if r.status_code not in (201, 409):
        r.raise_for_status()
    heartbeat(api, name, gpus)


def heartbeat(api: httpx.Client, name: str, gpus: int) -> None:
    r = api.patch(
        f"/api/v1/nodes/{name}/status",
        json={"status": _node_status(gpus)},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    r.raise_for_status()


def _pod_running_status(pod: dict[str, Any]) -> dict[str, Any]:
    now = _now()
    containers = pod["spec"].get("containers", [])
    return {
        "phase": "Running",
        "hostIP": "127.0.0.1",
        "podIP": "10.244.0.10",
        "podIPs": [{"ip": "10.244.0.10"}],
        "startTime": now,
        "conditions": [
            {"type": t, "status": "True", "lastTransitionTime": now}
            for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
        ],
        "containerStatuses": [
            {
                "name": c["name"],
                "image": c.get("image", ""),
                "imageID": "fake://" + c.get("image", ""),
                "containerID": f"fake://{pod['metadata']['uid']}-{c['name']}",
                "ready": True,
                "started": True,
                "restartCount": 0,
                "state": {"running": {"startedAt": now}},
            }
            for c in containers
        ],
    }


def sync_pods(api: httpx.Client, node: str) -> None:
    pods = api.get("/api/v1/pods").json().get("items", [])
    for pod in pods:
        meta, spec = pod["metadata"], pod["spec"]
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
        if meta.get("deletionTimestamp"):
            api.delete(path, params={"gracePeriodSeconds": "0"})
        elif not spec.get("nodeName"):
            binding = {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node},
            }
            api.post(f"{path}/binding", json=binding)
        elif (meta.get("annotations") or {}).get(NEVER_READY_ANNOTATION) == "true":
            continue  # tests use this to make a rollout stall
        elif spec["nodeName"] == node and pod.get("status", {}).get("phase") != "Running":
            api.patch(
                f"{path}/status",
                json={"status": _pod_running_status(pod)},
                headers={"Content-Type": "application/merge-patch+json"},
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--node", default="fake-gpu-node")
    parser.add_argument("--gpus", type=int, default=8)
    args = parser.parse_args()
    api = _client(args.kubeconfig)
    register_node(api, args.node, args.gpus)
    last_beat = time.monotonic()
    while True:
        try:
            if time.monotonic() - last_beat > HEARTBEAT_S:
                heartbeat(api, args.node, args.gpus)
                last_beat = time.monotonic()
            sync_pods(api, args.node)
        except httpx.HTTPError as e:  # the API server restarting or going away: try again
            print(f"fake kubelet: {e}", flush=True)
        time.sleep(POLL_S)


if __name__ == "__main__":
    main()
