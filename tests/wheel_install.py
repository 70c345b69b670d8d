"""Session fixtures: llmdeploy's wheel, built once, and one clean venv holding it.

The venv is made the way docker/engine-cpu.Dockerfile installs the engine: its `pip install` lines
are read from the Dockerfile and run here (interpreter and wheel path swapped for this machine's),
so the image and the tests cannot drift apart. Loaded from tests/conftest.py (`pytest_plugins`) so
every test module shares the one build and the one venv.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CPU_DOCKERFILE = ROOT / "docker" / "engine-cpu.Dockerfile"
CUDA_DOCKERFILE = ROOT / "docker" / "engine.Dockerfile"
IMAGE_PYTHON = "python3"  # the interpreter the Dockerfiles' install lines call (the image's venv)
IMAGE_WHEEL_DIR = "/tmp/dist"
INSTALL_TIMEOUT_S = 1200
_SKIP = (
    ".venv*",
    ".git",
    ".cache",
    "build",
    "dist",
    "*.egg-info",
    "tests",
    "benchmarks",
    "*_cache",
    ".hypothesis",
)


@dataclass(frozen=True)
class WheelVenv:
    python: Path
    bin: Path
    wheel: Path


def project_version() -> str:
    return str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])


def dockerfile_instructions(path: Path) -> list[str]:
    """The Dockerfile's instructions, continuation lines joined, comments dropped."""
    instructions: list[str] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        instructions.append(pending + line)
        pending = ""
    assert not pending, f"{path}: a continuation line ends the file"
    return instructions


def pip_install_lines(path: Path) -> list[list[str]]:
    """The argv of every `RUN python3 -m pip install ...` instruction, in order."""
    lines = []
    for instruction in dockerfile_instructions(path):
        if instruction.startswith("RUN ") and " pip install " in instruction:
            words = shlex.split(instruction[len("RUN ") :])
            assert words[:4] == [IMAGE_PYTHON, "-m", "pip", "install"], instruction
            assert not {"&&", ";", "|"} & set(words), f"one command per pip RUN line: {instruction}"
            lines.append(words)
    return lines


@pytest.fixture(scope="session")
def built_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """llmdeploy's wheel, built from a copy of the sources (building in the tree leaves build/ behind)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(*_SKIP))
    wheels = tmp / "dist"
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(wheels),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr[-2000:]
    # pip passes the build backend's warnings through even with -q: a user's first install shows them
    backend_warnings = [line for line in build.stderr.splitlines() if "Warning:" in line]
    assert backend_warnings == [], "\n".join(backend_warnings)
    (wheel,) = wheels.glob("llmdeploy-*.whl")
    assert wheel.name == f"llmdeploy-{project_version()}-py3-none-any.whl"
    return wheel


@pytest.fixture(scope="session")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory, built_wheel: Path) -> WheelVenv:
    """A fresh venv (no system site-packages, nothing from this tree) with the wheel installed by the
    CPU Dockerfile's own pip lines: the wheel, its `engine` extra and the pinned torch."""
    venv = tmp_path_factory.mktemp("wheel-venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    image_wheel = f"{IMAGE_WHEEL_DIR}/{built_wheel.name}"
    lines = pip_install_lines(CPU_DOCKERFILE)
    assert any(w.startswith(image_wheel) for words in lines for w in words), (
        f"{CPU_DOCKERFILE.name} installs no {image_wheel} (the wheel `pip wheel` builds from pyproject.toml)"
    )
    for words in lines:
        argv = [str(python), *(w.replace(image_wheel, str(built_wheel)) for w in words[1:])]
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, cwd=venv.parent
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return WheelVenv(python=python, bin=venv / "bin", wheel=built_wheel)


def run_installed(
    venv: WheelVenv, cwd: Path, env: dict[str, str], *args: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(venv.bin / "llmdeploy"), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=1500,
        stdin=subprocess.DEVNULL,
    )


def validate_plan_render(venv: WheelVenv, recipe: Path, env: dict[str, str], sets: list[str]) -> None:
    """`validate`, `plan` and `render -o out` of `recipe` with the installed llmdeploy, each exiting 0."""
    for verb in (["validate", str(recipe)], ["plan", str(recipe)], ["render", str(recipe), "-o", "out"]):
        done = run_installed(venv, recipe.parent, env, *verb, *sets)
        assert done.returncode == 0, f"{verb[0]}: {done.stdout[-2000:]}{done.stderr[-2000:]}"
    assert (recipe.parent / "out" / "launch.sh").is_file()


def installed_env(venv: WheelVenv, tmp_path: Path, extra_path: str = "") -> dict[str, str]:
    """A user's shell with the venv activated: its bin first on PATH, nothing of this tree importable."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = os.pathsep.join(p for p in (str(venv.bin), extra_path, "/usr/bin", "/bin") if p)
    env["LLMDEPLOY_STATE_DIR"] = str(tmp_path / "state")
    return env


def outside_copy(recipe: str, tmp_path: Path) -> Path:
    """The recipe (and what it extends) copied to a folder outside the repository."""
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    for path in (ROOT / "recipes").glob("*.yaml"):
        shutil.copy(path, work / path.name)
    return work / recipe
