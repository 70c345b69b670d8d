"""`target.patches`: kustomize-style patches applied to the rendered objects at render time.

A patch selects objects by kind (and name) and is either a list of RFC 6902 operations, applied
with the `jsonpatch` library, or a strategic-merge patch. Strategic merge is written here because
no Python library knows Kubernetes' merge keys (they live in the Go API types' struct tags, which
kubectl and kustomize compile in; Python's kubernetes client only sends patches to a server, and
`render` works offline). It follows Kubernetes' rules for the fields of the objects llmdeploy
renders, including the pod templates inside a LeaderWorkerSet:

- mappings merge key by key; a null value deletes the key;
- lists with a merge key merge entry by entry: containers, initContainers, env, volumes,
  imagePullSecrets by `name`; volumeMounts by `mountPath`; a container's ports by `containerPort`,
  a Service's by `port`; topologySpreadConstraints by `topologyKey`; new entries are appended;
- `$patch: delete` in a list entry removes the matching entry, in a mapping removes the mapping;
  `$patch: replace` in a mapping replaces it whole, as a list entry replaces the whole list;
- every other list (command, args, tolerations, ...) is replaced, as Kubernetes does.

A patch may not change an object's apiVersion, kind, name or namespace (kustomize's default too).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import jsonpatch
import jsonpointer

from llmdeploy.errors import UserError
from llmdeploy.recipe.kubernetes_patch import Patch

# list fields whose entries merge by a key (Kubernetes' patchMergeKey)
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "imagePullSecrets": "name",
    "resourceClaims": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "topologySpreadConstraints": "topologyKey",
    "hostAliases": "ip",
    "ownerReferences": "uid",
}
SET_LISTS = frozenset({"finalizers"})  # lists of scalars merged as sets
_DELETE = object()


class PatchFailure(Exception):
    """A patch that cannot be applied; the message says where in the patch and why."""


def apply_patches(objects: Sequence[dict[str, Any]], patches: Sequence[Patch]) -> list[dict[str, Any]]:
    """The objects with every patch applied in order; the inputs are left untouched."""
    out = [copy.deepcopy(obj) for obj in objects]
    for i, patch in enumerate(patches):
        where = f"target.patches[{i}]"
        selected = patch.selected()
        hits = [
            j
            for j, obj in enumerate(out)
            if obj.get("kind") == selected.kind
            and (selected.name is None or obj.get("metadata", {}).get("name") == selected.name)
        ]
        if not hits:
            rendered = ", ".join(f"{o.get('kind')}/{o.get('metadata', {}).get('name')}" for o in out)
            raise UserError.one(
                "the patch's target matches no rendered object",
                path=f"{where}.target",
                value=f"{selected.kind}/{selected.name or '*'}",
                fix=f"select one of: {rendered}",
            )
        for j in hits:
            try:
                patched = _apply_one(out[j], patch)
            except PatchFailure as exc:
                raise UserError.one(
                    f"the patch cannot be applied to {_label(out[j])}: {exc}",
                    path=f"{where}.patch",
                    fix="check the patch against `llmdeploy render` output without it",
                ) from None
            moved = [
                k
                for k in ("apiVersion", "kind", "name", "namespace")
                if _identity(patched, k) != _identity(out[j], k)
            ]
            if moved:
                raise UserError.one(
                    f"the patch changes the {' and '.join(moved)} of {_label(out[j])}",
                    path=f"{where}.patch",
                    fix="patches change fields, not which object it is; set names through the recipe",
                )
            out[j] = patched
    return out


def _label(obj: dict[str, Any]) -> str:
    return f"{obj.get('kind')} {obj.get('metadata', {}).get('name')}"


def _identity(obj: dict[str, Any], key: str) -> Any:
    if key in ("name", "namespace"):
        meta = obj.get("metadata")
        return meta.get(key) if isinstance(meta, dict) else None
    return obj.get(key)


def _apply_one(obj: dict[str, Any], patch: Patch) -> dict[str, Any]:
    if isinstance(patch.patch, list):
        doc: Any = obj
        for k, op in enumerate(patch.patch):
            operation = op.model_dump(by_alias=True, exclude_unset=True)
            try:
                doc = jsonpatch.apply_patch(doc, [operation])
            except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as exc:
                raise PatchFailure(
                    f"operation [{k}] ({op.op} {op.path}): {_reason(op.op, op.from_, exc)}"
                ) from None
        if not isinstance(doc, dict):
            raise PatchFailure("the operations replace the whole object with a non-mapping")
        return doc
    body = copy.deepcopy(patch.patch)
    # kind and metadata.name select the object (as in kustomize); they are not merged
    body.pop("apiVersion", None)
    body.pop("kind", None)
    if isinstance(body.get("metadata"), dict):
        body["metadata"] = {k: v for k, v in body["metadata"].items() if k not in ("name", "namespace")}
    merged = strategic_merge(obj, body, "")
    if not isinstance(merged, dict):
        raise PatchFailure("a strategic-merge patch of a whole object must be a mapping")
    return merged


def _reason(op: str, source: str | None, exc: Exception) -> str:
    """Why an operation failed, in our words: the library's messages print the values they compared
    or the whole parent object, which may be large or hold a value that must not be shown."""
    if isinstance(exc, jsonpatch.JsonPatchTestFailed):
        return "the value there differs from the tested value"
    if op in ("move", "copy") and isinstance(exc, jsonpatch.JsonPatchConflict):
        return f"nothing at {source} to {op}"
    if op == "add":
        return "its parent does not exist (or the list index is past the end)"
    return "nothing at that path (or the list index is past the end)"


def strategic_merge(original: Any, patch: Any, path: str) -> Any:
    """`patch` merged into `original` by Kubernetes' strategic-merge rules (see the module docstring)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    directive = patch.get("$patch")
    if directive == "replace":
        return _clean({k: v for k, v in patch.items() if k != "$patch"})
    if directive == "delete":
        return _DELETE
    if directive is not None:
        raise PatchFailure(f"{path or '/'}: unknown $patch directive {directive!r} (use replace or delete)")
    unsupported = sorted(k for k in patch if isinstance(k, str) and k.startswith("$"))
    if unsupported:
        raise PatchFailure(
            f"{path or '/'}: the directive {unsupported[0]} is not supported; use a JSON 6902 patch"
        )
    result = dict(original) if isinstance(original, dict) else {}
    for key, value in patch.items():
        sub = f"{path}/{key}"
        if value is None:
            result.pop(key, None)
            continue
        if isinstance(value, list):
            merged = _merge_list(str(key), result.get(key), value, sub)
        else:
            merged = strategic_merge(result.get(key), value, sub)
        if merged is _DELETE:
            result.pop(key, None)
        else:
            result[key] = merged
    return result


