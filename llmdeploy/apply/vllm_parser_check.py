"""Parse a vLLM serve argv with the installed vLLM's own parser; run with that install's interpreter.

    PYTHON-WITH-VLLM llmdeploy/apply/vllm_parser_check.py < ARGV.json

Prints one JSON object: {"version": "...", "error": null or the parser's message}. A plain script (no
llmdeploy imports): the interpreter that has vLLM usually does not have llmdeploy. The parser moved
between vLLM releases, so each known home is tried, newest first. Building EngineArgs is left out on
purpose: it would resolve the model, which may need the hub.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import sys
from typing import Any

PARSER_HOMES = (
    # (module with make_arg_parser and validate_parsed_serve_args, module with FlexibleArgumentParser)
    ("vllm.entrypoints.launchers.cli_args", "vllm.utils.argparse_utils"),
    ("vllm.entrypoints.openai.cli_args", "vllm.utils.argparse_utils"),
    ("vllm.entrypoints.openai.cli_args", "vllm.utils"),
)


def _parser_functions() -> tuple[Any, Any, Any]:
    last: Exception | None = None
    for cli_module, utils_module in PARSER_HOMES:
        try:
            cli_args = importlib.import_module(cli_module)
            utils = importlib.import_module(utils_module)
            return cli_args.make_arg_parser, cli_args.validate_parsed_serve_args, utils.FlexibleArgumentParser
        except (ImportError, AttributeError) as e:
            last = e
    raise ImportError(f"no known vLLM serve parser in this install ({last})")


def main() -> int:
    argv = json.load(sys.stdin)
    vllm = importlib.import_module("vllm")
    result: dict[str, object] = {"version": str(getattr(vllm, "__version__", "unknown")), "error": None}
    said = io.StringIO()
    try:
        make_arg_parser, validate, flexible = _parser_functions()
        parser = make_arg_parser(flexible(prog="vllm serve"))
        with contextlib.redirect_stderr(said):
            validate(parser.parse_args(argv))
    except SystemExit:
        # argparse printed usage and "error: ..." and exited; its last line is the message
        lines = [line for line in said.getvalue().splitlines() if line.strip()]
        result["error"] = lines[-1] if lines else "the parser rejected the arguments"
    except Exception as e:
        result["error"] = f"{type(e).__name__}: {e}"
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
