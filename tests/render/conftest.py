"""Render tests: `pytest tests/render --update-golden` (the flag is tests/conftest.py's) rewrites
tests/render/golden/ from the current code."""

from __future__ import annotations

import pytest


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden", default=False))
