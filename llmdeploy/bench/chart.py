"""The sweep's PNG: the Pareto chart (InferenceX / MLPerf Endpoints axes) beside latency and throughput.

Pareto panel: tok/s per user (1000 / TPOT p90 ms) on x, system output tok/s on y (per GPU when the
recipe names its GPU count), one labelled marker per point, the frontier joined, and the region the
SLOs allow shaded (x from `p99_tpot_ms`, y from `min_output_tok_s`; a TTFT limit has no axis here).
The PNG's text chunk `llmdeploy:points` lists every marker's data and pixel position, so a reader (the
tests) can check the points are drawn where the numbers say.
"""

from __future__ import annotations

import json
from pathlib import Path

from llmdeploy.bench.report import BenchReport, LevelReport

POINT_COLOR = "#d62728"
SLO_COLOR = "#2ca02c"


def _frontier(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Points no other point beats on both axes, by rising x."""
    best: list[tuple[float, float]] = []
    for x, y in sorted(points, key=lambda p: (-p[0], -p[1])):
        if not best or y > best[-1][1]:
            best.append((x, y))
    return sorted(best)


def _y(level: LevelReport, num_gpus: int | None) -> float:
    return level.metrics.output_throughput_tok_s / (num_gpus or 1)


def write_chart(report: BenchReport, path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display; must precede pyplot
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    levels = list(report.levels)
    num_gpus = report.num_gpus
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    pareto = axes[0]
    xs = [lv.metrics.tok_s_per_user for lv in levels]
    ys = [_y(lv, num_gpus) for lv in levels]
    front = _frontier(list(zip(xs, ys, strict=True)))
    pareto.plot([p[0] for p in front], [p[1] for p in front], "-", color="gray", lw=1, label="frontier")
    pareto.scatter(xs, ys, s=60, color=POINT_COLOR, zorder=3, label="sweep point")
    for lv, x, y in zip(levels, xs, ys, strict=True):
        pareto.annotate(lv.label, (x, y), textcoords="offset points", xytext=(6, 6), fontsize=8)
    pareto.set_xlim(0, max([*xs, 1.0]) * 1.25)
    pareto.set_ylim(0, max([*ys, 1.0]) * 1.25)
    slo = report.options.slo
    x0 = 1000 / slo.p99_tpot_ms if slo.p99_tpot_ms else None
    y0 = slo.min_output_tok_s / (num_gpus or 1) if slo.min_output_tok_s else None
    if x0 is not None or y0 is not None:
        left, bottom = x0 or 0.0, y0 or 0.0
        pareto.set_xlim(0, max(pareto.get_xlim()[1], left * 1.2))
        pareto.set_ylim(0, max(pareto.get_ylim()[1], bottom * 1.2))
        pareto.add_patch(
            Rectangle((left, bottom), 1e12, 1e12, color=SLO_COLOR, alpha=0.12, zorder=0, label="SLO region")
        )
    pareto.set_xlabel("tok/s per user (1000 / TPOT p90 ms)")
    pareto.set_ylabel(f"output tok/s per GPU ({num_gpus} GPUs)" if num_gpus else "system output tok/s")
    pareto.set_title("throughput vs interactivity")
    pareto.grid(True, alpha=0.3)
    pareto.legend(loc="upper right", fontsize=8)

    ticks = list(range(len(levels)))
    names = [lv.label for lv in levels]
    latency = axes[1]
    for attr, color in (("ttft", "tab:blue"), ("tpot", "tab:orange")):
        for pct, style in (("p50", "o-"), ("p90", "s--"), ("p99", "^:")):
            values = [getattr(getattr(lv.metrics, attr), f"{pct}_ms") for lv in levels]
            latency.plot(ticks, values, style, color=color, label=f"{attr.upper()} {pct}")
    latency.set_yscale("log")
    latency.set_title("latency (ms)")
    latency.legend(fontsize=7, ncol=2)
    throughput = axes[2]
    throughput.plot(ticks, [lv.metrics.output_throughput_tok_s for lv in levels], "o-", label="output tok/s")
    throughput.plot(
        ticks, [lv.metrics.total_token_throughput_tok_s for lv in levels], "s--", label="total tok/s"
    )
    throughput.set_title("throughput (tok/s)")
    throughput.legend(fontsize=8)
    for ax in axes[1:]:
        ax.set_xticks(ticks, names, rotation=30, fontsize=8)
        ax.set_xlabel("sweep point")
        ax.grid(True, alpha=0.3)
    fig.suptitle(f"{report.model} at {report.url}")
    fig.tight_layout()
    fig.canvas.draw()
    height = fig.get_size_inches()[1] * fig.dpi
    placed = []
    for lv, x, y in zip(levels, xs, ys, strict=True):
        px, py = pareto.transData.transform((x, y))
        placed.append(
            {"point": lv.label, "x": x, "y": y, "px": round(float(px)), "py": round(float(height - py))}
        )
    fig.savefig(
        path, dpi=fig.dpi, metadata={"llmdeploy:points": json.dumps({"color": POINT_COLOR, "points": placed})}
    )
    plt.close(fig)
