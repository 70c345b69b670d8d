"""Wall time of one `llmdeploy` command line, run N times in fresh processes (import time included).

    python benchmarks/cli_wall_time.py [--runs 10] [-- plan --fit --model ID ...]

Without a command it times the issue's `plan --fit` target: Llama-3.1-8B-Instruct, 32k context,
64 concurrent sequences. Prints one line: min / median / max seconds, the commit and Python.
With PYTHONDONTWRITEBYTECODE set every run recompiles the sources (~0.1 s more than an installed
wheel, whose bytecode is compiled at install); the script says so when it is set.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = [
    "plan", "--fit", "--model", "meta-llama/Llama-3.1-8B-Instruct",
    "--max-model-len", "32768", "--target-concurrency", "64",
]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("command", nargs="*", help="llmdeploy arguments (after --)")
    args = parser.parse_args()
    argv = args.command or DEFAULT
    times = []
    for _ in range(args.runs):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "llmdeploy.cli.main", *argv], check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    print(f"llmdeploy {' '.join(argv)}")
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):
        print("note: PYTHONDONTWRITEBYTECODE is set, so every run compiled the sources")
    print(
        f"commit {commit.stdout.strip() or '?'}  python {platform.python_version()}  runs {args.runs}: "
        f"min {min(times):.3f} s  median {statistics.median(times):.3f} s  max {max(times):.3f} s"
    )


if __name__ == "__main__":
    main()
