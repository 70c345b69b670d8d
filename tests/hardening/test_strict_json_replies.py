"""Every `json_schema` reply is strict JSON (issue 48, item 6): many replies sampled at temperature 1
from a random-weights model (its byte-level vocabulary holds every control character, and random
weights pick them readily) to schemas with length-bounded strings, each parsed with a strict parser
(`json.loads(strict=True)`: no raw U+0000-U+001F inside strings, as RFC 8259 says) and validated
against its schema with jsonschema. The seed fixes the sampling, so a run is repeatable."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import pytest
from engine_server import EngineServer, start

from hardening.figures import record

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
pytest.importorskip("xgrammar")

NUM_REQUESTS = 8
N_PER_REQUEST = 4
SCHEMAS: list[dict[str, Any]] = [
    {"type": "object", "properties": {"b": {"type": "string", "maxLength": 8}}, "required": ["b"]},
    {
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 12},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 3},
        },
        "required": ["name", "tags"],
    },
    {
        "type": "object",
        "properties": {"m": {"type": "object", "additionalProperties": {"type": "string", "maxLength": 5}}},
        "required": ["m"],
    },
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineServer]:
    srv = start(
        tmp_path_factory.mktemp("strict-json"),
        "--model", "random:HuggingFaceTB/SmolLM2-135M", "--max-model-len", "256",
        "--kv-cache-memory-bytes", "64M", "--max-num-seqs", "16", "--seed", "0",
    )  # fmt: skip
    try:
        yield srv
    finally:
        srv.stop()


def test_json_schema_replies_are_strict_json(server: EngineServer) -> None:
    async def one(client: httpx.AsyncClient, i: int) -> list[tuple[dict[str, Any], str, str]]:
        schema = SCHEMAS[i % len(SCHEMAS)]
        r = await client.post(
            server.url + "/v1/completions",
            json={
                "model": "smollm2",
                "prompt": "JSON:",
                "max_tokens": 40,
                "temperature": 1.0,
                "n": N_PER_REQUEST,
                "seed": i,
                "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": schema}},
            },
        )
        assert r.status_code == 200, r.text
        return [(schema, c["text"], c["finish_reason"]) for c in r.json()["choices"]]

    async def run() -> list[list[tuple[dict[str, Any], str, str]]]:
        async with httpx.AsyncClient(timeout=600) as client:
            return await asyncio.gather(*(one(client, i) for i in range(NUM_REQUESTS)))

    replies = [reply for batch in asyncio.run(run()) for reply in batch]
    finished = [(schema, text) for schema, text, reason in replies if reason == "stop"]
    with_controls = sum(1 for _, text in finished if any(ord(ch) < 0x20 for ch in text))
    escaped_controls = sum(1 for _, text in finished if "\\u00" in text or "\\t" in text or "\\n" in text)
    bad = []
    for schema, text in finished:
        try:
            jsonschema.validate(json.loads(text, strict=True), schema)
        except (json.JSONDecodeError, jsonschema.ValidationError) as e:
            bad.append(f"{text!r}: {e}")
    print(
        f"\n{len(replies)} json_schema replies at temperature 1 from a random model, {len(finished)} finished: "
        f"{len(finished) - len(bad)} strict JSON valid against the schema, {len(bad)} not; raw control "
        f"characters in {with_controls}, escaped ones in {escaped_controls}"
    )
    record("strict JSON: finished json_schema replies checked", len(finished))
    record("strict JSON: replies that failed json.loads(strict=True) or the schema", len(bad))
    assert len(finished) >= len(replies) // 4, "too few replies finished to say anything"
    assert not bad, "\n".join(bad[:5])
