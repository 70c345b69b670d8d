"""What every route needs: the engine, the names it is served under, the key, the metrics."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from fastapi import Request
from llmdeploy_engine.server.metrics import ServerMetrics


class ServedEngine(Protocol):
    """The part of `AsyncLLMEngine` the server uses (see docs/internals.md)."""

    tokenizer: Any
    max_model_len: int

    def generate_batch(self, requests: Any) -> Any:
        """Admit (prompt ids, params, request id) triples whole or not at all; one stream each, whose
        `close()` aborts it (see `AsyncLLMEngine.generate_batch`)."""
        ...

    def stats(self) -> Any: ...


@dataclass(frozen=True)
class ServerSettings:
    served_model_names: tuple[str, ...]
    model_path: str
    api_key: str | None = None
    block_size: int = 16
    max_num_seqs: int = 256
    max_queue_len: int = 1024
    max_num_seqs_per_request: int = 256  # prompts x n of one request; more is a 400
    max_num_batched_tokens: int | None = None
    dtype: str = "auto"
    device: str = "auto"
    # exception types the engine raises when its waiting queue is full (answered with 503)
    queue_full_errors: tuple[type[BaseException], ...] = ()
    # exception types the engine raises once shutdown() stopped it (answered with 503 "shutting down")
    shutdown_errors: tuple[type[BaseException], ...] = ()
    log_requests: bool = True
    grammar_compile_timeout_s: float = 10.0  # a structured-output grammar compiling longer is a 400
    # start the grammar workers with the server (cli.serve sets it once the engine's compiler is built)
    start_grammar_workers: bool = False

    @property
    def model_name(self) -> str:
        return self.served_model_names[0]


@dataclass
class ServerState:
    settings: ServerSettings
    metrics: ServerMetrics
    engine: ServedEngine | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def ready_engine(self) -> ServedEngine:
        from llmdeploy_engine.server.errors import APIError

        if self.engine is None:
            raise APIError(
                503, "the engine is still starting", code="engine_starting", headers={"Retry-After": "5"}
            )
        return self.engine


def server_state(request: Request) -> ServerState:
    state = request.app.state.serving
    assert isinstance(state, ServerState)
    return state
