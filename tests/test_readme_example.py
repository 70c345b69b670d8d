"""The README's library example runs as written."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from default_model import default_model_gguf

ROOT = Path(__file__).resolve().parents[1]


def _example(marker: str) -> str:
    text = (ROOT / "README.md").read_text()
    match = re.search(rf"<!-- example: {marker} -->\s*```python\n(.*?)```", text, re.S)
    assert match, f"README has no example marked {marker!r}"
    return match.group(1)


def test_library_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    code = _example("library")
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        exec(compile(code, "README.md:library", "exec"), {})
    finally:
        os.chdir(cwd)
    out = capsys.readouterr().out
    assert "KV tokens" in out and "fits=True" in out
    assert "limits.max_model_len" in out  # the UserError names the field


@pytest.mark.slow
def test_engine_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    gguf = default_model_gguf()
    code = _example("engine").replace("path/to/model.gguf", str(gguf))
    exec(compile(code, "README.md:engine", "exec"), {})
    assert capsys.readouterr().out.strip()
