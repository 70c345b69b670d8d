"""pydantic validation errors -> `Problem`s that name file:line, field path, bad value and a fix.

pydantic's error locations include union member tags (`ApiKeyFromEnv`, `int`, `kubernetes`) that
are not keys in the YAML; we drop them by walking the location against the data, and collapse the
per-member errors of one union into the member that came closest (or one summary problem).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from llmdeploy.errors import Problem
from llmdeploy.recipe.schema import Recipe
from llmdeploy.recipe.schema_paths import (
    all_field_paths,
    annotation_at,
    description_at,
    fields_at,
    literal_tags,
    model_classes,
    tag_name,
)
from llmdeploy.recipe.yaml_source import FieldPath, Mark

_SCALARS = (str, int, float, bool, type(None))
# error types saying the value had the wrong shape altogether (not a bad value of the right shape)
_SHAPE_MISMATCH = {
    "model_type",
    "model_attributes_type",
    "dict_type",
    "list_type",
    "int_type",
    "int_parsing",
    "float_type",
    "float_parsing",
    "string_type",
    "bool_type",
    "bool_parsing",
    "literal_error",
}


def problems_from_validation(
    error: ValidationError, data: Mapping[str, Any], marks: Mapping[FieldPath, Mark], skip: set[FieldPath]
) -> list[Problem]:
    """One problem per user mistake; errors at or under a path in `skip` (already reported) are dropped."""
    direct: list[tuple[FieldPath, ErrorDetails]] = []
    unions: dict[FieldPath, dict[str, list[tuple[FieldPath, ErrorDetails]]]] = {}
    for err in error.errors(include_url=False):
        clean, tag_at = _clean_location(err["loc"], data, err["type"] == "missing")
        if tag_at is None:
            direct.append((clean, err))
        else:
            prefix, tag = tag_at
            unions.setdefault(prefix, {}).setdefault(tag, []).append((clean, err))
    problems = []
    for clean, err in direct:
        problems.append(_problem(clean, err, marks))
    for prefix, branches in unions.items():
        chosen = _closest_branch(prefix, branches)
        if chosen is not None:
            problems += [_problem(clean, err, marks) for clean, err in chosen]
        else:
            problems.append(_union_summary(prefix, branches, data, marks))
    return [p for p in problems if not _skipped(p, skip)]


def _skipped(problem: Problem, skip: set[FieldPath]) -> bool:
    if problem.path is None:
        return False
    parts = tuple(problem.path.split("."))
    return any(parts[: len(s)] == tuple(str(x) for x in s) for s in skip)


def _clean_location(
    loc: tuple[str | int, ...], data: Any, missing: bool
) -> tuple[FieldPath, tuple[FieldPath, str] | None]:
    clean: list[str | int] = []
    first_tag: tuple[FieldPath, str] | None = None
    node = data
    for i, part in enumerate(loc):
        if _contains(node, part):
            node = node[part]
            clean.append(part)
        elif missing and i == len(loc) - 1:
            clean.append(part)
        else:
            if first_tag is None:
                first_tag = (tuple(clean), tag_name(str(part)))
    return tuple(clean), first_tag


def _contains(node: Any, part: str | int) -> bool:
    if isinstance(node, dict):
        return part in node
    return isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)


def _closest_branch(
    prefix: FieldPath, branches: dict[str, list[tuple[FieldPath, ErrorDetails]]]
) -> list[tuple[FieldPath, ErrorDetails]] | None:
    if len(branches) == 1:
        return next(iter(branches.values()))
    # a member "came close" when its errors are all inside it, i.e. the value had its shape
    close = [
        errs
        for errs in branches.values()
        if all(len(clean) > len(prefix) or err["type"] not in _SHAPE_MISMATCH for clean, err in errs)
    ]
    if not close:
        return None
    fewest = min(len(errs) for errs in close)
    best = [errs for errs in close if len(errs) == fewest]
    return best[0] if len(best) == 1 else None


def _union_summary(
    prefix: FieldPath,
    branches: dict[str, list[tuple[FieldPath, ErrorDetails]]],
    data: Any,
    marks: Mapping[FieldPath, Mark],
) -> Problem:
    members = {m.__name__: m for m in model_classes(annotation_at(prefix))}
    forms = " or ".join(_form_name(tag, members) for tag in branches)
    value = _value_at(data, prefix)
    description = description_at(prefix)
    return _make(
        prefix,
        f"does not match any accepted form ({forms})",
        marks,
        value=value,
        fix=description or f"write it as one of: {forms}",
    )


def _form_name(tag: str, members: Mapping[str, type[BaseModel]]) -> str:
    if tag in members:
        return "{" + ", ".join(members[tag].model_fields) + "}"
    plain = tag.removeprefix("constrained-")  # a bounded member, e.g. `Count`, is tagged constrained-int
    return {"int": "an integer", "str": "a string", "float": "a number", "bool": "true/false"}.get(plain, tag)


def _problem(clean: FieldPath, err: ErrorDetails, marks: Mapping[FieldPath, Mark]) -> Problem:
    kind = err["type"]
    ctx = err.get("ctx") or {}
    value = err.get("input")
    if kind == "extra_forbidden":
        key = str(clean[-1])
        allowed = fields_at(err["loc"][:-1])
        return _make(clean, f"unknown field {key!r}", marks, fix=_unknown_key_fix(key, allowed, clean[:-1]))
    if kind == "missing":
        description = description_at(clean)
        fix = f"add `{clean[-1]}:`" + (f" ({description})" if description else "")
        return _make(clean, "required field is missing", marks, fix=fix)
    if kind == "literal_error":
        allowed = re.findall(r"'([^']*)'", str(ctx.get("expected", "")))
        return _make(clean, "not an allowed value", marks, value=value, fix=_choice_fix(str(value), allowed))
    if kind == "union_tag_invalid":
        allowed = re.findall(r"'([^']*)'", str(ctx.get("expected_tags", "")))
        tag = ctx.get("tag")
        return _make((*clean, "type"), "unknown type", marks, value=tag, fix=_choice_fix(str(tag), allowed))
    if kind == "union_tag_not_found":
        allowed = literal_tags(clean)
        return _make(
            (*clean, "type"), "required field is missing", marks, fix=f"add `type:` ({' | '.join(allowed)})"
        )
    message = str(err["msg"])
    if kind == "value_error":
        message = message.removeprefix("Value error, ")
        # a field validator's input is the bad value itself; a section's checks name their values
        return _make(clean, message, marks, value=value if isinstance(value, str) else _NO_VALUE)
    if kind == "string_pattern_mismatch" and clean == ("name",):
        return _make(
            clean,
            "must be a DNS label: lowercase letters, digits and '-', at most 52 characters",
            marks,
            value=value,
            fix="e.g. name: my-llama-8b",
        )
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        fields = fields_at(err["loc"])
        listed = f" with fields: {', '.join(fields)}" if fields else ""
        return _make(clean, f"must be a mapping (key: value lines){listed}", marks, value=_shown(value))
    if kind == "list_type":
        example = f"[{value}]" if isinstance(value, _SCALARS) and value is not None else "[...]"
        return _make(clean, "must be a list", marks, value=_shown(value), fix=f"write a list, e.g. {example}")
    message = message[:1].lower() + message[1:]
    if kind == "string_type" and isinstance(value, bool | int | float):
        return _make(clean, message, marks, value=value, fix=f'quote it so YAML reads it as text: "{value}"')
    return _make(clean, message, marks, value=_shown(value), fix=_generic_fix(kind, ctx))


def _generic_fix(kind: str, ctx: Mapping[str, Any]) -> str | None:
    bounds = {
        "greater_than_equal": ("at least", "ge"),
        "greater_than": ("more than", "gt"),
        "less_than_equal": ("at most", "le"),
        "less_than": ("less than", "lt"),
    }
    if kind in bounds:
        words, key = bounds[kind]
        return f"use a value {words} {ctx.get(key)}"
    return {
        "int_parsing": "write a whole number, e.g. 8192",
        "int_type": "write a whole number, e.g. 8192",
        "int_from_float": "write a whole number, without a fraction",
        "float_parsing": "write a number, e.g. 0.9",
        "float_type": "write a number, e.g. 0.9",
        "bool_parsing": "write true or false",
        "bool_type": "write true or false",
        "string_type": "write a text value",
        "too_short": "give at least one item",
    }.get(kind)


_NO_VALUE = object()


def _shown(value: Any) -> Any:
    return value if isinstance(value, _SCALARS) else _NO_VALUE


def _make(
    path: FieldPath,
    message: str,
    marks: Mapping[FieldPath, Mark],
    value: Any = _NO_VALUE,
    fix: str | None = None,
) -> Problem:
    mark = _mark_for(path, marks)
    return Problem(
        message,
        file=mark.file if mark else None,
        line=mark.line if mark else None,
        path=".".join(str(p) for p in path) or None,
        value=None if value is _NO_VALUE else value,
        has_value=value is not _NO_VALUE,
        fix=fix,
    )


def _mark_for(path: FieldPath, marks: Mapping[FieldPath, Mark]) -> Mark | None:
    for end in range(len(path), -1, -1):
        if path[:end] in marks:
            return marks[path[:end]]
    return None


def _value_at(data: Any, path: FieldPath) -> Any:
    for part in path:
        data = data[part]
    return data if isinstance(data, _SCALARS) else _NO_VALUE


def _choice_fix(value: str, allowed: list[str]) -> str:
    close = difflib.get_close_matches(value, allowed, n=1, cutoff=0.5)
    listed = ", ".join(allowed)
    if close:
        return f"did you mean {close[0]!r}? (allowed: {listed})"
    return f"use one of: {listed}"


def _unknown_key_fix(key: str, allowed: list[str], parent: FieldPath) -> str:
    close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
    if close:
        return f"did you mean {close[0]!r}?"
    elsewhere = [p for p in all_field_paths(Recipe, ()) if p[-1] == key and p[:-1] != parent]
    if elsewhere:
        home = ".".join(elsewhere[0][:-1])
        return f"{key!r} belongs under `{home}:`" if home else f"{key!r} belongs at the top level"
    return f"allowed fields here: {', '.join(allowed)}" if allowed else "remove it"
