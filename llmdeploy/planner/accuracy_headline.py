"""The head of the accuracy report (`python -m llmdeploy.planner.accuracy`): the out-of-sample set,
the field reports of issue 44 and the failed starts, before the per-log table."""

from __future__ import annotations

import statistics

from llmdeploy.planner.accuracy_result import HYBRID, LEGACY, TARGET, LogCheck, percent


def summary_line(label: str, errors: list[float]) -> str:
    if not errors:
        return f"{label}: n=0"
    return f"{label}: n={len(errors)} median |error| {statistics.median(errors) * 100:.2f}%, max {max(errors) * 100:.2f}%"


FIELD_REPORT = "a user's field report"


def headline(checks: list[LogCheck], figures: dict[str, list[float]]) -> list[str]:
    """The out-of-sample figures first (`figures`: `accuracy.summaries` of `checks`): what the planner
    does on logs it was not fitted to, then the field reports and the failed starts."""
    lines = ["OUT OF SAMPLE (logs used to set no planner figure; non-torch re-fitted without their thread):"]
    for group in (TARGET, HYBRID, LEGACY):
        lines.append(
            "  " + summary_line(f"KV tokens, {group}", figures[f"full prediction out of sample, {group}"])
        )
    over = [
        c.log_id
        for c in checks
        if not c.in_sample
        and c.group == TARGET
        and c.heldout_error is not None
        and abs(c.heldout_error) > 0.05
    ]
    lines.append(f"  {TARGET} logs over 5 %: {len(over)}" + (f" ({', '.join(over)})" if over else ""))
    for c in checks:
        if c.source == FIELD_REPORT:
            lines.append(
                f"  field report {c.log_id}: {c.full_reference or 0:,} logged, "
                f"{c.full_tokens or 0:,} planned, {percent(c.full_error)}"
            )
    for c in checks:
        if c.start_failed:
            verdict = "fits: NO" if c.predicted_fits is False else "fits: yes (WRONG: the start failed)"
            lines.append(
                f"  failed start {c.log_id}: {verdict}; fix that works: {c.fix_that_works or 'none offered'}"
            )
    return lines
