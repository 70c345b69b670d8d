"""The knob -> flag mapping per engine, and knobs an engine cannot honour."""

from __future__ import annotations

import json

import pytest

from llmdeploy.errors import UserError
from llmdeploy.render import engine_command
from render.recipe_factory import make_recipe


def _value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_vllm_flags_use_vllm_names() -> None:
    recipe = make_recipe(
        "vllm",
        parallelism={"tensor": 2, "pipeline": 2},
        kv_cache={"dtype": "fp8_e4m3"},
        limits={
            "max_model_len": 8192,
            "max_num_batched_tokens": 4096,
            "kv_cache_memory_gib": 2,
            "enable_chunked_prefill": False,
        },
        server={"served_model_name": "m", "port": 9000},
    )
    argv = engine_command(recipe, model_ref="/m").argv
    assert argv[:3] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    assert _value(argv, "--model") == "/m"
    assert _value(argv, "--tensor-parallel-size") == "2"
    assert _value(argv, "--pipeline-parallel-size") == "2"
    assert _value(argv, "--kv-cache-dtype") == "fp8_e4m3"
    assert _value(argv, "--max-model-len") == "8192"
    assert _value(argv, "--kv-cache-memory-bytes") == str(2 * 2**30)
    assert "--no-enable-chunked-prefill" in argv and "--enable-prefix-caching" in argv
    assert _value(argv, "--served-model-name") == "m"
    assert _value(argv, "--port") == "9000"


@pytest.mark.parametrize(
    ("engine", "recipe_dtype", "spelled"),
    [
        ("vllm", "fp16", "float16"),
        ("vllm", "fp8", "fp8"),
        ("tgi", "fp8", "fp8_e4m3fn"),
        ("tgi", "fp8_e5m2", "fp8_e5m2"),
        ("builtin", "bf16", "bf16"),
    ],
)
def test_kv_dtype_spellings(engine: str, recipe_dtype: str, spelled: str) -> None:
    argv = engine_command(make_recipe(engine, kv_cache={"dtype": recipe_dtype}), model_ref="/m").argv
    assert _value(argv, "--kv-cache-dtype") == spelled


def test_tgi_mapping() -> None:
    recipe = make_recipe(
        "tgi",
        parallelism={"tensor": 4},
        kv_cache={"prefix_caching": False},
        limits={
            "max_model_len": 4096,
            "max_num_seqs": 64,
            "max_num_batched_tokens": 2048,
            "gpu_memory_utilization": 0.85,
        },
        speculative={"method": "ngram", "num_speculative_tokens": 3},
        server={"api_key": {"env": "MY_KEY"}},
    )
    command = engine_command(recipe, model_ref="org/model")
    argv = command.argv
    assert argv[0] == "text-generation-launcher"
    assert _value(argv, "--model-id") == "org/model"
    assert _value(argv, "--num-shard") == "4"
    assert (_value(argv, "--max-input-tokens"), _value(argv, "--max-total-tokens")) == ("4095", "4096")
    assert _value(argv, "--max-concurrent-requests") == "64"
    assert _value(argv, "--max-batch-prefill-tokens") == "2048"
    assert _value(argv, "--cuda-memory-fraction") == "0.85"
    assert _value(argv, "--speculate") == "3"
    assert command.env["PREFIX_CACHING"] == "0"
    assert [(s.name, s.from_env) for s in command.secrets] == [("API_KEY", "MY_KEY")]
    assert not any("MY_KEY" in a for a in argv)


def test_tgi_kv_budget_comes_from_the_plan() -> None:
    class Plan:
        kv_cache_tokens = 123456

    recipe = make_recipe("tgi", limits={"kv_cache_memory_gib": 10})
    assert _value(engine_command(recipe, Plan(), model_ref="m").argv, "--max-batch-total-tokens") == "123456"
    with pytest.raises(UserError, match="kv_cache_memory_gib"):
        engine_command(recipe, None, model_ref="m")


