"""Finding the local engine install (PATH or engine.executable) and asking it about the rendered flags.

Unit tests with stand-in executables; the real vLLM install is exercised by test_local_apply_vllm.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from llmdeploy.apply.local_engine import _script_python, check_flags, find_local_engine
from llmdeploy.errors import UserError
from llmdeploy.recipe import Recipe

FAKE_TGI = """#!/bin/sh
case "$1" in
  --version) echo "text-generation-launcher 3.1.0" ;;
  --help) printf 'Usage: text-generation-launcher [OPTIONS]\\n      --model-id <MODEL_ID>\\n      --hostname <HOSTNAME>\\n      --port <PORT>\\n      --max-input-tokens <N>\\n      --max-total-tokens <N>\\n      --max-batch-total-tokens <N>\\n      --max-concurrent-requests <N>\\n      --dtype <DTYPE>\\n' ;;
  *) exit 3 ;;
esac
"""


def _recipe(engine: dict[str, object]) -> Recipe:
    return Recipe.model_validate(
        {
            "name": "t",
            "model": {"id": "meta-llama/Llama-3.1-8B-Instruct"},
            "hardware": {"gpu": "A100-80GB"},
            "engine": engine,
        }
    )


def _script(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def test_interpreter_is_read_from_each_kind_of_console_script(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = _script(tmp_path / "a", "#!/opt/vllm/bin/python3\nimport sys\n")
    assert _script_python(plain) == Path("/opt/vllm/bin/python3")
    # pip's form for interpreter paths too long for a shebang line
    long_form = _script(
        tmp_path / "b",
        "#!/bin/sh\n'''exec' \"/very/long/venv/bin/python\" \"$0\" \"$@\"\n' '''\nimport sys\n",
    )
    assert _script_python(long_form) == Path("/very/long/venv/bin/python")
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))
    via_env = _script(tmp_path / "c", f"#!/usr/bin/env {Path(sys.executable).name}\n")
    assert _script_python(via_env) == Path(sys.executable)
    assert _script_python(_script(tmp_path / "d", "\x7fELF")) is None


def test_vllm_not_on_path_names_both_fixes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(UserError) as err:
        find_local_engine(_recipe({"type": "vllm"}))
    text = str(err.value)
    assert "no `vllm` on PATH" in text and "pip install vllm" in text and "engine.executable" in text


def test_named_executable_must_exist(tmp_path: Path) -> None:
    with pytest.raises(UserError) as err:
        find_local_engine(_recipe({"type": "vllm", "executable": str(tmp_path / "nope")}))
    assert "engine.executable: no executable file there" in str(err.value)


def test_named_python_without_vllm_says_it_cannot_import_it() -> None:
    with pytest.raises(UserError) as err:
        find_local_engine(_recipe({"type": "vllm", "executable": sys.executable}))
    assert "cannot import vllm" in str(err.value) or "no module named vllm" in str(err.value)


def test_tgi_on_path_reports_its_version_and_checks_flags_against_its_help(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _script(tmp_path / "bin" / "text-generation-launcher", FAKE_TGI)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    found = find_local_engine(_recipe({"type": "tgi"}))
    assert found.version == "3.1.0"
    assert found.describe() == f"TGI 3.1.0 at {tmp_path / 'bin' / 'text-generation-launcher'}"
    argv = found.argv(["text-generation-launcher", "--model-id", "m", "--port", "8000"])
    assert argv == [str(found.executable), "--model-id", "m", "--port", "8000"]
    check_flags(found, argv)
    with pytest.raises(UserError) as err:
        check_flags(found, [*argv, "--kv-cache-dtype", "fp8_e5m2"])
    assert "unknown flags --kv-cache-dtype" in str(err.value)


def test_builtin_engine_found_on_path_runs_its_console_script(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = _script(tmp_path / "bin" / "llmdeploy-engine", f"#!{sys.executable}\nraise SystemExit(0)\n")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    found = find_local_engine(_recipe({"type": "builtin"}))
    assert found.executable == script and found.python == Path(sys.executable)
    assert found.version == "0.1.0"
    assert found.argv(["llmdeploy-engine", "serve", "--port", "1"]) == [str(script), "serve", "--port", "1"]


def test_builtin_engine_off_path_runs_as_a_module_of_this_interpreter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    found = find_local_engine(_recipe({"type": "builtin"}))
    assert found.argv(["llmdeploy-engine", "serve", "--port", "1"]) == [
        sys.executable, "-m", "llmdeploy_engine.cli", "serve", "--port", "1",
    ]  # fmt: skip


@pytest.mark.slow
def test_executable_on_a_container_target_is_refused_with_its_line(tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "name: t\nmodel: {id: meta-llama/Llama-3.1-8B-Instruct}\nhardware: {gpu: A100-80GB}\n"
        "engine:\n  type: vllm\n  executable: /opt/vllm/bin/vllm\n"
        "target: {type: kubernetes, namespace: ml}\n"
    )
    out = subprocess.run(
        [sys.executable, "-m", "llmdeploy.cli.main", "validate", str(recipe)], capture_output=True, text=True
    )
    assert out.returncode != 0
    assert f"{recipe}:6: engine.executable: engine.executable names a local install" in out.stderr, out.stderr
    assert "fix: remove engine.executable" in out.stderr
    local = recipe.read_text().replace("target: {type: kubernetes, namespace: ml}\n", "")
    recipe.write_text(local)
    ok = subprocess.run(
        [sys.executable, "-m", "llmdeploy.cli.main", "validate", str(recipe)], capture_output=True, text=True
    )
    assert "engine.executable" not in ok.stdout + ok.stderr
