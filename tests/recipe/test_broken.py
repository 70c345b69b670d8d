"""Every file in broken/ fails with the exact message fragments its `# expect:` lines list
(file:line, field path, bad value and fix), in-process and through the CLI (exit 2, no traceback)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmdeploy.errors import UserError
from llmdeploy.recipe import load_recipe

BROKEN = Path(__file__).parent / "broken"
FILES = sorted(BROKEN.glob("*.yaml"))
ROOT = Path(__file__).resolve().parents[2]


def _expected(file: Path) -> list[str]:
    prefix = "# expect: "
    return [line[len(prefix) :] for line in file.read_text().splitlines() if line.startswith(prefix)]


def test_every_broken_file_states_what_it_expects() -> None:
    assert len(FILES) >= 20
    for file in FILES:
        assert _expected(file), f"{file.name} has no '# expect:' line"


@pytest.mark.parametrize("file", FILES, ids=[f.stem for f in FILES])
def test_broken_recipe_reports_expected_problems(file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(BROKEN)
    with pytest.raises(UserError) as info:
        load_recipe(file.name, env={})
    text = str(info.value)
    for fragment in _expected(file):
        if fragment.startswith("error: "):
            continue  # the CLI's summary line, checked below
        assert fragment in text, f"{fragment!r} not in:\n{text}"


def test_cli_on_all_broken_files_exits_2_without_traceback() -> None:
    env = {k: v for k, v in os.environ.items() if k != "LLMDEPLOY_TEST_SURELY_UNSET"}
    names = [f.name for f in FILES]
    done = subprocess.run(
        [sys.executable, "-m", "llmdeploy.cli.main", "validate", *names],
        cwd=BROKEN,
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert "Traceback" not in output
    for file in FILES:
        assert f"FAIL {file.name}" in done.stdout
        for fragment in _expected(file):
            if not fragment.startswith("error: "):
                assert fragment in done.stderr, f"{file.name}: {fragment!r} not in:\n{done.stderr}"


def test_cli_counts_problems_of_one_file() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "llmdeploy.cli.main", "validate", "all_at_once.yaml"],
        cwd=BROKEN,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("error: 5 problems found\n"), done.stderr


def test_cli_json_output_lists_every_problem_with_its_location() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "llmdeploy.cli.main",
            "validate",
            "--output",
            "json",
            "unknown_key.yaml",
            "tabs.yaml",
        ],
        cwd=BROKEN,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] is False
    unknown, tabs = report["files"]
    assert unknown["problems"] == [
        {
            "message": "unknown field 'max_model_lenn'",
            "file": "unknown_key.yaml",
            "line": 6,
            "path": "limits.max_model_lenn",
            "fix": "did you mean 'max_model_len'?",
        }
    ]
    assert tabs["problems"][0]["line"] == 4
