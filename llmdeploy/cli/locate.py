"""Giving a rule's problem the file:line that wrote the field it names, for every verb that loads a
recipe (`validate`, `render`, `apply`, `diff`): the rules run on the loaded `Recipe`, which no longer
knows its lines, so the verb keeps the `LoadedRecipe` and locates what a stage refuses."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from llmdeploy.errors import Problem, UserError
from llmdeploy.recipe.loader import LoadedRecipe


def locate(problem: Problem, loaded: LoadedRecipe, path: Path) -> Problem:
    """`problem` with the file:line of its field (of the recipe file when it names none)."""
    if problem.file is not None:
        return problem
    mark = loaded.mark_for(problem.path)
    if mark is None:
        return dataclasses.replace(problem, file=str(path))
    return dataclasses.replace(problem, file=mark.file, line=mark.line)


@contextmanager
def located(loaded: LoadedRecipe, path: Path) -> Iterator[None]:
    """Re-raise a `UserError` from the block with each problem that names a recipe field located in
    the recipe (a cluster's or the machine's refusal names none and is raised as it is)."""
    try:
        yield
    except UserError as e:
        if not any(p.path is not None and p.file is None for p in e.problems):
            raise
        raise UserError([locate(p, loaded, path) if p.path is not None else p for p in e.problems]) from e
