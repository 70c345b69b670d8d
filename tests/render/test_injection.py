"""Hostile strings (quotes, $(), backticks, newlines) reach the engine as the exact same argv."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest
import yaml

from llmdeploy.recipe.schema import Recipe
from llmdeploy.render import engine_command
from llmdeploy.render.model_location import container_model_ref
from llmdeploy.targets import render
from render.recipe_factory import make_recipe

HOSTILE = "evil'\"$(touch PWNED)`touch PWNED2`\n--port 1;${HOME}\\"


def _hostile(target: dict[str, object]) -> Recipe:
    return make_recipe(
        "builtin",
        model={"id": HOSTILE},
        hardware={"device": "cpu"},
        server={"served_model_name": HOSTILE},
        engine={"type": "builtin", "env": {"X": HOSTILE}},
        target=target,
    )


def test_launch_script_passes_argv_through_bash_unchanged(tmp_path: Path) -> None:
    recipe = _hostile({"type": "local"})
    folder = tmp_path / "out"
    folder.mkdir()
    for name, text in render(recipe, None).files.items():
        (folder / name).write_text(text)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "llmdeploy-engine"
    # stands in for the engine: records the argv and environment it was started with
    fake.write_text(
        "#!/usr/bin/env python3\nimport json, os, sys\n"
        'json.dump({"argv": sys.argv[1:], "X": os.environ.get("X")}, open(os.environ["OUT"], "w"))\n'
    )
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    out = tmp_path / "seen.json"
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "OUT": str(out), "HOME": str(tmp_path)}
    subprocess.run(["bash", str(folder / "launch.sh")], cwd=tmp_path, env=env, check=True, timeout=30)
    seen = json.loads(out.read_text())
    assert seen["argv"] == engine_command(recipe).argv[1:]
    assert seen["X"] == HOSTILE
    assert not list(tmp_path.glob("PWNED*"))


def test_compose_escapes_interpolation() -> None:
    recipe = _hostile({"type": "docker"})
    compose = yaml.safe_load(render(recipe, None).files["docker-compose.yaml"])
    command = compose["services"]["engine"]["command"]
    expected = engine_command(recipe, model_ref=container_model_ref(recipe), host="0.0.0.0").argv
    assert [arg.replace("$$", "$") for arg in command] == expected
    assert all("$" not in arg.replace("$$", "") for arg in command)
    assert compose["services"]["engine"]["environment"]["X"] == HOSTILE.replace("$", "$$")


def test_manifests_carry_the_exact_strings() -> None:
    recipe = _hostile({"type": "kubernetes"})
    artifacts = render(recipe, None)
    deployment = next(d for d in artifacts.documents if d["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == engine_command(recipe, model_ref=HOSTILE, host="0.0.0.0").argv
    assert {"name": "X", "value": HOSTILE} in container["env"]
    for text in artifacts.files.values():
        assert len(list(yaml.safe_load_all(text))) == 1


@pytest.mark.parametrize("name", ["1BAD", "A-B", "A B", "$(x)"])
def test_bad_environment_variable_names_are_refused(name: str) -> None:
    from pydantic import ValidationError

    from llmdeploy.errors import UserError

    # the schema refuses the name (a located recipe error); render never sees it
    with pytest.raises((UserError, ValidationError)):
        recipe = make_recipe(
            "builtin", hardware={"device": "cpu"}, server={"api_key": {"env": name}}, target={"type": "local"}
        )
        render(recipe, None)


def test_leader_worker_shell_line_keeps_the_argv() -> None:
    import shlex

    recipe = make_recipe(
        "vllm",
        hardware={"gpu": "H100-SXM", "nodes": 2},
        parallelism={"tensor": 8, "pipeline": 2},
        server={"served_model_name": HOSTILE},
        target={"type": "kubernetes"},
    )
    lws = next(d for d in render(recipe, None).documents if d["kind"] == "LeaderWorkerSet")
    leader = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]["command"]
    assert leader[:2] == ["sh", "-c"]
    _, _, exec_part = leader[2].partition(" && exec ")
    assert shlex.split(exec_part) == engine_command(recipe, model_ref=recipe.model.id, host="0.0.0.0").argv
