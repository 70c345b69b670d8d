"""Writing rendered files into a folder: only changed files are rewritten, and files a previous render
wrote that are no longer rendered are removed (listed in a manifest); files llmdeploy did not write stay.

A symbolic link inside the folder is never followed: a rendered path (or a folder on the way to it)
that is a link is refused before anything is written, so a link planted in the output folder cannot
make `render` overwrite, or mark executable, a file elsewhere. Each file is written to a fresh
temporary name and renamed into place, which replaces the directory entry, never what it pointed to.
An unchanged file is marked executable in place only when no other name links to it (a hard link
to a file elsewhere is replaced by a fresh copy, so its other names keep their permissions).
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from llmdeploy.errors import Problem, UserError
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
    if path.is_symlink() or not path.is_file():
        return []
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return []
    files = data.get("files", []) if isinstance(data, dict) else []
    return [f for f in files if isinstance(f, str)]


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return path.lstat()
    except (FileNotFoundError, NotADirectoryError):
        return None


def _obstacle(folder: Path, relative: str) -> Problem | None:
    """Why `relative` cannot be written inside `folder` without following a link, or None."""
    parts = Path(relative).parts
    for depth in range(1, len(parts) + 1):
        path = folder.joinpath(*parts[:depth])
        info = _lstat(path)
        if info is None:
            return None  # nothing there yet: everything below it is created by this render
        leaf = depth == len(parts)
        if stat.S_ISLNK(info.st_mode):
            kind = "file" if leaf else "folder"
            return Problem(
                f"a symbolic link is in the way of a rendered {kind} (links are never followed)",
                value=f"{path} -> {os.readlink(path)}",
                has_value=True,
                fix=f"remove the link (rm {path}) or render into another directory",
            )
        if leaf and stat.S_ISDIR(info.st_mode):
            return Problem(
                "a folder is in the way of a rendered file",
                value=str(path),
                has_value=True,
                fix="move the folder away or render into another directory",
            )
        if leaf and not stat.S_ISREG(info.st_mode):
            return Problem(
                "something other than a regular file is in the way of a rendered file",
                value=str(path),
                has_value=True,
                fix="move it away or render into another directory",
            )
        if not leaf and not stat.S_ISDIR(info.st_mode):
            return Problem(
                "a file is in the way of a rendered folder",
                value=str(path),
                has_value=True,
                fix="move the file away or render into another directory",
            )
    return None


def _same_text(path: Path, text: str) -> bool:
    try:
        return path.read_bytes() == text.encode()
    except FileNotFoundError:
        return False


def _write_file(path: Path, text: str, executable: bool) -> None:
    """Write through a new temporary file renamed over `path`: never into whatever `path` links to.
    A file being replaced keeps its permission bits (plus the execute bits where it must run)."""
    tmp = path.with_name(f".{path.name}.llmdeploy-tmp-{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    old = _lstat(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)  # the umask applies
    try:
        with os.fdopen(fd, "wb") as f:
            if old is not None and stat.S_ISREG(old.st_mode):
                os.fchmod(f.fileno(), stat.S_IMODE(old.st_mode))
            if executable:
                _make_executable(f.fileno())
            f.write(text.encode())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def _hard_linked(path: Path) -> bool:
    info = _lstat(path)
    return info is not None and info.st_nlink > 1


def _make_executable(fd: int) -> None:
    mode = stat.S_IMODE(os.fstat(fd).st_mode)
    os.fchmod(fd, mode | ((mode & 0o444) >> 2))  # execute for whoever may read it


def write_artifacts(artifacts: Artifacts, folder: Path) -> WriteResult:
    folder.mkdir(parents=True, exist_ok=True)
    names = [*artifacts.files, MANIFEST]
    problems = [p for p in (_obstacle(folder, name) for name in names) if p is not None]
    if problems:
        raise UserError(problems)
    written, unchanged = [], []
    for relative, text in artifacts.files.items():
        path = folder / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        executable = relative in EXECUTABLE
        if _same_text(path, text) and not (executable and _hard_linked(path)):
            unchanged.append(relative)
            if executable:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
                try:
                    _make_executable(fd)
                finally:
                    os.close(fd)
        else:
            _write_file(path, text, executable)
            written.append(relative)
    removed = []
    for relative in _previous(folder):
        # a manifest entry is removed only where it is still a regular file reached without a link
        if relative in artifacts.files or Path(relative).is_absolute() or ".." in Path(relative).parts:
            continue
        path = folder / relative
        info = _lstat(path)
        if info is not None and stat.S_ISREG(info.st_mode) and _obstacle(folder, relative) is None:
            path.unlink()
            removed.append(relative)
    manifest = {
        "recipe": artifacts.recipe_name,
        "recipe_sha256": artifacts.recipe_sha256,
        "files": sorted(artifacts.files),
    }
    _write_file(folder / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True) + "\n", executable=False)
    return WriteResult(tuple(written), tuple(unchanged), tuple(sorted(removed)))
