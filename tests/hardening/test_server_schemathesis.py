"""Schemathesis over the real server's own OpenAPI description: never a 5xx, errors in OpenAI's shape.

Both schema-conforming (positive) and schema-violating (negative) bodies are generated for every
operation; the number of examples per operation is bounded so the run fits CI.
"""

from __future__ import annotations

import httpx
import pytest
import schemathesis
from engine_server import EngineServer
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from hardening.figures import record
from hardening.test_server_bad_input import assert_openai_error, check_still_serving

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

MAX_EXAMPLES = 40
GENERATING = ("/v1/completions", "/v1/chat/completions", "/", "/generate", "/generate_stream")


def _cap(fields: dict[str, object], keys: tuple[str, ...], most: int, default: bool = False) -> None:
    for key in keys:
        value = fields.get(key)
        if (isinstance(value, int) and not isinstance(value, bool) and value > most) or (
            value is None and default and key == keys[0]
        ):
            fields[key] = most


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_no_server_errors_over_the_api_description(engine_server: EngineServer, mode: GenerationMode) -> None:
    schema = schemathesis.openapi.from_url(engine_server.url + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= set(GENERATING)
    failures: list[str] = []
    for operation in operations:
        # generating routes cost model time; the cheap ones get the same bound
        @settings(
            max_examples=MAX_EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck)
        )
        @given(case=operation.as_strategy(generation_mode=mode))
        def run(case: schemathesis.Case) -> None:
            body = case.body if isinstance(case.body, dict) else None
            if body is not None:  # keep cases cheap: the model generates at most a few tokens, few choices
                _cap(body, ("max_tokens", "max_completion_tokens"), 4, default=True)
                _cap(body, ("n", "best_of"), 2)
                if "inputs" in body and "parameters" not in body:  # TGI's default is 100 new tokens
                    body["parameters"] = {}
                params = body.get("parameters")
                if isinstance(params, dict):
                    _cap(params, ("max_new_tokens",), 4, default=True)
                    _cap(params, ("best_of",), 2)
            response = case.call(base_url=engine_server.url, headers=engine_server.headers(), timeout=120)
            record(f"schemathesis {mode.value} cases sent", 1)
            record(f"schemathesis responses HTTP {response.status_code // 100}xx", 1)
            if response.status_code >= 500:
                failures.append(f"{case.method} {case.path}: {response.status_code} {response.text[:200]}")
            elif response.status_code >= 400 and case.path.startswith("/v1"):
                assert_openai_error(httpx.Response(response.status_code, content=response.content))

        try:
            run()
        except Unsatisfiable:  # e.g. no schema-violating request exists for a GET without parameters
            record(f"schemathesis {mode.value} operations with no case to generate", 1)
    assert not failures, "\n".join(failures[:10])
    check_still_serving(engine_server)
