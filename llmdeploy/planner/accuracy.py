"""Planner accuracy against public vLLM start-up logs (`python -m llmdeploy.planner.accuracy [FILE]`).

Two checks per log:
- bytes/token: the log's own "Available KV cache memory" divided as the planner divides it
  (whole blocks of the KV layout) must give the log's "GPU KV cache size".
- full: the planner's whole estimate (weights, activation, non-torch, graphs) for the log's GPU and
  flags, compared with the logged KV tokens (or, when the thread shows no token line, with the tokens
  its logged KV memory holds, marked "derived").
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmdeploy.catalog.gpus import resolve_gpu
from llmdeploy.catalog.models import resolve_model
from llmdeploy.errors import UserError
from llmdeploy.planner.engine_rules import graphs_in_budget, kv_capacity, plan_for, vllm_defaults
from llmdeploy.planner.plan_inputs import GIB, PlanInputs

DEFAULT_FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "planner" / "fixtures" / "vllm_logs.json"


@dataclass(frozen=True)
class LogCheck:
    log_id: str
    source: str
    hybrid: bool
    logged_tokens: int | None
    bpt_tokens: int | None  # from the logged KV memory and our bytes/token
    bpt_error: float | None
    full_tokens: int | None  # from our whole estimate
    full_reference: int | None
    full_reference_derived: bool
    full_error: float | None
    weights_error_gib: float | None
    activation_error_gib: float | None
    kv_error_gib: float | None = None  # predicted minus logged KV memory (before clamping at 0)


def _inputs(entry: dict[str, Any]) -> PlanInputs:
    flags = {k: v for k, v in entry["inputs"].items() if v is not None}
    version = entry["vllm_version"].split()[0].lstrip(">=")
    try:
        gpu = resolve_gpu(entry["gpu"])
    except UserError:
        gpu = None  # e.g. "24 GB GPU (model not stated)"
    return PlanInputs(
        spec=resolve_model(entry["model"]),
        engine="vllm",
        engine_version=version,
        gpu=gpu,
        gpu_memory_gib=entry.get("total_gpu_memory_gib") or 80.0,
        **flags,
    )


def _tokens_for(kv_gib: float, inputs: PlanInputs) -> int:
    batched = inputs.max_num_batched_tokens or vllm_defaults(inputs)[0]
    return kv_capacity(inputs, int(kv_gib * GIB), batched)[2]


def check_log(entry: dict[str, Any]) -> LogCheck:
    inputs = _inputs(entry)
    logged = entry["logged"]
    tokens = logged.get("kv_cache_tokens")
    bpt_tokens = bpt_error = None
    if tokens and logged.get("kv_cache_gib"):
        bpt_tokens = _tokens_for(logged["kv_cache_gib"], inputs)
        bpt_error = (bpt_tokens - tokens) / tokens
    full_tokens = full_error = weights_err = act_err = kv_err = None
    reference, derived = tokens, False
    if entry.get("total_gpu_memory_gib"):
        plan = plan_for(inputs)
        full_tokens = plan.kv_cache_tokens
        if reference is None and logged.get("kv_cache_gib"):
            reference, derived = _tokens_for(logged["kv_cache_gib"], inputs), True
        if reference:
            full_error = (full_tokens - reference) / reference
        if logged.get("weights_gib") is not None:
            weights_err = plan.weights_gib - logged["weights_gib"]
        if logged.get("activation_gib") is not None:
            act_err = plan.activation_gib - logged["activation_gib"]
        if logged.get("kv_cache_gib") is not None:
            graphs = plan.cuda_graph_gib if graphs_in_budget(inputs) else 0.0
            raw_kv = plan.usable_gib - plan.weights_gib - plan.activation_gib - plan.non_torch_gib - graphs
            kv_err = raw_kv - logged["kv_cache_gib"]
    return LogCheck(
        entry["id"],
        entry["source"],
        bool(entry.get("hybrid")),
        tokens,
        bpt_tokens,
        bpt_error,
        full_tokens,
        reference,
        derived,
        full_error,
        weights_err,
        act_err,
        kv_err,
    )


def check_all(path: Path = DEFAULT_FIXTURES) -> list[LogCheck]:
    data = json.loads(path.read_text())
    return [check_log(e) for e in data["logs"]]


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:+.2f}%"


def _gib(x: float | None) -> str:
    return "-" if x is None else f"{x:+.2f}"


def report(checks: list[LogCheck]) -> str:
    lines = [
        f"{'log':<46}{'logged tok':>11}{'bpt tok':>10}{'bpt err':>9}{'full tok':>11}{'ref tok':>12}{'full err':>10}"
        f"{'dW GiB':>8}{'dAct GiB':>9}{'dKV GiB':>8}"
    ]
    for c in checks:
        ref = (
            "-"
            if c.full_reference is None
            else f"{c.full_reference:,}" + ("*" if c.full_reference_derived else "")
        )
        lines.append(
            f"{c.log_id:<46}{c.logged_tokens or '-':>11}{c.bpt_tokens or '-':>10}{_pct(c.bpt_error):>9}"
            f"{c.full_tokens if c.full_tokens is not None else '-':>11}{ref:>12}{_pct(c.full_error):>10}"
            f"{_gib(c.weights_error_gib):>8}{_gib(c.activation_error_gib):>9}{_gib(c.kv_error_gib):>8}"
        )
    for label, errors in (
        ("bytes/token check", [abs(c.bpt_error) for c in checks if c.bpt_error is not None and not c.hybrid]),
        ("full prediction", [abs(c.full_error) for c in checks if c.full_error is not None and not c.hybrid]),
    ):
        if errors:
            lines.append(
                f"{label}: n={len(errors)} median |error| {statistics.median(errors) * 100:.2f}%, "
                f"max {max(errors) * 100:.2f}%"
            )
    lines.append("* reference derived from the log's KV memory (the thread shows no token line)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    path = Path(args[0]) if args else DEFAULT_FIXTURES
    print(report(check_all(path)))


if __name__ == "__main__":
    main()

__all__ = ["LogCheck", "check_all", "check_log", "main", "report"]
