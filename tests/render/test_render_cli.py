"""`llmdeploy render` as a user runs it: files written, re-render unchanged, unsupported knobs exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from render.recipe_factory import REPO_ROOT

RECIPE = REPO_ROOT / "recipes" / "quickstart.yaml"


def _render(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llmdeploy.cli.main", "render", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
        check=False,
    )


@pytest.mark.slow
def test_render_writes_then_leaves_unchanged(tmp_path: Path) -> None:
    first = _render(str(RECIPE), "-o", str(tmp_path))
    assert first.returncode == 0, first.stderr
    assert (tmp_path / "launch.sh").is_file() and (tmp_path / "engine.env").is_file()
    second = _render(str(RECIPE), "-o", str(tmp_path))
    assert second.returncode == 0 and "written" not in second.stdout


@pytest.mark.slow
def test_unsupported_knob_exits_2_naming_engine_and_knob(tmp_path: Path) -> None:
    done = _render(str(RECIPE), "-o", str(tmp_path), "--set", "parallelism.pipeline=2")
    assert done.returncode == 2
    assert "engine 'builtin' cannot honour parallelism.pipeline" in done.stderr
    assert not (tmp_path / "launch.sh").exists()