def _merge_list(field: str, original: Any, patch: list[Any], path: str) -> Any:
    replace = [i for i in patch if isinstance(i, dict) and i.get("$patch") == "replace"]
    if replace:
        return _clean([i for i in patch if i not in replace])
    if field in SET_LISTS and isinstance(original, list):
        return [*original, *(v for v in patch if v not in original)]
    key = _merge_key(field, original, patch)
    if key is None or not isinstance(original, list):
        if any(isinstance(i, dict) and "$patch" in i for i in patch):
            if key is None:
                raise PatchFailure(
                    f"{path}: entries of this list have no merge key, so $patch cannot select one"
                )
            return _clean([i for i in patch if not (isinstance(i, dict) and i.get("$patch") == "delete")])
        return _clean(patch)
    result = list(original)
    for n, item in enumerate(patch):
        if not isinstance(item, dict) or key not in item:
            raise PatchFailure(f"{path}/{n}: entries of {field} are merged by {key!r}; give {key} in each")
        at = next((j for j, e in enumerate(result) if isinstance(e, dict) and e.get(key) == item[key]), None)
        if item.get("$patch") == "delete":
            if at is not None:
                result.pop(at)
            continue
        if at is None:
            result.append(_clean(item))
        else:
            result[at] = strategic_merge(result[at], item, f"{path}/{n}")
    return result


def _merge_key(field: str, original: Any, patch: list[Any]) -> str | None:
    if field == "ports":
        entries = [e for e in [*(original or []), *patch] if isinstance(e, dict)]
        # a container's ports carry containerPort, a Service's carry port
        return "containerPort" if any("containerPort" in e for e in entries) else "port"
    return MERGE_KEYS.get(field)


def _clean(value: Any) -> Any:
    """A patch fragment as plain data: directives and null entries dropped."""
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items() if k != "$patch" and v is not None}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return copy.deepcopy(value)
