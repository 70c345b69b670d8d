"""SGLang as an engine: launch argv, refusals, its flag catalogue and how smoke reads its KV capacity."""

from __future__ import annotations

import json
import textwrap

import pytest
from render.recipe_factory import make_recipe

from llmdeploy.engines import get_engine
from llmdeploy.engines.catalogue import check_flags, load_catalogue
from llmdeploy.engines.sglang_catalogue_gen import catalogue
from llmdeploy.errors import UserError
from llmdeploy.render import engine_command
from llmdeploy.smoke.kv_capacity import capacity_from_log, capacity_from_metrics


def _argv(**sections: object) -> list[str]:
    sections.setdefault("hardware", {"gpu": "H100"})
    return engine_command(make_recipe("sglang", **sections)).argv


def _value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_launch_argv_maps_the_recipe_knobs_to_server_args() -> None:
    argv = _argv(
        parallelism={"tensor": 2},
        kv_cache={"dtype": "fp8_e5m2", "block_size": 32, "prefix_caching": False},
        limits={"max_model_len": 16384, "max_num_seqs": 64, "max_num_batched_tokens": 4096},
        server={"served_model_name": "llama"},
    )
    assert argv[:3] == ["python3", "-m", "sglang.launch_server"]
    assert _value(argv, "--model-path") == "meta-llama/Llama-3.1-8B-Instruct"
    assert _value(argv, "--tp-size") == "2"
    assert _value(argv, "--kv-cache-dtype") == "fp8_e5m2"
    assert _value(argv, "--page-size") == "32"
    assert "--disable-radix-cache" in argv
    assert _value(argv, "--context-length") == "16384"
    assert _value(argv, "--max-running-requests") == "64"
    assert _value(argv, "--chunked-prefill-size") == "4096"
    assert _value(argv, "--served-model-name") == "llama"
    assert "--enable-metrics" in argv
    float(_value(argv, "--mem-fraction-static"))


def test_mem_fraction_static_follows_gpu_memory_utilization() -> None:
    low = float(_value(_argv(limits={"gpu_memory_utilization": 0.8}), "--mem-fraction-static"))
    high = float(_value(_argv(limits={"gpu_memory_utilization": 0.95}), "--mem-fraction-static"))
    # one GPU's share moves the static fraction by the same share (the reservation is fixed)
    assert high - low == pytest.approx(0.15, abs=0.002)


def test_chunked_prefill_off_is_minus_one_and_the_batch_goes_to_max_prefill_tokens() -> None:
    argv = _argv(limits={"enable_chunked_prefill": False, "max_num_batched_tokens": 32768})
    assert "--chunked-prefill-size=-1" in argv
    assert _value(argv, "--max-prefill-tokens") == "32768"


def test_kv_budget_becomes_max_total_tokens_from_the_plan() -> None:
    from llmdeploy.planner import make_plan

    recipe = make_recipe("sglang", hardware={"gpu": "H100"}, limits={"kv_cache_memory_gib": 4.0})
    plan = make_plan(recipe)
    argv = engine_command(recipe, plan).argv
    assert _value(argv, "--max-total-tokens") == str(plan.kv_cache_tokens)
    with pytest.raises(UserError, match="max-total-tokens"):
        engine_command(recipe)


@pytest.mark.parametrize(
    ("sections", "path"),
    [
        ({"server": {"api_key": {"env": "KEY"}}}, "server.api_key"),
        ({"hardware": {"gpu": "H100", "nodes": 2}}, "hardware.nodes"),
        (
            {"speculative": {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 8}},
            "speculative.prompt_lookup_max",
        ),
        ({"kv_cache": {"dtype": "fp16"}}, "kv_cache.dtype"),
    ],
)
def test_knobs_it_cannot_honour_are_named(sections: dict[str, object], path: str) -> None:
    with pytest.raises(UserError) as caught:
        engine_command(make_recipe("sglang", **{"hardware": {"gpu": "H100"}, **sections}))
    assert path in [p.path for p in caught.value.problems]


def test_speculation_maps_to_ngram_and_standalone_draft() -> None:
    ngram = _argv(speculative={"method": "ngram", "num_speculative_tokens": 3})
    assert _value(ngram, "--speculative-algorithm") == "NGRAM"
    assert _value(ngram, "--speculative-num-draft-tokens") == "3"
    draft = _argv(
        speculative={
            "method": "draft",
            "draft_model": "meta-llama/Llama-3.2-1B-Instruct",
            "num_speculative_tokens": 4,
        }
    )
    assert _value(draft, "--speculative-algorithm") == "STANDALONE"
    assert _value(draft, "--speculative-draft-model-path") == "meta-llama/Llama-3.2-1B-Instruct"
    assert _value(draft, "--speculative-num-steps") == "4"
    assert _value(draft, "--speculative-eagle-topk") == "1"
    assert _value(draft, "--speculative-num-draft-tokens") == "5"


