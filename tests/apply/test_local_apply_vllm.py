"""End to end: a wheel-installed llmdeploy, run outside the repository, validates, plans, renders and
applies the vLLM quickstart on the local target. The real vLLM CPU build (tests/vllm/setup.sh, run by
bin/test) is on PATH, as a user's pip-installed vLLM would be: apply finds it there, prints its
version, checks the rendered flags with its own parser, converts the GGUF once, waits for health and
smoke-tests it; then status and down."""

from __future__ import annotations

from pathlib import Path

import pytest
from local_apply_helpers import free_port
from vllm_install import vllm_python, vllm_venv
from wheel_install import WheelVenv, installed_env, outside_copy, run_installed, validate_plan_render

pytestmark = [pytest.mark.slow, pytest.mark.vllm]


@pytest.fixture(scope="module")
def needs_vllm() -> None:
    if vllm_python() is None:
        pytest.skip("the vLLM CPU venv is missing: run tests/vllm/setup.sh (bin/test does)")


@pytest.mark.timeout(3600)  # the session's clean venv may be made in this test's setup (minutes)
def test_installed_wheel_applies_the_vllm_quickstart(
    needs_vllm: None, wheel_venv: WheelVenv, tmp_path: Path
) -> None:
    recipe = outside_copy("quickstart-vllm.yaml", tmp_path)
    env = installed_env(wheel_venv, tmp_path, extra_path=str(vllm_venv() / "bin"))
    sets = ["--set", f"server.port={free_port()}"]
    validate_plan_render(wheel_venv, recipe, env, sets)
    try:
        applied = run_installed(wheel_venv, recipe.parent, env, "apply", str(recipe), "--yes", *sets)
        out = applied.stdout + applied.stderr
        assert applied.returncode == 0, out[-4000:]
        assert f"==> found vLLM 0.32.0 at {vllm_venv() / 'bin' / 'vllm'}" in out
        assert "own parser" in out
        assert "result: PASS" in out
        assert "Traceback" not in out.split("==> starting")[0]  # our side never prints one
        status = run_installed(wheel_venv, recipe.parent, env, "status", str(recipe), *sets)
        assert status.returncode == 0, status.stdout + status.stderr
    finally:
        down = run_installed(wheel_venv, recipe.parent, env, "down", str(recipe), *sets)
    assert down.returncode == 0, down.stderr


def test_the_installed_vllms_parser_judges_the_flags(needs_vllm: None) -> None:
    """A flag that release does not know, and a combination its own validation refuses (which the
    offline catalogue cannot see), both fail before anything starts, in vLLM's words."""
    from llmdeploy.apply.local_engine import check_flags, find_local_engine
    from llmdeploy.errors import UserError
    from llmdeploy.planner import make_plan
    from llmdeploy.recipe import load_recipe
    from llmdeploy.render import engine_command

    root = Path(__file__).resolve().parents[2]
    named = f"engine.executable={vllm_venv() / 'bin' / 'vllm'}"
    recipe = load_recipe(root / "recipes" / "quickstart-vllm.yaml", (named,))
    found = find_local_engine(recipe)
    assert found.version == "0.32.0" and found.python is not None
    argv = found.argv(engine_command(recipe, make_plan(recipe), model_ref="/models/m").argv)
    with pytest.raises(UserError) as err:
        check_flags(found, [*argv, "--no-such-flag"])  # as a newer catalogue than the install would allow
    assert "unrecognized arguments: --no-such-flag" in str(err.value) and "vLLM 0.32.0" in str(err.value)
    tools = load_recipe(
        root / "recipes" / "quickstart-vllm.yaml", (named, "engine.extra_args=[--enable-auto-tool-choice]")
    )
    with pytest.raises(UserError) as err:
        check_flags(found, found.argv(engine_command(tools, make_plan(tools), model_ref="/models/m").argv))
    assert "tool-call-parser" in str(err.value)
