"""The recipe schema's engine facts are the built-in engine's (engine/facts.py): its KV dtype names,
spelled out as a Literal for the type checker, and its default budgets."""

from __future__ import annotations

from typing import get_args

from llmdeploy_engine import facts

from llmdeploy.recipe.serving_schema import KVCacheDtype, KVCacheSection, LimitsSection


def test_kv_cache_dtypes_are_the_engines() -> None:
    assert get_args(KVCacheDtype) == facts.KV_CACHE_DTYPES


def test_default_budgets_are_the_engines() -> None:
    limits = LimitsSection()
    assert limits.max_num_seqs == facts.DEFAULT_MAX_NUM_SEQS
    assert limits.gpu_memory_utilization == facts.DEFAULT_GPU_MEMORY_UTILIZATION
    assert KVCacheSection().block_size == facts.DEFAULT_BLOCK_SIZE
