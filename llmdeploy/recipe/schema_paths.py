"""Schema paths: which pydantic model or field a location in a recipe refers to.

pydantic's error locations mix data keys with union member tags; these helpers walk the `Recipe`
model along such a location to find the allowed fields, literal tags and field descriptions there.
"""

from __future__ import annotations

import functools
import re
import types
import typing
from typing import Any

from pydantic import BaseModel

from llmdeploy.recipe.schema import Recipe
from llmdeploy.recipe.yaml_source import FieldPath


def tag_name(tag: str) -> str:
    # a member with a model validator is tagged "function-after[_check(), LengthRange]"
    wrapped = re.fullmatch(r"function-\w+\[.*, (\w+)\]", tag)
    return wrapped.group(1) if wrapped else tag


def model_classes(annotation: Any) -> list[type[BaseModel]]:
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return model_classes(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [m for arg in typing.get_args(annotation) for m in model_classes(arg)]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return []


def step(annotation: Any, part: str | int) -> Any:
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return step(typing.get_args(annotation)[0], part)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            if arg is type(None):
                continue
            for model in model_classes(arg):
                if isinstance(part, str) and tag_name(part) in (model.__name__, *own_tags(model)):
                    return model
        for arg in typing.get_args(annotation):
            found = None if arg is type(None) else step(arg, part)
            if found is not None:
                return found
        return None
    if origin is list and isinstance(part, int):
        return typing.get_args(annotation)[0]
    if origin is dict:
        return typing.get_args(annotation)[1]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel) and part in annotation.model_fields:
        return annotation.model_fields[str(part)].annotation
    return None


def own_tags(model: type[BaseModel]) -> tuple[str, ...]:
    field = model.model_fields.get("type")
    if field is not None and typing.get_origin(field.annotation) is typing.Literal:
        return tuple(str(a) for a in typing.get_args(field.annotation))
    return ()


def annotation_at(loc: tuple[str | int, ...]) -> Any:
    annotation: Any = Recipe
    for part in loc:
        annotation = step(annotation, part)
        if annotation is None:
            return None
    return annotation


def fields_at(loc: tuple[str | int, ...]) -> list[str]:
    models = model_classes(annotation_at(loc))
    return sorted({name for model in models for name in model.model_fields})


def literal_tags(loc: FieldPath) -> list[str]:
    return [tag for model in model_classes(annotation_at(loc)) for tag in own_tags(model)]


def description_at(path: FieldPath) -> str | None:
    if not path:
        return None
    for model in model_classes(annotation_at(path[:-1])):
        field = model.model_fields.get(str(path[-1]))
        if field is not None and field.description:
            return field.description
    return None


@functools.cache
def all_field_paths(model: type[BaseModel], prefix: tuple[str, ...]) -> tuple[tuple[str, ...], ...]:
    paths: list[tuple[str, ...]] = []
    for name, field in model.model_fields.items():
        paths.append((*prefix, name))
        for sub in model_classes(field.annotation):
            if len(prefix) < 4:
                paths += all_field_paths(sub, (*prefix, name))
    return tuple(paths)
