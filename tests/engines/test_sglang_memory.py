"""SGLang 0.5.15's memory accounting (llmdeploy/engines/sglang_memory.py) against figures worked out
by hand from its server_args.py `_handle_gpu_memory_settings` and pool_configurator.py."""

from __future__ import annotations

import pytest
from render.recipe_factory import make_recipe

from llmdeploy.engines import sglang_memory
from llmdeploy.engines.sglang import SGLANG, static_fraction
from llmdeploy.memory.plan_inputs import GIB, inputs_from_recipe

H100_MIB = 79.22 * 1024  # the catalog's H100 figure, as CUDA reports it


def test_tiers_pick_chunk_and_decode_graph_batch_by_gpu_memory_and_tp() -> None:
    assert sglang_memory.tier_defaults(16 * 1024, 1) == (2048, 8)
    assert sglang_memory.tier_defaults(24 * 1024, 1) == (2048, 24)
    assert sglang_memory.tier_defaults(24 * 1024, 4) == (2048, 80)
    assert sglang_memory.tier_defaults(48 * 1024, 2) == (4096, 32)
    assert sglang_memory.tier_defaults(H100_MIB, 1) == (8192, 256)
    assert sglang_memory.tier_defaults(H100_MIB, 8) == (8192, 512)
    assert sglang_memory.tier_defaults(141 * 1024, 1) == (8192, 256)
    assert sglang_memory.tier_defaults(180 * 1024, 1) == (16384, 512)


def test_prefill_graph_sizes_up_to_8192_tokens_are_58() -> None:
    # 8 (4..32) + 14 (48..256) + 8 (288..512) + 8 (576..1024) + 12 (1280..4096) + 8 (4608..8192)
    sizes = sglang_memory.prefill_graph_sizes(8192)
    assert len(sizes) == 58
    assert sizes[0] == 4 and sizes[-1] == 8192
    assert len(sglang_memory.prefill_graph_sizes(2048)) == 42


def test_h100_reservation_and_fraction_by_hand() -> None:
    reserved = sglang_memory.reservation(H100_MIB, 1, 1, 8192, 256, None, is_mla=False)
    # 512 + 8192 * 1.5 + 256 * 2 + 1 * 1 / 8 * 1024 + 58 * 8 = 13,904 MiB (above the 10 GiB floor)
    assert reserved.activation_mib == 12288
    assert reserved.decode_graphs_mib == 512
    assert reserved.prefill_graphs_mib == 464
    assert reserved.total_mib == 13904
    # SGLang's own default: round((81,121.3 - 13,904) / 81,121.3, 3)
    assert sglang_memory.mem_fraction_static(H100_MIB, 1.0, reserved) == 0.829
    # on 90 % of the GPU: round((73,009.2 - 13,904) / 81,121.3, 3)
    assert sglang_memory.mem_fraction_static(H100_MIB, 0.9, reserved) == 0.729


def test_small_gpu_has_no_floor_and_large_gpu_is_raised_to_ten_gib() -> None:
    # 24 GiB: 512 + 2048 * 1.5 + 24 * 2 + 128 + 42 * 8 = 4,096 MiB
    small = sglang_memory.reservation(24 * 1024, 1, 1, 2048, 24, None, is_mla=False)
    assert small.total_mib == 4096
    assert sglang_memory.mem_fraction_static(24 * 1024, 1.0, small) == 0.833
    # 80 GiB with a 2,048-token chunk: 512 + 3,072 + 512 + 128 + 336 = 4,560, raised to 10,240
    large = sglang_memory.reservation(80 * 1024, 1, 1, 2048, 256, None, is_mla=False)
    assert large.total_mib == 10240


def test_chunking_off_reserves_max_prefill_tokens_and_captures_no_prefill_graph() -> None:
    reserved = sglang_memory.reservation(48 * 1024, 1, 1, -1, 32, None, is_mla=False)
    assert reserved.activation_mib == 16384 * 1.5
    assert reserved.prefill_graphs_mib == 0


def test_mla_reserves_one_and_a_half_gib_for_prefill_graphs_and_context_caps_them() -> None:
    assert sglang_memory.reservation(H100_MIB, 1, 1, 8192, 256, None, is_mla=True).prefill_graphs_mib == 1536
    capped = sglang_memory.reservation(48 * 1024, 1, 1, 4096, 32, 1024, is_mla=False)
    assert capped.prefill_graphs_mib == len(sglang_memory.prefill_graph_sizes(1024)) * 8


def test_pool_tokens_are_whole_cells_in_whole_pages_capped_by_max_total_tokens() -> None:
    # Qwen2.5-7B, fp8 KV: 4 KV heads x (128 + 128) x 28 layers x 1 byte = 28,672 bytes a token
    assert sglang_memory.pool_tokens(GIB, 28672, 16, None) == 37440  # 37,449 cells -> 2,340 pages
    assert sglang_memory.pool_tokens(GIB, 28672, 1, None) == 37449
    assert sglang_memory.pool_tokens(GIB, 28672, 16, 9990) == 9984
    assert sglang_memory.pool_tokens(-1, 28672, 16, None) == 0


