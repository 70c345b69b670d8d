"""The hand-written package list in pyproject.toml covers every package folder."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_is_listed() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    listed = set(config["tool"]["setuptools"]["packages"])
    mapping = config["tool"]["setuptools"]["package-dir"]
    found = set()
    for import_name, folder in mapping.items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            rel = init.parent.relative_to(base)
            found.add(".".join([import_name, *rel.parts]))
    assert found - listed == set(), "add these to [tool.setuptools] packages"
    assert listed - found == set(), "these listed packages have no folder"


def test_toolkit_never_imports_torch() -> None:
    offenders = [
        str(p.relative_to(ROOT))
        for p in (ROOT / "llmdeploy").rglob("*.py")
        if any(line.strip().startswith(("import torch", "from torch")) for line in p.read_text().splitlines())
    ]
    assert offenders == []
