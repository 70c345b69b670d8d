"""A/B two result files of one suite script: each figure of B over A, row by row.

Rows are matched on their text fields (model, weights, kernel, shape, ...); every number both rows
have is printed as A, B and B / A. Which way is better depends on the figure (tok/s up, ms down).

    python benchmarks/compare.py before.json after.json
    python benchmarks/compare.py before.json after.json --fields decode_tok_s,roofline_pct
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def load(path: Path) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        sys.exit(f"{path}: not a suite result file ({e})")
    if not isinstance(data.get("rows"), list) or "script" not in data:
        sys.exit(f"{path}: not a suite result file (no 'script' and 'rows'; written by a --json run?)")
    return data


def key(row: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    """The row's identity: its text fields, less the measured ones (a spread like "241-249")."""
    return tuple((k, v) for k, v in row.items() if isinstance(v, str) and not k.endswith("_spread"))


def numbers(row: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in row.items() if isinstance(v, int | float) and not isinstance(v, bool)}


def compare(a: dict[str, Any], b: dict[str, Any], fields: set[str] | None) -> list[list[str]]:
    """Table lines: row, figure, A, B, B / A."""
    b_rows = {key(r): r for r in b["rows"]}
    lines = []
    for row in a["rows"]:
        other = b_rows.get(key(row))
        if other is None:
            continue
        label = " ".join(v for _, v in key(row))
        na, nb = numbers(row), numbers(other)
        for name in [n for n in na if n in nb and (fields is None or n in fields)]:
            ratio = f"{nb[name] / na[name]:.3f}" if na[name] else "-"
            lines.append([label, name, f"{na[name]:,.4g}", f"{nb[name]:,.4g}", ratio])
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("a", type=Path)
    p.add_argument("b", type=Path)
    p.add_argument("--fields", help="comma-separated figures to print (default: every number)")
    args = p.parse_args()
    a, b = load(args.a), load(args.b)
    if a["script"] != b["script"]:
        sys.exit(f"{args.a} is from {a['script']}.py, {args.b} from {b['script']}.py: nothing to compare")
    fields = {f.strip() for f in args.fields.split(",")} if args.fields else None
    for name, data in (("A", a), ("B", b)):
        head = data.get("header", {})
        print(f"{name}: " + "  ".join(f"{k}: {v}" for k, v in head.items()))
    lines = compare(a, b, fields)
    if not lines:
        sys.exit("no row of A matches a row of B (their text fields differ)")
    print("| row | figure | A | B | B / A |\n|---|---|---|---|---|")
    for line in lines:
        print("| " + " | ".join(line) + " |")


if __name__ == "__main__":
    main()
