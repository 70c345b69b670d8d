"""One connection to a cluster through the official `kubernetes` client: server-side apply, get,
list, delete and watches through its `DynamicClient`, pod logs through `CoreV1Api`.

Objects go in and come out as plain dicts (what the renderer writes and the diff compares); every
client exception becomes a `KubeApiError` naming what was asked, the context and the fix
(`kube_errors`). `connect()` in `kube_connect` builds one from a kubeconfig or the service account.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from kubernetes import client as k8s
from kubernetes import watch
from kubernetes.client.exceptions import ApiException
from kubernetes.client.rest import should_bypass_proxies
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.resource import Resource

from llmdeploy.apply.kube_context import KubeContext
from llmdeploy.apply.kube_errors import TRANSPORT_ERRORS, KubeApiError, http_error, redact, transport_error
from llmdeploy.errors import Problem

FIELD_MANAGER = "llmdeploy"
APPLY_PATCH = "application/apply-patch+yaml"


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
        return str(self.resource().path(name=name, namespace=namespace))

    def resource(self, client: DynamicClient | None = None) -> Resource:
        """The dynamic client's description of it: enough to build paths; a watch needs `client`."""
        return Resource(
            client=client,
            prefix="apis" if self.group else "api",
            group=self.group,
            api_version=self.version,
            kind=self.kind,
            name=self.plural,
            namespaced=self.namespaced,
        )

    @classmethod
    def of(cls, r: Resource) -> ResourceType:
        return cls(str(r.group or ""), str(r.api_version), str(r.kind), str(r.name), bool(r.namespaced))


def _as_dict(_client: object, data: Any) -> Any:
    """A serializer for the dynamic client that keeps the API server's JSON as it came."""
    return data


