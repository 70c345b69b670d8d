"""Session fixtures: a real kube-apiserver (+ etcd, controller-manager, fake kubelet) on loopback.

The binaries are built from Debian's sources by build.sh on first use (several minutes, cached in
~/.cache/llmdeploy/kube-1.20.2 or $LLMDEPLOY_KUBE_CACHE afterwards).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kube_cluster import KubeCluster, build_binaries

from llmdeploy.apply.discovery import Discovery
from llmdeploy.apply.kube_api import KubeClient
from llmdeploy.apply.kube_connect import connect
from llmdeploy.apply.kubernetes import Instance


@pytest.hookimpl(trylast=True)  # after -m / -k deselection
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Build the binaries (minutes, once) before any test starts, so no test's timeout covers it."""
    if not any(item.get_closest_marker("cluster") for item in items):
        return
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line("tests/cluster: building or finding kube-apiserver 1.20.2 (first run: ~10 min)")
    build_binaries()


@pytest.fixture(scope="session")
def kube_cluster() -> Iterator[KubeCluster]:
    bin_dir = build_binaries()
    workdir = Path(tempfile.mkdtemp(prefix="llmdeploy-kube-"))
    cluster = KubeCluster(workdir, bin_dir)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def kubeconfig(kube_cluster: KubeCluster) -> Path:
    return kube_cluster.kubeconfig


@pytest.fixture
def client(kubeconfig: Path) -> Iterator[KubeClient]:
    with connect(kubeconfig) as c:
        yield c


@pytest.fixture
def discovery(client: KubeClient) -> Discovery:
    return Discovery(client)


@pytest.fixture
def namespace(client: KubeClient, discovery: Discovery) -> Iterator[str]:
    """A fresh namespace per test, so tests never see each other's objects."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    ns_rt = discovery.resolve("v1", "Namespace")
    assert ns_rt is not None
    client.apply(ns_rt, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    yield name
    client.delete(ns_rt, name)


@pytest.fixture
def instance(namespace: str) -> Instance:
    return Instance("demo", namespace)
