"""The CLI verbs end to end: a shipped recipe rendered and applied to the real API server."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "production.yaml"


def _llmdeploy(*args: str, kubeconfig: Path, namespace: str) -> subprocess.CompletedProcess[str]:
    argv = [
        sys.executable,
        "-m",
        "llmdeploy.cli.main",
        *args,
        "--kubeconfig",
        str(kubeconfig),
        "--set",
        f"target.namespace={namespace}",
    ]
    return subprocess.run(
        argv, capture_output=True, text=True, cwd=ROOT, timeout=300, stdin=subprocess.DEVNULL
    )


def test_apply_reapply_diff_status_delete_production_recipe(kubeconfig: Path, namespace: str) -> None:
    recipe = str(RECIPE)
    applied = _llmdeploy(
        "apply", recipe, "--yes", "--timeout", "120", kubeconfig=kubeconfig, namespace=namespace
    )
    assert applied.returncode == 0, applied.stderr
    assert f"+ Deployment {namespace}/" in applied.stderr
    assert "is Available" in applied.stderr
    assert "capacity: KV cache" in applied.stderr

    again = _llmdeploy(
        "apply", recipe, "--yes", "--timeout", "60", kubeconfig=kubeconfig, namespace=namespace
    )
    assert again.returncode == 0, again.stderr
    assert "no changes" in again.stderr and "applied " not in again.stderr

    same = _llmdeploy("diff", recipe, kubeconfig=kubeconfig, namespace=namespace)
    assert same.returncode == 0, same.stdout + same.stderr
    assert "no changes" in same.stdout

    changed = _llmdeploy(
        "diff",
        recipe,
        "--set",
        "limits.gpu_memory_utilization=0.8",
        kubeconfig=kubeconfig,
        namespace=namespace,
    )
    assert changed.returncode == 1, changed.stdout + changed.stderr
    assert f"~ Deployment {namespace}/production (update)" in changed.stdout
    assert '"0.9" -> "0.8"  (after --gpu-memory-utilization)' in changed.stdout
    # less memory for the engine, so fewer KV tokens than the live deployment was planned with
    assert re.search(r"capacity: KV cache tokens [\d,]+ -> [\d,]+ \(-[\d,]+\)", changed.stdout), (
        changed.stdout
    )
    assert "GPUs 2 (unchanged)" in changed.stdout

    status = _llmdeploy("status", recipe, kubeconfig=kubeconfig, namespace=namespace)
    assert status.returncode == 0, status.stdout + status.stderr
    assert "Available=True" in status.stdout

    # the pods are found and their log requested; the fake node has no kubelet to serve it
    logs = _llmdeploy("logs", recipe, kubeconfig=kubeconfig, namespace=namespace)
    assert logs.returncode == 2, logs.stdout + logs.stderr
    assert (
        "read logs of pod production-" in logs.stderr and "could not reach the node's kubelet" in logs.stderr
    )

    no_tty = _llmdeploy("delete", recipe, kubeconfig=kubeconfig, namespace=namespace)
    assert no_tty.returncode == 1 and "nothing deleted" in no_tty.stderr
    deleted = _llmdeploy("delete", recipe, "--yes", kubeconfig=kubeconfig, namespace=namespace)
    assert deleted.returncode == 0, deleted.stderr
    assert "deleted Deployment" in deleted.stderr
    gone = _llmdeploy("status", recipe, kubeconfig=kubeconfig, namespace=namespace)
    assert gone.returncode == 1 and "not deployed" in gone.stdout


def test_unreachable_cluster_is_a_readable_error(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1', insecure-skip-tls-verify: true}}]\n"
        "users: [{name: u, user: {token: t}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    result = _llmdeploy("diff", str(RECIPE), kubeconfig=kubeconfig, namespace="default")
    assert result.returncode == 2
    assert "cannot reach the Kubernetes API at https://127.0.0.1:1" in result.stderr
    assert "Traceback" not in result.stderr


def _kubernetes_recipes() -> list[Path]:
    return sorted(p for p in (ROOT / "recipes").glob("*.yaml") if "type: kubernetes" in p.read_text())


@pytest.mark.parametrize("recipe", _kubernetes_recipes(), ids=lambda p: p.name)
def test_every_shipped_kubernetes_recipe_passes_a_server_side_dry_run(
    recipe: Path, kubeconfig: Path, namespace: str
) -> None:
    result = _llmdeploy("apply", str(recipe), "--dry-run", kubeconfig=kubeconfig, namespace=namespace)
    assert result.returncode == 0, result.stderr
    assert "dry run (server side): nothing was changed" in result.stderr
