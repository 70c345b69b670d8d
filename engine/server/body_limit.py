"""A cap on request body size: a larger body is answered 413 before the routes read it."""

from __future__ import annotations

from llmdeploy_engine.server.errors import APIError, error_response
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# far above any prompt a served model can take (a 128k-token prompt is well under 1 MiB of JSON)
MAX_REQUEST_BODY_BYTES = 16 * 1024 * 1024


def _too_large(limit_bytes: int) -> APIError:
    return APIError(413, f"request body larger than {limit_bytes} bytes", code="request_too_large")


class BodyLimitMiddleware:
    """Pure ASGI. A declared Content-Length over the cap is refused at once; a body without one
    (chunked) is collected up to the cap first and replayed to the app, so routes never see more."""

    def __init__(self, app: ASGIApp, limit_bytes: int = MAX_REQUEST_BODY_BYTES) -> None:
        self.app = app
        self.limit_bytes = limit_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        declared = headers.get("content-length")
        if declared is not None:
            if declared.strip().isdigit() and int(declared) > self.limit_bytes:
                await error_response(_too_large(self.limit_bytes))(scope, receive, send)
                return
            await self.app(scope, receive, send)  # the server stops reading at the declared length
            return
        if "chunked" not in headers.get("transfer-encoding", "").lower():
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        size_bytes = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away before its body was complete
            chunks.append(message.get("body", b""))
            size_bytes += len(chunks[-1])
            if size_bytes > self.limit_bytes:
                await error_response(_too_large(self.limit_bytes))(scope, receive, send)
                return
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)
