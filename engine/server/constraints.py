"""A request's structured-output constraint, checked and compiled before it reaches the engine.

Compiling runs on a worker thread (`asyncio.to_thread`), so neither the event loop nor the engine
loop waits for a large schema; the engine's compiler caches the result per constraint, so the
engine's own compile when the request is added is a cache hit. A constraint the library cannot
compile is a 400 naming the field it came from.
"""

from __future__ import annotations

import asyncio

from llmdeploy_engine.sampling_params import StructuredOutputsParams
from llmdeploy_engine.server.errors import bad_request
from llmdeploy_engine.server.state import ServerState


async def compile_constraint(state: ServerState, spec: StructuredOutputsParams, param: str | None) -> None:
    engine = state.ready_engine()
    compiler_of = getattr(engine, "grammar_compiler", None)
    if compiler_of is None:
        raise bad_request("this engine does not serve structured outputs", param)

    def compile_now() -> None:
        compiler_of().compile(spec)

    try:
        await asyncio.to_thread(compile_now)
    except ImportError as e:
        raise bad_request(
            f"structured outputs need the xgrammar package ({e}); install the engine extra", param
        ) from e
    except ValueError as e:
        raise bad_request(str(e), param) from e
