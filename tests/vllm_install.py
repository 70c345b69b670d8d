"""The vLLM CPU install the tests use: a venv made by tests/vllm/setup.sh (bin/test runs it), named by
LLMDEPLOY_VLLM_VENV (default: .venv-vllm in the repository). To llmdeploy it is one install like any
other: the tests put its bin folder on PATH, where `apply` looks for `vllm`."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
SETUP_SCRIPT = REPO_ROOT / "tests" / "vllm" / "setup.sh"


def vllm_venv() -> Path:
    return Path(os.environ.get("LLMDEPLOY_VLLM_VENV") or REPO_ROOT / ".venv-vllm")


def vllm_python() -> Path | None:
    """The venv's interpreter, or None when the venv has not been made."""
    python = vllm_venv() / "bin" / "python"
    return python if python.is_file() and (vllm_venv() / "bin" / "vllm").is_file() else None


def env_with_vllm(env: Mapping[str, str]) -> dict[str, str]:
    """`env` with the venv's bin folder first on PATH."""
    return {**env, "PATH": f"{vllm_venv() / 'bin'}{os.pathsep}{env.get('PATH', '')}"}
