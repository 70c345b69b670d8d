"""Checks through the OpenAI-compatible routes: models, a chat completion, a streamed one, recipe prompts.

Each check returns a one-line reason on failure; any shape problem in a reply is reported, not raised.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import httpx
from httpx_sse import EventSource, SSEError

from llmdeploy.recipe.schema import SmokePrompt

HELLO = [{"role": "user", "content": "Say hello in one short sentence."}]


class CheckFailed(Exception):
    """A check's one-line reason."""


def _json(response: httpx.Response, route: str) -> dict[str, object]:
    if response.status_code != 200:
        raise CheckFailed(f"{route} answered HTTP {response.status_code}: {response.text.strip()[:160]}")
    try:
        data = response.json()
    except ValueError as e:
        raise CheckFailed(f"{route} answered non-JSON: {response.text.strip()[:80]!r}") from e
    if not isinstance(data, dict):
        raise CheckFailed(f"{route} answered a JSON {type(data).__name__}, not an object")
    return data


def list_models(client: httpx.Client, base_url: str) -> list[str]:
    data = _json(client.get(base_url + "/v1/models"), "GET /v1/models")
    entries = data.get("data")
    if not isinstance(entries, list) or not entries:
        raise CheckFailed("GET /v1/models lists no models")
    return [str(e.get("id")) for e in entries if isinstance(e, dict)]


def _first_choice(data: dict[str, object], route: str) -> dict[str, object]:
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise CheckFailed(f"{route}: reply has no choices")
    return choices[0]


def chat_completion(client: httpx.Client, base_url: str, model: str, max_tokens: int = 16) -> str:
    route = "POST /v1/chat/completions"
    body = {"model": model, "messages": HELLO, "max_tokens": max_tokens, "temperature": 0.0}
    data = _json(client.post(base_url + "/v1/chat/completions", json=body), route)
    message = _first_choice(data, route).get("message")
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, str) or not content.strip():
        raise CheckFailed(f"{route}: empty message content")
    usage = data.get("usage")
    if not isinstance(usage, dict) or not isinstance(usage.get("completion_tokens"), int):
        raise CheckFailed(f"{route}: reply has no usage.completion_tokens")
    return content


@dataclass(frozen=True)
class StreamSummary:
    text: str
    num_content_chunks: int
    usage_seen: bool  # a usage chunk for stream_options.include_usage (bench counts chunks without it)


def streamed_chat_completion(
    client: httpx.Client, base_url: str, model: str, max_tokens: int = 16
) -> StreamSummary:
    """Check the SSE shape: role first, content deltas, a finish_reason, `data: [DONE]` last."""
    route = "streamed POST /v1/chat/completions"
    body = {
        "model": model,
        "messages": HELLO,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    events: list[str] = []
    with client.stream("POST", base_url + "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            raise CheckFailed(f"{route} answered HTTP {response.status_code}")
        try:
            events.extend(event.data.strip() for event in EventSource(response).iter_sse())
        except SSEError as e:
            raise CheckFailed(f"{route}: {e}") from e
    return _check_chat_stream(events, route)


def _check_chat_stream(events: list[str], route: str) -> StreamSummary:
    if not events or events[-1] != "[DONE]":
        raise CheckFailed(f"{route}: stream does not end with data: [DONE]")
    if events.count("[DONE]") != 1:
        raise CheckFailed(f"{route}: data: [DONE] appears {events.count('[DONE]')} times")
    role_seen = finish_seen = usage_seen = False
    pieces: list[str] = []
    for i, payload in enumerate(events[:-1]):
        try:
            chunk = json.loads(payload)
        except json.JSONDecodeError as e:
            raise CheckFailed(f"{route}: chunk {i} is not JSON") from e
        if "error" in chunk:
            raise CheckFailed(f"{route}: error event in stream: {json.dumps(chunk['error'])[:120]}")
        if chunk.get("usage"):
            usage_seen = True
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if not role_seen:
                if delta.get("role") != "assistant":
                    raise CheckFailed(f"{route}: first chunk's delta has no role 'assistant' ({delta!r:.80})")
                role_seen = True
            if finish_seen and delta.get("content"):
                raise CheckFailed(f"{route}: content after the finish_reason chunk")
            if delta.get("content"):
                pieces.append(delta["content"])
            if choice.get("finish_reason") is not None:
                finish_seen = True
    if not role_seen:
        raise CheckFailed(f"{route}: no chunk carries a choice")
    if not pieces:
        raise CheckFailed(f"{route}: no content deltas")
    if not finish_seen:
        raise CheckFailed(f"{route}: no chunk carries a finish_reason")
    return StreamSummary("".join(pieces), len(pieces), usage_seen)


def recipe_prompt(client: httpx.Client, base_url: str, model: str, prompt: SmokePrompt) -> str:
    """Greedy answer to one recipe prompt; every `expect` substring must appear (case-sensitive)."""
    body: dict[str, object] = {"model": model, "max_tokens": prompt.max_tokens, "temperature": 0.0}
    if prompt.messages is not None:
        route, path = "POST /v1/chat/completions", "/v1/chat/completions"
        body["messages"] = prompt.messages
    else:
        route, path = "POST /v1/completions", "/v1/completions"
        body["prompt"] = prompt.prompt
    choice = _first_choice(_json(client.post(base_url + path, json=body), route), route)
    if prompt.messages is not None:
        message = choice.get("message")
        text = message.get("content") if isinstance(message, dict) else None
    else:
        text = choice.get("text")
    if not isinstance(text, str):
        raise CheckFailed(f"{route}: reply has no text")
    missing = [e for e in prompt.expect if e not in text]
    if missing:
        raise CheckFailed(f"reply lacks {', '.join(repr(m) for m in missing)}; got {text.strip()[:100]!r}")
    return text
