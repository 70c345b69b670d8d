"""Request bodies parsed off the event loop: JSON decoding, lone-surrogate check, pydantic validation.

FastAPI parses a body parameter on the event loop, where a 10 MB JSON body takes ~0.1 s of
`json.loads` alone and every other client waits; the generation routes read the raw body and parse
it off the loop instead: in a worker thread when small, in a worker process from `BIG_BODY_BYTES`
on (`json.loads`, the surrogate scan and pydantic hold the GIL for the whole call, so a thread would
stall the loop just the same). Errors are raised as FastAPI's own `RequestValidationError` (same
`loc`/`type` entries as FastAPI gives), so they are answered as 400 by the same handler as before.
`openapi_body` keeps the body's schema in /openapi.json.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import email.message
import json
import multiprocessing
import re
import threading
from typing import Any, TypeVar

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)
_SURROGATE = re.compile("[\ud800-\udfff]")
# Arrays and objects inside each other; OpenAI allows 10 levels in a structured-output schema (about
# 25 levels of the request body), and Python's own parser stops near 1,000 with a RecursionError.
MAX_JSON_DEPTH = 64
BIG_BODY_BYTES = 1 << 20  # a thread parses 1 MiB of JSON in a few ms; past that, the worker process
_POOL: concurrent.futures.ProcessPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def openapi_body(model: type[BaseModel]) -> dict[str, Any]:
    """`openapi_extra` for a route that reads `model` itself (app.py adds the schema to components)."""
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}


def _is_json(content_type: str | None) -> bool:
    if not content_type:
        return True  # FastAPI reads a body without Content-Type as JSON too
    message = email.message.Message()
    message["content-type"] = content_type
    main, _, sub = message.get_content_type().partition("/")
    return main == "application" and (sub == "json" or sub.endswith("+json"))


def _shown(key: str) -> str:
    """A key as an error may quote it: a lone surrogate has no UTF-8 form, so it shows escaped."""
    return key.encode("utf-8", "backslashreplace").decode("utf-8")


def _problem(value: Any) -> tuple[str, tuple[str | int, ...]] | None:
    """The first ("depth" | "surrogate", path) in a parsed body, walked without recursion: a string with
    a lone surrogate (JSON `"\\ud800"`, which has no UTF-8 form) or nesting past MAX_JSON_DEPTH."""
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(value, ())]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return "surrogate", path
        elif isinstance(item, dict | list):
            if len(path) >= MAX_JSON_DEPTH:
                return "depth", path
            pairs = item.items() if isinstance(item, dict) else enumerate(item)
            for key, child in reversed(list(pairs)):
                if isinstance(key, str) and _SURROGATE.search(key):
                    return "surrogate", (*path, key)
                if isinstance(child, str | dict | list):
                    stack.append((child, (*path, key)))
    return None


def _too_deep() -> RequestValidationError:
    return RequestValidationError(
        [
            {
                "type": "json_too_deep",
                "loc": ("body",),
                "msg": f"JSON nested deeper than {MAX_JSON_DEPTH} levels",
                "input": None,
            }
        ]
    )


def parse(raw: bytes, content_type: str | None, model: type[M]) -> M:
    """Bytes -> `model`, or RequestValidationError (answered 400)."""
    if not _is_json(content_type):
        raise RequestValidationError(
            [
                {
                    "type": "model_attributes_type",
                    "loc": ("body",),
                    "msg": "expected a JSON body",
                    "input": None,
                }
            ]
        )
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as e:
        raise RequestValidationError(
            [
                {
                    "type": "json_invalid",
                    "loc": ("body", e.pos),
                    "msg": "JSON decode error",
                    "input": {},
                    "ctx": {"error": e.msg},
                }
            ]
        ) from None
    except RecursionError:
        raise _too_deep() from None
    except UnicodeDecodeError:
        raise RequestValidationError(
            [{"type": "json_invalid", "loc": ("body",), "msg": "the body is not valid UTF-8", "input": {}}]
        ) from None
    problem = _problem(data)
    if problem is not None and problem[0] == "depth":
        raise _too_deep()
    if problem is not None:
        where = [_shown(x) if isinstance(x, str) else x for x in problem[1]]
        raise RequestValidationError(
            [
                {
                    "type": "string_unicode",
                    "loc": ("body", *where),
                    "msg": "a lone UTF-16 surrogate (such as \\ud800) is not text",
                    "input": None,
                }
            ]
        )
    try:
        return model.model_validate(data)
    except ValidationError as e:
        errors = [{**err, "loc": ("body", *err["loc"])} for err in e.errors(include_url=False)]
        raise RequestValidationError(errors) from None


def _parse_in_worker(raw: bytes, content_type: str | None, model: type[M]) -> tuple[bool, Any]:
    """`parse` in the worker process: (True, the body) or (False, plain error entries to re-raise)."""
    try:
        return True, parse(raw, content_type, model)
    except RequestValidationError as e:
        keep = ("type", "loc", "msg")
        errors = []
        for err in e.errors():
            plain = {k: err[k] for k in keep if k in err}
            if "ctx" in err:
                plain["ctx"] = {k: str(v) for k, v in err["ctx"].items()}
            errors.append(plain)
        return False, errors


def parser_pool() -> concurrent.futures.ProcessPoolExecutor:
    """The worker process for big bodies (spawned, not forked: the engine process runs threads)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
            _POOL.submit(int).result()  # started and importable before the first body goes in
        return _POOL


def stop_parser_pool() -> None:
    global _POOL
    with _POOL_LOCK:
        if _POOL is not None:
            _POOL.shutdown(wait=False, cancel_futures=True)
            _POOL = None


async def read_body(request: Request, model: type[M]) -> M:
    raw = await request.body()
    content_type = request.headers.get("content-type")
    if len(raw) < BIG_BODY_BYTES:
        return await asyncio.to_thread(parse, raw, content_type, model)
    pool = await asyncio.to_thread(parser_pool)  # the first call spawns the process
    ok, value = await asyncio.get_running_loop().run_in_executor(
        pool, _parse_in_worker, raw, content_type, model
    )
    if not ok:
        raise RequestValidationError(value)
    return value  # type: ignore[no-any-return]
