"""On the GPU machine: the planner's builtin rule vs the engine's measured start-up (within 2 %)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("model_id", ["Qwen/Qwen2.5-0.5B", "meta-llama/Llama-3.1-8B"])
def test_builtin_plan_matches_engine_on_cuda(model_id: str) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from builtin_gpu_agreement import compare

    row, error = compare(model_id)
    print(row)
    assert abs(error) <= 0.02, row