def test_extra_args_are_checked_against_the_catalogue() -> None:
    good = _argv(
        engine={"type": "sglang", "extra_args": ["--enable-torch-compile", "--schedule-policy", "lpm"]}
    )
    assert good[-3:] == ["--enable-torch-compile", "--schedule-policy", "lpm"]
    with pytest.raises(UserError) as caught:
        _argv(engine={"type": "sglang", "extra_args": ["--enable-torch-compil", "--schedule-policy", "x"]})
    messages = [p.message for p in caught.value.problems]
    assert any("no flag --enable-torch-compil" in m for m in messages)
    assert any("--schedule-policy does not accept" in m for m in messages)
    assert any("did you mean --enable-torch-compile" in (p.fix or "") for p in caught.value.problems)


def test_catalogue_has_the_flags_llmdeploy_renders_and_their_aliases() -> None:
    catalogue_file = load_catalogue("sglang", get_engine("sglang").pinned_version)
    assert catalogue_file is not None
    for option in ("--model-path", "--model", "--tp-size", "--tensor-parallel-size", "--mem-fraction-static"):
        assert catalogue_file.lookup(option) is not None, option
    kv = catalogue_file.lookup("--kv-cache-dtype")
    assert kv is not None and kv.choices is not None and "fp8_e4m3" in kv.choices
    assert check_flags("sglang", ["--page-size", "16", "--disable-radix-cache"]) == []


SOURCE = textwrap.dedent(
    """
    MODES = ["a", "b"]
    ALIAS = MODES

    @dataclasses.dataclass
    class ServerArgs:
        model_path: A[str, Arg(help="m", aliases=["--model"])]
        tp_size: A[int, Arg(help="t", aliases=["--tensor-parallel-size"])] = 1
        disable_x: A[bool, "off"] = False
        mode: A[str, Arg(help="m", choices=ALIAS)] = "a"
        kind: A[Literal["p", "q"], "k"] = "p"
        sizes: A[Optional[List[int]], "s"] = None
        hidden: A[bool, Arg(no_cli=True)] = False
        plain: Optional[str] = None
        toggle: A[bool, Arg(help="t", action=argparse.BooleanOptionalAction)] = True

        @staticmethod
        def add_cli_args(parser):
            add_cli_args_from_dataclass(parser, ServerArgs)
            parser.add_argument("--parser", type=str, choices=["auto"] + registry_keys)
            parser.add_argument("--old", action=DeprecatedStoreTrueAction, dest="disable_x")
    """
)


def test_catalogue_generator_derives_options_as_add_cli_args_from_dataclass_does() -> None:
    rows = {r["flag"]: r for r in catalogue(SOURCE, "9.9", "test")["flags"]}
    assert sorted(rows) == [
        "--disable-x", "--kind", "--mode", "--model", "--no-toggle", "--old", "--parser", "--sizes", "--tensor-parallel-size"
    ]  # fmt: skip
    assert rows["--model"]["option_strings"] == ["--model", "--model-path"]
    assert rows["--tensor-parallel-size"]["dest"] == "tp_size"
    assert (rows["--disable-x"]["kind"], rows["--disable-x"]["nargs"]) == ("flag", 0)
    assert rows["--mode"]["choices"] == ["a", "b"]
    assert rows["--kind"]["choices"] == ["p", "q"]
    assert rows["--sizes"]["nargs"] == "+"
    # the first long option in sorted order names a row, as catalogue_gen.py does for vLLM
    assert rows["--no-toggle"]["option_strings"] == ["--no-toggle", "--toggle"]
    assert rows["--no-toggle"]["kind"] == "bool_optional"
    assert rows["--parser"]["choices"] is None  # built from a registry at run time: left open
    assert rows["--old"]["kind"] == "flag"
    json.dumps(rows)


def test_kv_capacity_from_its_gauge_and_from_its_start_up_line(tmp_path: object) -> None:
    metrics = (
        "# TYPE sglang:max_total_num_tokens gauge\n"
        'sglang:max_total_num_tokens{model_name="qwen",engine_type="unified",tp_rank="0"} 1617856.0\n'
        'sglang:token_usage{model_name="qwen"} 0.0\n'
    )
    found = capacity_from_metrics(metrics)
    assert found is not None and found.tokens == 1617856 and "sglang:max_total_num_tokens" in found.source
    from pathlib import Path

    log = Path(str(tmp_path)) / "engine.log"
    log.write_text(
        "[2026-07-13 10:00:01 TP0] Load weight end. type=Qwen2ForCausalLM, avail mem=64.93 GB\n"
        "[2026-07-13 10:00:02 TP0] KV Cache is allocated. dtype: torch.float8_e4m3fn, #tokens: 1617856, "
        "K size: 21.60 GB, V size: 21.60 GB\n"
    )
    from_log = capacity_from_log(log)
    assert from_log is not None and from_log.tokens == 1617856
