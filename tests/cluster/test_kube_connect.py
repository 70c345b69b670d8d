"""Kubeconfig loading as kubectl does it, through the client's loaders (no cluster needed: these
check what the connection is configured with; tests/cluster/test_kube_auth.py talks to a real one)."""

from __future__ import annotations

import base64
import json
import stat
import sys
from pathlib import Path
from typing import Any

import pytest
import urllib3
import yaml
from kubernetes.client.rest import RESTClientObject

from llmdeploy.apply.kube_connect import SERVICE_ACCOUNT_DIR_ENV, connect
from llmdeploy.errors import UserError


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT", SERVICE_ACCOUNT_DIR_ENV):
        monkeypatch.delenv(name, raising=False)
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def _write(path: Path, cfg: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(cfg))
    return path


def _cluster(name: str = "c", server: str = "https://10.0.0.1:6443", **extra: object) -> dict[str, Any]:
    ca = base64.b64encode(b"CA").decode()
    return {"name": name, "cluster": {"server": server, "certificate-authority-data": ca, **extra}}


def _config(user: dict[str, Any], **cluster_extra: object) -> dict[str, Any]:
    return {
        "clusters": [_cluster(**cluster_extra)],  # type: ignore[arg-type]
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "ctx",
    }


def _bearer(path: Path, context: str | None = None) -> tuple[str, Any]:
    with connect(path, context) as client:
        cfg = client.api_client.configuration
        return str(cfg.get_api_key_with_prefix("BearerToken")), cfg


def test_token_and_inline_ca(tmp_path: Path) -> None:
    with connect(_write(tmp_path / "config", _config({"token": "abc"}))) as client:
        cfg = client.api_client.configuration
        assert client.context.name == "ctx" and client.context.server == "https://10.0.0.1:6443"
        assert client.context.auth == "token" and client.context.user == "u"
        assert cfg.get_api_key_with_prefix("BearerToken") == "Bearer abc"
        assert Path(cfg.ssl_ca_cert).read_bytes() == b"CA"


