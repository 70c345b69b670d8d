"""The four classic back-of-envelope scenarios (weights = params x bytes, flat 1.5 GB overhead,
KV/token = 2 x layers x KV heads x head dim x bytes), reproduced by `plan`'s shape-only mode."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from llmdeploy.cli.plan_cmd import plan_command
from llmdeploy.planner.envelope import envelope_budget

LLAMA_8B = ["--params-b", "8", "--num-layers", "32", "--num-kv-heads", "8", "--head-dim", "128"]
LLAMA_70B = ["--params-b", "70", "--num-layers", "80", "--num-kv-heads", "8", "--head-dim", "128"]

# (name, flags, hand-computed KV tokens, concurrency at the context, fits)
SCENARIOS = [
    # 24 GB - 16 GB - 1.5 GB = 6.5 GB; 6.5e9 / 131,072 B = 49,591 tokens; 8K context -> 6.05 requests
    ("rtx4090-llama8b-fp16", [*LLAMA_8B, "--gpu", "RTX-4090", "--max-model-len", "8192"], 49_591, 6.05, True),
    # 80 - 16 - 1.5 = 62.5 GB -> 476,837 tokens -> 58.2 requests of 8K
    ("a100-llama8b-fp16", [*LLAMA_8B, "--gpu", "A100-80GB", "--max-model-len", "8192"], 476_837, 58.21, True),
    # same budget, 128K context: 3.64 requests
    (
        "a100-llama8b-128k",
        [*LLAMA_8B, "--gpu", "A100-80GB", "--max-model-len", "131072"],
        476_837,
        3.64,
        True,
    ),
    # 70B int4: 35 GB weights; 80 - 35 - 1.5 = 43.5 GB; 327,680 B/token -> 132,751 tokens
    (
        "h100-llama70b-int4",
        [*LLAMA_70B, "--weight-bytes", "0.5", "--gpu", "H100", "--max-model-len", "8192"],
        132_751,
        16.2,
        True,
    ),
]


@pytest.mark.parametrize(
    ("name", "flags", "tokens", "concurrency", "fits"), SCENARIOS, ids=[s[0] for s in SCENARIOS]
)
def test_classic_scenarios(name: str, flags: list[str], tokens: int, concurrency: float, fits: bool) -> None:
    out = CliRunner().invoke(plan_command, [*flags, "--output", "json"])
    assert out.exit_code == 0, out.output
    plan = json.loads(out.output)
    assert plan["engine"] == "envelope"
    assert plan["kv_cache_tokens"] == tokens
    assert plan["max_concurrency"] == pytest.approx(concurrency, abs=0.01)
    assert plan["fits"] is fits


def test_fp16_70b_does_not_fit_one_h100() -> None:
    budget = envelope_budget(70, 80, 8, 128, 80, weight_bytes=2)
    assert budget.kv_tokens == 0 and not budget.fits
