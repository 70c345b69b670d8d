"""Predicted (planner, builtin rule) vs actual (built-in engine start-up) on a CUDA GPU.

    python tests/planner/builtin_gpu_agreement.py [catalog-id ...]

Builds each model with random weights on the GPU (the engine's `random:<id>`), reads its start-up
report and prints it next to the plan for the same GPU and flags; exits 1 when the KV tokens differ
by more than 10 % or the activation peak (the profile step of max_num_batched_tokens, 8,192 here) by
more than 5 %. Needs torch with CUDA (the lent GPU machine); the planner side needs no GPU.
"""

from __future__ import annotations

import gc
import sys

DEFAULT_MODELS = ("Qwen/Qwen2.5-0.5B", "meta-llama/Llama-3.1-8B", "Qwen/Qwen3-8B")
GIB = 2**30


def compare(model_id: str, max_model_len: int = 8192, utilization: float = 0.9) -> tuple[str, float, float]:
    import torch
    from llmdeploy_engine.config import EngineConfig
    from llmdeploy_engine.runner.model_runner import ModelRunner

    from llmdeploy.catalog.models import resolve_model
    from llmdeploy.planner import PlanInputs, plan_from_inputs

    # the plan is for a process that holds nothing else: what is still held shows in the row (the
    # runner collects dropped engines first and sizes its cache without what is left)
    runner = ModelRunner(
        EngineConfig(
            model=f"random:{model_id}",
            device="cuda",
            gpu_memory_utilization=utilization,
            max_model_len=max_model_len,
        )
    )
    actual = runner.startup_report
    total_gib = torch.cuda.mem_get_info()[1] / GIB
    plan = plan_from_inputs(
        PlanInputs(
            spec=resolve_model(model_id),
            engine="builtin",
            device="cuda",
            gpu_memory_gib=total_gib,
            gpu_memory_utilization=utilization,
            max_model_len=max_model_len,
        )
    )
    error = (plan.kv_cache_tokens - actual.kv_cache_tokens) / actual.kv_cache_tokens
    act_error = plan.activation_gib * GIB / actual.peak_activation_bytes - 1
    row = (
        f"{model_id:<28} weights {plan.weights_gib:6.2f}/{actual.weights_bytes / GIB:6.2f}  "
        f"act {plan.activation_gib:5.2f}/{actual.peak_activation_bytes / GIB:5.2f} ({act_error * 100:+.1f}%)  "
        f"non-torch {plan.non_torch_gib:4.2f}/{actual.non_torch_bytes / GIB:4.2f}  "
        f"KV tokens {plan.kv_cache_tokens:>9,}/{actual.kv_cache_tokens:>9,}  error {error * 100:+.2f}%"
        + (f"  (held before start {actual.held_bytes / GIB:.2f} GiB)" if actual.held_bytes else "")
    )
    del runner
    gc.collect()
    torch.cuda.empty_cache()
    return row, error, act_error


def main(argv: list[str]) -> int:
    models = argv or list(DEFAULT_MODELS)
    print("predicted/actual (GiB) per GPU, built-in engine, gpu_memory_utilization 0.9, max_model_len 8192")
    worst = worst_act = 0.0
    for model_id in models:
        row, error, act_error = compare(model_id)
        print(row, flush=True)
        worst, worst_act = max(worst, abs(error)), max(worst_act, abs(act_error))
    return 0 if worst <= 0.10 and worst_act <= 0.05 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
