"""The built-in engine's plan counts quantized weights as the engine stores them (issue 28): AWQ /
GPTQ int4 projections at 4 bits plus a 16-bit scale and a 16-bit zero point per group of 128 (the
tinygemm layout CUDA GPUs hold them in), fp8 at
one byte, the embedding, LM head and norms 16-bit; GGUF files dequantized to 16-bit."""

from __future__ import annotations

import pytest
from llmdeploy_engine import facts as builtin_rule

from llmdeploy.catalog import resolve_model
from llmdeploy.catalog.gpus import resolve_gpu
from llmdeploy.memory.plan_inputs import PlanInputs
from llmdeploy.planner.plan import plan_for

GIB = 2**30


@pytest.mark.parametrize(
    ("quantization", "weights_gib"),
    # Llama-3.1-8B: 6.98e9 projection parameters, 1.05e9 in embedding + head (bf16)
    [("none", 14.96), ("awq", 5.41), ("gptq", 5.41), ("fp8", 8.46)],
)
def test_llama_8b_weights_as_stored(quantization: str, weights_gib: float) -> None:
    spec = resolve_model("meta-llama/Llama-3.1-8B-Instruct")
    inputs = PlanInputs(spec=spec, engine="builtin", gpu=resolve_gpu("H100"), quantization=quantization)
    assert plan_for(inputs).weights_gib == pytest.approx(weights_gib, abs=0.02)


def test_weights_bytes_rule() -> None:
    assert builtin_rule.weights_bytes(1000, 0, 2, "awq") == 2000
    assert builtin_rule.weights_bytes(1024 + 10, 1024, 2, "awq") == 1024 * 0.5 + 1024 * 4 // 128 + 20
    assert builtin_rule.weights_bytes(1024 + 10, 1024, 2, "fp8") == 1024 + 20
    assert builtin_rule.weights_bytes(1034, 1024, 2, "gguf") == 2068  # dequantized at load
