"""Figures the hardening tests produce (cases tried, requests sent, ...), printed as a Markdown table.

Tests call `record(name, n)`; the conftest prints the table at the end of the run and writes it to
`.cache/hardening-figures.json`.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

FIGURES: Counter[str] = Counter()
JSON_PATH = Path(__file__).resolve().parents[2] / ".cache" / "hardening-figures.json"


def record(name: str, n: int = 1) -> None:
    FIGURES[name] += n


def table(figures: dict[str, int]) -> str:
    rows = ["| figure | value |", "|---|---:|"]
    rows += [f"| {name} | {value} |" for name, value in sorted(figures.items())]
    return "\n".join(rows)


def save() -> None:
    JSON_PATH.parent.mkdir(parents=True, exist_ok=True)
    JSON_PATH.write_text(json.dumps(dict(sorted(FIGURES.items())), indent=1) + "\n")


if __name__ == "__main__":
    print(table(json.loads(JSON_PATH.read_text())))
