"""Cross-field rules, on the real catalog and planner."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmdeploy.engines.builtin import BUILTIN_ARCHITECTURES, BUILTIN_KV_DTYPES
from llmdeploy.errors import Problem
from llmdeploy.planner import make_plan
from llmdeploy.planner.recipe_checks import check_recipe, recipe_notes
from llmdeploy.recipe import load_recipe

ROOT = Path(__file__).resolve().parents[2]
LLAMA_8B = "model: {id: meta-llama/Llama-3.1-8B-Instruct}\nhardware: {gpu: A100-80GB}\n"


def _check(tmp_path: Path, text: str, *overrides: str) -> list[Problem]:
    path = tmp_path / "r.yaml"
    path.write_text(text)
    recipe = load_recipe(path, overrides=overrides, env={})
    return check_recipe(recipe, make_plan(recipe))


def _only(problems: list[Problem], path: str) -> Problem:
    matching = [p for p in problems if p.path == path]
    assert len(matching) == 1, [p.render() for p in problems]
    return matching[0]


def test_a_sound_recipe_has_no_problems(tmp_path: Path) -> None:
    assert _check(tmp_path, LLAMA_8B, "limits.max_model_len=8192") == []


def test_tensor_parallelism_must_divide_attention_heads(tmp_path: Path) -> None:
    problems = _check(tmp_path, LLAMA_8B, "parallelism.tensor=3", "hardware.gpus_per_node=4")
    problem = _only(problems, "parallelism.tensor")
    assert "does not divide the model's 32 attention heads" in problem.message
    assert problem.fix == "use one of: 1, 2, 4, 8"


def test_kv_heads_and_tensor_parallelism_must_divide_one_another(tmp_path: Path) -> None:
    qwen = "model: {id: Qwen/Qwen2.5-7B-Instruct}\nhardware: {gpu: H100, gpus_per_node: 8, nodes: 2}\n"
    problem = _only(
        _check(tmp_path, qwen, "parallelism.tensor=14", "limits.max_model_len=8192"), "parallelism.tensor"
    )
    assert "4 KV heads: one must divide the other" in problem.message


def test_gpus_per_replica_must_fit_the_hardware(tmp_path: Path) -> None:
    problems = _check(
        tmp_path, LLAMA_8B, "parallelism.tensor=2", "parallelism.pipeline=2", "hardware.gpus_per_node=2"
    )
    problem = _only(problems, "parallelism")
    assert "2 x 2 = 4 GPUs" in problem.message and "2 x 1 = 2" in problem.message


def test_pipeline_cannot_exceed_layers(tmp_path: Path) -> None:
    smol = "model: {id: HuggingFaceTB/SmolLM2-135M-Instruct}\nhardware: {gpu: H100, gpus_per_node: 8, nodes: 8}\n"
    problem = _only(_check(tmp_path, smol, "parallelism.pipeline=64"), "parallelism.pipeline")
    assert "exceeds the model's 30 layers" in problem.message


def test_max_model_len_within_the_model_context(tmp_path: Path) -> None:
    problem = _only(_check(tmp_path, LLAMA_8B, "limits.max_model_len=200000"), "limits.max_model_len")
    assert "exceeds the model's context of 131,072 tokens" in problem.message
    assert problem.fix == "set limits.max_model_len to at most 131072"


def test_fp8_moe_weights_need_fp8_hardware(tmp_path: Path) -> None:
    mixtral = "model: {id: mistralai/Mixtral-8x7B-Instruct-v0.1, quantization: fp8}\n"
    mixtral += "hardware: {gpu: A100-80GB, gpus_per_node: 2}\nparallelism: {tensor: 2}\nlimits: {max_model_len: 8192}\n"
    assert (
        "fp8 MoE weights need a GPU with fp8 support"
        in _only(_check(tmp_path, mixtral), "model.quantization").message
    )
    assert all(p.path != "model.quantization" for p in _check(tmp_path, mixtral, "hardware.gpu=H100"))


def test_fp8_on_ampere_is_a_note_for_vllm_and_fp8_weights_an_error_for_tgi(tmp_path: Path) -> None:
    assert _check(tmp_path, LLAMA_8B, "kv_cache.dtype=fp8", "limits.max_model_len=8192") == []
    assert _check(tmp_path, LLAMA_8B, "model.quantization=fp8", "limits.max_model_len=8192") == []
    recipe = load_recipe(ROOT / "recipes/production.yaml", env={})
    assert any("no fp8 tensor cores" in note for note in recipe_notes(recipe))
    problems = _check(
        tmp_path, LLAMA_8B, "model.quantization=fp8", "engine.type=tgi", "limits.max_model_len=8192"
    )
    assert "TGI's fp8 weights need a GPU with fp8 support" in _only(problems, "model.quantization").message
    tgi_h100 = _check(
        tmp_path,
        LLAMA_8B,
        "model.quantization=fp8",
        "engine.type=tgi",
        "hardware.gpu=H100",
        "limits.max_model_len=8192",
    )
    assert all(p.path != "model.quantization" for p in tgi_h100)


def test_tgi_prefill_tokens_cover_the_longest_input(tmp_path: Path) -> None:
    problems = _check(
        tmp_path,
        LLAMA_8B,
        "engine.type=tgi",
        "limits.max_model_len=8192",
        "limits.max_num_batched_tokens=4096",
    )
    problem = _only(problems, "limits.max_num_batched_tokens")
    assert "--max-batch-prefill-tokens (4,096) >= --max-input-tokens (8,191" in problem.message


def test_tgi_cannot_use_a_draft_model_gguf_or_pipeline(tmp_path: Path) -> None:
    problems = _check(
        tmp_path,
        LLAMA_8B,
        "engine.type=tgi",
        "limits.max_model_len=8192",
        "speculative.method=draft",
        "speculative.draft_model=meta-llama/Llama-3.2-1B-Instruct",
        "parallelism.pipeline=2",
        "hardware.gpus_per_node=2",
    )
    assert "TGI cannot speculate with a separate draft model" in _only(problems, "speculative.method").message
    assert "TGI has no pipeline parallelism" in _only(problems, "parallelism.pipeline").message


def test_request_shape_must_fit_max_model_len(tmp_path: Path) -> None:
    problems = _check(
        tmp_path, LLAMA_8B, "limits.max_model_len=4096", "bench.input_len=4000", "bench.output_len=200"
    )
    assert (
        "bench requests of up to 4,200 tokens (input + output) exceed max_model_len 4,096"
        in _only(problems, "bench").message
    )


def test_default_bench_shape_never_fails_a_short_context(tmp_path: Path) -> None:
    assert all(p.path != "bench" for p in _check(tmp_path, LLAMA_8B, "limits.max_model_len=200"))


def test_builtin_engine_limits(tmp_path: Path) -> None:
    problems = _check(
        tmp_path,
        "model: {id: mistralai/Mixtral-8x7B-Instruct-v0.1, quantization: awq}\nhardware: {gpu: H100}\n"
        "engine: {type: builtin}\nkv_cache: {dtype: fp8}\nlimits: {max_model_len: 4096}\n",
    )
    assert (
        "the built-in engine cannot run MixtralForCausalLM with MoE/MLA layers"
        in _only(problems, "engine.type").message
    )
    assert not [p for p in problems if p.path == "kv_cache.dtype"]  # fp8 KV is supported
    assert not [p for p in problems if p.path == "model.quantization"]  # AWQ int4 is supported
    refused = _check(
        tmp_path,
        "model: {id: meta-llama/Llama-3.1-8B-Instruct, quantization: bitsandbytes}\nhardware: {gpu: H100}\n"
        "engine: {type: builtin}\nlimits: {max_model_len: 4096}\n",
    )
    assert _only(refused, "model.quantization").value == "bitsandbytes"


def test_builtin_engine_speculation(tmp_path: Path) -> None:
    builtin = (
        "model: {id: meta-llama/Llama-3.1-8B-Instruct}\nhardware: {gpu: H100}\nengine: {type: builtin}\n"
    )
    assert _check(tmp_path, builtin, "speculative.method=ngram", "limits.max_model_len=8192") == []
    draft = (
        "speculative.method=draft",
        "speculative.draft_model=meta-llama/Llama-3.2-1B-Instruct",
        "limits.max_model_len=8192",
    )
    problem = _only(_check(tmp_path, builtin, *draft), "speculative.draft_model")
    assert "cannot fetch a draft model" in problem.message
    assert _check(tmp_path, builtin, "model.random_weights=true", *draft) == []


@pytest.mark.parametrize("dtype", ["fp8", "fp8_e4m3", "fp8_e5m2"])
def test_builtin_fp8_kv_validates_and_plans_one_byte_per_element(tmp_path: Path, dtype: str) -> None:
    text = LLAMA_8B.replace("A100-80GB", "H100") + "engine: {type: builtin}\nlimits: {max_model_len: 8192}\n"
    assert _check(tmp_path, text, f"kv_cache.dtype={dtype}") == []
    path = tmp_path / "r.yaml"
    fp8 = make_plan(load_recipe(path, overrides=(f"kv_cache.dtype={dtype}",), env={}))
    bf16 = make_plan(load_recipe(path, overrides=("kv_cache.dtype=bf16",), env={}))
    assert fp8.kv_bytes_per_token == 2 * 32 * 8 * 128 * 1 == bf16.kv_bytes_per_token // 2
    assert fp8.kv_cache_gib == bf16.kv_cache_gib
    assert fp8.kv_cache_tokens in range(2 * bf16.kv_cache_tokens - 16, 2 * bf16.kv_cache_tokens + 17)


def test_builtin_kv_dtypes_match_the_engine() -> None:
    kv_cache = pytest.importorskip("llmdeploy_engine.kernels.kv_cache")
    assert set(BUILTIN_KV_DTYPES) - {"auto"} <= set(kv_cache.KV_CACHE_DTYPES)


def test_builtin_architectures_match_the_engine() -> None:
    model = pytest.importorskip("llmdeploy_engine.model.model")
    assert tuple(BUILTIN_ARCHITECTURES.values()) == tuple(model.SUPPORTED_ARCHITECTURES)


def test_draft_model_must_share_the_vocabulary_and_be_smaller(tmp_path: Path) -> None:
    qwen = "model: {id: Qwen/Qwen2.5-7B-Instruct}\nhardware: {gpu: H100}\nlimits: {max_model_len: 8192}\n"
    problems = _check(
        tmp_path, qwen, "speculative.method=draft", "speculative.draft_model=Qwen/Qwen2.5-0.5B-Instruct"
    )
    assert (
        "vocabulary (151,936 tokens) differs from the target's (152,064)"
        in _only(problems, "speculative.draft_model").message
    )
    problems = _check(
        tmp_path,
        "model: {id: meta-llama/Llama-3.2-1B-Instruct}\nhardware: {gpu: H100}\nlimits: {max_model_len: 8192}\n",
        "speculative.method=draft",
        "speculative.draft_model=meta-llama/Llama-3.1-8B-Instruct",
    )
    assert "is not smaller than the target" in _only(problems, "speculative.draft_model").message


def test_a_plan_that_does_not_fit_brings_its_fixes(tmp_path: Path) -> None:
    big = "model: {id: meta-llama/Llama-3.1-70B-Instruct}\nhardware: {gpu: RTX-4090}\nlimits: {max_model_len: 8192}\n"
    problems = _check(tmp_path, big)
    unfit = [p for p in problems if p.message.startswith("does not fit")]
    assert unfit and all(p.fix for p in unfit)


def test_validate_cli_points_rule_problems_at_their_line(tmp_path: Path) -> None:
    path = tmp_path / "tp.yaml"
    path.write_text(LLAMA_8B + "parallelism:\n  tensor: 3\n")
    done = subprocess.run(
        [sys.executable, "-m", "llmdeploy.cli.main", "validate", str(path)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "tp.yaml:4: parallelism.tensor: tensor parallelism 3 does not divide" in done.stderr


@pytest.mark.slow
def test_every_shipped_recipe_validates() -> None:
    recipes = sorted(str(p) for p in (ROOT / "recipes").glob("*.yaml"))
    done = subprocess.run(
        [sys.executable, "-m", "llmdeploy.cli.main", "validate", *recipes],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "AGENT_API_KEY": "x"},
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("OK ") == len(recipes)


def test_validate_reports_knobs_the_engine_mapping_cannot_honour(tmp_path: Path) -> None:
    path = tmp_path / "tgi.yaml"
    path.write_text(
        "model: {id: mistralai/Mistral-7B-Instruct-v0.3}\nhardware: {gpu: L40S}\nengine: {type: tgi}\n"
        "kv_cache:\n  block_size: 32\nlimits: {max_model_len: 8192}\nspeculative: {method: draft, draft_model: meta-llama/Llama-3.2-1B-Instruct}\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "llmdeploy.cli.main", "validate", str(path)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "tgi.yaml:5: kv_cache.block_size: engine 'tgi' cannot honour kv_cache.block_size" in done.stderr
    # reported once, by the rule, although the flag mapping refuses it too
    assert done.stderr.startswith("error: 2 problems found")
    assert "TGI cannot speculate with a separate draft model" in done.stderr
    assert "cannot honour speculative.method" not in done.stderr


def test_vllm_batch_token_limits(tmp_path: Path) -> None:
    problems = _check(tmp_path, LLAMA_8B, "limits.max_model_len=8192", "limits.max_num_batched_tokens=64")
    assert (
        "max_num_batched_tokens (64) >= max_num_seqs (256)"
        in _only(problems, "limits.max_num_batched_tokens").message
    )
    problems = _check(
        tmp_path,
        LLAMA_8B,
        "limits.max_model_len=8192",
        "limits.max_num_batched_tokens=4096",
        "limits.enable_chunked_prefill=false",
    )
    assert "without chunked prefill" in _only(problems, "limits.max_num_batched_tokens").message
