"""llm-d's benchmark report (schema v0.2, the `llmd-benchmark-report` package), one per sweep point.

llm-d's harnesses write one report per treatment (a load level); llm-d's dashboards read them. The
report is built here as plain data from the field list of schema v0.2: the package is only a test
dependency, where every report is validated against its published JSON Schema and pydantic models.
The recipe, the plan's predicted capacity and the engine's reported capacity go into the engine
component's native config, the one free-form place the schema gives a component.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass
from pathlib import Path

from llmdeploy import __version__
from llmdeploy.bench.metrics import Distribution
from llmdeploy.bench.options import BenchOptions, LengthSpec
from llmdeploy.bench.report import BenchReport, LevelReport
from llmdeploy.errors import is_credential_name
from llmdeploy.recipe.schema import Recipe

REPORT_VERSION = "0.2"


@dataclass(frozen=True)
class StackFacts:
    """What llmdeploy knows of the serving side: from the recipe and its plan, and from the engine."""

    recipe: Recipe | None = None
    planned_kv_cache_tokens: int | None = None
    planned_max_concurrency: float | None = None
    engine_kv_cache_tokens: int | None = None
    engine_kv_cache_source: str | None = None


def _cfg_id(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _recipe_json(recipe: Recipe) -> dict[str, object]:
    """The recipe as data; an engine.env value named like a credential is left out (secrets are never written)."""
    data = recipe.model_dump(mode="json")
    env = data.get("engine", {}).get("env") if isinstance(data.get("engine"), dict) else None
    if isinstance(env, dict):
        for name in env:
            if is_credential_name(name):
                env[name] = "<redacted>"
    return data


def _length(spec: LengthSpec) -> dict[str, object]:
    if spec.fixed:
        return {"distribution": "fixed", "value": spec.min_tokens}
    return {
        "distribution": "uniform",
        "value": (spec.min_tokens + spec.max_tokens) / 2,
        "min": spec.min_tokens,
        "max": spec.max_tokens,
    }


def _stats(dist: Distribution, units: str) -> dict[str, object]:
    return {
        "units": units,
        "mean": dist.mean_ms,
        "stddev": dist.std_ms,
        "p50": dist.p50_ms,
        "p90": dist.p90_ms,
        "p99": dist.p99_ms,
    }


def _stack(report: BenchReport, facts: StackFacts) -> dict[str, object]:
    recipe = facts.recipe
    native = {
        "recipe": None if recipe is None else _recipe_json(recipe),
        "planned_capacity": {
            "kv_cache_tokens": facts.planned_kv_cache_tokens,
            "max_concurrency": facts.planned_max_concurrency,
        },
        "engine_capacity": {
            "kv_cache_tokens": facts.engine_kv_cache_tokens,
            "source": facts.engine_kv_cache_source,
        },
    }
    metadata = {
        "label": recipe.name if recipe else "endpoint",
        "cfg_id": _cfg_id(native),
        "description": report.url,
    }
    if recipe is None:
        standardized: dict[str, object] = {
            "kind": "generic",
            "tool": "openai-compatible",
            "tool_version": "unknown",
        }
    else:
        p = recipe.parallelism
        on_cpu = recipe.hardware.device == "cpu"
        standardized = {
            "kind": "inference_engine",
            "tool": recipe.engine.type,
            "tool_version": "unknown",
            "role": "replica",
            "replicas": p.replicas,
            "model": {"name": recipe.model.id},
            "accelerator": {
                "model": "cpu" if on_cpu else str(recipe.hardware.gpu),
                "count": 0 if on_cpu else p.tensor * p.pipeline * p.replicas,
                "parallelism": {"tp": p.tensor, "pp": p.pipeline, "dp": p.replicas},
            },
        }
    return {"metadata": metadata, "standardized": standardized, "native": {"config": native}}


def _load(report: BenchReport, level: LevelReport) -> dict[str, object]:
    o: BenchOptions = report.options
    workload = report.workload.to_json() if report.workload else {}
    standardized: dict[str, object] = {
        "tool": "llmdeploy",
        "tool_version": __version__,
        "source": "sampled" if o.dataset else "random",
        "input_seq_len": _length(o.input_len),
        "concurrency": level.concurrency,
    }
    if o.dataset is None or o.override_dataset_output_len:
        standardized["output_seq_len"] = _length(o.output_len)
    if level.request_rate is not None:
        standardized["rate_qps"] = level.request_rate
    if o.dataset is None and o.workload == "shared-prefix":
        standardized["prefix"] = {
            "prefix_len": {"distribution": "fixed", "value": o.prefix_len},
            "num_groups": 1,
            "num_users_per_group": o.suffixes_per_prefix,
            "num_prefixes": o.num_prefixes,
        }
    if o.dataset is None and o.workload == "multi-turn":
        standardized["multi_turn"] = {
            "enabled": True,
            "max_turns": {"distribution": "fixed", "value": o.num_turns},
        }
    native = {**report.to_json()["options"], "endpoint": o.endpoint, "workload": workload}  # type: ignore[dict-item]
    return {
        "metadata": {
            "cfg_id": _cfg_id(native),
            "description": f"llmdeploy bench, {workload.get('name', 'workload')} at {level.label}",
            "treatment": level.label,
        },
        "standardized": standardized,
        "native": {"config": native},
    }


def llmd_report(
    report: BenchReport, level: LevelReport, facts: StackFacts, experiment: str
) -> dict[str, object]:
    m = level.metrics
    per_request = {
        "units": "count",
        "mean": m.total_input_tokens / m.completed if m.completed else 0.0,
    }
    return {
        "version": REPORT_VERSION,
        "run": {
            "uid": uuid.uuid4().hex,
            "eid": str(uuid.uuid5(uuid.NAMESPACE_URL, experiment)),
            "time": {"duration": f"PT{m.duration_s:.6f}S"},
            "description": f"{report.model} [{experiment} {level.label}]",
            "keywords": ["llmdeploy", report.workload.name if report.workload else "bench"],
        },
        "scenario": {"stack": [_stack(report, facts)], "load": _load(report, level)},
        "results": {
            "request_performance": {
                "aggregate": {
                    "requests": {
                        "total": m.num_requests,
                        "failures": m.failed,
                        "input_length": per_request,
                        "output_length": {
                            "units": "count",
                            "mean": m.total_output_tokens / m.completed if m.completed else 0.0,
                        },
                    },
                    "latency": {
                        "time_to_first_token": _stats(m.ttft, "ms"),
                        "time_per_output_token": _stats(m.tpot, "ms/token"),
                        "inter_token_latency": _stats(m.itl, "ms/token"),
                        "request_latency": _stats(m.e2el, "ms"),
                    },
                    "throughput": {
                        "output_token_rate": {"units": "tokens/s", "mean": m.output_throughput_tok_s},
                        "total_token_rate": {"units": "tokens/s", "mean": m.total_token_throughput_tok_s},
                        "input_token_rate": {
                            "units": "tokens/s",
                            "mean": m.total_token_throughput_tok_s - m.output_throughput_tok_s,
                        },
                        "request_rate": {"units": "queries/s", "mean": m.request_throughput},
                    },
                }
            }
        },
    }


def write_llmd_reports(report: BenchReport, facts: StackFacts, folder: str | Path) -> list[Path]:
    """One `benchmark_report_v0.2_<point>.json` per sweep point; the points share one experiment id."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    experiment = f"llmdeploy-bench-{uuid.uuid4().hex[:12]}"
    paths = []
    for level in report.levels:
        name = f"c{level.concurrency}" + (f"-r{level.request_rate:g}" if level.request_rate else "")
        path = out / f"benchmark_report_v{REPORT_VERSION}_{name}.json"
        path.write_text(
            json.dumps(llmd_report(report, level, facts, experiment), indent=2) + "\n", encoding="utf-8"
        )
        paths.append(path)
    return paths
