"""Field-level differences between a live object and what applying would make of it.

The "after" side comes from a server-side dry-run apply, so defaults and admission changes are
already in it and a field diff shows only what the apply would really change. Fields the server
manages (resourceVersion, managedFields, status, ...) are ignored.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import yaml

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


# One step of a field path: a mapping key, a list index, or ("name", x) for a named list entry.
Step = str | int | tuple[str, str]


def render_path(keys: tuple[Step, ...]) -> str:
    out = ""
    for k in keys:
        if isinstance(k, tuple):
            out += f"[{k[0]}={k[1]}]"
        elif isinstance(k, int):
            out += f"[{k}]"
        else:
            out += f".{k}" if out else k
    return out


@dataclass(frozen=True)
class FieldChange:
    op: str  # "+" added, "-" removed, "~" changed
    keys: tuple[Step, ...]
    before: Any = None
    after: Any = None
    note: str = ""  # context, e.g. the flag before a changed argv entry

    @property
    def path(self) -> str:
        return render_path(self.keys)

    def render(self) -> str:
        note = f"  ({self.note})" if self.note else ""
        if self.op in "+-":
            value = self.after if self.op == "+" else self.before
            shown = _shown(value)
            return (
                f"{self.op} {self.path}: {shown}{note}"
                if _inline(value)
                else f"{self.op} {self.path}:{note}{shown}"
            )
        if isinstance(self.before, str) and isinstance(self.after, str) and "\n" in self.before + self.after:
            lines = difflib.ndiff(self.before.splitlines(), self.after.splitlines())
            changed = [f"      {ln[0]} {ln[2:]}" for ln in lines if ln[:1] in "+-"]
            return "\n".join([f"~ {self.path}:{note}", *changed])
        if _inline(self.before) and _inline(self.after):
            return f"~ {self.path}: {_shown(self.before)} -> {_shown(self.after)}{note}"
        return f"~ {self.path}:{note}\n    before: {_shown(self.before)}\n    after: {_shown(self.after)}"


def _is_scalar(value: Any) -> bool:
    return not isinstance(value, dict | list)


def _inline(value: Any) -> bool:
    return _is_scalar(value) or not value


def _shown(value: Any) -> str:
    """A scalar as JSON on the line; a mapping or list in full, as indented block YAML below it."""
    if _inline(value):
        return json.dumps(value, sort_keys=True)
    text = yaml.safe_dump(value, default_flow_style=False, sort_keys=False, width=float("inf"))
    return "\n" + "\n".join("      " + line for line in text.rstrip("\n").splitlines())


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


def _walk(before: Any, after: Any, keys: tuple[Step, ...], out: list[FieldChange]) -> None:
    if before == after:
        return
    if isinstance(before, dict) and isinstance(after, dict):
        _walk_entries(before, after, sorted(set(before) | set(after)), str, keys, out)
        return
    if isinstance(before, list) and isinstance(after, list):
        kb, ka = _keyed(before), _keyed(after)
        if kb is not None and ka is not None:
            # named entries (containers, env) in their own order, new names last
            order = list(kb) + [n for n in ka if n not in kb]
            _walk_entries(kb, ka, order, lambda name: ("name", name), keys, out)
            return
        if all(_is_scalar(v) for v in (*before, *after)):
            _walk_arguments(before, after, keys, out)
            return
        if len(before) == len(after):
            for i, (b, a) in enumerate(zip(before, after, strict=True)):
                _walk(b, a, (*keys, i), out)
            return
    out.append(FieldChange("~", keys, before=before, after=after))


def _walk_arguments(
    before: list[Any], after: list[Any], keys: tuple[Step, ...], out: list[FieldChange]
) -> None:
    """A list of scalars (a command, its args) entry by entry: what was removed, added or replaced, each
    with the flag it follows; entries before a removal are numbered as before, others as after."""

    def note(items: list[Any], i: int) -> str:
        return f"after {items[i - 1]}" if i and _is_flag(items[i - 1]) and not _is_flag(items[i]) else ""

    matcher = difflib.SequenceMatcher(a=before, b=after, autojunk=False)
    for tag, b0, b1, a0, a1 in matcher.get_opcodes():
        if tag == "equal":
            continue
        if tag == "replace" and b1 - b0 == a1 - a0:
            for k in range(b1 - b0):
                out.append(
                    FieldChange("~", (*keys, a0 + k), before[b0 + k], after[a0 + k], note=note(after, a0 + k))
                )
            continue
        for i in range(b0, b1):
            out.append(FieldChange("-", (*keys, i), before=before[i], note=note(before, i)))
        for j in range(a0, a1):
            out.append(FieldChange("+", (*keys, j), after=after[j], note=note(after, j)))


def _is_flag(value: Any) -> bool:
    text = str(value)
    return text.startswith("-") and not text[1:].replace(".", "", 1).isdigit()


def _walk_entries(
    before: dict[Any, Any],
    after: dict[Any, Any],
    order: list[Any],
    step: Callable[[Any], Step],
    keys: tuple[Step, ...],
    out: list[FieldChange],
) -> None:
    """The entries of two mappings in `order`, each removed, added or walked into; `step` names an
    entry in the field path."""
    for key in order:
        sub = (*keys, step(key))
        if key not in after:
            out.append(FieldChange("-", sub, before=before[key]))
        elif key not in before:
            out.append(FieldChange("+", sub, after=after[key]))
        else:
            _walk(before[key], after[key], sub, out)


_MISSING = object()


def lookup(obj: Any, keys: tuple[Step, ...]) -> Any:
    """The value at a field path, or `_MISSING`."""
    for k in keys:
        if isinstance(k, tuple):
            named = _keyed(obj) if isinstance(obj, list) else None
            obj = named.get(k[1], _MISSING) if named is not None else _MISSING
        elif isinstance(k, int):
            obj = obj[k] if isinstance(obj, list) and k < len(obj) else _MISSING
        else:
            obj = obj.get(k, _MISSING) if isinstance(obj, dict) else _MISSING
        if obj is _MISSING:
            return _MISSING
    return obj


def diff_objects(live: dict[str, Any], planned: dict[str, Any]) -> list[FieldChange]:
    """Changes from `live` to `planned`, both whole objects as the API server returns them."""
    out: list[FieldChange] = []
    _walk(comparable(live), comparable(planned), (), out)
    return out


def drop_settled(
    changes: list[FieldChange], desired: dict[str, Any], live: dict[str, Any]
) -> list[FieldChange]:
    """Leave out changes at fields we set to exactly their live value.

    kube-apiserver 1.20 answers a dry-run apply of an autoscaling/v2beta2 HPA with its `metrics`
    list doubled (a conversion round trip through the v1 storage version), while the real apply
    changes nothing; a field whose desired value already equals the live one is not a change.
    """
    return [c for c in changes if (v := lookup(desired, c.keys)) is _MISSING or v != lookup(live, c.keys)]
