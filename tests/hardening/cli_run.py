"""`llmdeploy ARGS` in-process, as a user runs it: exit code and everything printed, stdout and stderr."""

from __future__ import annotations

import io
import os
from collections.abc import Mapping
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from unittest import mock


@dataclass(frozen=True)
class CliResult:
    args: str
    returncode: int
    output: str


def run_cli(*args: str, env: Mapping[str, str] | None = None) -> CliResult:
    """Run the CLI in this process; an exception other than the CLI's own exits propagates."""
    from llmdeploy.cli.main import main

    out = io.StringIO()
    code = 0
    with mock.patch.dict(os.environ, dict(env or {})), redirect_stdout(out), redirect_stderr(out):
        try:
            main(list(args))
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
    return CliResult(" ".join(args), code, out.getvalue())
