"""A stand-in for the serving platforms' controllers on the test cluster: it sets the status a real
controller would, so `apply` has something to wait on and `smoke` a URL to read.

- KServe's LLMInferenceService: the `Ready` condition and `status.url`
  (`http://<name>.<namespace>.svc.cluster.local`, as KServe reports a cluster-local URL, unless the
  test names the URL of an engine it started itself in `urls`);
- KubeAI's Model: `status.replicas` with every wanted replica ready.

It writes nothing else (no pods, no routing); the fake kubelet makes Deployments' pods ready.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from llmdeploy.apply.discovery import Discovery
from llmdeploy.apply.kube_api import KubeClient, ResourceType
from llmdeploy.apply.kube_connect import connect

POLL_S = 0.3
KINDS = (("serving.kserve.io/v1alpha2", "LLMInferenceService"), ("kubeai.org/v1", "Model"))


def kserve_url(name: str, namespace: str) -> str:
    return f"http://{name}.{namespace}.svc.cluster.local"


def _status(kind: str, obj: dict[str, Any], urls: Mapping[str, str]) -> dict[str, Any] | None:
    meta, status = obj["metadata"], obj.get("status") or {}
    if kind == "LLMInferenceService":
        if any(c.get("type") == "Ready" for c in status.get("conditions") or []):
            return None
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        return {
            "url": urls.get(meta["name"]) or kserve_url(meta["name"], meta["namespace"]),
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now}],
        }
    want = max(1, int(obj["spec"].get("minReplicas") or 1))
    if (status.get("replicas") or {}).get("ready") == want:
        return None
    return {"replicas": {"all": want, "ready": want}}


class FakePlatformController:
    def __init__(self, kubeconfig: Path, namespace: str, urls: Mapping[str, str] | None = None) -> None:
        """`urls`: the status.url to report per LLMInferenceService name (default: cluster-local)."""
        self.kubeconfig, self.namespace = kubeconfig, namespace
        self.urls = dict(urls or {})
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.error: BaseException | None = None

    def __enter__(self) -> FakePlatformController:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        if self.error is not None:
            raise AssertionError(f"the fake platform controller failed: {self.error}") from self.error

    def _run(self) -> None:
        try:
            self._loop()
        except Exception as e:  # reported by __exit__, in the test's thread
            self.error = e

    def _loop(self) -> None:
        with connect(self.kubeconfig) as client:
            discovery = Discovery(client)
            while not self._stop.is_set():
                for api_version, kind in KINDS:
                    rt = discovery.resolve(api_version, kind)
                    if rt is not None:
                        self._settle(client, rt)
                self._stop.wait(POLL_S)

    def _settle(self, client: KubeClient, rt: ResourceType) -> None:
        for obj in client.list(rt, self.namespace):
            status = _status(rt.kind, obj, self.urls)
            if status is None:
                continue
            client.request(
                "PATCH",
                rt.path(self.namespace, obj["metadata"]["name"]) + "/status",
                what=f"set the status of {rt.kind} {obj['metadata']['name']}",
                body={"status": status},
                content_type="application/merge-patch+json",
                missing_ok=True,
            )
