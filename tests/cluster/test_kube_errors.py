"""How the client's exceptions reach the user (unit tests: the exceptions are built by hand)."""

from __future__ import annotations

import json
import ssl
from typing import Any

import pytest
import urllib3
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic.exceptions import api_exception

from llmdeploy.apply.kube_api import KubeClient
from llmdeploy.apply.kube_context import KubeContext
from llmdeploy.apply.kube_errors import KubeApiError, http_error, transport_error

CTX = KubeContext("prod", "https://k8s.example:6443", "/home/me/.kube/config", user="me", auth="token")
EXEC_CTX = KubeContext(
    "eks", "https://k8s.example:6443", "/home/me/.kube/config", user="arn", auth="exec", exec_command="aws"
)


def _api(code: int, reason: str, status: dict[str, Any]) -> ApiException:
    e = ApiException(status=code, reason=reason)
    e.body = json.dumps({"kind": "Status", "apiVersion": "v1", "code": code, **status})
    e.headers = {"Content-Type": "application/json", "Authorization": "Bearer leaked"}  # type: ignore[assignment]
    return api_exception(e)  # what the dynamic client raises


def _one(error: KubeApiError) -> str:
    assert len(error.problems) == 1
    return str(error)


def test_401_names_the_context_and_how_to_get_fresh_credentials() -> None:
    e = _api(401, "Unauthorized", {"reason": "Unauthorized", "message": "Unauthorized"})
    text = _one(http_error(e, "list configmaps", CTX))
    assert "list configmaps: HTTP 401 Unauthorized: context 'prod' (user 'me', token)" in text
    assert "credentials were rejected by https://k8s.example:6443" in text
    assert "fix: the token of user 'me' in /home/me/.kube/config is wrong or expired" in text
    assert "leaked" not in text
    exec_text = _one(http_error(e, "list configmaps", EXEC_CTX))
    assert "the exec plugin `aws` handed out a credential the cluster does not accept" in exec_text


def test_403_names_the_context_and_rbac() -> None:
    message = 'configmaps is forbidden: User "me" cannot list resource "configmaps" in the namespace "llm"'
    e = _api(403, "Forbidden", {"reason": "Forbidden", "message": message})
    text = _one(http_error(e, "list configmaps", CTX))
    assert f"HTTP 403 Forbidden: {message}" in text
    assert "fix: context 'prod' (user 'me', token) lacks the RBAC rights for this" in text


def test_409_conflict_names_the_other_manager_per_field() -> None:
    causes = [
        {
            "reason": "FieldManagerConflict",
            "message": 'conflict with "ops-team": .data.mode',
            "field": ".data.mode",
        }
    ]
    e = _api(
        409, "Conflict", {"reason": "Conflict", "message": "Apply failed", "details": {"causes": causes}}
    )
    error = http_error(e, "apply ConfigMap demo-config", CTX)
    assert error.status_code == 409
    text = _one(error)
    assert 'apply ConfigMap demo-config: conflict with "ops-team": .data.mode' in text
    assert "--force-conflicts" in text


def test_422_carries_the_servers_field_message() -> None:
    message = 'Deployment.apps "demo" is invalid: spec.template.metadata.labels: Invalid value'
    e = _api(422, "Unprocessable Entity", {"reason": "Invalid", "message": message})
    text = _one(http_error(e, "apply Deployment demo", CTX))
    assert f"apply Deployment demo: HTTP 422 Invalid: {message}" in text and "fix:" in text


def test_404_of_the_namespace_says_to_create_it() -> None:
    e = _api(
        404,
        "Not Found",
        {
            "reason": "NotFound",
            "message": 'namespaces "llm" not found',
            "details": {"name": "llm", "kind": "namespaces"},
        },
    )
    assert "kubectl create namespace llm" in _one(http_error(e, "apply ConfigMap x", CTX))


def test_a_non_json_body_is_shown_trimmed() -> None:
    e = ApiException(status=502, reason="Bad Gateway")
    e.body = "<html>bad gateway</html>"
    assert "HTTP 502 Bad Gateway: <html>bad gateway</html>" in _one(http_error(e, "get x", CTX))


def _connection_error(inner: BaseException) -> urllib3.exceptions.MaxRetryError:
    return urllib3.exceptions.MaxRetryError(None, "/version", inner)  # type: ignore[arg-type]


def test_transport_errors() -> None:
    refused = urllib3.exceptions.NewConnectionError(
        None,  # type: ignore[arg-type]
        "Failed to establish a new connection: [Errno 111] Connection refused",
    )
    text = _one(transport_error(_connection_error(refused), "read server version", CTX, None))
    assert (
        "cannot reach the Kubernetes API at https://k8s.example:6443 (context 'prod'): Connection refused"
        in text
    )
    assert "fix: check that the cluster is running" in text

    verify = ssl.SSLCertVerificationError(1, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed")
    tls = urllib3.exceptions.SSLError(verify)
    text = _one(transport_error(_connection_error(tls), "read server version", CTX, None))
    assert "TLS with the Kubernetes API at https://k8s.example:6443 (context 'prod') failed" in text
    assert "certificate-authority" in text

    proxy = urllib3.exceptions.ProxyError("Unable to connect to proxy", OSError("refused"))
    text = _one(transport_error(_connection_error(proxy), "read server version", CTX, "http://proxy:3128"))
    assert "through the proxy http://proxy:3128" in text and "HTTPS_PROXY / NO_PROXY" in text

    cut = urllib3.exceptions.ProtocolError("Connection aborted.", ConnectionResetError(104, "reset"))
    text = _one(transport_error(cut, "apply ConfigMap x", CTX, None))
    assert "cannot reach the Kubernetes API" in text and "the connection was cut" in text


def test_client_errors_never_show_the_token(tmp_path: Any) -> None:
    from kubernetes import client as k8s

    cfg = k8s.Configuration()
    cfg.host = "https://k8s.example:6443"
    cfg.api_key["BearerToken"] = "Bearer s3cr3t-t0ken"
    kube = KubeClient(k8s.ApiClient(cfg), CTX)
    try:
        e = _api(400, "Bad Request", {"reason": "BadRequest", "message": "echoed s3cr3t-t0ken back"})
        with pytest.raises(KubeApiError) as err, kube.errors("get x"):
            raise e
        assert "s3cr3t-t0ken" not in str(err.value) and "echoed *** back" in str(err.value)
        assert err.value.__cause__ is None and err.value.__suppress_context__
    finally:
        kube.close()
