"""A PNG chart of a concurrency sweep: latency percentiles and throughput against concurrency."""

from __future__ import annotations

from pathlib import Path

from llmdeploy.bench.report import BenchReport


def write_chart(report: BenchReport, path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display; must precede pyplot
    import matplotlib.pyplot as plt

    levels = sorted(report.levels, key=lambda lv: lv.concurrency)
    x = [lv.concurrency for lv in levels]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    panels = (("TTFT", "ttft"), ("TPOT", "tpot"))
    for ax, (title, attr) in zip(axes[:2], panels, strict=True):
        for pct, style in (("p50", "o-"), ("p90", "s--"), ("p99", "^:")):
            ax.plot(x, [getattr(getattr(lv.metrics, attr), f"{pct}_ms") for lv in levels], style, label=pct)
        ax.set_title(f"{title} (ms)")
        ax.set_xlabel("concurrency")
        ax.set_ylabel("ms")
        ax.legend()
        ax.grid(True, alpha=0.3)
    ax = axes[2]
    ax.plot(x, [lv.metrics.output_throughput_tok_s for lv in levels], "o-", label="output tok/s")
    ax.plot(x, [lv.metrics.total_token_throughput_tok_s for lv in levels], "s--", label="total tok/s")
    ax.set_title("throughput")
    ax.set_xlabel("concurrency")
    ax.set_ylabel("tokens/s")
    ax.grid(True, alpha=0.3)
    rps = ax.twinx()
    rps.plot(x, [lv.metrics.request_throughput for lv in levels], "^:", color="gray", label="req/s")
    rps.set_ylabel("requests/s")
    handles = ax.get_legend_handles_labels()
    extra = rps.get_legend_handles_labels()
    ax.legend(handles[0] + extra[0], handles[1] + extra[1], loc="upper left")
    for a in axes:
        if len(x) > 1 and max(x) / min(x) >= 4:
            a.set_xscale("log", base=2)  # sweeps are usually powers of two
        a.set_xticks(x, [str(c) for c in x])
    fig.suptitle(f"{report.model} at {report.url}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
