"""Recipes: the YAML description of one serving setup, parsed once into a frozen `Recipe`."""

from llmdeploy.recipe.loader import load_recipe, recipe_digest
from llmdeploy.recipe.schema import Recipe

__all__ = ["Recipe", "load_recipe", "recipe_digest"]
