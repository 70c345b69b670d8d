"""Planner vs public vLLM start-up logs (llmdeploy/planner/vllm_logs.json, each with its source and quoted lines)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from llmdeploy.memory.footprint import NON_TORCH_RULES, non_torch_rule, release
from llmdeploy.planner.accuracy import (
    DEFAULT_FIXTURES,
    FIELD_REPORT,
    LEGACY,
    TARGET,
    NonTorchObservation,
    check_all,
    fit_non_torch,
    headline,
    load,
    observations,
    report,
    summaries,
)

FIXTURES = Path(__file__).resolve().parents[2] / "llmdeploy" / "planner" / "vllm_logs.json"


def test_fixtures_parse_and_cite_their_source() -> None:
    assert FIXTURES.resolve() == DEFAULT_FIXTURES.resolve()
    data = json.loads(FIXTURES.read_text())
    ids = [e["id"] for e in data["logs"]] + [o["id"] for o in data["non_torch_observations"]]
    assert len(set(e["id"] for e in data["logs"])) == len(data["logs"])
    assert len(set(o["id"] for o in data["non_torch_observations"])) == len(data["non_torch_observations"])
    assert ids
    for item in data["logs"] + data["non_torch_observations"]:
        # a public thread, or a user's field report quoted as the issue states it
        assert item["source"].startswith("https://") or item["source"] == FIELD_REPORT, item["id"]
        assert item["quoted"] and all(isinstance(q, str) and q for q in item["quoted"]), item["id"]
        assert release(str(item["vllm_version"]).split()[0]) is not None
    for entry in data["logs"]:
        assert set(entry["inputs"]) >= {"gpu_memory_utilization", "tensor_parallel_size", "max_model_len"}
        assert "kv_cache_tokens" in entry["logged"] and "kv_cache_gib" in entry["logged"]


def test_logged_figures_appear_in_the_quoted_lines() -> None:
    # the stated numbers were copied from the quotes, not typed in: each one is in some quoted line
    for entry in load()["logs"]:
        text = " ".join(entry["quoted"]).replace(",", "")
        for key in ("kv_cache_tokens", "weights_gib"):
            value = entry["logged"].get(key)
            if value is not None:
                # V0 logs print blocks of 16 tokens instead of tokens
                assert f"{value}" in text or (
                    key == "kv_cache_tokens" and f"blocks: {value // 16}" in text
                ), (
                    entry["id"],
                    key,
                )
    for o in load()["non_torch_observations"]:
        for value in o.get("non_torch_gib_per_rank", [o["non_torch_gib"]]):
            assert f"{value:.2f}GiB" in " ".join(o["quoted"]).replace(" GiB", "GiB"), o["id"]


def test_release_parsing_and_families() -> None:
    assert release("0.8.5") == (0, 8, 5)
    assert release("v0.10.1.dev3") == (0, 10, 1)
    assert release(">=0.21") == (0, 21, 0)
    assert release("0.6.x") == (0, 6, 0)
    assert release(None) is None
    assert non_torch_rule("0.6.5.dev").since == (0, 0, 0)
    assert non_torch_rule("0.7.0").since == (0, 7, 0)
    assert non_torch_rule(None) is NON_TORCH_RULES[-1]


def test_shipped_non_torch_constants_are_the_medians_of_the_logged_lines() -> None:
    obs = observations(load())
    for rule in NON_TORCH_RULES:
        family = [o.obs_id for o in obs if non_torch_rule(o.version) == rule]
        assert sorted(family) == sorted(rule.fitted_on)
        single, multi = fit_non_torch(obs, rule)
        assert single is not None and multi is not None
        assert rule.single_gpu_gib == pytest.approx(round(single, 2), abs=1e-9)
        assert rule.multi_gpu_gib == pytest.approx(round(multi, 2), abs=1e-9)


def test_fit_leaves_out_the_excluded_source() -> None:
    rule = non_torch_rule("0.8.0")
    obs = [
        NonTorchObservation("a", "https://x/1", "0.8.0", 1, 0.1),
        NonTorchObservation("b", "https://x/2", "0.9.0", 1, 0.3),
        NonTorchObservation("c", "https://x/2", "0.9.0", 2, 0.5),
        NonTorchObservation("old", "https://x/3", "0.6.0", 1, 9.0),  # other family
    ]
    assert fit_non_torch(obs, rule) == (pytest.approx(0.2), 0.5)
    assert fit_non_torch(obs, rule, exclude_source="https://x/2") == (0.1, None)


def test_bytes_per_token_part_matches_logged_kv_tokens() -> None:
    # the log's own KV memory divided by our bytes/token must give the log's token count
    # (the PP 2/4 logs quote the first stage's KV memory while the token line is the smallest stage's:
    # they are compared stage to stage instead, below)
    errors = [abs(c.bpt_error) for c in check_all() if c.bpt_error is not None and not c.hybrid]
    assert len(errors) >= 49
    assert statistics.median(errors) <= 0.02
    assert max(errors) <= 0.02


def test_weights_match_the_logged_model_loading_line() -> None:
    checks = [c for c in check_all() if c.weights_error_gib is not None and not c.hybrid]
    assert len(checks) >= 60
    for c in checks:
        assert c.weights_gib is not None
        assert abs(c.weights_error_gib) / c.weights_gib < 0.02, c.log_id  # type: ignore[operator]
    # regression guard at the measured figures: within 0.03 GiB of every "model loading took" line
    # (the Qwen2 TP 2 logs were +0.19 GiB before the allocator rounding was modelled)
    assert max(abs(c.weights_error_gib) for c in checks) <= 0.03  # type: ignore[arg-type]


def test_held_out_error_differs_only_where_the_thread_states_non_torch() -> None:
    data = load()
    sources_with_lines = {o["source"] for o in data["non_torch_observations"]}
    for c in check_all():
        if c.full_error is None or c.heldout_error is None:
            continue
        if c.source not in sources_with_lines:
            assert c.heldout_error == c.full_error, c.log_id


def test_full_prediction_error_regression_guard() -> None:
    # measured (docs/planner.md: vLLM >= 0.7, non-hybrid, held out, n = 50, median 0.55 %, max 62.9 %: the
    # max is Qwen2.5-72B on 2 H100s at 0.19 with a 3 GiB cache, where the TP runs of that sweep leave
    # ~1.9 GiB less KV than planned); a guard against regressions, not proof of a target
    # (the field reports of issue 44 are guarded on their own below)
    figures = summaries([c for c in check_all() if c.source != FIELD_REPORT])
    target = figures[f"full prediction held out, {TARGET}"]
    assert len(target) >= 50
    assert statistics.median(target) <= 0.0056
    assert max(target) <= 0.63
    assert len(figures[f"full prediction, {LEGACY}"]) >= 4
    assert "median |error|" in report(check_all())


def test_logs_say_whether_they_set_a_figure() -> None:
    for entry in load()["logs"]:
        assert isinstance(entry["in_sample"], str), entry["id"]
        assert entry["in_sample"] == "" or entry["in_sample"].startswith("in-sample: "), entry["id"]


def test_hybrid_and_mxfp4_regression_guard() -> None:
    # measured (docs/planner.md): hybrid weights within 0.5 % of "model loading took" but for gpt-oss-20b
    # with TP 2 at 0.19 (planned 0.27 GiB over its 7.01 GiB, 3.9 %); KV tokens held out median 0.91 %,
    # max +15.6 % (120b at 0.11 with a 1.7 GiB cache), logs used to set no figure max 3.6 %
    checks = [c for c in check_all() if c.hybrid]
    weights = [c for c in checks if c.weights_error_gib is not None and c.weights_gib]
    assert len(weights) >= 12
    relative = sorted(abs(c.weights_error_gib) / c.weights_gib for c in weights)  # type: ignore[operator,arg-type]
    assert relative[-2] < 0.005 and relative[-1] <= 0.039
    figures = summaries(check_all())
    hybrid = figures["full prediction held out, hybrid"]
    assert len(hybrid) >= 12 and statistics.median(hybrid) <= 0.0092 and max(hybrid) <= 0.156
    assert max(figures["full prediction out of sample, hybrid"]) <= 0.0365


def test_pipeline_logs_are_compared_stage_to_stage() -> None:
    # llm-d-planner's PP 2/4 logs quote Worker_PP0's lines: the first stage skips the sampler warm-up,
    # so its activation is the forward alone (planned 0.19-0.24 GiB under the logged 1.1 GiB) and its
    # KV memory within 0.1 GiB; the token line follows the last stage, which the plan describes
    checks = {c.log_id: c for c in check_all()}
    for log_id in ("llmdp-llama31-8b-2xh100-pp2", "llmdp-llama31-8b-4xh100-pp4"):
        c = checks[log_id]
        assert c.bpt_error is None
        assert c.activation_error_gib is not None and -0.25 <= c.activation_error_gib <= -0.15
        assert c.kv_error_gib is not None and abs(c.kv_error_gib) <= 0.1
        assert c.full_error is not None and abs(c.full_error) <= 0.001


def test_failed_starts_are_planned_as_not_fitting_with_a_fix_that_works() -> None:
    # a start that failed for lack of memory must come out "fits: NO", and one suggested fix must be
    # one the log shows would have started (a --max-model-len within the KV tokens the start had)
    failed = [c for c in check_all() if c.start_failed]
    assert failed
    for c in failed:
        assert c.predicted_fits is False, c.log_id
        assert c.fix_that_works is not None and "--max-model-len" in c.fix_that_works, c.log_id
    assert all(
        "failed start" in line and "fits: NO" in line
        for line in headline(check_all(), summaries(check_all()))
        if line.strip().startswith("failed start")
    )


def test_field_reports_are_out_of_sample_fixtures() -> None:
    # the field reports of issue 44 (figures as stated there) set no planner figure
    reports = {e["id"]: e for e in load()["logs"] if e["source"] == FIELD_REPORT}
    assert len(reports) == 5
    assert all(e["in_sample"] == "" for e in reports.values())
    logged = {e["id"]: e["logged"]["kv_cache_tokens"] for e in reports.values()}
    assert sorted(logged.values()) == [49_744, 62_512, 62_688, 446_192, 1_170_336]
    checks = check_all()
    text = "\n".join(headline(checks, summaries(checks)))
    assert text.startswith("OUT OF SAMPLE")
    assert all(log_id in text for log_id in reports)
