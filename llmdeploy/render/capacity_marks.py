"""The memory plan's capacity written into rendered files, so a reviewer sees it in a pull request.

Kubernetes workload objects (and a platform's serving object) carry it as annotations, a Compose
service as labels, a launch script as a comment: KV cache tokens and the concurrency of requests
of max_model_len tokens, per replica. Without a plan nothing is written. The values are the plan's
own figures, so identical input renders identical marks.
"""

from __future__ import annotations

from llmdeploy.planner import MemoryPlan

KV_CACHE_TOKENS = "llmdeploy.io/kv-cache-tokens"
MAX_CONCURRENCY = "llmdeploy.io/max-concurrency"
MAX_MODEL_LEN = "llmdeploy.io/max-model-len"


def capacity_annotations(plan: MemoryPlan | None) -> dict[str, str]:
    """Annotations (or Compose labels) stating the plan's per-replica capacity; empty without a plan."""
    if plan is None:
        return {}
    return {
        KV_CACHE_TOKENS: str(plan.kv_cache_tokens),
        MAX_CONCURRENCY: f"{plan.max_concurrency:.2f}",
        MAX_MODEL_LEN: str(plan.max_model_len),
    }


def capacity_comment(plan: MemoryPlan | None) -> str:
    """One comment line stating the same figures ('' without a plan)."""
    if plan is None:
        return ""
    return (
        f"# Planned capacity per replica: {plan.kv_cache_tokens:,} KV cache tokens, max concurrency "
        f"{plan.max_concurrency:.2f} at max_model_len {plan.max_model_len:,}."
    )
