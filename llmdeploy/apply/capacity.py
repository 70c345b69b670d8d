"""The serving capacity a deployment was planned for, kept on the live Deployment so `diff` can
show how a change moves it: KV cache tokens, concurrency at max_model_len, GPUs.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from llmdeploy.memory.memory_plan import MemoryPlan
from llmdeploy.recipe.schema import Recipe

CAPACITY_ANNOTATION = "llmdeploy.io/capacity"


@dataclass(frozen=True)
class Capacity:
    kv_cache_tokens: int  # per replica
    max_concurrency: float  # per replica, requests of max_model_len
    num_gpus: int  # all replicas

    def to_annotation(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_annotation(cls, text: str | None) -> Capacity | None:
        if not text:
            return None
        try:
            d = json.loads(text)
            return cls(int(d["kv_cache_tokens"]), float(d["max_concurrency"]), int(d["num_gpus"]))
        except (ValueError, KeyError, TypeError):
            return None


def capacity_from_plan(recipe: Recipe, plan: MemoryPlan) -> Capacity:
    """Per-replica KV tokens and concurrency from the plan; GPUs over all replicas from the recipe."""
    p = recipe.parallelism
    gpus = 0 if recipe.hardware.device == "cpu" else p.tensor * p.pipeline * p.replicas
    return Capacity(plan.kv_cache_tokens, round(plan.max_concurrency, 2), gpus)


def _change(label: str, before: float, after: float, fmt: str) -> str:
    if before == after:
        return f"{label} {after:{fmt}} (unchanged)"
    return f"{label} {before:{fmt}} -> {after:{fmt}} ({after - before:+{fmt}})"


def describe_change(before: Capacity | None, after: Capacity) -> str:
    if before is None:
        return (
            f"capacity: KV cache {after.kv_cache_tokens:,} tokens, max concurrency "
            f"{after.max_concurrency:.1f}, {after.num_gpus} GPU(s) (nothing recorded on the live deployment)"
        )
    return "capacity: " + ", ".join(
        [
            _change("KV cache tokens", before.kv_cache_tokens, after.kv_cache_tokens, ","),
            _change("max concurrency", before.max_concurrency, after.max_concurrency, ".1f"),
            _change("GPUs", before.num_gpus, after.num_gpus, "d"),
        ]
    )
