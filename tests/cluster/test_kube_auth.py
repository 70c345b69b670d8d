"""The kubeconfigs platform teams have, against the real kube-apiserver, through the CLI as a user
runs it: an exec credential plugin, a KUBECONFIG of two files, the in-cluster service account, an
HTTPS proxy; and the errors for a wrong token, missing RBAC rights and a wrong CA."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kube_cluster import (
    ADMIN_TOKEN,
    EXEC_TOKEN,
    PROXIED_NAME,
    SERVICE_ACCOUNT_TOKEN,
    KubeCluster,
    make_client_cert,
)

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
RECIPE = str(ROOT / "recipes" / "production.yaml")
EXEC_API = "client.authentication.k8s.io/v1beta1"
CLEARED = (
    "KUBECONFIG",
    "KUBERNETES_SERVICE_HOST",
    "KUBERNETES_SERVICE_PORT",
    "LLMDEPLOY_KUBE_SERVICE_ACCOUNT_DIR",
    "HTTPS_PROXY",
    "https_proxy",
    "HTTP_PROXY",
    "http_proxy",
    "NO_PROXY",
    "no_proxy",
    "ALL_PROXY",
    "all_proxy",
)


def _llmdeploy(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llmdeploy.cli.main", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        stdin=subprocess.DEVNULL,
        env=env,
    )


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The test's own environment without any kubeconfig, service account or proxy, HOME empty."""
    env = {k: v for k, v in os.environ.items() if k not in CLEARED}
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return {**env, "HOME": str(home), **extra}


def _ns(namespace: str) -> tuple[str, str]:
    return "--set", f"target.namespace={namespace}"


def _cluster_entry(server: str, ca: Path) -> dict[str, Any]:
    return {"name": "test", "cluster": {"server": server, "certificate-authority": str(ca)}}


def _kubeconfig(path: Path, cluster: dict[str, Any], user: dict[str, Any], context: str = "test") -> Path:
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [cluster],
        "users": [{"name": "someone", "user": user}],
        "contexts": [{"name": context, "context": {"cluster": cluster["name"], "user": "someone"}}],
        "current-context": context,
    }
    path.write_text(yaml.safe_dump(cfg))
    return path


def _ca(cluster: KubeCluster) -> Path:
    return cluster.workdir / "pki" / "ca.crt"


def test_exec_plugin_kubeconfig_applies_diffs_and_deletes_the_production_recipe(
    kube_cluster: KubeCluster, namespace: str, tmp_path: Path
) -> None:
    calls = tmp_path / "calls"
    plugin = tmp_path / "get-token"
    credential = {"apiVersion": EXEC_API, "kind": "ExecCredential", "status": {"token": EXEC_TOKEN}}
    plugin.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        "info = json.loads(os.environ['KUBERNETES_EXEC_INFO'])\n"
        "with open(os.environ['CALLS_FILE'], 'a') as f:\n"
        "    f.write(' '.join(sys.argv[1:]) + ' ' + info['kind'] + '\\n')\n"
        f"print({json.dumps(json.dumps(credential))})\n"
    )
    plugin.chmod(plugin.stat().st_mode | stat.S_IXUSR)
    user = {
        "exec": {
            "apiVersion": EXEC_API,
            "command": str(plugin),
            "args": ["token", "--cluster", "test"],
            "env": [{"name": "CALLS_FILE", "value": str(calls)}],
        }
    }
    kubeconfig = _kubeconfig(
        tmp_path / "config", _cluster_entry(kube_cluster.server, _ca(kube_cluster)), user
    )
    env = _env(tmp_path)
    flags = ("--kubeconfig", str(kubeconfig), *_ns(namespace))

    applied = _llmdeploy("apply", RECIPE, "--yes", "--timeout", "120", *flags, env=env)
    assert applied.returncode == 0, applied.stderr
    assert f"+ Deployment {namespace}/production" in applied.stderr and "is Available" in applied.stderr
    assert calls.read_text().splitlines()[0] == "token --cluster test ExecCredential"

    same = _llmdeploy("diff", RECIPE, *flags, env=env)
    assert same.returncode == 0 and "no changes" in same.stdout, same.stdout + same.stderr
    changed = _llmdeploy("diff", RECIPE, "--set", "limits.gpu_memory_utilization=0.8", *flags, env=env)
    assert changed.returncode == 1 and f"~ Deployment {namespace}/production (update)" in changed.stdout

    deleted = _llmdeploy("delete", RECIPE, "--yes", *flags, env=env)
    assert deleted.returncode == 0 and "deleted Deployment" in deleted.stderr, deleted.stderr
    gone = _llmdeploy("status", RECIPE, *flags, env=env)
    assert gone.returncode == 1 and "not deployed" in gone.stdout
    assert len(calls.read_text().splitlines()) == 5  # once per command, as kubectl runs it


