"""Connecting as kubectl does, through the official client's own loaders.

- **Which kubeconfig**: `--kubeconfig FILE`, else every file of `$KUBECONFIG` (':'-separated,
  missing ones skipped, merged by the client's `KubeConfigMerger`: the first file to define a
  cluster, user or context wins), else `~/.kube/config`. `$KUBECONFIG` is read at each call (the
  client's `KUBE_CONFIG_DEFAULT_LOCATION` is fixed when it is imported) and an empty value counts as
  unset, as in kubectl.
- **Which context**: `--context`, else the first `current-context` in file order. kubectl takes the
  first file's; the client's merger lets the last one win, so the name is picked here and passed on.
- **Credentials**: `kubernetes.config.load_kube_config` loads tokens, token files, client
  certificates (files or inline data), basic auth, exec credential plugins (`aws eks get-token`,
  `gke-gcloud-auth-plugin`, `kubelogin`: run with `KUBERNETES_EXEC_INFO`, their token refreshed when
  it expires) and the gcp/oidc auth providers. The client logs a failing exec plugin and goes on
  without credentials; that log is caught here and becomes the error, naming the plugin and its
  install hint when it is not installed. Token files are stripped of surrounding whitespace, as
  kubectl does (the client would send a trailing newline as part of the header).
- **In-cluster**: with no kubeconfig file at all, no `--kubeconfig`/`--context`, and
  `KUBERNETES_SERVICE_HOST`/`_PORT` set with a service-account token present, the client's
  `InClusterConfigLoader` uses the pod's service account. It reads
  /var/run/secrets/kubernetes.io/serviceaccount/{token,ca.crt}; `LLMDEPLOY_KUBE_SERVICE_ACCOUNT_DIR`
  names another folder (meant for tests; the loader takes the file names as parameters).
- **Proxies**: the client reads `HTTPS_PROXY`/`HTTP_PROXY`/`NO_PROXY` (either case) itself and
  applies `NO_PROXY` (host names, domain suffixes, IPs, CIDRs, `*`) when it opens its pool; a
  cluster's `proxy-url` replaces them. Two kubectl rules are added here: a loopback server
  (localhost, 127.0.0.0/8, ::1) is never proxied, and `NO_PROXY` does not apply to a `proxy-url`.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import yaml
from kubernetes import client as k8s
from kubernetes.config import ConfigException, load_kube_config
from kubernetes.config.incluster_config import (
    SERVICE_HOST_ENV_NAME,
    SERVICE_PORT_ENV_NAME,
    InClusterConfigLoader,
)
from kubernetes.config.kube_config import ENV_KUBECONFIG_PATH_SEPARATOR, KubeConfigMerger

from llmdeploy.apply.kube_api import KubeClient
from llmdeploy.apply.kube_context import KubeContext
from llmdeploy.errors import Problem, UserError

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
SERVICE_ACCOUNT_DIR_ENV = "LLMDEPLOY_KUBE_SERVICE_ACCOUNT_DIR"
DEFAULT_KUBECONFIG = "~/.kube/config"


def connect(
    kubeconfig: Path | None = None,
    context: str | None = None,
    *,
    server: str | None = None,
    timeout_s: float = 30.0,
) -> KubeClient:
    """A client for the cluster kubectl would talk to with these flags (`server` as `--server`)."""
    configuration = k8s.Configuration()
    paths = str(kubeconfig) if kubeconfig is not None else os.environ.get("KUBECONFIG") or DEFAULT_KUBECONFIG
    merger = _merge(paths)
    if merger.config is None:
        if kubeconfig is None and context is None and _in_cluster_possible():
            ctx = _load_in_cluster(configuration)
        else:
            raise UserError.one(
                f"no kubeconfig found (looked at {paths})",
                fix="point --kubeconfig or $KUBECONFIG at your cluster's kubeconfig",
            )
    else:
        ctx = _load_kubeconfig(merger, context, configuration)
    if server:
        ctx = dataclasses.replace(ctx, server=server.rstrip("/"))
    _keep_after_refresh(configuration, ctx.server if server else None)
    _proxy_as_kubectl(configuration, merger, ctx)
    return KubeClient(k8s.ApiClient(configuration), ctx, timeout_s)


def _merge(paths: str) -> KubeConfigMerger:
    try:
        # kubectl reads an empty file as an empty config; the client's merger refuses it
        kept = [
            p
            for p in paths.split(ENV_KUBECONFIG_PATH_SEPARATOR)
            if p and not (os.path.isfile(q := os.path.expanduser(p)) and not Path(q).read_bytes().strip())
        ]
        return KubeConfigMerger(ENV_KUBECONFIG_PATH_SEPARATOR.join(kept))
    except (OSError, yaml.YAMLError, ConfigException, AttributeError, TypeError, KeyError) as e:
        raise UserError.one(
            f"cannot read kubeconfig {paths}: {' '.join(str(e).split())}",
            fix="check the file(s) with `kubectl config view`",
        ) from None


def _entries(merged: Any, key: str) -> dict[str, tuple[dict[str, Any], str]]:
    """name -> (entry, file that defined it) for the merged clusters, users or contexts."""
    out: dict[str, tuple[dict[str, Any], str]] = {}
    for node in merged.value.get(key) or []:
        entry = node.value if hasattr(node, "value") else node
        if isinstance(entry, dict) and "name" in entry:
            out.setdefault(str(entry["name"]), (entry, str(getattr(node, "path", "") or "")))
    return out


def _auth_kind(user: dict[str, Any]) -> tuple[str, str]:
    if "exec" in user:
        return "exec", str((user.get("exec") or {}).get("command", ""))
    if "auth-provider" in user:
        return f"auth-provider {(user.get('auth-provider') or {}).get('name', '?')}", ""
    if user.get("token"):
        return "token", ""
    if user.get("tokenFile"):
        return "token file", ""
    if user.get("client-certificate") or user.get("client-certificate-data"):
        return "client certificate", ""
    if user.get("username"):
        return "basic auth", ""
    return "no credentials", ""


def _load_kubeconfig(
    merger: KubeConfigMerger, context: str | None, configuration: k8s.Configuration
) -> KubeContext:
    files = list(merger.paths)
    source = ENV_KUBECONFIG_PATH_SEPARATOR.join(files)
    merged = merger.config
    contexts = _entries(merged, "contexts")
    first_current = next(
        (str(c) for p in files if (c := (merger.config_files.get(p) or {}).get("current-context"))), None
    )
    name = context or first_current
    known = ", ".join(sorted(contexts)) or "none defined"
    if not name:
        raise UserError.one(
            f"kubeconfig {source} sets no current-context",
            fix=f"pass --context NAME (contexts: {known}) or run `kubectl config use-context NAME`",
        )
    if name not in contexts:
        raise UserError.one(
            f"kubeconfig {source} has no context {name!r}",
            fix=f"pick one of its contexts with --context ({known})",
        )
    ctx_entry = contexts[name][0].get("context") or {}
    user_name = str(ctx_entry.get("user") or "")
    user_entry, user_file = _entries(merged, "users").get(user_name, ({}, ""))
    user = user_entry.get("user") or {}
    cluster_name = str(ctx_entry.get("cluster") or "")
    cluster_entry, cluster_file = _entries(merged, "clusters").get(cluster_name, ({}, ""))
    cluster = cluster_entry.get("cluster") or {}
    auth, exec_command = _auth_kind(user)
    ctx = KubeContext(
        name, str(cluster.get("server", "")), source, user=user_name, auth=auth, exec_command=exec_command
    )
    with _client_errors_logged() as logged:
        try:
            load_kube_config(
                config_file=source, context=name, client_configuration=configuration, persist_config=False
            )
        except (ConfigException, OSError, ValueError, KeyError, TypeError) as e:
            raise UserError.one(
                f"kubeconfig {source}: context {name!r} cannot be loaded: {' '.join(str(e).split())}",
                fix=f"check it with `kubectl config view --minify --context {name}`",
            ) from None
    ctx = dataclasses.replace(ctx, server=str(configuration.host))
    has_credential = bool(configuration.api_key.get("BearerToken") or configuration.cert_file)
    if auth == "exec" and not has_credential:
        raise UserError([_exec_problem(ctx, user.get("exec") or {}, cluster_file or user_file, logged)])
    if auth.startswith("auth-provider") and not has_credential:
        raise UserError.one(
            f"{ctx.who}: the {auth} gave no token ({'; '.join(logged) or 'not supported by the client'})",
            fix="kubectl dropped auth-provider plugins too: switch the kubeconfig to an exec plugin "
            "(`kubelogin convert-kubeconfig` for AKS, `gke-gcloud-auth-plugin` for GKE)",
        )
    return ctx


def _exec_problem(ctx: KubeContext, exec_cfg: dict[str, Any], base_file: str, logged: list[str]) -> Problem:
    command = str(exec_cfg.get("command", ""))
    argv = " ".join([command, *[str(a) for a in exec_cfg.get("args") or []]])
    env_path = next(
        (str(e.get("value")) for e in exec_cfg.get("env") or [] if e.get("name") == "PATH"),
        os.environ.get("PATH", ""),
    )
    if "/" in command:
        path = Path(command) if os.path.isabs(command) else Path(base_file).parent / command
        found = path.is_file() and os.access(path, os.X_OK)
    else:
        found = shutil.which(command, path=env_path) is not None
    if command and not found:
        hint = " ".join(str(exec_cfg.get("installHint") or "").split())
        return Problem(
            f"{ctx.who}: the exec credential plugin `{command}` is not installed (not found on PATH)",
            fix=hint or f"install `{command}` (the cluster provider's CLI) or put it on PATH",
        )
    why = " ".join(" ".join(logged).split())[:400] or "it gave no token or client certificate"
    return Problem(
        f"{ctx.who}: the exec credential plugin `{command}` failed: {why}",
        fix=f"run `{argv}` yourself to see why; usually you need to log in again with the provider's CLI",
    )


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextmanager
def _client_errors_logged() -> Iterator[list[str]]:
    """The client reports a failed exec plugin with `logging.error` on the root logger and carries
    on; collect those lines (and keep them off the terminal) while loading."""
    handler = _Collect()
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield handler.messages
    finally:
        root.removeHandler(handler)


def _service_account_dir() -> Path:
    return Path(os.environ.get(SERVICE_ACCOUNT_DIR_ENV) or SERVICE_ACCOUNT_DIR)


def _in_cluster_possible() -> bool:
    return (
        bool(os.environ.get(SERVICE_HOST_ENV_NAME))
        and bool(os.environ.get(SERVICE_PORT_ENV_NAME))
        and (_service_account_dir() / "token").is_file()
    )


def _load_in_cluster(configuration: k8s.Configuration) -> KubeContext:
    folder = _service_account_dir()
    loader = InClusterConfigLoader(token_filename=str(folder / "token"), cert_filename=str(folder / "ca.crt"))
    try:
        loader.load_and_set(configuration)
    except (ConfigException, OSError) as e:
        raise UserError.one(
            f"in-cluster service account ({folder}): {e}",
            fix="mount the service account token (automountServiceAccountToken) or pass --kubeconfig",
        ) from None
    return KubeContext("in-cluster", str(configuration.host), str(folder), auth="service account")


def _keep_after_refresh(configuration: k8s.Configuration, server: str | None) -> None:
    """Before every request the loaders' refresh hook sets host, token and TLS files again from the
    kubeconfig; keep two things across it: a `--server` override, and the token trimmed (kubectl
    trims token files; the client keeps a trailing newline, which is no valid header value)."""
    hook = configuration.refresh_api_key_hook

    def after(cfg: k8s.Configuration) -> None:
        if hook is not None:
            hook(cfg)
            cfg.refresh_api_key_hook = after  # the client's hook re-installs itself
        if server:
            cfg.host = server
        token = cfg.api_key.get("BearerToken")
        if token:
            cfg.api_key["BearerToken"] = " ".join(token.split())

    after(configuration)
    configuration.refresh_api_key_hook = after  # type: ignore[assignment]  # the client types it as None


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _proxy_as_kubectl(configuration: k8s.Configuration, merger: KubeConfigMerger, ctx: KubeContext) -> None:
    clusters = _entries(merger.config, "clusters") if merger.config is not None else {}
    contexts = _entries(merger.config, "contexts") if merger.config is not None else {}
    cluster_name = str(((contexts.get(ctx.name, ({}, ""))[0]).get("context") or {}).get("cluster", ""))
    proxy_url = (clusters.get(cluster_name, ({}, ""))[0].get("cluster") or {}).get("proxy-url")
    if proxy_url:
        configuration.no_proxy = None  # kubectl: a cluster's proxy-url is used for it, always
    elif _is_loopback(urlparse(str(configuration.host)).hostname or ""):
        configuration.proxy = None  # kubectl never proxies a loopback server
