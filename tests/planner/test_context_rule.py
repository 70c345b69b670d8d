"""The context-length rule of engine/facts.py (vLLM's: an unset max_model_len is the model's context and
must fit in the KV cache whole; auto takes the longest that fits) and the planner's verdict on it: the
plan says "fits" for exactly the inputs the engine starts with, and offers the context the engine names.
The real engine on the same inputs: test_builtin_engine_agreement.py."""

from __future__ import annotations

import re

import pytest
from llmdeploy_engine import facts

from llmdeploy.catalog.models import resolve_model
from llmdeploy.planner import PlanInputs, plan_from_inputs

AUTO = facts.AUTO_MAX_MODEL_LEN
MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"  # the default model: 8,192 positions


def test_unset_means_the_models_context_which_must_fit_whole() -> None:
    assert facts.requested_context_len(None, 8192) == 8192
    assert facts.requested_context_len(2048, 8192) == 2048
    assert facts.requested_context_len(AUTO, 8192) == 8192
    # 100 blocks of 16 tokens hold one request of 1,600 tokens
    assert facts.context_problem(1600, 8192, 100, 16) is None
    problem = facts.context_problem(None, 8192, 100, 16)
    assert problem is not None and "(max_model_len unset)" in problem
    assert "the longest context it holds is 1600" in problem
    with pytest.raises(ValueError, match="the longest context it holds is 1600"):
        facts.max_model_len_for(None, 8192, 100, 16)
    with pytest.raises(ValueError, match="max_model_len 1601 needs more KV cache"):
        facts.max_model_len_for(1601, 8192, 100, 16)
    assert facts.max_model_len_for(None, 1600, 100, 16) == 1600
    assert facts.max_model_len_for(1000, 8192, 100, 16) == 1000


def test_auto_takes_the_longest_context_that_fits_up_to_the_models() -> None:
    assert facts.max_model_len_for(AUTO, 8192, 100, 16) == 1600
    assert facts.max_model_len_for(AUTO, 1000, 100, 16) == 1000
    with pytest.raises(ValueError, match="auto: the KV cache holds no block"):
        facts.max_model_len_for(AUTO, 8192, 0, 16)


@pytest.mark.parametrize("kv_cache_memory_gib", [0.05, 0.25, 1.0])
@pytest.mark.parametrize("max_model_len", [None, 1024, 4096, 8192])
def test_the_plan_fits_exactly_when_the_engine_starts(
    kv_cache_memory_gib: float, max_model_len: int | None
) -> None:
    spec = resolve_model(MODEL)
    plan = plan_from_inputs(
        PlanInputs(
            spec=spec,
            engine="builtin",
            device="cpu",
            kv_cache_memory_gib=kv_cache_memory_gib,
            max_model_len=max_model_len,
        )
    )
    model_len = spec.max_position_embeddings
    assert plan.max_model_len == facts.requested_context_len(max_model_len, model_len)
    problem = facts.context_problem(max_model_len, model_len, plan.num_kv_blocks, plan.block_size)
    assert plan.fits == (problem is None), (plan.problems, problem)
    if problem is not None:
        # the plan's first fix is the context the engine's refusal names
        longest = facts.longest_context(plan.num_kv_blocks, plan.block_size, model_len)
        assert f"the longest context it holds is {longest}:" in problem
        offered = re.match(r"--max-model-len ([\d,]+) ", plan.suggestions[0])
        assert offered is not None and int(offered.group(1).replace(",", "")) == longest


def test_the_default_batched_tokens_follow_the_context() -> None:
    assert facts.default_max_num_batched_tokens(512) == 2048
    assert facts.default_max_num_batched_tokens(4096) == 4096
    assert facts.default_max_num_batched_tokens(131072) == 8192
    plan = plan_from_inputs(
        PlanInputs(
            spec=resolve_model(MODEL),
            engine="builtin",
            device="cpu",
            kv_cache_memory_gib=1.0,
            max_model_len=4096,
        )
    )
    assert plan.max_num_batched_tokens == 4096 and plan.max_num_seqs == facts.DEFAULT_MAX_NUM_SEQS