def test_kubeconfig_of_two_files_cluster_in_one_user_in_the_other(
    kube_cluster: KubeCluster, namespace: str, tmp_path: Path
) -> None:
    cluster_file = tmp_path / "cluster.yaml"
    cluster_file.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [_cluster_entry(kube_cluster.server, _ca(kube_cluster))],
                "contexts": [{"name": "team", "context": {"cluster": "test", "user": "me"}}],
                "current-context": "team",
            }
        )
    )
    token_file = tmp_path / "token"
    token_file.write_text(ADMIN_TOKEN + "\n")  # as `echo $TOKEN > token` writes it
    user_file = tmp_path / "user.yaml"
    user_file.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "users": [{"name": "me", "user": {"tokenFile": str(token_file)}}],
                "current-context": "some-other-context",  # the first file's current-context wins
            }
        )
    )
    env = _env(tmp_path, KUBECONFIG=f"{cluster_file}:{tmp_path / 'absent.yaml'}:{user_file}")
    applied = _llmdeploy("apply", RECIPE, "--yes", "--no-wait", *_ns(namespace), env=env)
    assert applied.returncode == 0, applied.stderr
    assert f"cluster {kube_cluster.server} (context team, v1.20.2)" in applied.stderr
    status = _llmdeploy("status", RECIPE, *_ns(namespace), env=env)
    assert f"Deployment {namespace}/production" in status.stdout, status.stdout + status.stderr
    deleted = _llmdeploy("delete", RECIPE, "--yes", *_ns(namespace), env=env)
    assert deleted.returncode == 0, deleted.stderr


def test_in_cluster_service_account(kube_cluster: KubeCluster, namespace: str, tmp_path: Path) -> None:
    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    (sa / "token").write_text(SERVICE_ACCOUNT_TOKEN)
    shutil.copy(_ca(kube_cluster), sa / "ca.crt")
    host, _, port = kube_cluster.server.removeprefix("https://").rpartition(":")
    env = _env(
        tmp_path,
        KUBERNETES_SERVICE_HOST=host,
        KUBERNETES_SERVICE_PORT=port,
        LLMDEPLOY_KUBE_SERVICE_ACCOUNT_DIR=str(sa),
    )
    applied = _llmdeploy("apply", RECIPE, "--yes", "--timeout", "120", *_ns(namespace), env=env)
    assert applied.returncode == 0, applied.stderr
    assert f"cluster https://{host}:{port} (context in-cluster, v1.20.2)" in applied.stderr
    assert "is Available" in applied.stderr
    deleted = _llmdeploy("delete", RECIPE, "--yes", *_ns(namespace), env=env)
    assert deleted.returncode == 0 and "deleted Deployment" in deleted.stderr, deleted.stderr
    # without the service account's token there is nothing to fall back on
    (sa / "token").unlink()
    none = _llmdeploy("status", RECIPE, *_ns(namespace), env=env)
    assert none.returncode == 2 and "no kubeconfig found" in none.stderr


def _problem_lines(stderr: str) -> list[str]:
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert lines[0] == "error: 1 problem found", stderr
    return lines[1:]


def test_wrong_token_is_one_problem_naming_the_context_and_the_fix(
    kube_cluster: KubeCluster, tmp_path: Path
) -> None:
    wrong = "wrong-token-0123456789"
    kubeconfig = _kubeconfig(
        tmp_path / "config",
        _cluster_entry(kube_cluster.server, _ca(kube_cluster)),
        {"token": wrong},
        "staging",
    )
    result = _llmdeploy("diff", RECIPE, "--kubeconfig", str(kubeconfig), env=_env(tmp_path))
    assert result.returncode == 2
    assert wrong not in result.stdout + result.stderr
    problem, fix = _problem_lines(result.stderr)
    assert "HTTP 401 Unauthorized: context 'staging' (user 'someone', token)" in problem
    assert "credentials were rejected" in problem
    assert fix.strip().startswith("fix: the token of user 'someone'") and "--context" in fix


def test_missing_rbac_rights_name_the_context(kube_cluster: KubeCluster, tmp_path: Path) -> None:
    crt, key = make_client_cert(kube_cluster.workdir / "pki", "nobody", "no-rights")
    user = {"client-certificate": str(crt), "client-key": str(key)}
    cluster = _cluster_entry(kube_cluster.server, _ca(kube_cluster))
    kubeconfig = _kubeconfig(tmp_path / "config", cluster, user, "readonly")
    result = _llmdeploy("status", RECIPE, "--kubeconfig", str(kubeconfig), env=_env(tmp_path))
    assert result.returncode == 2
    problem, fix = _problem_lines(result.stderr)
    assert "HTTP 403 Forbidden" in problem and 'User "nobody" cannot list' in problem
    assert "context 'readonly' (user 'someone', client certificate) lacks the RBAC rights" in fix


