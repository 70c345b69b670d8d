"""What `render` produces: files by relative path, and the Kubernetes documents in apply order."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from llmdeploy.recipe import Recipe, recipe_digest


@dataclass(frozen=True)
class Artifacts:
    recipe_name: str
    recipe_sha256: str
    files: dict[str, str]  # relative path -> text, in the order they are written / applied
    documents: tuple[dict[str, Any], ...] = field(default=())  # Kubernetes objects, apply order

    @property
    def kubernetes_objects(self) -> tuple[dict[str, Any], ...]:
        """The Kubernetes documents (the name the apply contract uses)."""
        return self.documents


def header(recipe: Recipe) -> str:
    """The first comment of every rendered file: names the recipe and its digest (no timestamps)."""
    return (
        f"# Rendered by llmdeploy from recipe {recipe.name!r} (recipe sha256 {recipe_digest(recipe)}).\n"
        "# Generated file: edit the recipe and run `llmdeploy render` again instead."
    )
