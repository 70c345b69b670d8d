"""Issue 48, item 11: the follow-up commands `apply` prints (`llmdeploy status / logs / down`) work
pasted into a new shell, whose PATH lacks `.venv/bin`; and `bin/setup-env` says what it is doing
while it builds `.venv` (the quickstart's first minutes)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from llmdeploy.apply.command_hint import follow_up_commands, llmdeploy_command

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(sys.prefix) / "bin" / "llmdeploy"
pytestmark = pytest.mark.skipif(not SCRIPT.is_file(), reason="llmdeploy is not installed as a console script")


def _in_a_new_shell(command: str, cwd: Path, home: Path | None = None) -> subprocess.CompletedProcess[str]:
    # what a new terminal has: a login PATH without the virtual environment, no VIRTUAL_ENV
    env = {"HOME": str(home or Path.home()), "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        ["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def test_the_printed_command_works_in_a_new_shell(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for folder in (REPO, tmp_path):  # from the repository (a relative path) and from elsewhere
        monkeypatch.chdir(folder)
        monkeypatch.setenv("PATH", f"{SCRIPT.parent}:/usr/bin:/bin")  # as bin/quickstart runs it
        printed = llmdeploy_command()
        assert printed != "llmdeploy"
        done = _in_a_new_shell(f"{printed} status --help", folder)
        assert done.returncode == 0, done.stderr
        assert "Usage:" in done.stdout


def test_each_printed_line_is_one_command(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Each line under "See it" / "Stop it" pasted whole runs as one command (two on one line ran as
    one `status` with extra arguments: a usage error). HOME is a fresh folder: nothing is running."""
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("PATH", f"{SCRIPT.parent}:/usr/bin:/bin")
    text = follow_up_commands("recipes/quickstart.yaml")
    lines = [line.strip() for line in text.splitlines() if line.startswith("  ")]
    assert [line.split()[1:] for line in lines] == [
        [verb, "recipes/quickstart.yaml"] for verb in ("status", "logs", "down")
    ]
    for line in lines:
        done = _in_a_new_shell(line, REPO, home=tmp_path)
        assert done.returncode != 2 and "Usage:" not in done.stderr, (line, done.stderr)


def test_plain_llmdeploy_when_the_login_path_finds_this_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    bin_dir = tmp_path / "bin"  # as pipx or a user install links it into ~/.local/bin
    bin_dir.mkdir()
    (bin_dir / "llmdeploy").symlink_to(SCRIPT)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    assert llmdeploy_command() == "llmdeploy"


def test_setup_env_reports_each_step() -> None:
    text = (REPO / "bin" / "setup-env").read_text()
    assert re.findall(r'^echo "  \[(\d)/4\]', text, re.MULTILINE) == ["1", "2", "3", "4"]
    assert "--progress-bar off" in text and "ready in" in text
    # every install goes through the step's progress lines, none is silenced with -q but pip's own upgrade
    assert text.count("pip_install ") == 3 and text.count(" -q ") == 1
