"""/health names the engine instance (`x-llmdeploy-instance`), so `llmdeploy apply` can tell its own
engine from another server on the same port (issue 29, item 12)."""

from __future__ import annotations

import pytest

from tests.server.fake_engine import FakeEngine
from tests.server.test_app_unit import make_client


def test_health_echoes_the_instance_id_it_was_started_with(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMDEPLOY_INSTANCE_ID", "0123abcd")
    r = make_client(FakeEngine()).get("/health")
    assert r.status_code == 200 and r.headers["x-llmdeploy-instance"] == "0123abcd"


@pytest.mark.parametrize("given", ["", "bad value\r\nx-injected: 1", "é" * 3, "x" * 65])
def test_without_a_usable_id_each_server_makes_its_own(monkeypatch: pytest.MonkeyPatch, given: str) -> None:
    monkeypatch.setenv("LLMDEPLOY_INSTANCE_ID", given)
    first = make_client(FakeEngine()).get("/health").headers["x-llmdeploy-instance"]
    second = make_client(FakeEngine()).get("/health").headers["x-llmdeploy-instance"]
    assert first != second and len(first) == 32 and "x-injected" not in first
