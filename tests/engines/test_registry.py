"""The registry matches the recipe schema, and no stage package branches on an engine's name."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import get_args

import pytest

from llmdeploy.engines import ENGINES, get_engine
from llmdeploy.engines.catalogue import catalogue_path
from llmdeploy.errors import UserError
from llmdeploy.recipe.schema import EngineType

STAGES = ("recipe", "memory", "planner", "render", "apply", "smoke", "bench", "cli")
PACKAGE = Path(__file__).resolve().parents[2] / "llmdeploy"


def test_every_recipe_engine_type_has_an_engine_and_back() -> None:
    assert set(get_args(EngineType)) == set(ENGINES)
    assert all(name == engine.name for name, engine in ENGINES.items())


def test_every_engine_has_a_catalogue_for_its_pinned_release() -> None:
    for name, engine in ENGINES.items():
        assert catalogue_path(name, engine.pinned_version).is_file(), name


def test_an_unknown_engine_names_the_known_ones() -> None:
    with pytest.raises(UserError, match="vllm, tgi, builtin"):
        get_engine("nope")


def _name_branches(tree: ast.AST) -> list[int]:
    names = set(ENGINES)
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            for operand in operands:
                elements = operand.elts if isinstance(operand, (ast.Tuple, ast.List, ast.Set)) else [operand]
                if any(isinstance(e, ast.Constant) and e.value in names for e in elements):
                    lines.append(node.lineno)
        elif isinstance(node, ast.Dict):
            keys = [k.value for k in node.keys if isinstance(k, ast.Constant)]
            if len(names.intersection(keys)) >= 2:
                lines.append(node.lineno)
    return lines


@pytest.mark.parametrize("stage", STAGES)
def test_stage_packages_ask_the_engine_instead_of_testing_its_name(stage: str) -> None:
    found = {
        str(path.relative_to(PACKAGE)): lines
        for path in sorted((PACKAGE / stage).rglob("*.py"))
        if (lines := _name_branches(ast.parse(path.read_text())))
    }
    assert not found, f"compare with / table keyed by an engine name (use get_engine): {found}"