def test_vllm_speculative_config_json() -> None:
    ngram = make_recipe(
        "vllm", speculative={"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 3}
    )
    config = json.loads(_value(engine_command(ngram, model_ref="m").argv, "--speculative-config"))
    assert config == {
        "method": "ngram",
        "num_speculative_tokens": 5,
        "prompt_lookup_max": 3,
        "prompt_lookup_min": 1,
    }
    draft = make_recipe("vllm", speculative={"method": "draft", "draft_model": "org/small"})
    config = json.loads(_value(engine_command(draft, model_ref="m").argv, "--speculative-config"))
    assert config == {"method": "draft_model", "model": "org/small", "num_speculative_tokens": 4}


def test_builtin_speculative_config_json_is_what_its_parser_reads() -> None:
    ngram = make_recipe(
        "builtin", speculative={"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 3}
    )
    argv = engine_command(ngram, model_ref="m").argv
    config = json.loads(_value(argv, "--speculative-config"))
    assert config == {
        "method": "ngram",
        "num_speculative_tokens": 5,
        "prompt_lookup_max": 3,
        "prompt_lookup_min": 1,
    }
    cli_args = pytest.importorskip("llmdeploy_engine.cli_args")
    parser = cli_args.serve_parser()
    spec = cli_args.config_from_args(parser.parse_args(argv[2:]), parser).speculative_config
    assert (spec.method, spec.num_speculative_tokens, spec.prompt_lookup_max, spec.prompt_lookup_min) == (
        "ngram",
        5,
        3,
        1,
    )
    draft = make_recipe(
        "builtin",
        model={"id": "meta-llama/Llama-3.1-8B-Instruct", "random_weights": True},
        speculative={"method": "draft", "draft_model": "meta-llama/Llama-3.2-1B-Instruct"},
    )
    config = json.loads(_value(engine_command(draft).argv, "--speculative-config"))
    assert config == {
        "method": "draft_model",
        "model": "random:meta-llama/Llama-3.2-1B-Instruct",
        "num_speculative_tokens": 4,
    }


@pytest.mark.parametrize(
    ("engine", "sections", "knob"),
    [
        ("tgi", {"parallelism": {"pipeline": 2}}, "parallelism.pipeline"),
        ("tgi", {"speculative": {"method": "draft", "draft_model": "x"}}, "speculative.method"),
        ("tgi", {"kv_cache": {"block_size": 32}}, "kv_cache.block_size"),
        ("tgi", {"limits": {"enable_chunked_prefill": False}}, "limits.enable_chunked_prefill"),
        ("tgi", {"model": {"id": "a/b", "dtype": "float32"}}, "model.dtype"),
        ("tgi", {"kv_cache": {"dtype": "fp16"}}, "kv_cache.dtype"),
        ("tgi", {"server": {"served_model_name": "other"}}, "server.served_model_name"),
        (
            "builtin",
            {"speculative": {"method": "draft", "draft_model": "org/small"}},
            "speculative.draft_model",
        ),
        ("builtin", {"parallelism": {"pipeline": 2}}, "parallelism.pipeline"),
        ("builtin", {"model": {"id": "a/b", "quantization": "bitsandbytes"}}, "model.quantization"),
        ("vllm", {"model": {"id": "a/b", "quantization": "int8"}}, "model.quantization"),
    ],
)
def test_unsupported_knob_names_engine_and_knob(engine: str, sections: dict[str, object], knob: str) -> None:
    with pytest.raises(UserError) as caught:
        engine_command(make_recipe(engine, **sections), model_ref="m")
    problem = caught.value.problems[0]
    assert problem.path == knob
    assert f"engine '{engine}'" in problem.message


def test_every_unsupported_knob_is_reported_at_once() -> None:
    recipe = make_recipe("tgi", parallelism={"pipeline": 2}, kv_cache={"block_size": 32})
    with pytest.raises(UserError) as caught:
        engine_command(recipe, model_ref="m")
    assert {p.path for p in caught.value.problems} == {"parallelism.pipeline", "kv_cache.block_size"}


def test_extra_args_are_checked_against_the_catalogue() -> None:
    recipe = make_recipe("vllm", engine={"type": "vllm", "extra_args": ["--max-model-length", "4096"]})
    with pytest.raises(UserError, match="--max-model-len"):
        engine_command(recipe, model_ref="m")


def test_secret_reference_stays_a_reference() -> None:
    recipe = make_recipe("vllm", server={"api_key": {"secret": {"name": "s", "key": "k"}}})
    command = engine_command(recipe, model_ref="m")
    assert [(s.name, s.secret_name, s.secret_key) for s in command.secrets] == [("VLLM_API_KEY", "s", "k")]


def test_vllm_on_cpu_needs_blocks_of_32() -> None:
    with pytest.raises(UserError, match=r"kv_cache\.block_size"):
        engine_command(make_recipe("vllm", hardware={"device": "cpu"}), model_ref="m")
    argv = engine_command(
        make_recipe("vllm", hardware={"device": "cpu"}, kv_cache={"block_size": 128}), model_ref="m"
    ).argv
    assert _value(argv, "--block-size") == "128"
