"""Which cluster and identity a connection uses: the facts error messages name (never a credential)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KubeContext:
    """Which cluster and identity a connection uses, for messages (never a credential)."""

    name: str  # the kubeconfig context, or "in-cluster"
    server: str
    source: str  # the kubeconfig file(s), or the service-account folder
    user: str = ""
    auth: str = "none"  # "token", "token file", "client certificate", "exec", "service account", ...
    exec_command: str = ""

    @property
    def who(self) -> str:
        user = f"user {self.user!r}, " if self.user else ""
        return f"context {self.name!r} ({user}{self.auth})"

    def rejected_fix(self) -> str:
        if self.auth == "exec":
            return (
                f"the exec plugin `{self.exec_command}` handed out a credential the cluster does not accept: "
                "log in again with the tool that wrote this kubeconfig (e.g. `aws sso login`, "
                "`gcloud auth login`, `az login`), or pick another context with --context"
            )
        if self.auth == "service account":
            return "the pod's service account token is not accepted; check the pod's serviceAccountName"
        if self.auth == "client certificate":
            return (
                "the client certificate is expired or not signed by this cluster's CA; get a fresh kubeconfig"
            )
        return (
            f"the token of user {self.user!r} in {self.source} is wrong or expired; get a fresh one, "
            "or pick another context with --context"
        )
