"""The batching core (engine/core/) never touches a tensor: it imports neither torch nor numpy nor
triton, directly or through the engine modules it uses, so it runs (and is tested) on any machine."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ENGINE = Path(__file__).resolve().parents[2] / "engine"
CORE = sorted((ENGINE / "core").glob("*.py"))
# modules outside core/ that the core may import: plain values and rules, themselves torch-free
ALLOWED_OUTSIDE = {
    "llmdeploy_engine.config",
    "llmdeploy_engine.facts",
    "llmdeploy_engine.outputs",
    "llmdeploy_engine.sampling_params",
    "llmdeploy_engine.core.runner_interface",
}
TENSOR_LIBRARIES = ("torch", "numpy", "triton")
# what the subprocess refuses to import: the tensor libraries, and the toolkit's pydantic / PyYAML
# (engine/facts.py is shared with the toolkit and must not need them)
BLOCKED = (*TENSOR_LIBRARIES, "pydantic", "yaml")


def _imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "llmdeploy_engine":
                found.extend((node.lineno, f"llmdeploy_engine.{alias.name}") for alias in node.names)
            else:
                found.append((node.lineno, node.module))
    return found


def test_core_exists() -> None:
    names = {p.stem for p in CORE}
    assert {"scheduler", "block_manager", "sequence", "stop_checker", "request_state"} <= names


@pytest.mark.parametrize("path", CORE, ids=lambda p: p.name)
def test_core_module_imports_no_tensor_library(path: Path) -> None:
    """Every import, lazy ones included: no tensor library, and engine modules only from core/ or
    ALLOWED_OUTSIDE."""
    bad = []
    for line, name in _imports(path):
        top = name.split(".")[0]
        if top in TENSOR_LIBRARIES:
            bad.append(f"{path.name}:{line} imports {name}")
        elif top == "llmdeploy_engine" and not (
            name.startswith("llmdeploy_engine.core") or name in ALLOWED_OUTSIDE
        ):
            bad.append(f"{path.name}:{line} imports {name} (outside the core)")
    assert not bad, "\n".join(bad)


def test_core_imports_with_tensor_libraries_blocked() -> None:
    """Import every core module (and the facts module the toolkit shares) in a fresh interpreter in
    which importing torch, numpy, triton, pydantic or PyYAML fails."""
    modules = [f"llmdeploy_engine.core.{p.stem}" for p in CORE if p.stem != "__init__"]
    modules += sorted(ALLOWED_OUTSIDE)
    program = f"""
import importlib, importlib.abc, sys

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {BLOCKED!r}:
            raise ImportError(f"blocked in this test: {{name}}")
        return None

sys.meta_path.insert(0, Block())
for name in {modules!r}:
    importlib.import_module(name)
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
