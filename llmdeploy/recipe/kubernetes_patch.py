"""Recipe models of `target.patches`: kustomize-style patches applied to the rendered objects.

A patch is a strategic-merge patch (a mapping in the object's own shape) or a list of RFC 6902
operations; `llmdeploy.render.kubernetes_patches` applies them.
"""

from __future__ import annotations

from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class PatchTarget(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: str = Field(description="kind of the rendered object, e.g. Deployment")
    name: str | None = Field(default=None, description="its name; default: every object of that kind")


class JsonPatchOp(BaseModel):
    """One RFC 6902 operation."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=False)
    op: Literal["add", "remove", "replace", "move", "copy", "test"]
    path: str = Field(description="JSON pointer, e.g. /spec/template/spec/hostNetwork")
    value: Any = None
    from_: str | None = Field(default=None, alias="from", description="source pointer of move and copy")

    @model_validator(mode="after")
    def _operands(self) -> JsonPatchOp:
        for pointer in (self.path, self.from_):
            if pointer is not None and pointer and not pointer.startswith("/"):
                raise ValueError(f"{pointer!r} is not a JSON pointer: start it with '/'")
        if self.op in ("move", "copy") and self.from_ is None:
            raise ValueError(f"op {self.op} needs `from:`")
        if self.op in ("add", "replace", "test") and "value" not in self.model_fields_set:
            raise ValueError(f"op {self.op} needs `value:`")
        return self


class Patch(BaseModel):
    """A kustomize-style patch of the rendered objects: a strategic-merge patch or RFC 6902 ops."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    target: PatchTarget | None = Field(
        default=None, description="objects to patch; default (strategic merge): the patch's own kind and name"
    )
    patch: dict[str, Any] | list[JsonPatchOp] = Field(
        description="a mapping (strategic merge) or a list of {op, path, value} (JSON 6902); "
        "a YAML string of either is read too"
    )

    @field_validator("patch", mode="before")
    @classmethod
    def _read_text(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                return yaml.safe_load(value)
            except yaml.YAMLError as exc:
                raise ValueError(f"the patch text is not YAML: {exc}") from None
        return value

    @model_validator(mode="after")
    def _has_target(self) -> Patch:
        if self.target is not None:
            return self
        if isinstance(self.patch, list):
            raise ValueError("a JSON 6902 patch needs `target: {kind: ..., name: ...}`")
        metadata = self.patch.get("metadata")
        if not isinstance(self.patch.get("kind"), str) or not (
            isinstance(metadata, dict) and isinstance(metadata.get("name"), str)
        ):
            raise ValueError(
                "give `target: {kind: ..., name: ...}`, or `kind:` and `metadata: {name: ...}` in the patch"
            )
        return self

    def selected(self) -> PatchTarget:
        if self.target is not None:
            return self.target
        assert isinstance(self.patch, dict)
        return PatchTarget(kind=self.patch["kind"], name=self.patch["metadata"]["name"])
