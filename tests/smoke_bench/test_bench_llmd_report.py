"""`--report llmd`: llm-d's benchmark report v0.2, validated against the `llmd-benchmark-report`
package's published JSON Schema and its own pydantic models."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import resources
from pathlib import Path

import jsonschema
import pytest
from llmd_benchmark_report import BenchmarkReportV02

from llmdeploy.bench.llmd_report import StackFacts, llmd_report, write_llmd_reports
from llmdeploy.bench.metrics import compute_metrics
from llmdeploy.bench.options import BenchOptions, LengthSpec
from llmdeploy.bench.report import BenchReport, LevelReport
from llmdeploy.bench.request import RequestResult
from llmdeploy.bench.slo import check_slos
from llmdeploy.bench.words import PromptCalibration
from llmdeploy.bench.workload import make_workload
from llmdeploy.planner import make_plan
from llmdeploy.recipe import load_recipe

REPO = Path(__file__).resolve().parents[2]
SCHEMA = json.loads(
    resources.files("llmd_benchmark_report").joinpath("br_v0_2_json_schema.json").read_text(encoding="utf-8")
)


def validate(doc: dict[str, object]) -> None:
    jsonschema.Draft202012Validator(SCHEMA).validate(doc)
    BenchmarkReportV02.model_validate(doc)  # the package's own checks too (units, concurrency)


def _report(options: BenchOptions, num_gpus: int | None = None) -> BenchReport:
    results = [
        RequestResult(True, None, 30 + i, 8, True, 0.05 + i / 100, tuple([0.01] * 7), 0.12 + i / 100)
        for i in range(5)
    ]
    levels = []
    for concurrency, rate in options.points:
        metrics = compute_metrics(results, 1.5)
        levels.append(LevelReport(concurrency, rate, metrics, check_slos(metrics, options.slo)))
    workload = make_workload(options, PromptCalibration())
    return BenchReport("http://h:8000", "m", options, None, tuple(levels), (), workload.summary, num_gpus)


def test_report_per_point_with_recipe_plan_and_engine_capacity(tmp_path: Path) -> None:
    recipe = load_recipe(REPO / "recipes" / "production.yaml")
    plan = make_plan(recipe)
    facts = StackFacts(
        recipe, plan.kv_cache_tokens, plan.max_concurrency, 123_456, "/metrics vllm:cache_config_info"
    )
    options = BenchOptions(
        num_requests=5, concurrency=(1, 4), request_rates=(2.0,), input_len=LengthSpec(16, 64)
    )
    paths = write_llmd_reports(_report(options, num_gpus=1), facts, tmp_path)
    assert [p.name for p in paths] == ["benchmark_report_v0.2_c1-r2.json", "benchmark_report_v0.2_c4-r2.json"]
    docs = [json.loads(p.read_text()) for p in paths]
    for doc in docs:
        validate(doc)
        assert doc["version"] == "0.2"
        (engine,) = doc["scenario"]["stack"]
        assert engine["standardized"]["kind"] == "inference_engine"
        assert engine["standardized"]["model"]["name"] == recipe.model.id
        p = recipe.parallelism
        assert engine["standardized"]["accelerator"]["count"] == p.tensor * p.pipeline * p.replicas
        config = engine["native"]["config"]
        assert config["recipe"]["name"] == "production"
        assert config["planned_capacity"]["kv_cache_tokens"] == plan.kv_cache_tokens
        assert config["engine_capacity"] == {
            "kv_cache_tokens": 123_456,
            "source": "/metrics vllm:cache_config_info",
        }
        load = doc["scenario"]["load"]["standardized"]
        assert load["rate_qps"] == 2.0 and load["input_seq_len"] == {
            "distribution": "uniform",
            "value": 40.0,
            "min": 16,
            "max": 64,
        }
        aggregate = doc["results"]["request_performance"]["aggregate"]
        assert (
            aggregate["requests"]["total"] == 5
            and aggregate["latency"]["time_to_first_token"]["units"] == "ms"
        )
    assert [d["scenario"]["load"]["standardized"]["concurrency"] for d in docs] == [1, 4]
    assert docs[0]["run"]["eid"] == docs[1]["run"]["eid"] and docs[0]["run"]["uid"] != docs[1]["run"]["uid"]


@pytest.mark.parametrize(
    "options",
    [
        BenchOptions(num_requests=5, workload="shared-prefix", num_prefixes=2, suffixes_per_prefix=3),
        BenchOptions(num_requests=5, workload="multi-turn", endpoint="chat", num_turns=2),
    ],
    ids=["shared-prefix", "multi-turn"],
)
def test_workload_shapes_validate_without_a_recipe(options: BenchOptions) -> None:
    report = _report(options)
    doc = llmd_report(report, report.levels[0], StackFacts(), "experiment")
    validate(doc)
    load = doc["scenario"]["load"]["standardized"]
    assert ("prefix" in load) == (options.workload == "shared-prefix")
    assert ("multi_turn" in load) == (options.workload == "multi-turn")
    assert doc["scenario"]["stack"][0]["standardized"]["kind"] == "generic"


@pytest.mark.slow
def test_cli_writes_valid_reports_with_engine_capacity(fault_server: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable, "-m", "llmdeploy.cli.main", "bench", "--url", fault_server, "--model", "ok",
            "--num-requests", "4", "--concurrency", "1,2", "--input-len", "8", "--output-len", "4",
            "--warmup-requests", "0", "--no-progress", "--report", "llmd", "--report-dir", str(tmp_path / "out"),
        ],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    paths = sorted((tmp_path / "out").glob("*.json"))
    assert [p.name for p in paths] == ["benchmark_report_v0.2_c1.json", "benchmark_report_v0.2_c2.json"]
    for path in paths:
        doc = json.loads(path.read_text())
        validate(doc)
        assert doc["scenario"]["stack"][0]["native"]["config"]["engine_capacity"]["kv_cache_tokens"] == 1000
        assert doc["results"]["request_performance"]["aggregate"]["requests"]["output_length"]["mean"] == 4
