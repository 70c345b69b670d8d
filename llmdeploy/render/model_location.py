"""Where a rendered launch file points the engine: a file under llmdeploy's cache, a path, or a hub id.

Rendered files must be byte-identical on every machine, so a model living in the cache is named by
its path relative to the cache root; each target places that root (a shell expression locally,
the model-cache volume in containers).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from llmdeploy_engine.facts import cache_root

from llmdeploy.engines import get_engine
from llmdeploy.engines.flags import is_gguf
from llmdeploy.errors import UserError
from llmdeploy.recipe.schema import ModelSection, PackagedFile, Recipe

CONTAINER_CACHE_DIR = "/models"
VLLM_CHECKPOINTS_DIR = "vllm-checkpoints"


def package_dir(pkg: PackagedFile) -> Path:
    """The folder a PyPI-packaged model is installed into (--target), under the cache."""
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", pkg.package)
    return cache_root() / "packages" / slug


def packaged_file_path(pkg: PackagedFile) -> Path:
    return package_dir(pkg) / pkg.file


@dataclass(frozen=True)
class ModelLocation:
    in_cache: str | None = None  # path relative to the cache root
    literal: str | None = None  # absolute path, hub id or random:<id>
    package: str | None = None  # pip requirement that puts `in_cache` in place (PyPI-packaged models)
    needs_gguf_conversion: bool = False  # vLLM reads a checkpoint folder made from the GGUF by `apply`


def packaged_relative(model: ModelSection) -> str:
    assert model.pypi is not None
    return os.path.relpath(packaged_file_path(model.pypi), cache_root())


def vllm_checkpoint_relative(model: ModelSection) -> str:
    """The checkpoint folder `apply` converts a GGUF into for vLLM, relative to the cache root."""
    return f"{VLLM_CHECKPOINTS_DIR}/{vllm_checkpoint_name(model)}"


def vllm_checkpoint_name(model: ModelSection) -> str:
    source = model.pypi.file if model.pypi else os.path.basename(model.path or model.id)
    return source.replace("/", "_").removesuffix(".gguf")


def model_location(recipe: Recipe) -> ModelLocation:
    model = recipe.model
    engine = get_engine(recipe.engine.type)
    if engine.gguf_as_checkpoint and is_gguf(model):
        return ModelLocation(
            in_cache=vllm_checkpoint_relative(model),
            needs_gguf_conversion=True,
            package=model.pypi.package if model.pypi else None,
        )
    if model.pypi is not None:
        return ModelLocation(in_cache=packaged_relative(model), package=model.pypi.package)
    if model.path is not None:
        return ModelLocation(literal=model.path)
    if model.random_weights and engine.random_weights_prefix is not None:
        return ModelLocation(literal=f"{engine.random_weights_prefix}{model.id}")
    return ModelLocation(literal=model.id)


def container_model_ref(recipe: Recipe) -> str:
    """The model argument inside a container, where the cache root is the model-cache volume."""
    where = model_location(recipe)
    if where.needs_gguf_conversion:
        raise UserError.one(
            "vLLM 0.32 cannot load a GGUF file, and containers get no conversion step",
            path="model",
            value=recipe.model.pypi.file if recipe.model.pypi else recipe.model.path,
            fix="point model.id at a Hugging Face checkpoint for vLLM, or use engine.type: builtin",
        )
    if where.in_cache is not None:
        return f"{CONTAINER_CACHE_DIR}/{where.in_cache}"
    if recipe.model.path is not None:
        raise UserError.one(
            "a local model path does not exist inside a container",
            path="model.path",
            value=recipe.model.path,
            fix="use model.id (the engine downloads it into the model cache) or model.pypi",
        )
    assert where.literal is not None
    return where.literal


def local_model_ref(recipe: Recipe) -> str:
    """The model argument on this machine (what `apply` prepares)."""
    where = model_location(recipe)
    if where.in_cache is not None:
        return str(cache_root() / where.in_cache)
    assert where.literal is not None
    return where.literal
