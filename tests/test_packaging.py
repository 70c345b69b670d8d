"""Packaging: the hand-written package list, the wheel (templates as package data, rendering without
the source tree), the engine images' Dockerfiles, and the clean venv those Dockerfiles' install lines
make: it serves the command a rendered Deployment gives the engine container, and a wheel-installed
llmdeploy runs validate / plan / render / apply outside the repository.

No container runtime exists on these machines, so the images themselves are never built here
(docs/docker.md says so); what the image would run is run in the venv instead.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import tomllib
import zipfile
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from wheel_install import (
    CPU_DOCKERFILE,
    CUDA_DOCKERFILE,
    WheelVenv,
    dockerfile_instructions,
    installed_env,
    outside_copy,
    pip_install_lines,
    run_installed,
    validate_plan_render,
)

from llmdeploy.recipe import load_recipe
from llmdeploy.render.kubernetes_objects import image
from llmdeploy.render.model_location import CONTAINER_CACHE_DIR

ROOT = Path(__file__).resolve().parents[1]
STARTUP_BUDGET_S = 600  # loading torch and the model on a shared 2-core machine
# the session's one clean venv (torch included) is made in the first of these tests' setup: minutes
VENV_TIMEOUT = pytest.mark.timeout(3600)


def test_every_package_is_listed() -> None:
    """Every folder of code or package data: setuptools treats a data folder (templates/docker) as a
    package too and warns at every install about one missing from the list."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    listed = set(config["tool"]["setuptools"]["packages"])
    mapping = config["tool"]["setuptools"]["package-dir"]
    found = set()
    for import_name, folder in mapping.items():
        base = ROOT / folder
        for sub in [base, *base.rglob("*")]:
            if sub.is_dir() and sub.name != "__pycache__" and any(f.is_file() for f in sub.iterdir()):
                found.add(".".join([import_name, *sub.relative_to(base).parts]))
    assert found - listed == set(), "add these to [tool.setuptools] packages"
    assert listed - found == set(), "these listed packages have no folder"


def test_toolkit_never_imports_torch() -> None:
    offenders = [
        str(p.relative_to(ROOT))
        for p in (ROOT / "llmdeploy").rglob("*.py")
        if any(line.strip().startswith(("import torch", "from torch")) for line in p.read_text().splitlines())
    ]
    assert offenders == []


