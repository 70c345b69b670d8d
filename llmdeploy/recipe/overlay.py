"""Layering recipe data: `extends:` deep merges and `--set a.b.c=value` overrides.

Mappings merge key by key; anything else (lists, scalars, null) in the overlay replaces the base
value whole, and so does a mapping that selects another variant of a union than the base's (an
overlay's `api_key: {env: K}` replaces a base's `{secret: ...}`, `target: {type: kubernetes}` a local
target). The marks (file:line of each field) follow the same rule, so an error in a merged
recipe still points at the file that wrote the offending value.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from pydantic import BaseModel

from llmdeploy.errors import Problem, Redacted, is_secret_path
from llmdeploy.recipe.schema_paths import annotation_at, model_classes, own_tags
from llmdeploy.recipe.yaml_source import MAX_DEPTH, MAX_YAML_BYTES, FieldPath, Mark, parse_yaml


@dataclass(frozen=True)
class Layer:
    """Recipe data before validation, with where each field came from."""

    data: dict[str, Any]
    marks: dict[FieldPath, Mark]


def merge(base: Layer, overlay: Layer) -> Layer:
    replaced: list[FieldPath] = []
    data = _merge_data(base.data, overlay.data, (), replaced)
    marks = dict(base.marks)
    for path in [*overlay.marks, *replaced]:
        if path and (path in replaced or not isinstance(_get(overlay.data, path), dict)):
            marks = {k: m for k, m in marks.items() if not (len(k) > len(path) and k[: len(path)] == path)}
    marks.update(overlay.marks)
    if () in base.marks:
        marks[()] = overlay.marks.get((), base.marks[()])
    return Layer(data, marks)


def _merge_data(
    base: dict[str, Any], overlay: dict[str, Any], path: FieldPath, replaced: list[FieldPath]
) -> dict[str, Any]:
    out = dict(base)
    for key, value in overlay.items():
        here = (*path, key)
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            if _switches_variant(here, out[key], value):
                out[key] = value
                replaced.append(here)
            else:
                out[key] = _merge_data(out[key], value, here, replaced)
        else:
            out[key] = value
    return out


def _switches_variant(path: FieldPath, base: dict[str, Any], overlay: dict[str, Any]) -> bool:
    """Whether `overlay` is a mapping of another member of the union at `path` than `base` is."""
    members = model_classes(annotation_at(path)) if all(isinstance(p, str) for p in path) else []
    if len(members) < 2:
        return False
    chosen = _members_of(members, overlay)
    return bool(chosen) and not (chosen & _members_of(members, base))


def _members_of(members: list[type[BaseModel]], value: dict[str, Any]) -> set[str]:
    # by the `type` tag where the union has one, else by the fields the mapping writes
    if "type" in value and all(own_tags(m) for m in members):
        return {m.__name__ for m in members if value["type"] in own_tags(m)}
    return {m.__name__ for m in members if set(value) <= set(m.model_fields)}


def _get(data: Any, path: FieldPath) -> Any:
    for part in path:
        if isinstance(data, dict) and part in data:
            data = data[part]
            continue
        if isinstance(data, list) and isinstance(part, int) and 0 <= part < len(data):
            data = data[part]
            continue
        return None
    return data


def apply_overrides(layer: Layer, overrides: Sequence[str]) -> tuple[Layer, list[Problem]]:
    """Apply `a.b.c=value` items in order; the value is read as a YAML scalar (or flow list/mapping),
    under the recipe file's limits (size, nesting, alias expansion, tags), or else kept as text."""
    data = layer.data
    marks = dict(layer.marks)
    problems: list[Problem] = []
    total_bytes = 0
    for item in overrides:
        dotted, sep, raw = item.partition("=")
        dotted = dotted.strip()
        total_bytes += len(item.encode("utf-8", "surrogatepass"))
        # the item names where a problem came from; a secret-bearing value is shown only by its length
        shown = item if len(item) <= 200 else f"{item[:160]}... ({len(item)} characters)"
        source = f"--set {dotted}={Redacted(raw)}" if _holds_secret(dotted) else f"--set {shown}"
        if total_bytes > MAX_YAML_BYTES:
            problems.append(
                Problem(
                    f"the --set items are longer than {MAX_YAML_BYTES // 1024} KiB together",
                    file=source[:200],
                    fix="write large values into the recipe file (or an `extends:` overlay)",
                )
            )
            break
        if not sep or not dotted or any(not part for part in dotted.split(".")):
            problems.append(
                Problem("expected PATH=VALUE", file=source, fix="write e.g. --set limits.max_model_len=8192")
            )
            continue
        path: FieldPath = tuple(int(p) if p.isdigit() else p for p in dotted.split("."))
        if len(path) > MAX_DEPTH:
            problems.append(
                Problem(
                    f"the path is more than {MAX_DEPTH} fields deep; no recipe field is",
                    file=source,
                    fix="name a field of the recipe (see `llmdeploy schema`)",
                )
            )
            continue
        value, value_problems = _override_value(raw, dotted, source)
        if value_problems:
            problems += value_problems
            continue
        data, problem = _set(data, path, value, source)
        if problem is not None:
            problems.append(problem)
            continue
        path = _normalize(data, path)
        marks = {k: m for k, m in marks.items() if k[: len(path)] != path}
        marks[path] = Mark(source, None)
        if isinstance(value, dict | list):
            for sub in _leaf_paths(value, path):
                marks[sub] = Mark(source, None)
    return Layer(data, marks), problems


