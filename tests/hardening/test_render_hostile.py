"""Random hostile strings in model names, served names and env values never inject into rendered files.

Each string either is refused with a UserError or reaches the engine as the exact same argv and
environment: launch.sh is run under bash with a recording stand-in for the engine, Compose files and
manifests are parsed back. (tests/render/test_injection.py does the same for one fixed string.)
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hardening.figures import record
from llmdeploy.errors import UserError
from llmdeploy.recipe import load_recipe
from llmdeploy.render import engine_command
from llmdeploy.render.model_location import container_model_ref
from llmdeploy.targets import render

PIECES = ["'", '"', "$(touch PWNED)", "`touch PWNED`", "\n", "\\", "${HOME}", "$$", ";", "|", "&", "--port 1",
          "{{ x }}", "{% raw %}", "#", ": ", "- ", "*a", "&a", "!!python/object", "\t", " ", "é", "\u202e", "%"]  # fmt: skip
hostile = st.lists(
    st.one_of(st.sampled_from(PIECES), st.text(min_size=1, max_size=3)), min_size=1, max_size=8
).map("".join)
FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _recipe(tmp_path: Path, target: str, model: str, served: str, value: str) -> Any:
    data = {"name": "h", "model": {"id": model}, "hardware": {"device": "cpu"},
            "engine": {"type": "builtin", "env": {"X_HOSTILE": value}},
            "server": {"served_model_name": served}, "target": {"type": target}}  # fmt: skip
    path = tmp_path / "hostile.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True))
    try:
        recipe = load_recipe(path, env={})
        artifacts = render(recipe, None)
    except UserError as e:
        assert e.problems and "Traceback" not in str(e)
        record("render: hostile recipes refused with UserError", 1)
        return None
    record("render: hostile recipes rendered and parsed back", 1)
    return recipe, artifacts


@FUZZ
@given(model=hostile, served=hostile, value=hostile)
@pytest.mark.slow
def test_launch_script(tmp_path: Path, model: str, served: str, value: str) -> None:
    made = _recipe(tmp_path, "local", model, served, value)
    if made is None:
        return
    recipe, artifacts = made
    folder = tmp_path / "out"
    folder.mkdir(exist_ok=True)
    for name, text in artifacts.files.items():
        (folder / name).write_text(text)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "llmdeploy-engine"
    fake.write_text('#!/usr/bin/env python3\nimport json, os, sys\n'
                    'json.dump({"argv": sys.argv[1:], "X": os.environ.get("X_HOSTILE")}, open(os.environ["OUT"], "w"))\n')  # fmt: skip
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    out = tmp_path / "seen.json"
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "OUT": str(out), "HOME": str(tmp_path)}
    subprocess.run(["bash", str(folder / "launch.sh")], cwd=tmp_path, env=env, check=True, timeout=30,
                   capture_output=True)  # fmt: skip
    seen = json.loads(out.read_text())
    assert seen["argv"] == engine_command(recipe).argv[1:]
    assert seen["X"] == recipe.engine.env["X_HOSTILE"]  # the value after the recipe's own `$${` escape
    assert not list(tmp_path.glob("PWNED*"))


@FUZZ
@given(model=hostile, served=hostile, value=hostile)
def test_compose_file(tmp_path: Path, model: str, served: str, value: str) -> None:
    made = _recipe(tmp_path, "docker", model, served, value)
    if made is None:
        return
    recipe, artifacts = made
    compose = yaml.safe_load(artifacts.files["docker-compose.yaml"])
    engine = compose["services"]["engine"]
    expected = engine_command(recipe, model_ref=container_model_ref(recipe), host="0.0.0.0").argv
    # Compose interpolates `$`; the file must escape every one of them as `$$`
    assert [arg.replace("$$", "$") for arg in engine["command"]] == expected
    assert all("$" not in arg.replace("$$", "") for arg in engine["command"])
    assert engine["environment"]["X_HOSTILE"] == recipe.engine.env["X_HOSTILE"].replace("$", "$$")


@FUZZ
@given(model=hostile, served=hostile, value=hostile)
@pytest.mark.slow
def test_manifests(tmp_path: Path, model: str, served: str, value: str) -> None:
    made = _recipe(tmp_path, "kubernetes", model, served, value)
    if made is None:
        return
    recipe, artifacts = made
    for text in artifacts.files.values():
        assert len(list(yaml.safe_load_all(text))) == 1, "one object per file: nothing smuggled in"
    parsed = [
        yaml.safe_load(text) for name, text in artifacts.files.items() if name.endswith((".yaml", ".yml"))
    ]
    workload = next(d for d in parsed if d and d.get("kind") in ("Deployment", "StatefulSet"))
    assert workload == next(d for d in artifacts.documents if d["kind"] == workload["kind"]), "file == object"
    container = workload["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "X_HOSTILE", "value": recipe.engine.env["X_HOSTILE"]} in container["env"]
    assert recipe.server.served_model_name in container["command"]


@pytest.mark.parametrize("key", ["X_HOSTILE; rm -rf /", "A=B", "$(id)", "X\nY"])
def test_hostile_env_names_are_refused(tmp_path: Path, key: str) -> None:
    data = {"model": {"id": "m"}, "hardware": {"device": "cpu"}, "engine": {"type": "builtin", "env": {key: "v"}},
            "target": {"type": "local"}}  # fmt: skip
    path = tmp_path / "env.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(UserError):
        render(load_recipe(path, env={}), None)
    record("render: hostile recipes refused with UserError", 1)
