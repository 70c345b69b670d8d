"""Constrained value types of recipe fields: names other systems accept, and bounded numbers.

Each type refuses, at load time and with the field's file:line, a value that would otherwise be
rendered into something a shell, the engine or the Kubernetes API rejects or misreads later: an
environment variable name `bash` cannot export, a label the API server refuses, a host that argparse
reads as a flag, a number past Kubernetes' int32 fields.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from typing import Annotated

from pydantic import AfterValidator, Field

from llmdeploy.errors import is_credential_name

# Kubernetes' int32 fields (replicas, periodSeconds, failureThreshold, ...) end here
INT32_MAX = 2**31 - 1
# a bound for counts of tokens, requests and seconds that never reach an int32 field: far past any
# real value, and small enough that every product and float conversion downstream stays exact
COUNT_MAX = 2**31 - 1

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN_PART = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_LABEL_NAME = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)")
_SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]{1,253}")
_HOSTNAME_PART = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?")
_VERSION = re.compile(r"[0-9A-Za-z][0-9A-Za-z.+_-]{0,63}")
_KUBERNETES_VERSION = re.compile(r"v?\d{1,4}\.\d{1,4}(\.\d{1,4})?")
# labels llmdeploy sets itself on every object (selectors, pruning); a recipe cannot replace them
RESERVED_LABELS = ("app.kubernetes.io/managed-by", "app.kubernetes.io/instance", "app.kubernetes.io/name")


def checked(ok: Callable[[str], bool], problem: Callable[[str], str]) -> Callable[[str], str]:
    """A pydantic after-validator: the value when `ok(value)`, else ValueError(problem(value))."""

    def check(value: str) -> str:
        if not ok(value):
            raise ValueError(problem(value))
        return value

    return check


def is_dns_label(value: str) -> bool:
    return _DNS_LABEL.fullmatch(value) is not None


def is_dns_subdomain(value: str) -> bool:
    return len(value) <= 253 and all(_DNS_SUBDOMAIN_PART.fullmatch(p) for p in value.split("."))


def is_label_name(value: str) -> bool:
    """A label's name part or value: at most 63 letters, digits, '-', '_' or '.', alphanumeric at both ends."""
    return _LABEL_NAME.fullmatch(value) is not None


_env_name = checked(
    lambda v: _ENV_NAME.fullmatch(v) is not None,
    lambda _: "not an environment variable name: letters, digits and underscores, not starting with a digit",
)
_dns_label = checked(
    is_dns_label,
    lambda _: (
        "not a DNS label (what Kubernetes needs here): lower-case letters, digits "
        "and '-', starting and ending with a letter or digit, at most 63 characters"
    ),
)
_dns_subdomain = checked(
    is_dns_subdomain,
    lambda _: (
        "not a Kubernetes object name: lower-case letters, digits, '-' and '.', "
        "starting and ending with a letter or digit, at most 253 characters"
    ),
)
_secret_key = checked(
    lambda v: _SECRET_KEY.fullmatch(v) is not None,
    lambda _: "not a key of a Kubernetes Secret: letters, digits, '-', '_' and '.'",
)


def _label_key(value: str) -> str:
    prefix, slash, name = value.rpartition("/")
    if not is_label_name(name) or (slash and not (prefix and is_dns_subdomain(prefix))):
        raise ValueError(
            "not a Kubernetes label key: an optional DNS prefix and '/', then at most "
            "63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
        )
    return value


_label_value = checked(
    lambda v: not v or is_label_name(v),
    lambda _: (
        "not a Kubernetes label value: empty, or at most 63 letters, digits, "
        "'-', '_' or '.', starting and ending with a letter or digit"
    ),
)


def _user_label_key(value: str) -> str:
    if value in RESERVED_LABELS:
        raise ValueError("set by llmdeploy on every object (it selects and prunes them); use another key")
    return _label_key(value)


def _host(value: str) -> str:
    try:
        ipaddress.ip_address(value)
        return value
    except ValueError:
        pass
    if len(value) > 253 or not all(_HOSTNAME_PART.fullmatch(p) for p in value.split(".")):
        raise ValueError("not an address to listen on: an IP address (0.0.0.0, 127.0.0.1, ::) or a host name")
    return value


_version = checked(
    lambda v: _VERSION.fullmatch(v) is not None,
    lambda _: "not a release version: at most 64 letters, digits, '.', '+', '_' and '-', e.g. '0.11.0'",
)
_kubernetes_version = checked(
    lambda v: _KUBERNETES_VERSION.fullmatch(v) is not None,
    lambda _: "not a Kubernetes version: write MAJOR.MINOR, e.g. '1.30'",
)


def _no_credentials(env: dict[str, str]) -> dict[str, str]:
    named = sorted(name for name in env if is_credential_name(name))
    if named:
        raise ValueError(
            f"{', '.join(named)} looks like a credential: its value would be written in plain text into "
            "launch.sh, engine.env, Compose files and manifests (give the API key and hub token as "
            "server.api_key / server.hf_token: {env: VAR} or {secret: {name, key}}, which render by "
            "reference)"
        )
    return env


EnvName = Annotated[str, AfterValidator(_env_name)]
DnsLabel = Annotated[str, AfterValidator(_dns_label)]
ObjectName = Annotated[str, AfterValidator(_dns_subdomain)]
SecretKey = Annotated[str, AfterValidator(_secret_key)]
LabelKey = Annotated[str, AfterValidator(_label_key)]
UserLabelKey = Annotated[str, AfterValidator(_user_label_key)]
LabelValue = Annotated[str, AfterValidator(_label_value)]
Host = Annotated[str, AfterValidator(_host)]
Version = Annotated[str, AfterValidator(_version)]
KubernetesVersion = Annotated[str, AfterValidator(_kubernetes_version)]
EngineEnv = Annotated[dict[EnvName, str], AfterValidator(_no_credentials)]
# a token count or request count: a positive whole number a manifest or an engine flag can carry
Count = Annotated[int, Field(ge=1, le=COUNT_MAX)]
