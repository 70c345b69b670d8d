"""The hand-written package list in pyproject.toml covers every package folder."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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


def test_wheel_ships_the_templates_and_renders_without_the_source_tree(tmp_path: Path) -> None:
    """Build the wheel, install it into a folder of its own (no editable link back to this tree) and
    render the quickstart recipe from there: the Jinja2 templates and flag catalogues are package data."""
    import shutil
    import subprocess
    import sys
    import zipfile

    # a copy of the sources: building in the tree would leave build/ behind (and reuse a stale one)
    src = tmp_path / "src"
    skip = (
        ".venv*",
        ".git",
        ".cache",
        "build",
        "*.egg-info",
        "tests",
        "benchmarks",
        "*_cache",
        ".hypothesis",
    )
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(*skip))
    wheels = tmp_path / "wheels"
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
    names = set(zipfile.ZipFile(wheel).namelist())
    templates = {
        "llmdeploy/" + str(p.relative_to(ROOT / "llmdeploy"))
        for p in (ROOT / "llmdeploy" / "templates").rglob("*")
        if p.is_file()
    }
    assert templates and templates <= names, sorted(templates - names)

    site = tmp_path / "site"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
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
