"""Apply under faults on the real kube-apiserver of tests/cluster: the API server goes away mid-apply.

A TCP proxy between the client and the API server forwards a byte budget and then cuts every
connection and refuses new ones (TLS passes through untouched). The apply fails with a clear
UserError (never a traceback); a later apply straight to the API server converges, and the one after
that changes nothing. Unreachable servers, prune/delete scoping and field-manager conflicts are
covered in tests/cluster.
"""

from __future__ import annotations

import contextlib
import importlib.util
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hardening.figures import record
from llmdeploy.apply.discovery import Discovery
from llmdeploy.apply.kube_api import KubeClient
from llmdeploy.apply.kube_connect import connect
from llmdeploy.apply.kube_target import ApplyOptions, apply_kubernetes
from llmdeploy.apply.kubernetes import Instance
from llmdeploy.apply.prune import live_objects
from llmdeploy.errors import UserError

CLUSTER_DIR = Path(__file__).resolve().parents[1] / "cluster"
sys.path.insert(0, str(CLUSTER_DIR))

import manifests as m  # noqa: E402  (tests/cluster's objects)

# tests/cluster's fixtures (a real kube-apiserver, a client, a fresh namespace per test), loaded by
# path under their own name: other test folders have a module named `conftest` too
_spec = importlib.util.spec_from_file_location("cluster_conftest", CLUSTER_DIR / "conftest.py")
assert _spec is not None and _spec.loader is not None
cluster_conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cluster_conftest)
kube_cluster = cluster_conftest.kube_cluster
kubeconfig = cluster_conftest.kubeconfig
client = cluster_conftest.client
discovery = cluster_conftest.discovery
namespace = cluster_conftest.namespace
instance = cluster_conftest.instance

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]


class CuttingProxy:
    """Forwards TCP to `target` until `budget_bytes` went from client to server, then cuts everything."""

    def __init__(self, target: tuple[str, int], budget_bytes: int) -> None:
        self.target = target
        self.budget_bytes = budget_bytes
        self.sent_bytes = 0
        self.cut = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.cut.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            if self.cut.is_set():
                conn.close()
                return
            upstream = socket.create_connection(self.target)
            with self.lock:
                self.sockets += [conn, upstream]
            threading.Thread(target=self._pump, args=(conn, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, conn, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, counted: bool) -> None:
        try:
            while data := src.recv(65536):
                if counted:
                    with self.lock:
                        self.sent_bytes += len(data)
                        over = self.sent_bytes > self.budget_bytes
                    if over:
                        self.close()
                        return
                dst.sendall(data)
        except OSError:
            pass

    def close(self) -> None:
        self.cut.set()
        with self.lock:
            for s in [self.listener, *self.sockets]:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()


def _apply(kube: KubeClient, target: Instance, objects: list[dict[str, Any]]) -> tuple[int, str]:
    lines: list[str] = []
    rc = apply_kubernetes(
        kube, target, objects, None, ApplyOptions(timeout_s=60), lambda _q: True, lines.append
    )
    return rc, "\n".join(lines)


def _server(kubeconfig: Path) -> str:
    with connect(kubeconfig) as c:
        return c.context.server


@pytest.fixture
def cut_proxy(kubeconfig: Path) -> Iterator[CuttingProxy]:
    host, _, port = _server(kubeconfig).removeprefix("https://").partition(":")
    proxy = CuttingProxy((host, int(port)), budget_bytes=0)
    yield proxy
    proxy.close()


@pytest.mark.parametrize("fraction", [0.5, 0.85])
def test_api_server_gone_mid_apply_then_a_later_apply_converges(
    kubeconfig: Path, client: KubeClient, instance: Instance, cut_proxy: CuttingProxy, fraction: float
) -> None:
    objects = m.full_set()
    # measure what a whole apply sends, through a proxy that never cuts, with a twin instance
    host, _, port = _server(kubeconfig).removeprefix("https://").partition(":")
    probe = CuttingProxy((host, int(port)), budget_bytes=10**12)
    twin = Instance("twin", instance.namespace)
    with connect(kubeconfig, server=f"https://{host}:{probe.port}") as via_probe:
        assert _apply(via_probe, twin, m.full_set("twin"))[0] == 0
    total_bytes = probe.sent_bytes
    probe.close()

    cut_proxy.budget_bytes = int(total_bytes * fraction)
    with (
        connect(kubeconfig, server=f"https://{host}:{cut_proxy.port}", timeout_s=10) as cut,
        pytest.raises(UserError) as failure,
    ):
        _apply(cut, instance, objects)
    message = str(failure.value)
    record("apply faults: API server cut mid-apply", 1)
    assert "Traceback" not in message and "cannot reach the Kubernetes API" in message, message

    written = len(live_objects(client, Discovery(client), instance))
    print(f"\ncut at {fraction:.0%} of {total_bytes} bytes: {written} of {len(objects)} objects written")
    record("apply faults: objects written before the cut", written)

    rc, text = _apply(client, instance, objects)
    assert rc == 0, text
    assert len(live_objects(client, Discovery(client), instance)) == len(objects)
    rc, text = _apply(client, instance, objects)
    assert rc == 0 and "no changes" in text, text
    record("apply faults: later applies that converged", 1)
