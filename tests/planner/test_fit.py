"""`plan --fit`: the roofline model, replica sizing for both target kinds, ranking, prices, the CLI."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from llmdeploy.catalog.gpus import resolve_gpu
from llmdeploy.catalog.models import resolve_model
from llmdeploy.catalog.prices import load_prices, shipped_prices
from llmdeploy.cli.main import main
from llmdeploy.cli.plan_cmd import plan_command
from llmdeploy.errors import UserError
from llmdeploy.memory.plan_inputs import PlanInputs
from llmdeploy.planner.fit import FitTarget, fit
from llmdeploy.planner.plan import plan_for
from llmdeploy.planner.roofline import (
    ACHIEVABLE_BANDWIDTH_FRACTION,
    decode_step,
    decode_tok_s,
    prefill_step,
)

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"


def _base(model: str = LLAMA_8B, **kw: object) -> PlanInputs:
    return PlanInputs(spec=resolve_model(model), **kw)  # type: ignore[arg-type]


def test_single_stream_decode_reads_the_weights_once() -> None:
    h200 = resolve_gpu("H200")
    inputs = replace(_base(), gpu=h200)
    step = decode_step(inputs, h200, batch=1, context=256)
    spec = inputs.spec
    weights = spec.num_params * 2
    kv = 256 * 2 * spec.num_kv_heads * spec.head_dim * 2 * spec.num_layers
    assert step.bytes_read == pytest.approx(weights + kv, rel=0.01)
    assert step.bound == "memory"
    bandwidth = h200.bandwidth_gb_s * 1e9 * ACHIEVABLE_BANDWIDTH_FRACTION
    assert step.seconds == pytest.approx((weights + kv) / bandwidth, rel=0.01)


def test_batching_raises_throughput_until_compute_bound() -> None:
    h200 = resolve_gpu("H200")
    inputs = replace(_base(), gpu=h200)
    rates = [decode_tok_s(inputs, h200, b, 512) for b in (1, 8, 64, 256)]
    assert rates == sorted(rates) and rates[-1] > 20 * rates[0]
    # a long prompt in one step is compute-bound on every GPU
    assert prefill_step(inputs, h200, 8192).bound == "compute"
    # tensor parallelism halves what each GPU reads
    tp2 = replace(inputs, tensor_parallel_size=2)
    assert decode_step(tp2, h200, 1, 512).bytes_read == pytest.approx(
        decode_step(inputs, h200, 1, 512).bytes_read / 2, rel=0.02
    )


def test_moe_decode_reads_only_the_routed_experts_at_batch_one() -> None:
    spec = resolve_model("Qwen/Qwen3-30B-A3B")
    h200 = resolve_gpu("H200")
    inputs = PlanInputs(spec=spec, gpu=h200)
    one = decode_step(inputs, h200, 1, 128).bytes_read
    many = decode_step(inputs, h200, 512, 1).bytes_read
    assert one < 0.3 * spec.num_params * 2  # ~3B of 30B parameters active
    assert many == pytest.approx(spec.num_params * 2, rel=0.05)  # every expert touched


def test_concurrency_target_replicas_and_ranking() -> None:
    target = FitTarget(max_model_len=32768, concurrency=64)
    prices = shipped_prices()
    result = fit(_base(), target, [resolve_gpu("H200"), resolve_gpu("A100-80GB")], prices)
    assert result.options
    for option in result.options:
        plan = plan_for(
            replace(
                _base(),
                gpu=resolve_gpu(option.gpu),
                tensor_parallel_size=option.tensor_parallel_size,
                max_model_len=32768,
            )
        )
        held = min(plan.max_num_seqs, math.floor(plan.max_concurrency))
        assert option.sequences_per_replica == held
        assert option.replicas == math.ceil(64 / held)
        assert option.usd_per_hour == pytest.approx(prices[option.gpu] * option.num_gpus)
    costs = [o.usd_per_hour for o in result.options]
    assert costs == sorted(costs)  # type: ignore[type-var]


def test_gpu_too_small_is_rejected_with_the_engine_reason() -> None:
    result = fit(
        _base("meta-llama/Llama-3.1-70B-Instruct"),
        FitTarget(max_model_len=8192, concurrency=4),
        [resolve_gpu("RTX-4090")],
        {},
    )
    assert all(o.tensor_parallel_size >= 8 for o in result.options)
    assert any(r.tensor_parallel_size == 1 for r in result.rejected)


def test_tpot_limit_adds_replicas() -> None:
    gpus = [resolve_gpu("H200")]
    loose = fit(_base(), FitTarget(max_model_len=4096, concurrency=256), gpus, {}).options[0]
    tight_ms = loose.tpot_ms / 2
    tight = fit(_base(), FitTarget(max_model_len=4096, concurrency=256, p99_tpot_ms=tight_ms), gpus, {})
    one_gpu = next(o for o in tight.options if o.tensor_parallel_size == 1)
    assert one_gpu.replicas > loose.replicas and one_gpu.tpot_ms <= tight_ms


def test_rate_target_follows_littles_law() -> None:
    gpus = [resolve_gpu("H100-SXM")]
    target = FitTarget(max_model_len=8192, requests_per_s=20, input_tokens=1000, output_tokens=200)
    option = next(o for o in fit(_base(), target, gpus, {}).options if o.tensor_parallel_size == 1)
    rate = 20 / option.replicas
    assert option.ttft_ms is not None
    expected = rate * (option.ttft_ms + 200 * option.tpot_ms) / 1e3
    assert option.batch_per_replica == pytest.approx(expected, rel=0.05)
    more = FitTarget(max_model_len=8192, requests_per_s=200, input_tokens=1000, output_tokens=200)
    bigger = next(o for o in fit(_base(), more, gpus, {}).options if o.tensor_parallel_size == 1)
    assert bigger.replicas > option.replicas


def test_target_errors() -> None:
    with pytest.raises(UserError, match="one target"):
        FitTarget(max_model_len=4096)
    with pytest.raises(UserError, match="input and output"):
        FitTarget(max_model_len=4096, requests_per_s=3)
    with pytest.raises(UserError, match="exceed the context"):
        FitTarget(max_model_len=1000, requests_per_s=3, input_tokens=900, output_tokens=200)


def test_price_file_overrides_and_errors(tmp_path: Path) -> None:
    good = tmp_path / "prices.yaml"
    good.write_text("h200: 9.5\nB200: 1\n")
    prices = load_prices(good)
    assert prices["H200"] == 9.5 and prices["B200"] == 1.0 and prices["L4"] == shipped_prices()["L4"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("H300: 2\nL4: cheap\n")
    with pytest.raises(UserError) as e:
        load_prices(bad)
    text = str(e.value)
    assert "unknown GPU 'H300'" in text and "L4" in text and str(bad) in text


def test_cli_fit_json_and_table(tmp_path: Path) -> None:
    args = ["--fit", "--model", LLAMA_8B, "--max-model-len", "32768", "--target-concurrency", "64"]
    out = CliRunner().invoke(plan_command, [*args, "--output", "json", "--gpu", "H200", "--gpu", "L40S"])
    assert out.exit_code == 0, out.output
    body = json.loads(out.output)
    assert {o["gpu"] for o in body["options"]} == {"H200", "L40S"}
    first = body["options"][0]
    for key in (
        "tensor_parallel_size",
        "replicas",
        "kv_cache_tokens",
        "max_concurrency",
        "decode_tok_s_per_replica",
    ):
        assert key in first
    table = CliRunner().invoke(plan_command, [*args, "--top", "3"])
    assert table.exit_code == 0 and "decode tok/s" in table.output and "more (--output json" in table.output


def test_cli_fit_from_recipe_targets(tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "name: fit\nmodel: {id: meta-llama/Llama-3.1-8B-Instruct}\n"
        "limits: {max_model_len: 8192, target_requests_per_s: 5, target_input_tokens: 2000, "
        "target_output_tokens: 300, target_p99_ttft_ms: 2000}\n"
    )
    out = CliRunner().invoke(plan_command, [str(recipe), "--fit", "--output", "json", "--gpu", "H100"])
    assert out.exit_code == 0, out.output
    body = json.loads(out.output)
    assert "5 requests/s" in body["target"] and body["options"]
    assert all(o["ttft_ms"] <= 2000 for o in body["options"])


def test_cli_fit_without_target_is_one_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as e:
        main(["plan", "--fit", "--model", LLAMA_8B, "--max-model-len", "4096"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "plan --fit needs a target" in err and "--target-concurrency" in err and "Traceback" not in err
