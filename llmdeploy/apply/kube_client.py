"""A small Kubernetes REST client on httpx: server-side apply, get, list, delete.

Every failure becomes a `KubeApiError` (a `UserError`) that says what was asked, what the API
server answered and, for apply conflicts, which field manager owns the contested fields.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx

from llmdeploy.apply.kube_config import KubeConfig
from llmdeploy.errors import Problem, UserError

FIELD_MANAGER = "llmdeploy"
APPLY_PATCH = "application/apply-patch+yaml"


@dataclass
class KubeApiError(UserError):
    status_code: int = 0
    reason: str = ""


@dataclass(frozen=True)
class ResourceType:
    """One API resource as discovery describes it."""

    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        return f"{base}/{name}" if name else base


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


def _tls_context(config: KubeConfig) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=config.ca_file)
    if config.insecure_skip_tls_verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if config.client_cert_file:
        ctx.load_cert_chain(config.client_cert_file, config.client_key_file)
    return ctx


class KubeClient:
    def __init__(self, config: KubeConfig, timeout_s: float = 30.0) -> None:
        self.config = config
        headers = {"Accept": "application/json", "User-Agent": "llmdeploy"}
        if config.token:
            headers["Authorization"] = f"Bearer {config.token}"
        try:
            tls = _tls_context(config)
        except (OSError, ssl.SSLError) as e:  # unreadable or mismatched CA / client cert / key files
            raise UserError.one(f"cannot set up TLS for {config.server}: {e}", file=config.source) from e
        self._http = httpx.Client(base_url=config.server, headers=headers, verify=tls, timeout=timeout_s)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> KubeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        what: str,
        params: dict[str, str] | None = None,
        body: dict[str, Any] | None = None,
        content_type: str = "application/json",
        missing_ok: bool = False,
    ) -> dict[str, Any] | None:
        content = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": content_type} if content is not None else {}
        try:
            r = self._http.request(method, path, params=params, content=content, headers=headers)
        except httpx.TransportError as e:
            raise KubeApiError(
                [
                    Problem(
                        f"cannot reach the Kubernetes API at {self.config.server} (context {self.config.context!r}): {e}",
                        fix="check that the cluster is running and that your kubeconfig points at it",
                    )
                ]
            ) from e
        if r.status_code == 404 and missing_ok:
            return None
        if r.status_code >= 400:
            raise self._error(r, what)
        return r.json() if r.content else {}

    def _error(self, r: httpx.Response, what: str) -> KubeApiError:
        try:
            status = r.json()
        except ValueError:
            status = {"message": r.text.strip()[:500]}
        reason = str(status.get("reason", ""))
        if r.status_code == 409 and reason == "Conflict" and status.get("details", {}).get("causes"):
            return KubeApiError(_conflict_problems(status, what), status_code=409, reason=reason)
        message = str(status.get("message") or r.reason_phrase)
        fix = {
            401: "your credentials were rejected; refresh the token or client certificate in the kubeconfig",
            403: "your user lacks permission for this; ask for RBAC rights or use another context",
            404: "the resource does not exist",
            422: "the object is invalid for this cluster's API version",
        }.get(r.status_code)
        details = status.get("details") or {}
        if r.status_code == 404 and details.get("kind") == "namespaces":
            ns = details.get("name")
            fix = f"create the namespace first (kubectl create namespace {ns}) or set target.namespace"
        if r.status_code >= 500 and "containerLogs" in message:
            fix = "the API server could not reach the node's kubelet to read logs"
        head = f"{what}: HTTP {r.status_code}" + (f" {reason}" if reason else "")
        return KubeApiError(
            [Problem(f"{head}: {message}", fix=fix)], status_code=r.status_code, reason=reason
        )

    def get(self, rt: ResourceType, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        return self.request("GET", rt.path(namespace, name), what=f"get {rt.kind} {name}", missing_ok=True)

    def list(
        self, rt: ResourceType, namespace: str | None = None, label_selector: str | None = None
    ) -> list[dict[str, Any]]:
        params = {"labelSelector": label_selector} if label_selector else None
        result = self.request("GET", rt.path(namespace), what=f"list {rt.plural}", params=params) or {}
        items: list[dict[str, Any]] = result.get("items") or []
        for item in items:  # list responses omit these; callers want whole objects
            item.setdefault("apiVersion", rt.api_version)
            item.setdefault("kind", rt.kind)
        return items

    def apply(
        self, rt: ResourceType, obj: dict[str, Any], *, dry_run: bool = False, force: bool = False
    ) -> dict[str, Any]:
        meta = obj["metadata"]
        params = {"fieldManager": FIELD_MANAGER}
        if force:
            params["force"] = "true"
        if dry_run:
            params["dryRun"] = "All"
        # JSON is YAML, so the apply-patch content type takes the object serialized as JSON.
        result = self.request(
            "PATCH",
            rt.path(meta.get("namespace"), meta["name"]),
            params=params,
            body=obj,
            content_type=APPLY_PATCH,
            what=f"apply {rt.kind} {meta['name']}",
        )
        assert result is not None
        return result

    def delete(
        self, rt: ResourceType, name: str, namespace: str | None = None, *, dry_run: bool = False
    ) -> bool:
        """Delete one object (dependents in the background); False when it was already gone."""
        params = {"propagationPolicy": "Background"}
        if dry_run:
            params["dryRun"] = "All"
        result = self.request(
            "DELETE",
            rt.path(namespace, name),
            params=params,
            what=f"delete {rt.kind} {name}",
            missing_ok=True,
        )
        return result is not None

    def stream_lines(self, path: str, params: dict[str, str], what: str) -> Iterator[str]:
        try:
            with self._http.stream("GET", path, params=params, timeout=None) as r:
                if r.status_code >= 400:
                    r.read()
                    raise self._error(r, what)
                yield from r.iter_lines()
        except httpx.TransportError as e:
            raise KubeApiError([Problem(f"{what}: connection to {self.config.server} failed: {e}")]) from e
