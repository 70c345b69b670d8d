"""apply / status / logs / down on a docker target drive `docker compose` on the rendered file.

No container runtime exists on these machines, so a stand-in `docker` on PATH records the argv it
is called with (and exits with $DOCKER_EXIT); the smoke test after `up --wait` is replaced where a
healthy engine would be needed. The real Docker path is documented as untested in docs/targets/docker.md.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

from llmdeploy.cli.main import main
from llmdeploy.planner import make_plan
from llmdeploy.recipe import load_recipe
from llmdeploy.targets import render

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "long-context-agent.yaml"
PROJECT = "llmdeploy-long-context-agent"
# the subpackage (the attribute `llmdeploy.smoke` is the function of the same name)
SMOKE_PACKAGE = importlib.import_module("llmdeploy.smoke")


@pytest.fixture
def docker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in `docker` first on PATH; returns the file each call's argv is appended to."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "docker-calls.jsonl"
    script = bin_dir / "docker"
    script.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        "with open(os.environ['DOCKER_RECORD'], 'a') as f:\n"
        "    f.write(json.dumps(sys.argv[1:]) + '\\n')\n"
        "sys.exit(int(os.environ.get('DOCKER_EXIT', '0')))\n"
    )
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setenv("DOCKER_RECORD", str(record))
    monkeypatch.setenv("LLMDEPLOY_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("AGENT_API_KEY", "not-a-real-key")
    return record


def _run(*args: str) -> int:
    with pytest.raises(SystemExit) as exited:
        main(list(args))
    code = exited.value.code
    return code if isinstance(code, int) else 1


def _calls(record: Path) -> list[list[str]]:
    return [json.loads(line) for line in record.read_text().splitlines()] if record.is_file() else []


def _compose_file(tmp_path: Path) -> Path:
    return tmp_path / "state" / "long-context-agent" / "docker-compose.yaml"


def test_apply_runs_compose_up_on_the_rendered_file(docker: Path, tmp_path: Path) -> None:
    assert _run("apply", str(RECIPE), "--no-wait") == 0
    compose = _compose_file(tmp_path)
    base = ["compose", "--project-name", PROJECT, "--file", str(compose)]
    assert _calls(docker) == [[*base, "up", "--detach"]]
    recipe = load_recipe(RECIPE)
    assert compose.read_text() == render(recipe, make_plan(recipe)).files["docker-compose.yaml"]
    assert "not-a-real-key" not in compose.read_text()  # Compose reads the key from the environment


def test_apply_waits_for_health_then_smoke_tests(
    docker: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    smoked: list[str] = []

    class Passed:
        ok = True

        def render(self) -> str:
            return "smoke: result: PASS"

    def fake_smoke(url: str, **_: object) -> Passed:
        smoked.append(url)
        return Passed()

    monkeypatch.setattr(SMOKE_PACKAGE, "smoke", fake_smoke)
    assert _run("apply", str(RECIPE), "--yes") == 0
    (call,) = _calls(docker)
    assert call[-3:] == ["up", "--detach", "--wait"]
    assert smoked == ["http://127.0.0.1:8000"]
    assert "result: PASS" in capsys.readouterr().err


def test_failed_up_fails_apply_and_skips_smoke(docker: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_EXIT", "1")
    monkeypatch.setattr(SMOKE_PACKAGE, "smoke", lambda *a, **k: pytest.fail("smoke ran after a failed up"))
    assert _run("apply", str(RECIPE), "--yes") == 1


def test_status_logs_down_use_the_same_project(docker: Path, tmp_path: Path) -> None:
    assert _run("apply", str(RECIPE), "--no-wait") == 0
    compose = _compose_file(tmp_path)
    base = ["compose", "--project-name", PROJECT, "--file", str(compose)]
    assert _run("status", str(RECIPE)) == 1  # nothing answers /health on port 8000 here
    assert _run("logs", str(RECIPE), "-n", "20", "--follow") == 0
    assert _run("down", str(RECIPE)) == 0
    assert _calls(docker)[1:] == [
        [*base, "ps", "--all"],
        [*base, "logs", "--tail", "20", "--follow", "engine"],
        [*base, "down"],
    ]
    assert not compose.exists()
    assert _run("down", str(RECIPE)) == 0  # a second down has nothing to stop and calls nothing
    assert len(_calls(docker)) == 4


def test_missing_secret_variable_is_named_and_docker_never_runs(
    docker: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("AGENT_API_KEY")
    assert _run("apply", str(RECIPE), "--yes") == 2
    err = capsys.readouterr().err
    assert "AGENT_API_KEY is not set" in err and "Traceback" not in err
    assert _calls(docker) == []


def test_no_docker_on_path_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setenv("LLMDEPLOY_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("AGENT_API_KEY", "x")
    assert _run("apply", str(RECIPE), "--yes") == 2
    err = capsys.readouterr().err
    assert "`docker` is not on PATH" in err and "docker compose" in err
    assert not _compose_file(tmp_path).exists()
