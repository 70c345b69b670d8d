"""Exclusive locks for the local target: one per recipe instance and one per port.

Two `llmdeploy apply` runs at once used to both start an engine, both see /health answer (from
whichever engine bound the port) and both record themselves. Each apply now holds the lock of its
recipe's state folder for its whole run, and the lock of its port until its engine is serving; `down`
takes the recipe's lock too. The locks are `fcntl.flock` locks on small files in llmdeploy's state
folder, so the kernel drops them when the holder exits, however it exits; the file names the holder
so the refusal can say who it is.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

from llmdeploy.apply.local_state import instance_dir, state_root
from llmdeploy.errors import UserError
from llmdeploy.recipe.schema import Recipe

LOCK_FILE = "apply.lock"


def port_lock_path(port: int) -> Path:
    return state_root() / "locks" / f"port-{port}.lock"


@contextlib.contextmanager
def recipe_lock(recipe: Recipe, verb: str) -> Iterator[None]:
    """Hold the recipe instance's lock while `verb` (apply, down) runs; refuse at once when it is held."""
    path = instance_dir(recipe) / LOCK_FILE
    with _exclusive(path, recipe.name, verb) as holder:
        if holder is not None:
            raise UserError.one(
                f"another llmdeploy command is working on recipe {recipe.name!r}: {holder}",
                path="name",
                value=recipe.name,
                fix="wait for it to finish (or stop it), then run this again",
            )
        yield


@contextlib.contextmanager
def port_lock(recipe: Recipe) -> Iterator[None]:
    """Hold the port's lock until the engine listens on it; refuse at once when another apply claims it."""
    port = recipe.server.port
    with _exclusive(port_lock_path(port), recipe.name, "apply") as holder:
        if holder is not None:
            raise UserError.one(
                f"port {port} is being claimed by another llmdeploy apply: {holder}",
                path="server.port",
                value=port,
                fix=f"wait for that apply to finish, or pick another port: --set server.port={port + 1}",
            )
        yield


@contextlib.contextmanager
def _exclusive(path: Path, recipe_name: str, verb: str) -> Iterator[str | None]:
    """Yield None while holding the lock at `path`, or a description of its holder when it is taken."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield _describe(fd)
            return
        os.ftruncate(fd, 0)
        holder = {"pid": os.getpid(), "recipe": recipe_name, "command": verb, "since": time.time()}
        os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
        try:
            yield None
        finally:
            # emptied before the unlock so a stale file never names a holder that is gone
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)


def _describe(fd: int) -> str:
    try:
        data = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (ValueError, OSError):
        data = {}
    if not isinstance(data, dict) or "pid" not in data:
        return "a command that is still starting"
    since_s = max(0.0, time.time() - float(data.get("since", time.time())))
    what = f"`llmdeploy {data.get('command', '?')}` of recipe {data.get('recipe', '?')!r}"
    return f"{what} (pid {data['pid']}, running for {since_s:.0f} s)"
