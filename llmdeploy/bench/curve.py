"""The sweep as a curve: one row per point, MLPerf Endpoints' figures first, printed as points finish.

Per point: system output tok/s (per GPU when the recipe names its GPU count), tok/s per user
(1000 / TPOT p90 in ms), TTFT p90, then the p50 / p99 of TTFT and TPOT.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmdeploy.bench.report import LevelReport


@dataclass(frozen=True)
class CurveTable:
    num_gpus: int | None = None

    def _columns(self) -> list[tuple[str, int]]:
        columns = [("point", 16), ("output tok/s", 12)]
        if self.num_gpus is not None:
            columns.append((f"tok/s/GPU ({self.num_gpus})", 14))
        columns += [
            ("tok/s/user", 10),
            ("TTFT p90", 9),
            ("TTFT p50/p99 ms", 17),
            ("TPOT p50/p90/p99 ms", 22),
            ("failed", 6),
            ("SLO", 4),
        ]
        return columns

    def header(self) -> str:
        columns = self._columns()
        names = "  ".join(
            name.ljust(max(w, len(name))) if i == 0 else name.rjust(max(w, len(name)))
            for i, (name, w) in enumerate(columns)
        )
        return names + "\n" + "  ".join("-" * max(w, len(name)) for name, w in columns)

    def row(self, level: LevelReport) -> str:
        m = level.metrics
        cells = [level.label, f"{m.output_throughput_tok_s:.1f}"]
        if self.num_gpus is not None:
            cells.append(f"{m.output_throughput_tok_s / self.num_gpus:.1f}")
        cells += [
            f"{m.tok_s_per_user:.1f}",
            f"{m.ttft.p90_ms:.1f}",
            f"{m.ttft.p50_ms:.1f} / {m.ttft.p99_ms:.1f}",
            f"{m.tpot.p50_ms:.2f} / {m.tpot.p90_ms:.2f} / {m.tpot.p99_ms:.2f}",
            str(m.failed),
            "pass" if level.passed else "FAIL",
        ]
        columns = self._columns()
        return "  ".join(
            cell.ljust(max(w, len(name))) if i == 0 else cell.rjust(max(w, len(name)))
            for i, (cell, (name, w)) in enumerate(zip(cells, columns, strict=True))
        )
