"""The accuracy report as Markdown for docs/planner.md (`python -m llmdeploy.planner.accuracy --markdown`):
a summary per release family and group, then every log with its source, grouped by family."""

from __future__ import annotations

import statistics

from llmdeploy.memory.footprint import release
from llmdeploy.planner.accuracy_result import HYBRID, LEGACY, TARGET, LogCheck, percent

# release families as the planner's rules split them (sampler path, non-torch accounting, graphs)
FAMILIES = (
    ((0, 0, 0), "< 0.7 (V0)"),
    ((0, 7, 0), "0.7 (V0)"),
    ((0, 8, 0), "0.8-0.10"),
    ((0, 11, 0), "0.11-0.16"),
    ((0, 17, 0), "0.17-0.20"),
    ((0, 21, 0), "0.21+"),
)
UNSTATED = "V1, release not stated"


def family(version: str) -> str:
    found = release(version) if version and version[0] in "0123456789>=v" else None
    if found is None:
        return UNSTATED
    return [name for since, name in FAMILIES if found >= since][-1]


def _median_max(errors: list[float]) -> str:
    if not errors:
        return "- | -"
    return f"{statistics.median(errors) * 100:.2f} % | {max(errors) * 100:.2f} %"


def summary_table(checks: list[LogCheck]) -> str:
    order = [name for _, name in FAMILIES] + [UNSTATED]
    lines = [
        "| family | group | logs | full predictions | held-out median | held-out max |",
        "|---|---|---|---|---|---|",
    ]
    for name in order:
        for group in (TARGET, LEGACY, HYBRID):
            rows = [c for c in checks if family(c.version) == name and c.group == group]
            if not rows:
                continue
            held = [abs(c.heldout_error) for c in rows if c.heldout_error is not None]
            lines.append(f"| {name} | {group} | {len(rows)} | {len(held)} | {_median_max(held)} |")
    return "\n".join(lines)


def log_table(checks: list[LogCheck]) -> str:
    lines = [
        "| family | log (source) | vLLM | GPU | model | KV tokens error | held out | weights error | sample |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    order = {name: i for i, (_, name) in enumerate(FAMILIES)}
    for c in sorted(checks, key=lambda c: (order.get(family(c.version), len(order)), c.group, c.log_id)):
        star = "*" if c.full_reference_derived and c.full_error is not None else ""
        weights = "-" if c.weights_error_gib is None else f"{c.weights_error_gib:+.2f} GiB"
        model = c.model.split("/")[-1]
        kind = " (hybrid)" if c.hybrid else ""
        sample = "in" if c.in_sample else "out"
        cited = f"[{c.log_id}]({c.source})" if c.source.startswith("https://") else f"{c.log_id} ({c.source})"
        lines.append(
            f"| {family(c.version)} | {cited}{kind} | {c.version} | {c.gpu} | {model} | "
            f"{percent(c.full_error)}{star} | {percent(c.heldout_error)} | {weights} | {sample} |"
        )
    return "\n".join(lines)


def markdown(checks: list[LogCheck]) -> str:
    return summary_table(checks) + "\n\n" + log_table(checks)
