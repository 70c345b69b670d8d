"""The FastAPI application: OpenAI and TGI routes, /health, /metrics, errors and the API key.

`build_app` takes the engine (tests pass a small stand-in) or a factory that the lifespan calls
before the socket opens; either way /health answers 200 only once the engine is ready.
"""

from __future__ import annotations

import inspect
import logging
import os
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, Response
from llmdeploy_engine.server import openai_routes, tgi_routes
from llmdeploy_engine.server.auth import APIKeyMiddleware
from llmdeploy_engine.server.body_limit import BodyLimitMiddleware
from llmdeploy_engine.server.constraints import close_grammar_pool, start_grammar_pool
from llmdeploy_engine.server.errors import (
    APIError,
    drop_validation_responses,
    error_response,
    install_error_handlers,
)
from llmdeploy_engine.server.generation import ClientDisconnected
from llmdeploy_engine.server.metrics import ServerMetrics, read
from llmdeploy_engine.server.openai_protocol import ChatCompletionRequest, CompletionRequest
from llmdeploy_engine.server.request_body import stop_parser_pool
from llmdeploy_engine.server.state import ServedEngine, ServerSettings, ServerState, server_state
from llmdeploy_engine.server.tgi_protocol import TGIRequest

logger = logging.getLogger("llmdeploy_engine.server")
PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
VERSION = "0.1.0"
# `llmdeploy apply` starts the engine with an id of its own choosing and checks that /health echoes
# it, so it never smoke-tests another server that holds the port; a hand-started engine gets one too.
INSTANCE_ENV = "LLMDEPLOY_INSTANCE_ID"
INSTANCE_HEADER = "x-llmdeploy-instance"


async def _shutdown(engine: ServedEngine) -> None:
    stop = getattr(engine, "shutdown", None)
    if stop is None:
        return
    result = stop()
    if inspect.isawaitable(result):
        await result


def build_app(
    settings: ServerSettings,
    engine: ServedEngine | None = None,
    engine_factory: Callable[[], ServedEngine] | None = None,
) -> FastAPI:
    state = ServerState(settings=settings, metrics=ServerMetrics(settings.model_name), engine=engine)
    state.extra["started"] = int(time.time())
    given = os.environ.get(INSTANCE_ENV, "")
    instance = {
        INSTANCE_HEADER: given if re.fullmatch(r"[\w.-]{1,64}", given, re.ASCII) else uuid.uuid4().hex
    }

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if state.engine is None and engine_factory is not None:
            state.engine = engine_factory()
        if state.engine is not None:
            # The engine itself logs the start-up report (weights, KV memory, KV tokens, concurrency).
            report = read(state.engine.stats(), "startup_report", None)
            logger.info(
                "serving %s as %s: KV cache %s tokens in %s blocks, max concurrency %s",
                settings.model_path,
                ", ".join(settings.served_model_names),
                read(report, "kv_cache_tokens", "?"),
                read(report, "num_kv_blocks", "?"),
                read(report, "max_concurrency", "?"),
            )
        if state.engine is not None and settings.start_grammar_workers:
            await start_grammar_pool(state)
        try:
            yield
        finally:
            stop_parser_pool()
            await close_grammar_pool(state)
            if state.engine is not None:
                await _shutdown(state.engine)

    app = FastAPI(
        title="llmdeploy built-in engine",
        version=VERSION,
        lifespan=lifespan,
        description="OpenAI- and TGI-compatible text generation with Prometheus metrics.",
    )
    app.state.serving = state
    install_error_handlers(app)

    async def on_disconnect(request: Request, exc: Exception) -> Response:
        # the engine requests are aborted already; nobody reads this answer
        logger.info("client closed the connection before the response of %s; its generation was aborted", exc)
        return error_response(APIError(499, "the client closed the request", code="client_closed_request"))

    app.add_exception_handler(ClientDisconnected, on_disconnect)
    app.add_middleware(BodyLimitMiddleware)
    if settings.api_key:
        # outermost: a request without the key is refused from its headers, before any of its body is
        # read (the body limit collects a chunked body whole), so unauthenticated uploads cost nothing
        app.add_middleware(APIKeyMiddleware, api_key=settings.api_key)

    @app.get(
        "/health",
        response_class=Response,
        responses={200: {"description": "ready"}, 503: {"description": "not ready"}},
    )
    async def health(request: Request) -> Response:
        engine = server_state(request).engine
        ready = engine is not None and bool(getattr(engine, "is_running", True))
        return Response(status_code=200 if ready else 503, headers=instance)

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": VERSION}

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics(request: Request) -> Response:
        st = server_state(request)
        stats: Any = st.engine.stats() if st.engine is not None else None
        text = st.metrics.render(stats, st.settings.block_size)
        return Response(content=text, media_type=PROMETHEUS_CONTENT_TYPE)

    app.include_router(openai_routes.router)
    app.include_router(tgi_routes.router)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = drop_validation_responses(FastAPI.openapi(app))
            # the generation routes parse their bodies themselves (off the event loop): their schemas
            schemas = schema.setdefault("components", {}).setdefault("schemas", {})
            for model in (CompletionRequest, ChatCompletionRequest, TGIRequest):
                body = model.model_json_schema(ref_template="#/components/schemas/{model}")
                schemas.update(body.pop("$defs", {}))
                schemas[model.__name__] = body
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app