def test_a_ca_that_does_not_match_is_a_tls_problem(kube_cluster: KubeCluster, tmp_path: Path) -> None:
    other_ca = tmp_path / "other-ca.crt"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=other",
            "-keyout",
            str(tmp_path / "other-ca.key"),
            "-out",
            str(other_ca),
        ],
        check=True,
        capture_output=True,
    )
    cluster = _cluster_entry(kube_cluster.server, other_ca)
    kubeconfig = _kubeconfig(tmp_path / "config", cluster, {"token": ADMIN_TOKEN})
    result = _llmdeploy("diff", RECIPE, "--kubeconfig", str(kubeconfig), env=_env(tmp_path))
    assert result.returncode == 2
    problem, fix = _problem_lines(result.stderr)
    assert f"TLS with the Kubernetes API at {kube_cluster.server} (context 'test') failed" in problem
    assert "certificate verify failed" in problem and "certificate-authority" in fix
    assert ADMIN_TOKEN not in result.stderr


class ConnectProxy:
    """An HTTP CONNECT proxy that resolves PROXIED_NAME to loopback and records what it was asked."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.targets: list[str] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        head = b""
        while b"\r\n\r\n" not in head and (chunk := conn.recv(4096)):
            head += chunk
        method, target, _ = head.split(b"\r\n", 1)[0].decode().split(" ", 2)
        self.targets.append(f"{method} {target}")
        host, _, port = target.rpartition(":")
        try:
            upstream = socket.create_connection(("127.0.0.1" if host == PROXIED_NAME else host, int(port)))
        except OSError:
            conn.sendall(b"HTTP/1.1 502 Bad Gateway\r\n\r\n")
            conn.close()
            return
        conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        threading.Thread(target=self._pump, args=(upstream, conn), daemon=True).start()
        self._pump(conn, upstream)

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def connect_proxy() -> Iterator[ConnectProxy]:
    proxy = ConnectProxy()
    yield proxy
    proxy.close()


def test_https_proxy_and_no_proxy_are_honoured_as_kubectl_does(
    kube_cluster: KubeCluster, connect_proxy: ConnectProxy, namespace: str, tmp_path: Path
) -> None:
    port = kube_cluster.server.rpartition(":")[2]
    proxied = f"https://{PROXIED_NAME}:{port}"
    kubeconfig = _kubeconfig(
        tmp_path / "config", _cluster_entry(proxied, _ca(kube_cluster)), {"token": ADMIN_TOKEN}
    )
    flags = ("--kubeconfig", str(kubeconfig), *_ns(namespace))
    via_proxy = _env(tmp_path, HTTPS_PROXY=f"http://127.0.0.1:{connect_proxy.port}")
    result = _llmdeploy("diff", RECIPE, *flags, env=via_proxy)
    assert result.returncode == 1, result.stdout + result.stderr  # everything would be created
    assert f"+ Deployment {namespace}/production (create)" in result.stdout
    dry = _llmdeploy("apply", RECIPE, "--dry-run", *flags, env=via_proxy)
    assert dry.returncode == 0, dry.stderr
    assert f"(context test, v1.20.2, through the proxy http://127.0.0.1:{connect_proxy.port})" in dry.stderr
    assert connect_proxy.targets and set(connect_proxy.targets) == {f"CONNECT {PROXIED_NAME}:{port}"}

    # NO_PROXY (a domain suffix here) sends it direct, where the name resolves nowhere
    seen = len(connect_proxy.targets)
    direct = _llmdeploy("diff", RECIPE, *flags, env={**via_proxy, "NO_PROXY": "llmdeploy.invalid"})
    assert direct.returncode == 2
    assert f"cannot reach the Kubernetes API at {proxied} (context 'test')" in direct.stderr
    assert len(connect_proxy.targets) == seen

    # a loopback server is never proxied, whatever HTTPS_PROXY says (the proxy here is dead)
    loopback = _kubeconfig(
        tmp_path / "loopback", _cluster_entry(kube_cluster.server, _ca(kube_cluster)), {"token": ADMIN_TOKEN}
    )
    dead_proxy = _env(tmp_path, HTTPS_PROXY="http://127.0.0.1:1")
    result = _llmdeploy("diff", RECIPE, "--kubeconfig", str(loopback), *_ns(namespace), env=dead_proxy)
    assert result.returncode == 1, result.stdout + result.stderr
