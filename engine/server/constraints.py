"""A request's structured-output constraint, checked and compiled before it reaches the engine.

Compiling runs in the grammar pool's worker processes (grammar_pool.py): bounded in size and time,
never on the event loop or the engine loop, and stopped when the client hangs up (the wait runs
under `until_disconnect`). The compiled grammar lands in the engine's compiler cache, so the
engine's own compile when the request is added is a cache hit. A constraint the library cannot
compile, or one past the size or time bound, is a 400 naming the field it came from.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from fastapi import Request
from llmdeploy_engine.sampling_params import StructuredOutputsParams
from llmdeploy_engine.server.errors import APIError, bad_request
from llmdeploy_engine.server.generation import until_disconnect
from llmdeploy_engine.server.grammar_pool import ConstraintRefused, GrammarPool, PoolBusy
from llmdeploy_engine.server.state import ServerState

POOL_KEY = "grammar_pool"
logger = logging.getLogger("llmdeploy_engine.server")


async def start_grammar_pool(state: ServerState) -> None:
    """Start the pool and its workers with the server (the workers' start-up, seconds each, then never
    falls on a request); a failure is logged and left to the first constrained request to report."""
    try:
        await grammar_pool(state, None)
    except APIError as e:
        logger.warning("grammar workers not started: %s", e.message)


async def grammar_pool(state: ServerState, param: str | None) -> GrammarPool:
    """The server's pool (made at start-up or on the first constrained request); 400 without xgrammar."""
    pool = state.extra.get(POOL_KEY)
    if pool is None:
        compiler_of = getattr(state.ready_engine(), "grammar_compiler", None)
        if compiler_of is None:
            raise bad_request("this engine does not serve structured outputs", param)
        try:
            # reading the vocabulary takes a second or more: not on the event loop
            compiler = await asyncio.to_thread(compiler_of)
        except ImportError as e:
            raise bad_request(
                f"structured outputs need the xgrammar package ({e}); install the engine extra", param
            ) from e
        pool = state.extra.get(POOL_KEY)
        if pool is None:  # (another request may have made it meanwhile)
            pool = GrammarPool(compiler, timeout_s=state.settings.grammar_compile_timeout_s)
            state.extra[POOL_KEY] = pool
            pool.warm_up()
    assert isinstance(pool, GrammarPool)
    return pool


async def _compiled(request: Request, work: Any, param: str | None) -> Any:
    try:
        return await until_disconnect(request, work)
    except ConstraintRefused as e:
        raise bad_request(str(e), param) from e
    except PoolBusy as e:
        raise APIError(
            503,
            f"the server is busy compiling grammars ({e}); retry later",
            code="grammar_queue_full",
            headers={"Retry-After": "2"},
        ) from e


async def compile_constraint(
    request: Request, state: ServerState, spec: StructuredOutputsParams, param: str | None
) -> None:
    pool = await grammar_pool(state, param)
    await _compiled(request, pool.compile(spec), param)


async def tool_call_constraint(
    request: Request, state: ServerState, fmt: str, functions: list[dict[str, Any]]
) -> StructuredOutputsParams:
    """The compiled constraint that forces one call to one of `functions` (tool_calls.py)."""
    pool = await grammar_pool(state, "tools")
    spec = await _compiled(request, pool.tool_call_constraint(fmt, functions), "tools")
    assert isinstance(spec, StructuredOutputsParams)
    return spec


async def close_grammar_pool(state: ServerState) -> None:
    pool = state.extra.pop(POOL_KEY, None)
    if isinstance(pool, GrammarPool):
        await pool.close()