def test_plan_charges_weights_against_the_static_pool() -> None:
    recipe = make_recipe(
        "sglang",
        model={"id": "Qwen/Qwen2.5-7B-Instruct", "dtype": "bfloat16"},
        hardware={"gpu": "H100"},
        kv_cache={"dtype": "fp8"},
        limits={"max_model_len": 32768, "max_num_batched_tokens": 8192},
    )
    inputs = inputs_from_recipe(recipe)
    plan = SGLANG.memory_plan(inputs)
    fraction = static_fraction(inputs, chunked_prefill=True)
    assert fraction == 0.729
    pre_model_load = int(inputs.total_memory_gib * GIB) - GIB // 2
    assert plan.usable_gib * GIB == pytest.approx(int(pre_model_load * fraction), abs=1)
    assert plan.kv_cache_gib == pytest.approx(plan.usable_gib - plan.weights_gib)
    assert plan.kv_bytes_per_token == 28672
    assert plan.kv_cache_tokens == int(plan.kv_cache_gib * GIB) // 28672 // 16 * 16
    assert plan.max_concurrency == pytest.approx(plan.kv_cache_tokens / 32768)
    assert plan.fits
    # the table names SGLang's own budget, not vLLM's utilization share; the JSON keys stay the same
    assert "--mem-fraction-static 0.729" in plan.to_table()
    assert "gpu_memory_utilization 0.9" not in plan.to_table()
    assert "usable_label" not in plan.to_json()


def test_explicit_kv_budget_caps_the_pool() -> None:
    recipe = make_recipe(
        "sglang", hardware={"gpu": "H100"}, limits={"kv_cache_memory_gib": 4.0, "max_model_len": 8192}
    )
    plan = SGLANG.memory_plan(inputs_from_recipe(recipe))
    assert plan.kv_cache_gib == 4.0


def _given(extra_args: list[str], **limits: object) -> object:
    return make_recipe(
        "sglang",
        model={"id": "Qwen/Qwen2.5-7B-Instruct", "dtype": "bfloat16"},
        hardware={"gpu": "H100"},
        engine={"type": "sglang", "extra_args": extra_args},
        limits={"max_model_len": 32768, **limits},
    )


def test_a_given_mem_fraction_static_sizes_the_static_pool_and_is_not_rendered_twice() -> None:
    from llmdeploy.planner.plan import make_plan, recipe_inputs
    from llmdeploy.render import engine_command

    for extra in (["--mem-fraction-static", "0.85"], ["--mem-fraction-static=0.85"]):
        recipe = _given(extra)
        inputs = recipe_inputs(recipe)
        assert inputs.mem_fraction_static == 0.85
        plan = make_plan(recipe)
        pre_model_load = int(inputs.total_memory_gib * GIB) - GIB // 2
        assert plan.usable_gib * GIB == pytest.approx(int(pre_model_load * 0.85), abs=1)
        assert plan.kv_cache_gib == pytest.approx(plan.usable_gib - plan.weights_gib)
        assert any("--mem-fraction-static 0.85 (given" in note for note in plan.notes)
        argv = engine_command(recipe).argv
        assert sum(a.startswith("--mem-fraction-static") for a in argv) == 1
    # utilization no longer moves the pool when the fraction is given; without it, it does
    assert make_plan(_given(["--mem-fraction-static", "0.85"], gpu_memory_utilization=0.7)).usable_gib == (
        pytest.approx(make_plan(_given(["--mem-fraction-static", "0.85"])).usable_gib)
    )
    derived = make_plan(_given([]))
    assert recipe_inputs(_given([])).mem_fraction_static is None
    assert any("(derived: SGLang's default formula" in note for note in derived.notes)


def test_a_given_fraction_warns_when_little_is_left_outside_and_fails_only_below_the_weights() -> None:
    from llmdeploy.planner.plan import make_plan

    # SGLang starts whenever its pool holds the weights: too little outside is a runtime risk
    tight = make_plan(_given(["--mem-fraction-static", "0.99"]))
    assert tight.fits and tight.problems == ()
    assert any(
        "expect out-of-memory errors under load; lower --mem-fraction-static" in n for n in tight.notes
    )
    roomy = make_plan(_given(["--mem-fraction-static", "0.6"]))
    assert not any("expect out-of-memory" in n for n in roomy.notes)
    # a pool smaller than Qwen2.5-7B's ~14 GiB of weights on an 80 GB GPU: the start fails
    small = make_plan(_given(["--mem-fraction-static", "0.15"]))
    assert not small.fits
    assert any("no memory left for the KV cache" in p for p in small.problems)


@pytest.mark.parametrize(
    ("extra", "path"),
    [
        (["--mem-fraction-static", "high"], "engine.extra_args.1"),
        (["--enable-metrics", "--mem-fraction-static=1.2"], "engine.extra_args.1"),
        (["--mem-fraction-static", "0"], "engine.extra_args.1"),
    ],
)
def test_a_bad_given_fraction_is_refused_where_it_stands(extra: list[str], path: str) -> None:
    from llmdeploy.errors import UserError
    from llmdeploy.planner.plan import recipe_inputs

    with pytest.raises(UserError) as caught:
        recipe_inputs(_given(extra))
    assert caught.value.problems[0].path == path
    assert "--mem-fraction-static" in (caught.value.problems[0].fix or "")


def test_plan_flag_mode_takes_mem_fraction_static_for_sglang_only() -> None:
    import json

    from click.testing import CliRunner

    from llmdeploy.cli.plan_cmd import plan_command

    args = ["--model", "Qwen/Qwen2.5-7B-Instruct", "--gpu-memory-gib", "79.22", "--max-model-len", "32768"]
    out = CliRunner().invoke(
        plan_command, [*args, "--engine", "sglang", "--mem-fraction-static", "0.8", "--output", "json"]
    )
    assert out.exit_code == 0, out.output
    plan = json.loads(out.output)
    pre_model_load = int(79.22 * GIB) - GIB // 2
    assert plan["usable_gib"] == round(int(pre_model_load * 0.8) / GIB, 2)
    refused = CliRunner().invoke(plan_command, [*args, "--engine", "vllm", "--mem-fraction-static", "0.8"])
    assert refused.exit_code != 0
    assert "SGLang's knob" in refused.output
