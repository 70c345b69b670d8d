"""The benchmark report: per sweep point metrics and SLO verdicts, as a table or JSON."""

from __future__ import annotations

import json
from dataclasses import dataclass

from llmdeploy.bench.metrics import BenchMetrics
from llmdeploy.bench.options import BenchOptions
from llmdeploy.bench.slo import SLOResult
from llmdeploy.bench.words import PromptCalibration
from llmdeploy.bench.workload import WorkloadSummary


@dataclass(frozen=True)
class LevelReport:
    concurrency: int
    request_rate: float | None
    metrics: BenchMetrics
    slo_results: tuple[SLOResult, ...]

    @property
    def passed(self) -> bool:
        return all(r.ok for r in self.slo_results)

    @property
    def label(self) -> str:
        return f"c={self.concurrency}" + (f" @{self.request_rate:g}/s" if self.request_rate else "")

    def to_json(self, num_gpus: int | None = None) -> dict[str, object]:
        per_gpu = None if num_gpus is None else self.metrics.output_throughput_tok_s / num_gpus
        return {
            "max_concurrency": self.concurrency,
            "request_rate": self.request_rate,
            **self.metrics.to_json(),
            "output_throughput_tok_s_per_gpu": per_gpu,
            "slo": [
                {"name": r.name, "limit": r.limit, "actual": r.actual, "ok": r.ok} for r in self.slo_results
            ],
            "passed": self.passed,
        }


@dataclass(frozen=True)
class BenchReport:
    url: str
    model: str
    options: BenchOptions
    calibration: PromptCalibration | None  # None with a dataset
    levels: tuple[LevelReport, ...]
    notes: tuple[str, ...] = ()
    workload: WorkloadSummary | None = None
    num_gpus: int | None = None  # the recipe's GPU count; None with a URL alone or on CPU

    @property
    def passed(self) -> bool:
        """Every level meets every SLO (a sweep signs off only if the busiest level does too)."""
        return all(level.passed for level in self.levels)

    def to_json(self) -> dict[str, object]:
        o = self.options
        return {
            "url": self.url,
            "model": self.model,
            "endpoint": o.endpoint,
            "options": {
                "num_requests": o.num_requests,
                "concurrency": list(o.concurrency),
                "request_rate": o.request_rates[0] if len(o.request_rates) == 1 else None,
                "request_rates": list(o.request_rates),
                "input_len": str(o.input_len),
                "output_len": str(o.output_len),
                "dataset": o.dataset,
                "workload": o.workload,
                "ignore_eos": o.ignore_eos,
                "warmup_requests": o.warmup_requests,
                "seed": o.seed,
                "slo": o.slo.model_dump(),
            },
            "calibration": None
            if self.calibration is None
            else {
                "tokens_per_word": self.calibration.tokens_per_word,
                "overhead_tokens": self.calibration.overhead_tokens,
                "measured": self.calibration.measured,
            },
            "workload": None if self.workload is None else self.workload.to_json(),
            "num_gpus": self.num_gpus,
            "levels": [level.to_json(self.num_gpus) for level in self.levels],
            "passed": self.passed,
            "notes": list(self.notes),
        }

    def to_json_text(self) -> str:
        return json.dumps(self.to_json(), indent=2) + "\n"


def _rows(m: BenchMetrics) -> list[tuple[str, str]]:
    rows = [
        ("completed / failed", f"{m.completed} / {m.failed}"),
        ("duration (s)", f"{m.duration_s:.2f}"),
        ("input tokens", str(m.total_input_tokens)),
        ("output tokens", str(m.total_output_tokens) + ("" if m.usage_reported else "*")),
        ("request throughput (req/s)", f"{m.request_throughput:.2f}"),
        ("output throughput (tok/s)", f"{m.output_throughput_tok_s:.1f}"),
        ("total throughput (tok/s)", f"{m.total_token_throughput_tok_s:.1f}"),
    ]
    for label, dist in (("TTFT", m.ttft), ("TPOT", m.tpot), ("ITL", m.itl), ("E2EL", m.e2el)):
        rows.append((f"{label} mean / p50 (ms)", f"{dist.mean_ms:.1f} / {dist.p50_ms:.1f}"))
        rows.append((f"{label} p90 / p99 (ms)", f"{dist.p90_ms:.1f} / {dist.p99_ms:.1f}"))
    return rows


def format_table(report: BenchReport) -> str:
    """Metrics as rows, one column per concurrency level; failures and SLO verdicts below."""
    headers = ["metric"] + [lv.label for lv in report.levels]
    columns = [_rows(lv.metrics) for lv in report.levels]
    labels = [label for label, _ in columns[0]] if columns else []
    table = [headers] + [[label] + [col[i][1] for col in columns] for i, label in enumerate(labels)]
    widths = [max(len(row[c]) for row in table) for c in range(len(headers))]
    lines = [f"benchmark of {report.model} at {report.url} ({report.options.endpoint})"]
    if report.workload is not None:
        lines.append(report.workload.describe())
    for i, row in enumerate(table):
        lines.append(
            "  ".join(
                cell.ljust(widths[0]) if c == 0 else cell.rjust(widths[c]) for c, cell in enumerate(row)
            )
        )
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    if any(not lv.metrics.usage_reported for lv in report.levels):
        lines.append("* some output token counts are streamed chunks counted, the server sent no usage")
    for lv in report.levels:
        for reason, count in lv.metrics.failure_reasons:
            lines.append(f"failed at {lv.label}: {count} x {reason}")
    for lv in report.levels:
        for r in lv.slo_results:
            lines.append(f"SLO {lv.label}: {r.describe()}")
    lines.extend(f"note: {n}" for n in report.notes)
    lines.append("result: " + ("PASS" if report.passed else "FAIL"))
    return "\n".join(lines)