class KubeClient:
    def __init__(self, api_client: k8s.ApiClient, context: KubeContext, timeout_s: float = 30.0) -> None:
        self.api_client = api_client
        self.context = context
        self.timeout_s = timeout_s
        self._dynamic: DynamicClient | None = None
        # Discovery results go to a private folder for this connection only: the client's default
        # cache file sits in the shared temp folder and outlives CRDs that come and go.
        self._cache_dir = Path(tempfile.mkdtemp(prefix="llmdeploy-discovery-"))

    def close(self) -> None:
        self.api_client.close()
        shutil.rmtree(self._cache_dir, ignore_errors=True)

    def __enter__(self) -> KubeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def proxy(self) -> str | None:
        """The proxy requests go through (its user:password left out), or None."""
        cfg = self.api_client.configuration
        if not cfg.proxy or should_bypass_proxies(cfg.host, cfg.no_proxy or ""):
            return None
        url = urlsplit(str(cfg.proxy))
        return url._replace(netloc=url.netloc.rpartition("@")[2]).geturl()

    @contextmanager
    def errors(self, what: str) -> Iterator[None]:
        """Turn the client's exceptions inside the block into one KubeApiError about `what`."""
        try:
            yield
        except KubeApiError:
            raise
        except ApiException as e:
            raise self._redacted(http_error(e, what, self.context)) from None
        except TRANSPORT_ERRORS as e:
            raise self._redacted(transport_error(e, what, self.context, self.proxy)) from None

    def _redacted(self, error: KubeApiError) -> KubeApiError:
        token = str(self.api_client.configuration.api_key.get("BearerToken") or "")  # "Bearer xyz"
        secrets = (token, token.partition(" ")[2])
        problems = [
            dataclasses.replace(p, message=redact(p.message, secrets), fix=p.fix and redact(p.fix, secrets))
            for p in error.problems
        ]
        return KubeApiError(problems, status_code=error.status_code, reason=error.reason)

    # -- discovery ---------------------------------------------------------------------------
    def rediscover(self) -> DynamicClient:
        """A dynamic client with fresh discovery (the API server's version and groups are read now)."""
        cache = self._cache_dir / f"{uuid.uuid4().hex}.json"
        with self.errors("discover the cluster's APIs"):
            try:
                self._dynamic = DynamicClient(self.api_client, cache_file=str(cache))
            except (json.JSONDecodeError, AttributeError, KeyError, TypeError) as e:  # no API listing
                raise KubeApiError(
                    [
                        Problem(
                            f"{self.context.server} (context {self.context.name!r}) does not answer like a "
                            f"Kubernetes API server ({type(e).__name__} reading its API listing)",
                            fix=f"check the cluster's server URL in {self.context.source}",
                        )
                    ]
                ) from None
        return self._dynamic

    @property
    def dynamic(self) -> DynamicClient:
        return self._dynamic if self._dynamic is not None else self.rediscover()

    # -- objects -------------------------------------------------------------------------------
    def get(self, rt: ResourceType, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        found, obj = self._unless_missing(f"get {rt.kind} {name}", "get", rt, name=name, namespace=namespace)
        return obj if found else None

    def list(
        self, rt: ResourceType, namespace: str | None = None, label_selector: str | None = None
    ) -> list[dict[str, Any]]:
        result = self._call(
            f"list {rt.plural}", "get", rt, namespace=namespace, label_selector=label_selector
        )
        items: list[dict[str, Any]] = result.get("items") or []
        for item in items:  # list responses omit these; callers want whole objects
            item.setdefault("apiVersion", rt.api_version)
            item.setdefault("kind", rt.kind)
        return items

    def apply(
        self,
        rt: ResourceType,
        obj: dict[str, Any],
        *,
        dry_run: bool = False,
        force: bool = False,
        field_manager: str = FIELD_MANAGER,
    ) -> dict[str, Any]:
        """Server-side apply of the whole object (`force` takes over fields other managers own)."""
        meta = obj["metadata"]
        result: dict[str, Any] = self._call(
            f"apply {rt.kind} {meta['name']}",
            "server_side_apply",
            rt,
            body=obj,
            namespace=meta.get("namespace"),
            field_manager=field_manager,
            force_conflicts=True if force else None,
            dry_run="All" if dry_run else None,
        )
        return result

    def delete(
        self, rt: ResourceType, name: str, namespace: str | None = None, *, dry_run: bool = False
    ) -> bool:
        """Delete one object (dependents in the background); False when it was already gone."""
        found, _ = self._unless_missing(
            f"delete {rt.kind} {name}",
            "delete",
            rt,
            name=name,
            namespace=namespace,
            propagation_policy="Background",
            dry_run="All" if dry_run else None,
        )
        return found

    def _call(self, action: str, method: str, rt: ResourceType, **kwargs: Any) -> Any:
        """The dynamic client's `method` on `rt`, as plain dicts and within the timeout, its failures
        (discovery's included, which the first call runs) reported as `action`."""
        with self.errors(action):
            call = getattr(self.dynamic, method)
            return call(rt.resource(), serializer=_as_dict, _request_timeout=self.timeout_s, **kwargs)

    def _unless_missing(self, action: str, method: str, rt: ResourceType, **kwargs: Any) -> tuple[bool, Any]:
        """`_call`, answering (False, None) when the object does not exist (404)."""
        try:
            return True, self._call(action, method, rt, **kwargs)
        except KubeApiError as e:
            if e.status_code == 404:
                return False, None
            raise

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
        """Any other call (a subresource, a raw path) through the dynamic client's transport."""
        try:
            with self.errors(what):
                result: dict[str, Any] = self.dynamic.request(
                    method.lower(),
                    path,
                    body=body,
                    query_params=list((params or {}).items()),
                    content_type=content_type,
                    serializer=_as_dict,
                    _request_timeout=self.timeout_s,
                )
        except KubeApiError as e:
            if e.status_code == 404 and missing_ok:
                return None
            raise
        return result

    def watch(
        self, rt: ResourceType, name: str, namespace: str | None, resource_version: str, timeout_s: float
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """(event type, object) for one object's changes after `resource_version`, for up to
        `timeout_s` (the API server ends the watch then). An expired resource version (410 Gone)
        ends the stream early; the caller reads the object again and watches on."""
        watcher = watch.Watch()
        try:
            with self.errors(f"watch {rt.kind} {name}"):
                for event in self.dynamic.watch(
                    rt.resource(self.dynamic),
                    namespace=namespace,
                    name=name,
                    resource_version=resource_version,
                    timeout=max(1, math.ceil(timeout_s)),
                    watcher=watcher,
                ):
                    yield str(event["type"]), event["raw_object"]
        except KubeApiError as e:
            if e.status_code != 410:
                raise
        finally:
            watcher.stop()

    def pod_log_lines(
        self, name: str, namespace: str, container: str, tail_lines: int, follow: bool
    ) -> Iterator[str]:
        core = k8s.CoreV1Api(self.api_client)
        with self.errors(f"read logs of pod {name}"):
            if follow:
                yield from watch.Watch().stream(
                    core.read_namespaced_pod_log,
                    name,
                    namespace,
                    container=container,
                    tail_lines=tail_lines,
                    follow=True,
                )
            else:
                text = core.read_namespaced_pod_log(
                    name,
                    namespace,
                    container=container,
                    tail_lines=tail_lines,
                    _request_timeout=self.timeout_s,
                )
                yield from str(text).splitlines()
