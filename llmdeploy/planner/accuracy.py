"""Planner accuracy against public vLLM start-up logs (`python -m llmdeploy.planner.accuracy [--markdown] [FILE]`).

Checks per log (`vllm_logs.json`, package data beside this module, each with its source and the quoted lines):
- bytes/token: the log's own "Available KV cache memory" divided as the planner divides it (whole
  blocks of the KV layout) must give the log's "GPU KV cache size";
- weights: the planner's per-GPU weights vs "Model loading took";
- full: the planner's whole estimate (weights, activation, non-torch, graphs) for the log's GPU and
  flags vs the logged KV tokens (or, when the thread shows no token line, the tokens its logged KV
  memory holds, marked "derived"). The non-torch constants are medians of logged non-torch lines
  (`footprint.NON_TORCH_RULES`); the "held-out" error re-fits them without the lines of the log's own
  thread, so no log is predicted with a constant that its own numbers helped to set.

- failed starts: a log whose start failed for lack of memory (`start_failed`) must be planned as not
  fitting, with a suggested fix that the log shows would have started (a `--max-model-len` no longer
  than the KV tokens the failed start had).

Groups: vLLM >= 0.7 non-hybrid (the accuracy target), vLLM < 0.7 (V0's older non-torch accounting)
and hybrid/sliding-window models, reported separately. The headline is the out-of-sample set: the
logs used to set no planner figure (`in_sample` empty), with the non-torch medians re-fitted without
their thread.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmdeploy.catalog.gpus import resolve_gpu
from llmdeploy.catalog.models import resolve_model
from llmdeploy.engines.vllm import graphs_in_budget, kv_capacity, vllm_activation_bytes, vllm_defaults
from llmdeploy.errors import UserError
from llmdeploy.memory.footprint import NON_TORCH_RULES, NonTorchRule, non_torch_rule, vllm_non_torch_bytes
from llmdeploy.memory.plan_inputs import GIB, PlanInputs
from llmdeploy.planner.accuracy_headline import FIELD_REPORT, headline, summary_line
from llmdeploy.planner.accuracy_result import HYBRID, LEGACY, TARGET, LogCheck, percent
from llmdeploy.planner.accuracy_table import markdown
from llmdeploy.planner.plan import plan_for, plan_from_inputs

# package data, so the check runs from an installed wheel as from a checkout
DEFAULT_FIXTURES = Path(__file__).resolve().with_name("vllm_logs.json")


@dataclass(frozen=True)
class NonTorchObservation:
    obs_id: str
    source: str
    version: str
    tensor_parallel_size: int
    non_torch_gib: float


def _release_text(entry: dict[str, Any]) -> str:
    return str(entry["vllm_version"]).split()[0]


def _inputs(entry: dict[str, Any]) -> PlanInputs:
    flags = {k: v for k, v in entry["inputs"].items() if v is not None}
    try:
        gpu = resolve_gpu(entry["gpu"])
    except UserError:
        gpu = None  # e.g. "24 GB GPU (model not stated)"
    return PlanInputs(
        spec=resolve_model(entry["model"]),
        engine="vllm",
        engine_version=_release_text(entry),
        gpu=gpu,
        gpu_memory_gib=entry.get("total_gpu_memory_gib") or 80.0,
        **flags,
    )


def load(path: Path = DEFAULT_FIXTURES) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def observations(data: dict[str, Any]) -> list[NonTorchObservation]:
    out = []
    for o in data.get("non_torch_observations", []):
        ranks = o.get("non_torch_gib_per_rank")
        value = statistics.median(ranks) if ranks else o["non_torch_gib"]
        out.append(
            NonTorchObservation(o["id"], o["source"], _release_text(o), int(o["tensor_parallel_size"]), value)
        )
    return out


def fit_non_torch(
    obs: list[NonTorchObservation], rule: NonTorchRule, exclude_source: str | None = None
) -> tuple[float | None, float | None]:
    """(single-GPU, multi-GPU) medians of the observations of `rule`'s release family, without those
    from `exclude_source`; None where no observation is left."""
    family = [o for o in obs if non_torch_rule(o.version) == rule and o.source != exclude_source]
    single = [o.non_torch_gib for o in family if o.tensor_parallel_size == 1]
    multi = [o.non_torch_gib for o in family if o.tensor_parallel_size > 1]
    return (
        statistics.median(single) if single else None,
        statistics.median(multi) if multi else None,
    )


def _tokens_for(kv_bytes: int, inputs: PlanInputs) -> int:
    batched = inputs.max_num_batched_tokens or vllm_defaults(inputs)[0]
    return kv_capacity(inputs, kv_bytes, batched)[2]


def _group(entry: dict[str, Any]) -> str:
    if entry.get("hybrid"):
        return HYBRID
    return TARGET if non_torch_rule(_release_text(entry)).since >= (0, 7, 0) else LEGACY


def _logged_stage(entry: dict[str, Any]) -> int | None:
    """The pipeline stage whose "Available KV cache memory" line is quoted (vLLM prefixes worker
    lines with Worker_PP<i>), None when the line names none."""
    for line in entry["quoted"]:
        found = re.search(r"Worker_PP(\d+)\b.*Available KV cache memory", line)
        if found:
            return int(found.group(1))
    return None


_CONTEXT_FIX = re.compile(r"--max-model-len ([\d,]+)")


def failed_start_verdict(entry: dict[str, Any], inputs: PlanInputs) -> tuple[bool, str | None]:
    """(the plan fits, the first suggested fix the log shows would have worked) for a log whose start
    failed: a shorter --max-model-len works when it is no longer than the KV tokens the start had."""
    plan = plan_from_inputs(inputs)
    capacity = entry["logged"].get("kv_cache_tokens")
    for fix in plan.suggestions:
        found = _CONTEXT_FIX.search(fix)
        if found and capacity and int(found.group(1).replace(",", "")) <= capacity:
            return plan.fits, fix
    return plan.fits, None


def check_log(entry: dict[str, Any], obs: list[NonTorchObservation] | None = None) -> LogCheck:
    inputs = _inputs(entry)
    logged = entry["logged"]
    tokens = logged.get("kv_cache_tokens")
    bpt_tokens = bpt_error = None
    # with PP each stage sizes its own cache and vLLM prints the smallest stage's block count, so a
    # quoted memory line of an earlier stage (which skips the sampler warm-up) is compared stage to
    # stage for activation and KV memory, and not against the token line
    stage = _logged_stage(entry) if inputs.pipeline_parallel_size > 1 else None
    earlier_stage = stage is not None and stage < inputs.pipeline_parallel_size - 1
    if tokens and logged.get("kv_cache_gib") and not earlier_stage:
        bpt_tokens = _tokens_for(int(logged["kv_cache_gib"] * GIB), inputs)
        bpt_error = (bpt_tokens - tokens) / tokens
    full_tokens = full_error = act_err = kv_err = heldout_tokens = heldout_error = None
    weights_err = None
    reference, derived = tokens, False
    plan = plan_for(inputs)
    if logged.get("weights_gib") is not None:
        weights_err = plan.weights_gib - logged["weights_gib"]
    if entry.get("total_gpu_memory_gib"):
        full_tokens = plan.kv_cache_tokens
        if reference is None and logged.get("kv_cache_gib"):
            reference, derived = _tokens_for(int(logged["kv_cache_gib"] * GIB), inputs), True
        if reference:
            full_error = (full_tokens - reference) / reference
        graphs = plan.cuda_graph_gib if graphs_in_budget(inputs) else 0.0
        raw_kv = plan.usable_gib - plan.weights_gib - plan.activation_gib - plan.non_torch_gib - graphs
        stage_act = plan.activation_gib
        if earlier_stage:
            batched, seqs = vllm_defaults(inputs)
            stage_act = vllm_activation_bytes(inputs, batched, seqs, sampler_stage=False) / GIB
        if logged.get("activation_gib") is not None:
            act_err = stage_act - logged["activation_gib"]
        if logged.get("kv_cache_gib") is not None:
            kv_err = raw_kv + plan.activation_gib - stage_act - logged["kv_cache_gib"]
        if obs is not None and reference:
            parallel = inputs.tensor_parallel_size * inputs.pipeline_parallel_size > 1
            refit = fit_non_torch(obs, non_torch_rule(inputs.engine_version), exclude_source=entry["source"])[
                1 if parallel else 0
            ]
            if refit is not None:
                shipped = vllm_non_torch_bytes(inputs)
                heldout_kv = int(raw_kv * GIB) + shipped - int(refit * GIB)
                heldout_tokens = _tokens_for(heldout_kv, inputs) if heldout_kv > 0 else 0
                heldout_error = (heldout_tokens - reference) / reference
    failed = bool(entry.get("start_failed"))
    predicted_fits, fix = failed_start_verdict(entry, inputs) if failed else (plan.fits, None)
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
        group=_group(entry),
        model=inputs.spec.hf_id,
        gpu=inputs.gpu.name if inputs.gpu else str(entry["gpu"]).split()[0] + "?",
        version=_release_text(entry),
        weights_gib=logged.get("weights_gib"),
        heldout_tokens=heldout_tokens,
        heldout_error=heldout_error,
        in_sample=str(entry.get("in_sample", "")),
        start_failed=failed,
        predicted_fits=predicted_fits,
        fix_that_works=fix,
    )


def check_all(path: Path = DEFAULT_FIXTURES) -> list[LogCheck]:
    data = load(path)
    obs = observations(data)
    return [check_log(e, obs) for e in data["logs"]]


def _gib(x: float | None) -> str:
    return "-" if x is None else f"{x:+.2f}"


def summaries(checks: list[LogCheck]) -> dict[str, list[float]]:
    """|error| lists per reported figure (used by the report and the regression tests)."""
    out: dict[str, list[float]] = {
        "bytes/token check (non-hybrid)": [
            abs(c.bpt_error) for c in checks if c.bpt_error is not None and not c.hybrid
        ]
    }
    for group in (TARGET, LEGACY, HYBRID):
        rows = [c for c in checks if c.group == group]
        out[f"full prediction, {group}"] = [abs(c.full_error) for c in rows if c.full_error is not None]
        out[f"full prediction held out, {group}"] = [
            abs(c.heldout_error) for c in rows if c.heldout_error is not None
        ]
        # logs used to set no figure at all (non-torch re-fitted without their thread)
        out[f"full prediction out of sample, {group}"] = [
            abs(c.heldout_error) for c in rows if c.heldout_error is not None and not c.in_sample
        ]
    return out


def report(checks: list[LogCheck]) -> str:
    lines = [
        *headline(checks, summaries(checks)),
        "",
        f"{'log':<48}{'model':<28}{'GPU':<10}{'vLLM':<10}{'group':<10}{'ref tok':>11}{'pred tok':>10}{'error':>9}"
        f"{'held-out':>9}{'bpt err':>9}{'dW GiB':>8}{'dAct':>7}{'dKV':>7}  in-sample",
    ]
    for c in checks:
        ref = (
            "-"
            if c.full_reference is None
            else f"{c.full_reference:,}" + ("*" if c.full_reference_derived else "")
        )
        if c.full_tokens is None and c.logged_tokens:
            ref = f"{c.logged_tokens:,}"
        pred = "-" if c.full_tokens is None else f"{c.full_tokens:,}"
        lines.append(
            f"{c.log_id:<48}{c.model[-27:]:<28}{c.gpu:<10}{c.version[:9]:<10}{c.group:<10}{ref:>11}{pred:>10}"
            f"{percent(c.full_error):>9}{percent(c.heldout_error):>9}{percent(c.bpt_error):>9}{_gib(c.weights_error_gib):>8}"
            f"{_gib(c.activation_error_gib):>7}{_gib(c.kv_error_gib):>7}  {'yes' if c.in_sample else '-'}"
        )
    for label, errors in summaries(checks).items():
        lines.append(summary_line(label, errors))
    lines.append("* reference derived from the log's KV memory (the thread shows no token line)")
    lines.append(
        "held-out: the non-torch constant re-fitted without the thread's own non-torch lines (the same as error "
        "where the thread has none; - where no other line of its release family is left)"
    )
    for rule in NON_TORCH_RULES:
        since = ".".join(str(x) for x in rule.since)
        lines.append(
            f"non-torch since {since}: {rule.single_gpu_gib:.2f} GiB (1 GPU), {rule.multi_gpu_gib:.2f} GiB (TP/PP), "
            f"median of {len(rule.fitted_on)} logged lines"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    as_markdown = "--markdown" in args
    files = [a for a in args if a != "--markdown"]
    checks = check_all(Path(files[0]) if files else DEFAULT_FIXTURES)
    if as_markdown:
        print(markdown(checks))
    else:
        print(report(checks))


if __name__ == "__main__":
    main()

__all__ = [
    "FIELD_REPORT",
    "HYBRID",
    "LEGACY",
    "TARGET",
    "LogCheck",
    "NonTorchObservation",
    "check_all",
    "check_log",
    "failed_start_verdict",
    "fit_non_torch",
    "headline",
    "load",
    "main",
    "observations",
    "report",
    "summaries",
]
