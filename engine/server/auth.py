"""Optional API key: `Authorization: Bearer KEY` on the generation routes.

/health, /metrics, /info and the API description (/docs, /openapi.json) stay open so probes,
scrapers and load balancers need no secret; everything that generates or lists models needs the key.
"""

from __future__ import annotations

import hmac

from llmdeploy_engine.server.errors import APIError, error_response
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

OPEN_PATHS = frozenset({"/health", "/metrics", "/info", "/docs", "/redoc", "/openapi.json", "/version"})


def needs_key(path: str) -> bool:
    return path not in OPEN_PATHS and not path.startswith("/docs/")


def key_matches(header: str | None, api_key: str) -> bool:
    if not header:
        return False
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(token.strip().encode(), api_key.encode())


class APIKeyMiddleware:
    """Pure ASGI (not BaseHTTPMiddleware) so streaming and disconnect detection pass through untouched."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.api_key = api_key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("method") != "OPTIONS" and needs_key(scope.get("path", "")):
            header = Headers(scope=scope).get("authorization")
            if not key_matches(header, self.api_key):
                response = error_response(
                    APIError(
                        401,
                        "Incorrect or missing API key: send 'Authorization: Bearer KEY'",
                        code="invalid_api_key",
                    )
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
