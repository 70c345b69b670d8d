"""A tiny OpenAI/TGI-shaped server whose faults are chosen by the model name, for smoke and bench tests.

Every reply is deterministic so tests can count by hand: a completion is exactly `max_tokens` tokens
(" w0", " w1", ...), one SSE chunk each, and `prompt_tokens` is the number of whitespace-separated
words in the prompt (or in all chat message contents).

Models (the fault):
  ok              correct answers
  slow            correct, but 0.3 s before the first token and --token-delay-s between tokens
  midstream-error two tokens (fewer if max_tokens < 3), then an OpenAI error event, then data: [DONE]
  drop            two tokens (fewer if max_tokens < 3), then the connection is cut
  http-500        HTTP 500 with an OpenAI error body
  no-usage        correct, but never sends a usage chunk
  mixed           every third request (1-based: 3, 6, 9, ...) is cut like `drop`; the rest are correct
  bad-shape       streams without a role chunk and without data: [DONE]

Run: python tests/smoke_bench/fault_server.py --port 8123 [--kv-cache-tokens N] [--health-delay-s S]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import time
from collections.abc import AsyncIterator

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

MODELS = ("ok", "slow", "midstream-error", "drop", "http-500", "no-usage", "mixed", "bad-shape")


class Cut(Exception):
    """Raised inside a streaming body: uvicorn then closes the connection mid-response."""


def build_app(kv_cache_tokens: int | None, health_delay_s: float, token_delay_s: float) -> Starlette:
    first_health_call: list[float] = []
    counters = {name: itertools.count(1) for name in MODELS}

    def prompt_words(body: dict[str, object]) -> int:
        if "messages" in body:
            return sum(len(str(m.get("content", "")).split()) for m in body["messages"])  # type: ignore[attr-defined, union-attr]
        return len(str(body.get("prompt", "")).split())

    async def health(_: Request) -> Response:
        # the delay counts from the first /health call, so a slow test machine cannot skip it
        if not first_health_call:
            first_health_call.append(time.monotonic())
        if time.monotonic() - first_health_call[0] < health_delay_s:
            return PlainTextResponse("starting", status_code=503)
        return PlainTextResponse("ok")

    async def models(_: Request) -> Response:
        return JSONResponse(
            {"object": "list", "data": [{"id": m, "object": "model", "owned_by": "test"} for m in MODELS]}
        )

    async def metrics(_: Request) -> Response:
        lines = ["# TYPE llmdeploy:kv_cache_tokens gauge"]
        if kv_cache_tokens is not None:
            lines.append(f'llmdeploy:kv_cache_tokens{{model_name="ok"}} {kv_cache_tokens}')
        return PlainTextResponse("\n".join(lines) + "\n")

    def error_body(message: str, code: int) -> dict[str, object]:
        return {"error": {"message": message, "type": "InternalServerError", "code": code}}

    async def openai(request: Request) -> Response:
        chat = request.url.path.endswith("/chat/completions")
        body = await request.json()
        model = str(body.get("model", "ok"))
        if model not in MODELS:
            return JSONResponse(error_body(f"model {model!r} not found", 404), status_code=404)
        n = next(counters[model])
        if model == "http-500":
            return JSONResponse(error_body("injected failure", 500), status_code=500)
        max_tokens = int(body.get("max_tokens") or 16)
        words = [f" w{i}" for i in range(max_tokens)]
        usage = {"prompt_tokens": prompt_words(body), "completion_tokens": max_tokens, "total_tokens": 0}
        usage["total_tokens"] = usage["prompt_tokens"] + max_tokens
        if not body.get("stream"):
            if model in ("drop", "midstream-error") or (model == "mixed" and n % 3 == 0):
                return JSONResponse(error_body("injected failure", 500), status_code=500)
            text = "".join(words)
            choice: dict[str, object] = {"index": 0, "finish_reason": "length"}
            choice.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
            kind = "chat.completion" if chat else "text_completion"
            return JSONResponse(
                {"id": f"r{n}", "object": kind, "model": model, "choices": [choice], "usage": usage}
            )

        include_usage = bool((body.get("stream_options") or {}).get("include_usage")) and model != "no-usage"
        kind = "chat.completion.chunk" if chat else "text_completion"

        def chunk(piece: dict[str, object], finish: str | None = None) -> str:
            choice = {"index": 0, "finish_reason": finish, **piece}
            return (
                "data: "
                + json.dumps({"id": f"r{n}", "object": kind, "model": model, "choices": [choice]})
                + "\n\n"
            )

        def token(text: str) -> dict[str, object]:
            return {"delta": {"content": text}} if chat else {"text": text}

        async def stream() -> AsyncIterator[str]:
            if model == "slow":
                await asyncio.sleep(0.3)
            if chat and model != "bad-shape":
                yield chunk({"delta": {"role": "assistant", "content": ""}})
            for i, word in enumerate(words):
                if i == min(2, max_tokens - 1) and (
                    model in ("drop", "midstream-error") or (model == "mixed" and n % 3 == 0)
                ):
                    if model == "midstream-error":
                        yield "data: " + json.dumps(error_body("injected mid-stream failure", 500)) + "\n\n"
                        yield "data: [DONE]\n\n"
                        return
                    raise Cut
                if model == "slow" and i > 0:
                    await asyncio.sleep(token_delay_s)
                last = i == len(words) - 1
                yield chunk(token(word), "length" if last else None)
            if include_usage:
                yield (
                    "data: "
                    + json.dumps(
                        {"id": f"r{n}", "object": kind, "model": model, "choices": [], "usage": usage}
                    )
                    + "\n\n"
                )
            if model != "bad-shape":
                yield "data: [DONE]\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")

    async def info(_: Request) -> Response:
        return JSONResponse(
            {"model_id": "ok", "max_input_tokens": 2048, "max_total_tokens": 4096, "version": "test"}
        )

    async def generate_stream(request: Request) -> Response:
        body = await request.json()
        max_new = int((body.get("parameters") or {}).get("max_new_tokens") or 16)

        async def stream() -> AsyncIterator[str]:
            for i in range(max_new):
                last = i == max_new - 1
                event = {
                    "index": i,
                    "token": {"id": i, "text": f" w{i}", "logprob": 0.0, "special": False},
                    "generated_text": "".join(f" w{j}" for j in range(max_new)) if last else None,
                    "details": {"finish_reason": "length", "generated_tokens": max_new} if last else None,
                }
                yield "data:" + json.dumps(event) + "\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")

    return Starlette(
        routes=[
            Route("/health", health),
            Route("/v1/models", models),
            Route("/metrics", metrics),
            Route("/v1/completions", openai, methods=["POST"]),
            Route("/v1/chat/completions", openai, methods=["POST"]),
            Route("/info", info),
            Route("/generate_stream", generate_stream, methods=["POST"]),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--kv-cache-tokens", type=int, default=None)
    parser.add_argument("--health-delay-s", type=float, default=0.0)
    parser.add_argument("--token-delay-s", type=float, default=0.02)
    args = parser.parse_args()
    app = build_app(args.kv_cache_tokens, args.health_delay_s, args.token_delay_s)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="critical")


if __name__ == "__main__":
    main()
