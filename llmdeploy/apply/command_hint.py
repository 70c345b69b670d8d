"""`llmdeploy` as a user types it in a new shell, for the follow-up commands `apply` prints.

A new shell has its login PATH, not the one that started this process: a virtual environment's
`bin` is on it only while activated. So the follow-up commands name `llmdeploy` bare only when PATH
finds this very script outside the environment's own `bin` (pipx, a user or system install), and
otherwise the script's path (`.venv/bin/llmdeploy` from the folder it was run in), which works
pasted anywhere.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path


def llmdeploy_command() -> str:
    script = Path(sys.prefix) / "bin" / "llmdeploy"
    if not script.is_file():
        return "llmdeploy"  # not a console-script install (run from source): nothing better to name
    found = shutil.which("llmdeploy")
    on_login_path = found is not None and Path(found).parent.resolve() != script.parent.resolve()
    if on_login_path and Path(str(found)).resolve() == script.resolve():
        return "llmdeploy"
    here = Path.cwd()
    return os.path.relpath(script, here) if script.is_relative_to(here) else str(script)


def follow_up_commands(recipe_path: str, stop_note: str = "") -> str:
    """The "See it" / "Stop it" lines `apply` prints: one command a line, so a line pasted whole runs
    as one command (two on a line ran as one `status` with extra arguments)."""
    cli = llmdeploy_command()
    return (
        f"See it:\n  {cli} status {recipe_path}\n  {cli} logs {recipe_path}\n"
        f"Stop it{stop_note}:\n  {cli} down {recipe_path}"
    )
