"""Field-level differences between a live object and what applying would make of it.

The "after" side comes from a server-side dry-run apply, so defaults and admission changes are
already in it and a field diff shows only what the apply would really change. Fields the server
manages (resourceVersion, managedFields, status, ...) are ignored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

SERVER_MANAGED_METADATA = frozenset(
    {
        "managedFields",
        "resourceVersion",
        "generation",
        "uid",
        "creationTimestamp",
        "selfLink",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
    }
)
SERVER_MANAGED_ANNOTATIONS = frozenset({"deployment.kubernetes.io/revision"})


@dataclass(frozen=True)
class FieldChange:
    op: str  # "+" added, "-" removed, "~" changed
    path: str
    before: Any = None
    after: Any = None

    def render(self) -> str:
        if self.op == "+":
            return f"+ {self.path}: {_short(self.after)}"
        if self.op == "-":
            return f"- {self.path}: {_short(self.before)}"
        return f"~ {self.path}: {_short(self.before)} -> {_short(self.after)}"


def _short(value: Any, limit: int = 120) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def comparable(obj: dict[str, Any]) -> dict[str, Any]:
    """A copy without status and server-managed metadata."""
    out = {k: v for k, v in obj.items() if k != "status"}
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k not in SERVER_MANAGED_METADATA}
    annotations = {
        k: v for k, v in (meta.get("annotations") or {}).items() if k not in SERVER_MANAGED_ANNOTATIONS
    }
    if annotations:
        meta["annotations"] = annotations
    else:
        meta.pop("annotations", None)
    out["metadata"] = meta
    return out


def _keyed(items: list[Any]) -> dict[str, Any] | None:
    """Lists of named entries (containers, env, ports, volumes) compare by name, not position."""
    if items and all(isinstance(i, dict) and isinstance(i.get("name"), str) for i in items):
        names = [i["name"] for i in items]
        if len(set(names)) == len(names):
            return {n: i for n, i in zip(names, items, strict=True)}
    return None


def _walk(before: Any, after: Any, path: str, out: list[FieldChange]) -> None:
    if before == after:
        return
    if isinstance(before, dict) and isinstance(after, dict):
        for key in sorted(set(before) | set(after)):
            sub = f"{path}.{key}" if path else str(key)
            if key not in after:
                out.append(FieldChange("-", sub, before=before[key]))
            elif key not in before:
                out.append(FieldChange("+", sub, after=after[key]))
            else:
                _walk(before[key], after[key], sub, out)
        return
    if isinstance(before, list) and isinstance(after, list):
        kb, ka = _keyed(before), _keyed(after)
        if kb is not None and ka is not None:
            _walk_named(kb, ka, path, out)
            return
        if len(before) == len(after):
            for i, (b, a) in enumerate(zip(before, after, strict=True)):
                _walk(b, a, f"{path}[{i}]", out)
            return
    out.append(FieldChange("~", path, before=before, after=after))


def _walk_named(before: dict[str, Any], after: dict[str, Any], path: str, out: list[FieldChange]) -> None:
    for name in list(before) + [n for n in after if n not in before]:
        sub = f"{path}[name={name}]"
        if name not in after:
            out.append(FieldChange("-", sub, before=before[name]))
        elif name not in before:
            out.append(FieldChange("+", sub, after=after[name]))
        else:
            _walk(before[name], after[name], sub, out)


def diff_objects(live: dict[str, Any], planned: dict[str, Any]) -> list[FieldChange]:
    """Changes from `live` to `planned`, both whole objects as the API server returns them."""
    out: list[FieldChange] = []
    _walk(comparable(live), comparable(planned), "", out)
    return out
