"""The recipe's JSON Schema, generated from the pydantic models, for editors and CI.

The committed copy lives at `schema/recipe.schema.json`; `llmdeploy schema -o` regenerates it and
a test checks it is up to date. Recipes point editors at it with a first line
`# yaml-language-server: $schema=../schema/recipe.schema.json`.
"""

from __future__ import annotations

import json
from typing import Any

from llmdeploy.recipe.schema import Recipe

DRAFT = "https://json-schema.org/draft/2020-12/schema"


def recipe_json_schema() -> dict[str, Any]:
    """The JSON Schema of a recipe file as users write it (what the loader accepts before layering)."""
    schema = Recipe.model_json_schema(mode="validation")
    properties = schema["properties"]
    # file-level keys the loader handles before validation
    properties["extends"] = {
        "type": "string",
        "title": "Extends",
        "description": "another recipe file (relative to this one) to deep-merge this recipe over",
    }
    properties["name"] = {
        **properties["name"],
        "description": properties["name"].get("description", "") + "; default: the file name",
    }
    # `model` may come from the extended recipe; a recipe that extends nothing must give it
    required = [key for key in schema.pop("required", []) if key not in ("name", "model")]
    if required:
        schema["required"] = required
    schema["anyOf"] = [{"required": ["model"]}, {"required": ["extends"]}]
    schema["patternProperties"] = {"^x-": {"description": "free space for YAML anchors; ignored"}}
    return {
        "$schema": DRAFT,
        "title": "llmdeploy recipe",
        **{k: v for k, v in schema.items() if k != "title"},
    }


def recipe_json_schema_text() -> str:
    return json.dumps(recipe_json_schema(), indent=2, sort_keys=False) + "\n"
