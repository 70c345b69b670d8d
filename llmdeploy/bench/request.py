"""One benchmark request: send it streamed, time every token, and say why it failed if it did.

Token timing follows `vllm bench serve` exactly: TTFT is the time to the first chunk carrying a choice
(its text may be empty, as a chat stream's role chunk is), inter-token latencies are the gaps between
later choice chunks, and the request's latency ends at its last choice chunk (not at `data: [DONE]`).
The output token count comes from the usage chunk (`stream_options.include_usage`); without one, each
chunk with text counts as one token.

After `data: [DONE]` the response body is still read to its end, as vLLM's aiohttp client reads
every stream to its end: only a response read whole hands its HTTP/1.1 connection back to the pool.
Stopping at `[DONE]` closed the connection, so every request opened a new one, and the connect and
the server's accept landed inside each request's TTFT (about 10 ms a request on a busy 2-core machine).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import httpx
from httpx_sse import EventSource, SSEError

from llmdeploy.bench.options import Endpoint


@dataclass(frozen=True)
class RequestSpec:
    """One request. In a multi-turn session (`session` set) the prompt is this turn's user message; the
    load generator sends it after the session's earlier turns and the replies they got."""

    prompt: str
    output_len: int
    target_input_len: int | None = None  # what the prompt was sized for; actual length comes from usage
    session: int | None = None
    turn: int = 0


Message = tuple[str, str]  # (role, content)


@dataclass(frozen=True)
class RequestResult:
    ok: bool
    error: str | None = None  # a short reason, grouped in the report
    prompt_tokens: int = 0
    output_tokens: int = 0
    usage_reported: bool = False
    ttft_s: float = 0.0
    itl_s: tuple[float, ...] = field(default_factory=tuple)
    latency_s: float = 0.0
    generated_text: str = ""


def request_body(
    model: str,
    spec: RequestSpec,
    endpoint: Endpoint,
    ignore_eos: bool,
    history: tuple[Message, ...] = (),
) -> dict[str, object]:
    body: dict[str, object] = {
        "model": model,
        "max_tokens": spec.output_len,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if endpoint == "chat":
        messages = [*history, ("user", spec.prompt)]
        body["messages"] = [{"role": role, "content": content} for role, content in messages]
    else:
        body["prompt"] = spec.prompt
    if ignore_eos:
        # not in the OpenAI API; vLLM and the built-in engine take it as an extra body field
        body["ignore_eos"] = True
    return body


def endpoint_path(endpoint: Endpoint) -> str:
    return "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"


def _chunk_text(choice: dict[str, object], endpoint: Endpoint) -> str:
    if endpoint == "chat":
        delta = choice.get("delta")
        content = delta.get("content") if isinstance(delta, dict) else None
        return content if isinstance(content, str) else ""
    text = choice.get("text")
    return text if isinstance(text, str) else ""


class _StreamFailure(Exception):
    pass


async def send_request(
    client: httpx.AsyncClient,
    base_url: str,
    model: str,
    spec: RequestSpec,
    endpoint: Endpoint,
    ignore_eos: bool,
    history: tuple[Message, ...] = (),
) -> RequestResult:
    """Never raises for anything the server or network does; the reason goes into the result."""
    body = request_body(model, spec, endpoint, ignore_eos, history)
    start = time.perf_counter()
    ttft_s = 0.0
    last_token_at = start
    itl: list[float] = []
    pieces: list[str] = []
    num_chunks = 0  # chunks carrying a choice
    num_text_chunks = 0
    usage: dict[str, object] | None = None
    done = False
    try:
        async with client.stream("POST", base_url + endpoint_path(endpoint), json=body) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode("utf-8", "replace")
                raise _StreamFailure(f"HTTP {response.status_code}: {_error_message(text)}")
            events = EventSource(response).aiter_sse()
            async for event in events:
                payload = event.data.strip()
                if payload == "[DONE]":
                    done = True
                    break
                chunk = json.loads(payload)
                if not isinstance(chunk, dict):
                    raise _StreamFailure("stream chunk is not a JSON object")
                if "error" in chunk:
                    raise _StreamFailure(f"error event in stream: {_error_message(json.dumps(chunk))}")
                if isinstance(chunk.get("usage"), dict):
                    usage = chunk["usage"]
                choices = chunk.get("choices")
                if choices:
                    now = time.perf_counter()
                    if num_chunks == 0:
                        ttft_s = now - start
                    else:
                        itl.append(now - last_token_at)
                    last_token_at = now
                    num_chunks += 1
                    text = _chunk_text(choices[0], endpoint)
                    if text:
                        num_text_chunks += 1
                        pieces.append(text)
            async for _ in events:  # the body's end after [DONE]: the connection goes back to the pool
                pass
        if not done:
            raise _StreamFailure("stream ended without data: [DONE]")
    except _StreamFailure as e:
        return RequestResult(ok=False, error=str(e), latency_s=time.perf_counter() - start)
    except httpx.TimeoutException:
        return RequestResult(ok=False, error="timed out", latency_s=time.perf_counter() - start)
    except (httpx.RemoteProtocolError, httpx.ReadError) as e:
        return RequestResult(
            ok=False, error=f"connection dropped ({type(e).__name__})", latency_s=time.perf_counter() - start
        )
    except SSEError:  # before httpx.HTTPError, which it derives from
        return RequestResult(
            ok=False, error="not an SSE stream (Content-Type)", latency_s=time.perf_counter() - start
        )
    except httpx.ConnectError:
        return RequestResult(ok=False, error="connection refused", latency_s=time.perf_counter() - start)
    except httpx.HTTPError as e:
        return RequestResult(
            ok=False, error=f"HTTP error ({type(e).__name__})", latency_s=time.perf_counter() - start
        )
    except (json.JSONDecodeError, UnicodeDecodeError):
        return RequestResult(
            ok=False, error="malformed stream chunk (not JSON)", latency_s=time.perf_counter() - start
        )
    except (
        AttributeError,
        TypeError,
        ValueError,
    ):  # JSON of the wrong shape, e.g. a choice that is not an object
        return RequestResult(
            ok=False, error="malformed stream chunk (unexpected shape)", latency_s=time.perf_counter() - start
        )
    if num_text_chunks == 0:
        return RequestResult(ok=False, error="no tokens generated", latency_s=time.perf_counter() - start)
    latency_s = last_token_at - start
    prompt_tokens, output_tokens = _usage_counts(usage)
    return RequestResult(
        ok=True,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens if usage is not None else num_text_chunks,
        usage_reported=usage is not None,
        ttft_s=ttft_s,
        itl_s=tuple(itl),
        latency_s=latency_s,
        generated_text="".join(pieces),
    )


def _usage_counts(usage: dict[str, object] | None) -> tuple[int, int]:
    if usage is None:
        return 0, 0
    prompt = usage.get("prompt_tokens")
    completion = usage.get("completion_tokens")
    return (prompt if isinstance(prompt, int) else 0, completion if isinstance(completion, int) else 0)


def _error_message(text: str) -> str:
    """The server's own message when the body is an OpenAI-style error, else the body's start."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return text.strip()[:120] or "(empty body)"
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return str(err["message"])[:120]
        if isinstance(err, str):
            return err[:120]
        if isinstance(data.get("detail"), str):
            return str(data["detail"])[:120]
    return text.strip()[:120]
