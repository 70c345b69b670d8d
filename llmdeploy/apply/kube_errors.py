"""What the Kubernetes client's exceptions mean for the user: one problem naming the context and the fix.

The official client raises `ApiException` (a `DynamicApiError` from the dynamic client) for an HTTP
error, urllib3's `MaxRetryError` / `ProtocolError` / `SSLError` / timeouts for the transport, and
`ConfigException` from its kubeconfig loaders. `api_error` turns each into a `KubeApiError`
(a `UserError`); no exception text that could carry a header (and so a token) is ever shown: HTTP
errors show the API server's own `Status.message`, and every message passes through `redact`.
"""

from __future__ import annotations

import json
import re
import ssl
from dataclasses import dataclass
from typing import Any

import urllib3.exceptions
from kubernetes.client.exceptions import ApiException

from llmdeploy.apply.kube_context import KubeContext
from llmdeploy.errors import Problem, UserError


@dataclass
class KubeApiError(UserError):
    status_code: int = 0
    reason: str = ""


MIN_SECRET_CHARS = 8  # shorter strings are no credential, and replacing them would garble the text


def redact(text: str, secrets: tuple[str, ...]) -> str:
    for secret in secrets:
        if len(secret) >= MIN_SECRET_CHARS:
            text = text.replace(secret, "***")
    return text


def _status_of(e: ApiException) -> dict[str, Any]:
    body = e.body.decode(errors="replace") if isinstance(e.body, bytes) else e.body
    try:
        status = json.loads(body or "")
    except ValueError:
        status = None
    if isinstance(status, dict):
        return status
    return {"message": (str(body).strip()[:500] if body else str(e.reason or ""))}


def _conflict_problems(status: dict[str, Any], what: str) -> list[Problem]:
    causes = (status.get("details") or {}).get("causes") or []
    problems = [
        Problem(
            f"{what}: {c.get('message', 'conflict')}",
            fix="another field manager owns these fields; re-run with --force-conflicts to take them over",
        )
        for c in causes
    ]
    return problems or [
        Problem(
            f"{what}: {status.get('message', 'conflict')}",
            fix="re-run with --force-conflicts to take over the contested fields",
        )
    ]


def http_error(e: ApiException, what: str, ctx: KubeContext) -> KubeApiError:
    status = _status_of(e)
    code = int(e.status or status.get("code") or 0)
    reason = str(status.get("reason") or e.reason or "")
    if code == 409 and reason == "Conflict" and (status.get("details") or {}).get("causes"):
        return KubeApiError(_conflict_problems(status, what), status_code=409, reason=reason)
    message = " ".join(str(status.get("message") or reason).split())
    head = f"{what}: HTTP {code}" + (f" {reason}" if reason else "")
    if code == 401:
        return KubeApiError(
            [
                Problem(
                    f"{head}: {ctx.who}: its credentials were rejected by {ctx.server}",
                    fix=ctx.rejected_fix(),
                )
            ],
            status_code=code,
            reason=reason,
        )
    fix = {
        403: f"{ctx.who} lacks the RBAC rights for this; ask a cluster admin for them, or use another context with --context",
        404: "the resource does not exist",
        422: "the object is invalid for this cluster's API version; the message names the field",
    }.get(code)
    details = status.get("details") or {}
    if code == 404 and details.get("kind") == "namespaces":
        ns = details.get("name")
        fix = f"create the namespace first (kubectl create namespace {ns}) or set target.namespace"
    if code >= 500 and "containerLogs" in message:
        fix = "the API server could not reach the node's kubelet to read logs"
    return KubeApiError([Problem(f"{head}: {message}", fix=fix)], status_code=code, reason=reason)


def _os_reason(e: BaseException) -> str:
    """`[Errno 111] Connection refused` out of urllib3's wrapped error text, else the text itself."""
    text = str(e)
    m = re.search(r"\[Errno -?\d+\] ([^'\")]+)", text)
    if m:
        return m.group(1).strip()
    return re.sub(r"<[^>]*>: ", "", text).strip() or type(e).__name__


def _is_certificate_error(e: BaseException) -> bool:
    seen: BaseException | None = e
    while seen is not None:
        if isinstance(seen, ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY_FAILED" in str(seen):
            return True
        if "doesn't match" in str(seen) or "hostname mismatch" in str(seen).lower():
            return True
        seen = seen.__cause__ or seen.__context__ or getattr(seen, "reason", None)
        if not isinstance(seen, BaseException):
            seen = None
    return False


def transport_error(e: BaseException, what: str, ctx: KubeContext, proxy: str | None) -> KubeApiError:
    """A connection that could not be made or was cut: refused, unresolvable, TLS, proxy, timeout."""
    inner = e.reason if isinstance(e, urllib3.exceptions.MaxRetryError) and e.reason is not None else e
    where = f"the Kubernetes API at {ctx.server} (context {ctx.name!r})"
    if _is_certificate_error(inner):
        return KubeApiError(
            [
                Problem(
                    f"{what}: TLS with {where} failed: {_os_reason(inner)}",
                    fix="the server's certificate does not match the cluster's certificate-authority (or name) "
                    f"in {ctx.source}; refresh the kubeconfig from the cluster's provider",
                )
            ]
        )
    if isinstance(inner, urllib3.exceptions.ProxyError):
        return KubeApiError(
            [
                Problem(
                    f"{what}: cannot reach {where} through the proxy {proxy}: {_os_reason(inner)}",
                    fix="check HTTPS_PROXY / NO_PROXY (or the cluster's proxy-url in the kubeconfig)",
                )
            ]
        )
    if isinstance(inner, urllib3.exceptions.NewConnectionError | urllib3.exceptions.NameResolutionError):
        why = _os_reason(inner)  # a subclass of the timeout error, but refused or unresolvable
    elif isinstance(inner, urllib3.exceptions.TimeoutError):
        why = "no answer in time"
    elif isinstance(inner, urllib3.exceptions.ProtocolError | urllib3.exceptions.SSLError):
        why = f"the connection was cut ({_os_reason(inner)})"
    else:
        why = _os_reason(inner)
    return KubeApiError(
        [
            Problem(
                f"cannot reach {where}: {why} ({what})",
                fix="check that the cluster is running and that your kubeconfig points at it"
                + (f" (requests go through the proxy {proxy})" if proxy else ""),
            )
        ]
    )


TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (urllib3.exceptions.HTTPError, ssl.SSLError, OSError)