def _override_value(raw: str, dotted: str, source: str) -> tuple[Any, list[Problem]]:
    """A `--set` value read as YAML with the recipe file's limits; text that is not YAML stays text."""
    if not raw.strip():
        return raw, []
    parsed = parse_yaml(raw, source)
    if parsed.unreadable:
        return raw, []
    if not parsed.problems:
        return parsed.data, []
    # problems name the item and the field (the value's own line, always 1, says nothing here)
    return None, [
        replace(p, file=source, line=None, path=f"{dotted}.{p.path}" if p.path else dotted)
        for p in parsed.problems
    ]


def _holds_secret(dotted: str) -> bool:
    # the field itself, or a section a mapping value could fill one of (`--set server={api_key: ...}`)
    return is_secret_path(dotted) or dotted in ("server", "engine", "engine.env")


def _set(
    data: dict[str, Any], path: FieldPath, value: Any, source: str
) -> tuple[dict[str, Any], Problem | None]:
    root: Any = _copy(data)
    node = root
    for depth, part in enumerate(path[:-1]):
        key = str(part) if isinstance(node, dict) else part
        child = node[key] if _has(node, part) else None
        if child is None:
            if isinstance(node, list):
                return data, _index_problem(path, depth, len(node), source)
            child = {}
            node[key] = child
        if not isinstance(child, dict | list):
            here = ".".join(str(p) for p in path[: depth + 1])
            return data, Problem(
                f"cannot set {'.'.join(str(p) for p in path)}: {here} is a value, not a section",
                file=source,
                path=here,
                value=child,
                has_value=True,
                fix=f"set {here} itself, e.g. --set {here}=...",
            )
        node = child
    last = path[-1]
    if isinstance(node, list):
        if not isinstance(last, int) or last >= len(node):
            return data, _index_problem(path, len(path) - 1, len(node), source)
        node[last] = value
    else:
        node[str(last)] = value
    return root, None


def _normalize(data: Any, path: FieldPath) -> FieldPath:
    # digits name a list index only where the value is a list; in a mapping they are a key
    out: list[str | int] = []
    for part in path:
        key = str(part) if isinstance(data, dict) else part
        out.append(key)
        data = _get(data, (key,))
    return tuple(out)


def _has(node: Any, part: str | int) -> bool:
    if isinstance(node, dict):
        return str(part) in node
    return isinstance(part, int) and 0 <= part < len(node)


def _index_problem(path: FieldPath, depth: int, length: int, source: str) -> Problem:
    here = ".".join(str(p) for p in path[:depth])
    return Problem(
        f"{here} is a list of {length} item(s); {path[depth]!r} is not one of its indexes",
        file=source,
        path=here,
        fix=f"use an index from 0 to {length - 1}" if length else f"set the whole list: --set {here}=[...]",
    )


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def _leaf_paths(value: Any, prefix: FieldPath) -> list[FieldPath]:
    if isinstance(value, dict):
        items: list[tuple[str | int, Any]] = list(value.items())
    elif isinstance(value, list):
        items = list(enumerate(value))
    else:
        return []
    paths: list[FieldPath] = []
    for key, sub in items:
        paths.append((*prefix, key))
        paths += _leaf_paths(sub, (*prefix, key))
    return paths