@pytest.mark.slow
def test_wheel_ships_the_templates_and_renders_without_the_source_tree(
    built_wheel: Path, tmp_path: Path
) -> None:
    """Install the wheel into a folder of its own (no editable link back to this tree) and render the
    quickstart recipe from there: the Jinja2 templates and flag catalogues are package data."""
    names = set(zipfile.ZipFile(built_wheel).namelist())
    templates = {
        "llmdeploy/" + str(p.relative_to(ROOT / "llmdeploy"))
        for p in (ROOT / "llmdeploy" / "templates").rglob("*")
        if p.is_file()
    }
    assert templates and templates <= names, sorted(templates - names)
    assert "llmdeploy/apply/vllm_parser_check.py" in names  # run by path in vLLM's interpreter
    assert "llmdeploy_engine/kernels/cpu_dot.c" in names  # compiled at the CPU engine's first start

    site = tmp_path / "site"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(built_wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stderr[-2000:]
    out = tmp_path / "rendered"
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import llmdeploy, pathlib; "
        "assert pathlib.Path(llmdeploy.__file__).is_relative_to(sys.argv[1]), llmdeploy.__file__; "
        "from llmdeploy.cli.main import main; sys.argv = ['llmdeploy', 'render', sys.argv[2], '-o', sys.argv[3]]; main()"
    )
    run = subprocess.run(
        [sys.executable, "-c", code, str(site), str(ROOT / "recipes" / "quickstart.yaml"), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert (out / "launch.sh").is_file()


# --- the engine images -----------------------------------------------------------------------------


def _instructions(path: Path, keyword: str) -> list[str]:
    return [i[len(keyword) + 1 :] for i in dockerfile_instructions(path) if i.startswith(keyword + " ")]


def test_both_dockerfiles_install_the_same_wheel_the_same_way() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    wheel = f"llmdeploy-{version}-py3-none-any.whl"
    cpu, cuda = pip_install_lines(CPU_DOCKERFILE), pip_install_lines(CUDA_DOCKERFILE)
    assert cpu == cuda and cpu, "the CPU and CUDA images must install llmdeploy with the same pip lines"
    assert [f"/tmp/dist/{wheel}[engine]" in words for words in cpu] == [True]
    assert any("torch==2.13.0" in words for words in cpu)  # the torch the tests run with, never unpinned
    for path in (CPU_DOCKERFILE, CUDA_DOCKERFILE):
        assert _instructions(path, "COPY") == [f"dist/{wheel} /tmp/dist/"], path.name
        assert _instructions(path, "USER") == ["1000"], path.name  # the pods' runAsUser
        assert _instructions(path, "VOLUME") == [json.dumps([CONTAINER_CACHE_DIR])], path.name
        assert _instructions(path, "ENTRYPOINT") == ['["llmdeploy-engine", "serve"]'], path.name
    # only the wheel is sent to the builder
    assert (ROOT / ".dockerignore").read_text().splitlines()[1:] == ["*", "!dist/llmdeploy-*.whl"]


def _documented_builds() -> dict[str, str]:
    """Dockerfile -> the tag docs/docker.md's `docker build` command gives it."""
    builds = {}
    for line in (ROOT / "docs" / "docker.md").read_text().splitlines():
        words = line.split()
        if words[:2] == ["docker", "build"]:
            builds[words[words.index("-f") + 1]] = words[words.index("-t") + 1]
    return builds


def test_default_builtin_images_are_the_tags_the_documented_builds_produce() -> None:
    builds = _documented_builds()
    assert set(builds) == {"docker/engine.Dockerfile", "docker/engine-cpu.Dockerfile"}
    for dockerfile, tag in builds.items():
        assert f"docker build -f {dockerfile} -t {tag} ." in (ROOT / dockerfile).read_text()
    quickstart = load_recipe(ROOT / "recipes" / "quickstart.yaml", ("target.type=kubernetes",))
    gpu = load_recipe(
        ROOT / "recipes" / "quickstart.yaml",
        ("target.type=kubernetes", "hardware.device=cuda", "hardware.gpu=L4"),
    )
    assert quickstart.target.type == gpu.target.type == "kubernetes"
    assert image(quickstart, quickstart.target) == builds["docker/engine-cpu.Dockerfile"]  # type: ignore[arg-type]
    assert image(gpu, gpu.target) == builds["docker/engine.Dockerfile"]  # type: ignore[arg-type]
    named = load_recipe(
        ROOT / "recipes" / "quickstart.yaml", ("target.type=kubernetes", "target.image=reg/e:1")
    )
    assert image(named, named.target) == "reg/e:1"  # type: ignore[arg-type]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rendered_pod(tmp_path: Path, port: int) -> dict[str, Any]:
    out = tmp_path / "k8s"
    sets = ["--set", "target.type=kubernetes", "--set", f"server.port={port}"]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "llmdeploy.cli.main",
            "render",
            str(ROOT / "recipes" / "quickstart.yaml"),
            *sets,
            "-o",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    docs = [d for f in sorted(out.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]
    (deployment,) = [d for d in docs if d.get("kind") == "Deployment"]
    return dict(deployment["spec"]["template"]["spec"])


def _wait_healthy(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + STARTUP_BUDGET_S
    while True:
        if process.poll() is not None:
            pytest.fail(f"the engine exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"not healthy within {STARTUP_BUDGET_S} s:\n{log.read_text()[-3000:]}")
        time.sleep(1)


@pytest.mark.slow
@VENV_TIMEOUT
def test_clean_venv_serves_the_rendered_deployments_command(wheel_venv: WheelVenv, tmp_path: Path) -> None:
    """What the CPU image would run: the Deployment's init container fetches the model into the cache
    volume, then the engine container's exact command and environment start the engine, from the
    venv the Dockerfile's install lines made. Only the volumes' mount paths are mapped to folders here."""
    port = _free_port()
    pod = _rendered_pod(tmp_path, port)
    (engine,) = [c for c in pod["containers"] if c["name"] == "engine"]
    (fetch,) = pod.get("initContainers", [])
    assert engine["image"] == "llmdeploy/engine:0.1.0-cpu"
    mounts = {
        m["mountPath"]: tmp_path / "volumes" / m["name"]
        for m in engine["volumeMounts"]
        if m["mountPath"] != "/dev/shm"
    }
    assert CONTAINER_CACHE_DIR in mounts

    def here(value: str) -> str:
        for mount, folder in mounts.items():
            if value == mount or value.startswith(mount + "/"):
                return str(folder) + value[len(mount) :]
        return value

    for folder in mounts.values():
        folder.mkdir(parents=True)
    image_path = f"{wheel_venv.bin}:/usr/bin:/bin"  # the image's PATH starts with its venv's bin

    def container_env(container: dict[str, Any]) -> dict[str, str]:
        env = {"PATH": image_path}
        for item in container.get("env", []):
            assert "value" in item, f"the quickstart's pod reads no Secret: {item}"
            env[item["name"]] = here(item["value"])
        return env

    fetched = subprocess.run(
        [here(w) for w in fetch["command"]],
        env=container_env(fetch),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert fetched.returncode == 0, fetched.stderr[-2000:]
    argv = [here(w) for w in [*engine["command"], *engine.get("args", [])]]
    assert argv[:2] == ["llmdeploy-engine", "serve"]
    log = tmp_path / "engine.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            argv,
            env=container_env(engine),
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, process, log)
        reply = httpx.post(
            url + "/v1/chat/completions",
            json={
                "model": "smollm2-135m-instruct",
                "messages": [{"role": "user", "content": "What is the capital of France?"}],
                "max_tokens": 32,
                "temperature": 0,
            },
            timeout=120,
        )
        assert reply.status_code == 200, reply.text
        assert "Paris" in reply.json()["choices"][0]["message"]["content"]
        # the CPU image carries gcc, as this machine does: the wheel's cpu_dot.c built into the cache
        # under HOME and took the 4-bit projections
        assert "'q4dot'" in log.read_text(), log.read_text()[-3000:]
    finally:
        os.killpg(process.pid, 15)
        process.wait(timeout=60)


# --- a wheel-installed llmdeploy, run outside the repository -------------------------------------------


@pytest.mark.slow
@VENV_TIMEOUT
def test_installed_wheel_validates_plans_renders_and_applies_the_quickstart(
    wheel_venv: WheelVenv, tmp_path: Path
) -> None:
    recipe = outside_copy("quickstart.yaml", tmp_path)
    env = installed_env(wheel_venv, tmp_path)
    sets = ["--set", f"server.port={_free_port()}"]
    validate_plan_render(wheel_venv, recipe, env, sets)
    try:
        applied = run_installed(wheel_venv, recipe.parent, env, "apply", str(recipe), "--yes", *sets)
        out = applied.stdout + applied.stderr
        assert applied.returncode == 0, out[-4000:]
        assert f"==> found the built-in engine 0.1.0 at {wheel_venv.bin / 'llmdeploy-engine'}" in out
        assert "result: PASS" in out
    finally:
        down = run_installed(wheel_venv, recipe.parent, env, "down", str(recipe), *sets)
    assert down.returncode == 0, down.stderr
