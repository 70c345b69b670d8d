"""`bench compare`: two `--output-json` reports, figure by figure, with a regression bound for pipelines.

Points are matched by (max concurrency, request rate). Each figure knows which way is worse: higher
latency (TTFT, TPOT, ITL, E2EL) and more failures are worse, lower throughput (tok/s, req/s, tok/s per
user) is worse. A figure regresses when it moves the worse way by more than the bound.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from llmdeploy.errors import UserError

Better = Literal["higher", "lower"]

_THROUGHPUT: tuple[tuple[str, str], ...] = (
    ("output_throughput_tok_s", "output tok/s"),
    ("tok_s_per_user", "tok/s per user"),
    ("total_token_throughput_tok_s", "total tok/s"),
    ("request_throughput", "requests/s"),
)
_LATENCY = ("ttft", "tpot", "itl", "e2el")
_STATS = ("mean_ms", "p50_ms", "p90_ms", "p99_ms")


@dataclass(frozen=True)
class FigureChange:
    point: str
    figure: str
    better: Better
    base: float
    new: float
    regressed: bool

    @property
    def ratio(self) -> float | None:
        return self.new / self.base if self.base else None


def parse_bound(text: str) -> float:
    """ "5%" or "5" (percent) -> 0.05."""
    try:
        value = float(text.strip().removesuffix("%"))
    except ValueError as e:
        raise UserError.one(
            "the regression bound is not a number", path="--max-regression", value=text, fix="e.g. 5%"
        ) from e
    if not 0 <= value < 1000:
        raise UserError.one("the regression bound must be a percentage", path="--max-regression", value=text)
    return value / 100


def load_report(path: str | Path) -> dict[str, object]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise UserError.one(f"cannot read the report: {e.strerror}", file=str(path)) from e
    except ValueError as e:
        raise UserError.one(f"not JSON: {e}", file=str(path), fix="give a `bench --output-json` file") from e
    if not isinstance(data, dict) or not isinstance(data.get("levels"), list):
        raise UserError.one(
            'not a bench report: no "levels" list', file=str(path), fix="give a `bench --output-json` file"
        )
    return data


def _point(level: dict[str, object]) -> str:
    rate = level.get("request_rate")
    return f"c={level.get('max_concurrency')}" + (f" @{rate:g}/s" if isinstance(rate, int | float) else "")


def _figures(level: dict[str, object]) -> dict[str, tuple[float, Better]]:
    figures: dict[str, tuple[float, Better]] = {}
    for key, label in _THROUGHPUT:
        value = level.get(key)
        if key == "tok_s_per_user" and value is None:  # reports from before the field existed
            tpot = level.get("tpot")
            p90 = tpot.get("p90_ms") if isinstance(tpot, dict) else None
            value = 1000 / p90 if isinstance(p90, int | float) and p90 > 0 else None
        if isinstance(value, int | float):
            figures[label] = (float(value), "higher")
    for name in _LATENCY:
        dist = level.get(name)
        if isinstance(dist, dict):
            for stat in _STATS:
                if isinstance(dist.get(stat), int | float):
                    figures[f"{name.upper()} {stat.removesuffix('_ms')} (ms)"] = (float(dist[stat]), "lower")
    if isinstance(level.get("failed"), int):
        figures["failed requests"] = (float(level["failed"]), "lower")  # type: ignore[arg-type]
    return figures


def _regressed(base: float, new: float, better: Better, bound: float) -> bool:
    if base == 0:  # no ratio: only a lower-is-better figure that became non-zero (failures) regresses
        return better == "lower" and new > 0
    ratio = new / base
    return ratio > 1 + bound if better == "lower" else ratio < 1 - bound


def compare_reports(
    base: dict[str, object], new: dict[str, object], bound: float
) -> tuple[list[FigureChange], list[str]]:
    """Every figure of every point both reports have; notes name the points only one has."""
    base_levels = {_point(lv): lv for lv in base["levels"] if isinstance(lv, dict)}  # type: ignore[attr-defined]
    new_levels = {_point(lv): lv for lv in new["levels"] if isinstance(lv, dict)}  # type: ignore[attr-defined]
    changes: list[FigureChange] = []
    notes = [f"{p}: only in BASE" for p in base_levels if p not in new_levels]
    notes += [f"{p}: only in NEW" for p in new_levels if p not in base_levels]
    for point, base_level in base_levels.items():
        if point not in new_levels:
            continue
        new_figures = _figures(new_levels[point])
        for figure, (base_value, better) in _figures(base_level).items():
            if figure in new_figures:
                new_value = new_figures[figure][0]
                regressed = _regressed(base_value, new_value, better, bound)
                changes.append(FigureChange(point, figure, better, base_value, new_value, regressed))
    return changes, notes


def format_comparison(changes: list[FigureChange], notes: list[str], bound: float) -> str:
    rows = [["point", "figure", "base", "new", "new/base", "verdict"]]
    for c in changes:
        ratio = "-" if c.ratio is None else f"{c.ratio:.3f}"
        worse = "higher is worse" if c.better == "lower" else "lower is worse"
        verdict = f"REGRESSION ({worse})" if c.regressed else "ok"
        rows.append([c.point, c.figure, f"{c.base:.4g}", f"{c.new:.4g}", ratio, verdict])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for i, row in enumerate(rows):
        lines.append(
            "  ".join(
                cell.ljust(w) if c < 2 or c == 5 else cell.rjust(w)
                for c, (cell, w) in enumerate(zip(row, widths, strict=True))
            ).rstrip()
        )
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    lines.extend(f"note: {n}" for n in notes)
    regressions = sum(c.regressed for c in changes)
    lines.append(
        f"result: {'FAIL' if regressions else 'PASS'} ({regressions} of {len(changes)} figures regressed "
        f"past {bound * 100:g} %)"
    )
    return "\n".join(lines)
