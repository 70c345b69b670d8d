"""Who is on the local target's port: free, another recipe's engine, something else, or ours.

Before an engine starts, its port must be free (a port held by another llmdeploy recipe is named);
once it answers, the server on the port must be the process this apply started: `mismatch` says
what answers instead (see `llmdeploy.smoke.identity`).
"""

from __future__ import annotations

import socket

import httpx

from llmdeploy.apply.local_state import LocalState, live_states_on_port
from llmdeploy.engines import get_engine
from llmdeploy.errors import UserError
from llmdeploy.recipe.schema import Recipe
from llmdeploy.smoke.identity import EngineIdentity


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host if host not in ("0.0.0.0", "") else "0.0.0.0", port))
        except OSError:
            return False
    return True


def engine_identity(recipe: Recipe, instance_id: str) -> EngineIdentity:
    """What the started engine must answer with; only the built-in engine echoes an instance id."""
    served = recipe.server.served_model_name or recipe.model.id
    echoes_instance = get_engine(recipe.engine.type).echoes_instance_id
    return EngineIdentity(served, instance_id if echoes_instance and instance_id else None)


def mismatch(recipe: Recipe, identity: EngineIdentity, url: str) -> str | None:
    from llmdeploy.smoke.runner import api_key_from_recipe

    key = api_key_from_recipe(recipe)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    with httpx.Client(headers=headers, timeout=5.0) as client:
        return identity.mismatch(client, url)


def is_ours(state: LocalState, recipe: Recipe) -> bool:
    """The state's engine answers on its URL (and not some other server that took the port)."""
    if not healthy(state.url):
        return False
    try:
        return mismatch(recipe, engine_identity(recipe, state.instance_id), state.url) is None
    except httpx.HTTPError:
        return False


def check_port_free(recipe: Recipe) -> None:
    host, port = recipe.server.host, recipe.server.port
    if port_free(host, port):
        return
    others = [s for s in live_states_on_port(port) if s.name != recipe.name]
    if others:
        other = others[0]
        raise UserError.one(
            f"port {port} is in use by recipe {other.name!r} (pid {other.pid}, started by llmdeploy apply)",
            path="server.port",
            value=port,
            fix=f"stop it (llmdeploy down on that recipe), or pick another port: --set server.port={port + 1}",
        )
    raise UserError.one(
        f"port {port} on {host} is already in use by another process",
        path="server.port",
        value=port,
        fix=f"stop what listens there, or pick another port: --set server.port={port + 1}",
    )


def healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False
