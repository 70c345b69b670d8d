"""Target tests: `pytest tests/targets --update-golden` (the flag is tests/conftest.py's) rewrites
tests/targets/golden/ from the current code."""

from __future__ import annotations

import pytest


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden", default=False))
