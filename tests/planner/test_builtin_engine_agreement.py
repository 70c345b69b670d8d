"""The planner's builtin rule against the real built-in engine on CPU (default model): same KV
bytes per token, same number of blocks, weights within 1 %; the same verdict and context length for an
unset max_model_len (engine/facts.py's rule, vLLM's)."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
from default_model import DEFAULT_MODEL_GGUF, needs_default_model

from llmdeploy.catalog.models import resolve_model
from llmdeploy.planner import PlanInputs, plan_from_inputs

GGUF = DEFAULT_MODEL_GGUF
pytestmark = [pytest.mark.slow, needs_default_model]


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


def test_plan_and_engine_agree_on_an_unset_max_model_len() -> None:
    """The default model's 8,192 positions need 0.35 GiB of float32 KV; with 0.25 GiB the plan says
    "fits: NO" and the engine refuses to start, both naming the same longest context; with that
    context (or auto on the engine) both start with it."""
    pytest.importorskip("torch")
    from llmdeploy_engine.config import EngineConfig
    from llmdeploy_engine.facts import AUTO_MAX_MODEL_LEN
    from llmdeploy_engine.runner.model_runner import ModelRunner

    budget_gib = 0.25
    inputs = PlanInputs(
        spec=resolve_model(str(GGUF)), engine="builtin", device="cpu", kv_cache_memory_gib=budget_gib
    )
    plan = plan_from_inputs(inputs)
    assert not plan.fits and plan.max_model_len == 8192
    offered = re.match(r"--max-model-len ([\d,]+) ", plan.suggestions[0])
    assert offered is not None
    longest = int(offered.group(1).replace(",", ""))
    assert 0 < longest < 8192

    def runner(max_model_len: int | None) -> ModelRunner:
        config = EngineConfig(
            model=str(GGUF),
            device="cpu",
            kv_cache_memory_bytes=int(budget_gib * 2**30),
            max_model_len=max_model_len,
        )
        return ModelRunner(config)

    with pytest.raises(ValueError, match=f"the longest context it holds is {longest}:"):
        runner(None)
    fitted = plan_from_inputs(replace(inputs, max_model_len=longest))
    assert fitted.fits
    assert (
        runner(longest).max_model_len
        == runner(AUTO_MAX_MODEL_LEN).max_model_len
        == fitted.max_model_len
        == longest
    )
