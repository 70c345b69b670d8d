"""llm-d's router in front of an engine on this machine: the local and docker targets' opt-in
`target.llm_d_router` adds the router's no-Kubernetes endpoints file and the endpoint-picker config
that reads it (`llm_d_objects.router_files`) to their render output.

The router reaches the engine where this machine serves it (the local process's address, or the
address Compose publishes the port on), so the endpoints file names `server.host` and `server.port`;
the router's file-discovery plugin resolves no host names, so the address must be an IPv4 literal
(`localhost` and the wildcard 0.0.0.0 are written as 127.0.0.1).
"""

from __future__ import annotations

import ipaddress

from llmdeploy.errors import Problem
from llmdeploy.recipe.schema import Recipe
from llmdeploy.targets.llm_d_objects import router_files

# where the router's container sees the rendered llm-d/ folder (docs/targets/llm-d.md mounts it there)
ROUTER_CONFIG_DIR = "/etc/epp"
_LOOPBACK = "127.0.0.1"


def router_address(recipe: Recipe) -> str | None:
    """The IPv4 address the router reaches the engine at, or None when `server.host` names none."""
    host = recipe.server.host
    if host == "localhost":
        return _LOOPBACK
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    if not isinstance(address, ipaddress.IPv4Address):
        return None
    return _LOOPBACK if address.is_unspecified else host


def router_problems(recipe: Recipe, wanted: bool) -> list[Problem]:
    if not wanted:
        return []
    problems: list[Problem] = []
    if router_address(recipe) is None:
        problems.append(
            Problem(
                "llm-d's router reads endpoints by IPv4 address (its file-discovery plugin resolves "
                "no host names), and server.host is not one",
                path="server.host",
                value=recipe.server.host,
                has_value=True,
                fix="set server.host to an IPv4 address such as 127.0.0.1 or 0.0.0.0, "
                "or remove target.llm_d_router",
            )
        )
    if recipe.engine.type == "tgi":
        problems.append(
            Problem(
                "llm-d's endpoint picker reads no TGI metrics",
                path="engine.type",
                value=recipe.engine.type,
                has_value=True,
                fix="use engine.type: vllm, sglang or builtin, or remove target.llm_d_router",
            )
        )
    return problems


def local_router_files(recipe: Recipe) -> dict[str, str]:
    """`llm-d/endpoints.yaml` and `llm-d/epp-config.yaml` for the engine at server.host:server.port."""
    address = router_address(recipe)
    if address is None:
        raise ValueError(f"server.host {recipe.server.host!r} is no IPv4 address (router_problems says so)")
    return router_files(recipe, address, [recipe.server.port], ROUTER_CONFIG_DIR)