def test_token_file_is_trimmed_as_kubectl_does(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("abc\n")
    path = _write(tmp_path / "config", _config({"tokenFile": str(tmp_path / "token")}))
    with connect(path) as client:
        cfg = client.api_client.configuration
        # the client's refresh hook sets the token again before every request
        assert [cfg.get_api_key_with_prefix("BearerToken") for _ in range(3)] == ["Bearer abc"] * 3


def test_client_cert_files_are_relative_to_the_file(tmp_path: Path) -> None:
    (tmp_path / "a.crt").write_text("cert")
    (tmp_path / "a.key").write_text("key")
    path = _write(tmp_path / "config", _config({"client-certificate": "a.crt", "client-key": "a.key"}))
    with connect(path) as client:
        cfg = client.api_client.configuration
        assert cfg.cert_file == str(tmp_path / "a.crt") and cfg.key_file == str(tmp_path / "a.key")
        assert client.context.auth == "client certificate"


def test_kubeconfig_list_is_merged_and_the_first_current_context_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _write(
        tmp_path / "a",
        {
            "clusters": [_cluster("c1", "https://10.0.0.1:6443")],
            "contexts": [{"name": "one", "context": {"cluster": "c1", "user": "u"}}],
            "current-context": "one",
        },
    )
    second = _write(
        tmp_path / "b",
        {
            "clusters": [_cluster("c1", "https://10.9.9.9:6443"), _cluster("c2", "https://10.0.0.2:6443")],
            "users": [{"name": "u", "user": {"token": "from-b"}}],
            "contexts": [{"name": "two", "context": {"cluster": "c2", "user": "u"}}],
            "current-context": "two",
        },
    )
    (tmp_path / "empty").write_text("")  # kubectl reads an empty file as an empty config
    monkeypatch.setenv("KUBECONFIG", f"{first}:{tmp_path / 'missing'}:{tmp_path / 'empty'}:{second}")
    with connect() as client:
        # the first file's current-context, its cluster (c1 from the second file is ignored), and
        # the user only the second file defines
        assert client.context.name == "one" and client.context.server == "https://10.0.0.1:6443"
        assert client.api_client.configuration.get_api_key_with_prefix("BearerToken") == "Bearer from-b"
    with connect(context="two") as client:
        assert client.context.server == "https://10.0.0.2:6443"


def test_kubeconfig_problems_are_user_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no kubeconfig found"):
        connect(tmp_path / "missing")
    path = _write(tmp_path / "config", _config({"token": "abc"}))
    with pytest.raises(UserError) as err:
        connect(path, context="nope")
    assert "has no context 'nope'" in str(err.value) and "(ctx)" in str(err.value)
    no_current = _config({"token": "abc"})
    del no_current["current-context"]
    with pytest.raises(UserError, match="sets no current-context"):
        connect(_write(tmp_path / "config", no_current))
    (tmp_path / "bad").write_text("clusters: [unclosed\n")
    with pytest.raises(UserError, match="cannot read kubeconfig"):
        connect(tmp_path / "bad")


def _plugin(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "plugin"
    script.write_text(f"#!{sys.executable}\n{body}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


EXEC_API = "client.authentication.k8s.io/v1beta1"


def test_exec_plugin_token_is_used(tmp_path: Path) -> None:
    credential = {"apiVersion": EXEC_API, "kind": "ExecCredential", "status": {"token": "from-plugin"}}
    script = _plugin(tmp_path, f"print({json.dumps(json.dumps(credential))})")
    path = _write(tmp_path / "config", _config({"exec": {"apiVersion": EXEC_API, "command": str(script)}}))
    token, _cfg = _bearer(path)
    assert token == "Bearer from-plugin"


def test_a_failing_exec_plugin_is_one_problem_naming_context_and_plugin(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = _plugin(tmp_path, "import sys; sys.stderr.write('token expired, run login\\n'); sys.exit(3)")
    exec_cfg = {"apiVersion": EXEC_API, "command": str(script), "args": ["get-token"]}
    with pytest.raises(UserError) as err:
        connect(_write(tmp_path / "config", _config({"exec": exec_cfg})))
    assert len(err.value.problems) == 1
    text = str(err.value)
    assert "context 'ctx' (user 'u', exec)" in text and f"plugin `{script}` failed" in text
    assert "process returned 3" in text and "token expired, run login" in text
    assert f"run `{script} get-token` yourself" in text
    assert capsys.readouterr().err == ""  # the client's log line became the error, not terminal noise


def test_a_missing_exec_plugin_names_its_install_hint(tmp_path: Path) -> None:
    exec_cfg = {
        "apiVersion": EXEC_API,
        "command": "llmdeploy-no-such-auth-plugin",
        "installHint": "install it with: pip install no-such-plugin",
    }
    with pytest.raises(UserError) as err:
        connect(_write(tmp_path / "config", _config({"exec": exec_cfg})))
    text = str(err.value)
    assert "`llmdeploy-no-such-auth-plugin` is not installed (not found on PATH)" in text
    assert "fix: install it with: pip install no-such-plugin" in text


def test_in_cluster_service_account(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("sa-token")
    (sa / "ca.crt").write_text("CA")
    monkeypatch.setenv(SERVICE_ACCOUNT_DIR_ENV, str(sa))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    with connect() as client:
        cfg = client.api_client.configuration
        assert client.context.name == "in-cluster" and client.context.server == "https://10.96.0.1:443"
        assert cfg.get_api_key_with_prefix("BearerToken") == "bearer sa-token"
        assert cfg.ssl_ca_cert == str(sa / "ca.crt")
    # an explicit --context means a kubeconfig was meant (kubectl does not fall back either)
    with pytest.raises(UserError, match="no kubeconfig found"):
        connect(context="prod")


def _pool(client_cfg: Any) -> urllib3.PoolManager:
    return RESTClientObject(client_cfg).pool_manager


def test_proxies_from_the_environment_as_kubectl_uses_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://me:pa55@proxy.corp:3128")
    path = _write(tmp_path / "config", _config({"token": "abc"}))
    with connect(path) as client:
        pool = _pool(client.api_client.configuration)
        assert isinstance(pool, urllib3.ProxyManager) and pool.proxy is not None
        assert pool.proxy.host == "proxy.corp"
        assert client.proxy == "http://proxy.corp:3128"  # shown to the user without the password
    monkeypatch.setenv("NO_PROXY", "example.org,10.0.0.0/8")
    with connect(path) as client:
        assert not isinstance(_pool(client.api_client.configuration), urllib3.ProxyManager)
        assert client.proxy is None
    monkeypatch.delenv("NO_PROXY")
    loopback = _write(tmp_path / "loop", _config({"token": "abc"}, server="https://127.0.0.1:6443"))
    with connect(loopback) as client:
        assert not isinstance(_pool(client.api_client.configuration), urllib3.ProxyManager)


def test_a_clusters_proxy_url_wins_over_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.corp:3128")
    monkeypatch.setenv("NO_PROXY", "10.0.0.1")
    path = _write(tmp_path / "config", _config({"token": "abc"}, **{"proxy-url": "http://bastion:8888"}))
    with connect(path) as client:
        pool = _pool(client.api_client.configuration)
        assert isinstance(pool, urllib3.ProxyManager) and pool.proxy is not None
        assert pool.proxy.host == "bastion"


def test_server_override_survives_the_clients_refresh_hook(tmp_path: Path) -> None:
    path = _write(tmp_path / "config", _config({"token": "abc"}))
    with connect(path, server="https://10.0.0.9:7443/") as client:
        cfg = client.api_client.configuration
        cfg.get_api_key_with_prefix("BearerToken")  # runs the hook, as every request does
        assert cfg.host == "https://10.0.0.9:7443" and client.context.server == "https://10.0.0.9:7443"
