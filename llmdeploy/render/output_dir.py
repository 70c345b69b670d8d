"""Writing rendered files into a folder: only changed files are rewritten, and files a previous render
wrote that are no longer rendered are removed (listed in a manifest); files llmdeploy did not write stay.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from llmdeploy.errors import UserError
from llmdeploy.render.artifacts import Artifacts

MANIFEST = ".llmdeploy-render.json"
EXECUTABLE = ("launch.sh",)


@dataclass(frozen=True)
class WriteResult:
    written: tuple[str, ...]
    unchanged: tuple[str, ...]
    removed: tuple[str, ...]


def _previous(folder: Path) -> list[str]:
    path = folder / MANIFEST
    if not path.is_file():
        return []
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError:
        return []
    files = data.get("files", []) if isinstance(data, dict) else []
    return [f for f in files if isinstance(f, str)]


def write_artifacts(artifacts: Artifacts, folder: Path) -> WriteResult:
    folder.mkdir(parents=True, exist_ok=True)
    written, unchanged = [], []
    for relative, text in artifacts.files.items():
        path = folder / relative
        if path.is_dir():
            raise UserError.one(
                "a folder is in the way of a rendered file",
                value=str(path),
                fix="move the folder away or render into another directory",
            )
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_file() and path.read_text() == text:
            unchanged.append(relative)
        else:
            path.write_text(text)
            written.append(relative)
        if relative in EXECUTABLE:
            path.chmod(0o755)
    removed = []
    root = folder.resolve()
    for relative in _previous(folder):
        path = (folder / relative).resolve()
        # a manifest entry pointing outside the folder is never followed
        if relative in artifacts.files or root not in path.parents:
            continue
        if path.is_file():
            path.unlink()
            removed.append(relative)
    manifest = {
        "recipe": artifacts.recipe_name,
        "recipe_sha256": artifacts.recipe_sha256,
        "files": sorted(artifacts.files),
    }
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return WriteResult(tuple(written), tuple(unchanged), tuple(sorted(removed)))
