"""Is the server answering on a URL the engine process we started, or something else on that port?

A /health 200 alone proves nothing when another server holds the port: an apply whose engine could
not bind would smoke-test the other one and pass. The built-in engine answers /health with the
instance id it was started with (environment variable `LLMDEPLOY_INSTANCE_ID`, echoed in the
`x-llmdeploy-instance` header); vLLM and TGI expose no such id, so for them the check is that
/v1/models lists the served model name the recipe asked for.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import httpx

INSTANCE_ENV = "LLMDEPLOY_INSTANCE_ID"
INSTANCE_HEADER = "x-llmdeploy-instance"


def new_instance_id() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True)
class EngineIdentity:
    """What the engine we started answers with: its served model name, and its instance id where the
    engine echoes one (the built-in engine); `instance_id` None skips that part."""

    served_model_name: str
    instance_id: str | None = None

    def mismatch(self, client: httpx.Client, base_url: str) -> str | None:
        """None when `base_url` is this engine; otherwise a one-line description of what answers there.

        Raises httpx.HTTPError when the endpoint cannot be reached (the caller keeps waiting or fails)."""
        base_url = base_url.rstrip("/")
        if self.instance_id is not None:
            got = client.get(base_url + "/health").headers.get(INSTANCE_HEADER)
            if got != self.instance_id:
                other = f"instance {got}" if got else "a server that names no llmdeploy instance"
                return f"{base_url} is answered by {other}, not by the engine started as instance {self.instance_id}"
        response = client.get(base_url + "/v1/models")
        if response.status_code != 200:
            return f"GET {base_url}/v1/models answered HTTP {response.status_code}"
        try:
            entries = response.json().get("data", [])
            served = [str(e.get("id")) for e in entries if isinstance(e, dict)]
        except (ValueError, AttributeError):
            return "GET /v1/models answered something other than a model list"
        if self.served_model_name not in served:
            return (
                f"{base_url} serves {', '.join(served) or 'no model'}, not {self.served_model_name!r}: "
                "another server holds the port"
            )
        return None
