"""Every fix offered for a plan that does not fit really fits when re-planned (issue 29, item 13:
"does not fit" listed fp8 KV and int4 weights marked "still does not fit"); when nothing fits, the
one suggestion says so."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import pytest

from llmdeploy.catalog.gpus import resolve_gpu
from llmdeploy.catalog.models import resolve_model
from llmdeploy.planner import PlanInputs, plan_from_inputs

CASES = [
    ("meta-llama/Llama-3.1-8B-Instruct", "RTX-3090", 131072),
    ("meta-llama/Llama-3.1-8B-Instruct", "L4", 131072),
    ("meta-llama/Llama-3.1-70B-Instruct", "A100-80GB", 8192),
    ("meta-llama/Llama-3.1-70B-Instruct", "RTX-4090", 32768),
    ("Qwen/Qwen2.5-7B-Instruct", "RTX-4090", 131072),
    ("meta-llama/Llama-3.1-405B", "RTX-3090", 8192),
    ("Qwen/Qwen3-235B-A22B", "A100-40GB", 32768),
]


def _change(text: str) -> dict[str, Any]:
    """The PlanInputs fields one suggestion's text names (the flags a user would type)."""
    fields: dict[str, Any] = {}
    for part in text.split(":")[0].split(" and "):
        if m := re.match(r"--max-model-len ([\d,]+)", part):
            fields["max_model_len"] = int(m.group(1).replace(",", ""))
        elif part.startswith("--kv-cache-dtype fp8"):
            fields["kv_cache_dtype"] = "fp8"
        elif part.startswith("int4 weights"):
            fields["quantization"] = "awq"
        elif m := re.match(r"--tensor-parallel-size (\d+)", part):
            fields["tensor_parallel_size"] = int(m.group(1))
        elif m := re.match(r"a larger GPU, (\S+)", part):
            fields.update(gpu=resolve_gpu(m.group(1)), gpu_memory_gib=None)
        else:
            raise AssertionError(f"a suggestion that names no change: {text!r}")
    return fields


@pytest.mark.parametrize(("model", "gpu", "context"), CASES)
def test_each_suggestion_fits_when_re_planned(model: str, gpu: str, context: int) -> None:
    inputs = PlanInputs(spec=resolve_model(model), gpu=resolve_gpu(gpu), max_model_len=context)
    plan = plan_from_inputs(inputs)
    assert not plan.fits and plan.suggestions
    for text in plan.suggestions:
        if text.startswith("none of the usual changes"):
            assert plan.suggestions == (text,)
            continue
        again = plan_from_inputs(replace(inputs, **_change(text)))
        assert again.fits, f"{text!r} still does not fit: {again.problems}"
        assert "does not fit" not in text


def test_when_nothing_fits_it_says_so() -> None:
    inputs = PlanInputs(
        spec=resolve_model("meta-llama/Llama-3.1-405B"),
        gpu=resolve_gpu("B200"),  # the catalog's largest, at its widest TP, weights and KV already small
        max_model_len=8192,
        tensor_parallel_size=8,
        quantization="awq",
        kv_cache_dtype="fp8",
        gpu_memory_utilization=0.05,
    )
    plan = plan_from_inputs(inputs)
    assert not plan.fits
    assert len(plan.suggestions) == 1 and plan.suggestions[0].startswith("none of the usual changes")
