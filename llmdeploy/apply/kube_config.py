"""Where the cluster is and who we are: a kubeconfig (or the in-cluster service account) parsed once.

Only what an HTTPS client needs is kept: server URL, CA bundle, client certificate and key, or a
bearer token. Inline `*-data` fields are written to private temp files because Python's TLS stack
loads certificates from files.
"""

from __future__ import annotations

import base64
import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from llmdeploy.errors import UserError

IN_CLUSTER_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


@dataclass(frozen=True)
class KubeConfig:
    server: str
    context: str
    ca_file: str | None = None
    insecure_skip_tls_verify: bool = False
    client_cert_file: str | None = None
    client_key_file: str | None = None
    token: str | None = None
    source: str = ""  # the file it came from, for error messages


def _default_path() -> Path:
    env = os.environ.get("KUBECONFIG")
    if env:
        return Path(env.split(os.pathsep)[0])
    return Path.home() / ".kube" / "config"


def _named(entries: Any, name: str, what: str, source: str) -> dict[str, Any]:
    for entry in entries or []:
        if isinstance(entry, dict) and entry.get("name") == name:
            value = entry.get(what)
            return value if isinstance(value, dict) else {}
    raise UserError.one(
        f"kubeconfig names {what} {name!r} but defines no such {what}",
        file=source,
        fix=f"add it under {what}s: or pick another context with --context",
    )


def _file_or_data(section: dict[str, Any], key: str, base_dir: Path) -> str | None:
    path = section.get(key)
    if path:
        p = Path(os.path.expanduser(str(path)))
        return str(p if p.is_absolute() else base_dir / p)
    data = section.get(key + "-data")
    if not data:
        return None
    raw = base64.b64decode(data)
    # content-addressed in a private folder: repeated runs reuse one file instead of piling up
    folder = Path(tempfile.gettempdir()) / f"llmdeploy-kube-tls-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    path = folder / f"{hashlib.sha256(raw).hexdigest()[:24]}.pem"
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
    return str(path)


def load_kubeconfig(path: Path | None = None, context: str | None = None) -> KubeConfig:
    """Parse a kubeconfig; with no file present and running in a pod, use the service account."""
    file = path or _default_path()
    if not file.exists():
        if path is None and (IN_CLUSTER_DIR / "token").exists():
            return _in_cluster()
        raise UserError.one(
            "no kubeconfig found",
            file=str(file),
            fix="point --kubeconfig or $KUBECONFIG at your cluster's kubeconfig",
        )
    source = str(file)
    try:
        cfg = yaml.safe_load(file.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise UserError.one(f"cannot read kubeconfig: {e}", file=source) from e
    ctx_name = context or cfg.get("current-context")
    if not ctx_name:
        raise UserError.one("kubeconfig has no current-context", file=source, fix="pass --context NAME")
    ctx = _named(cfg.get("contexts"), ctx_name, "context", source)
    cluster = _named(cfg.get("clusters"), str(ctx.get("cluster")), "cluster", source)
    user = _named(cfg.get("users"), str(ctx.get("user")), "user", source) if ctx.get("user") else {}
    server = cluster.get("server")
    if not server:
        raise UserError.one(f"cluster {ctx.get('cluster')!r} has no server URL", file=source)
    if "exec" in user or "auth-provider" in user:
        raise UserError.one(
            f"user {ctx.get('user')!r} authenticates with an exec/auth-provider plugin, which llmdeploy does not run",
            file=source,
            fix="use a kubeconfig with a token or a client certificate",
        )
    base = file.parent
    token = user.get("token")
    if not token and user.get("tokenFile"):
        token = Path(user["tokenFile"]).read_text().strip()
    return KubeConfig(
        server=str(server).rstrip("/"),
        context=str(ctx_name),
        ca_file=_file_or_data(cluster, "certificate-authority", base),
        insecure_skip_tls_verify=bool(cluster.get("insecure-skip-tls-verify", False)),
        client_cert_file=_file_or_data(user, "client-certificate", base),
        client_key_file=_file_or_data(user, "client-key", base),
        token=str(token) if token else None,
        source=source,
    )


def _in_cluster() -> KubeConfig:
    host = os.environ.get("KUBERNETES_SERVICE_HOST", "kubernetes.default.svc")
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    return KubeConfig(
        server=f"https://{host}:{port}",
        context="in-cluster",
        ca_file=str(IN_CLUSTER_DIR / "ca.crt"),
        token=(IN_CLUSTER_DIR / "token").read_text().strip(),
        source=str(IN_CLUSTER_DIR),
    )
