"""HTTP errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.

Every failure the server reports goes through `APIError`; FastAPI's 422 validation errors are
answered as 400 like OpenAI does, and anything unexpected becomes a logged 500 in the same shape.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

logger = logging.getLogger("llmdeploy_engine.server")

_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    503: "server_error",
}


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


def _described(description: str) -> dict[str, Any]:
    return {"model": ErrorResponse, "description": description}


# For the API description: what every generation route can answer besides 200.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: _described("Bad parameters, malformed JSON, or a prompt longer than max_model_len"),
    401: _described("Missing or wrong API key (when the server has one)"),
    404: _described("Unknown model"),
    500: _described("Unexpected server error"),
    503: _described("The waiting queue is full (see Retry-After) or the engine is not running"),
}


# 200 of a route that answers JSON, or an SSE stream when the body asks for one
JSON_OR_STREAM: dict[int | str, dict[str, Any]] = {
    200: {
        "content": {"application/json": {}, "text/event-stream": {}},
        "description": "JSON, or SSE when stream",
    }
}
STREAM_ONLY: dict[int | str, dict[str, Any]] = {
    200: {"content": {"text/event-stream": {}}, "description": "SSE"}
}


def drop_validation_responses(schema: dict[str, Any]) -> dict[str, Any]:
    """FastAPI documents 422 for every body; this server answers validation errors with 400."""
    for path_item in schema.get("paths", {}).values():
        for operation in path_item.values():
            if isinstance(operation, dict):
                operation.get("responses", {}).pop("422", None)
    return schema


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, param=self.param, code=self.code)


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param=param, code="invalid_value")


def error_body(
    status: int, message: str, *, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    kind = _TYPE_BY_STATUS.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(err: APIError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    parts, param = [], None
    for item in exc.errors():
        if item.get("type") == "json_invalid":
            # FastAPI puts the character offset in `loc`; it is a position, not a parameter name
            offset = next((x for x in item.get("loc", ()) if isinstance(x, int)), None)
            reason = (item.get("ctx") or {}).get("error") or "invalid JSON"
            at = f" (char {offset})" if offset is not None else ""  # 0-based, as Python's json says it
            parts.append(f"the body is not valid JSON: {reason}{at}")
            continue
        loc = [str(x) for x in item.get("loc", ()) if x != "body"]
        where = ".".join(loc) or "body"
        param = param or (where if loc else None)
        parts.append(f"{where}: {item.get('msg', 'invalid value')}")
    return "; ".join(parts) or "invalid request", param


def install_error_handlers(app: FastAPI) -> None:
    async def on_api_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, APIError)
        return error_response(exc)

    async def on_validation(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        message, param = _validation_message(exc)
        return error_response(APIError(400, message, param=param, code="invalid_value"))

    async def on_http(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return error_response(
            APIError(
                exc.status_code,
                str(exc.detail),
                code=code,
                headers=dict(exc.headers) if exc.headers else None,
            )
        )

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        logger.exception(
            "unexpected error while serving %s %s", request.method, request.url.path, exc_info=exc
        )
        return error_response(
            APIError(500, f"internal server error: {type(exc).__name__}", code="internal_error")
        )

    app.add_exception_handler(APIError, on_api_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(Exception, on_unexpected)
