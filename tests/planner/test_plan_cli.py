"""`llmdeploy plan`: recipe mode, recipe-free mode with vLLM flag names, errors without tracebacks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from llmdeploy.cli.plan_cmd import plan_command

REPO = Path(__file__).resolve().parents[2]
RECIPE = """\
name: plan-test
model:
  id: meta-llama/Llama-3.1-8B-Instruct
hardware:
  gpu: A100-80GB
kv_cache:
  dtype: fp8
limits:
  max_model_len: 32768
"""


def test_recipe_mode_json_and_set(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(RECIPE)
    out = CliRunner().invoke(plan_command, [str(path), "--output", "json"])
    assert out.exit_code == 0, out.output
    plan = json.loads(out.output)
    assert plan["fits"] and plan["kv_bytes_per_token"] == 65_536 and plan["gpu"] == "A100-80GB"
    out = CliRunner().invoke(
        plan_command,
        [
            str(path),
            "--set",
            "hardware.gpu=RTX-4090",
            "--set",
            "limits.max_model_len=131072",
            "--output",
            "json",
        ],
    )
    # the plan is still printed; the memory gate refuses the recipe (exit 2, as validate's JSON mode)
    assert out.exit_code == 2, out.output
    small = json.loads(out.stdout)
    assert not small["fits"] and small["suggestions"]


def test_recipe_free_mode_with_vllm_flags() -> None:
    args = [
        "--model",
        "Qwen/Qwen2.5-7B-Instruct",
        "--gpu-memory-gib",
        "79.19",
        "--gpu-memory-utilization",
        "0.85",
        "--max-model-len",
        "16384",
        "--tensor-parallel-size",
        "2",
        "--pipeline-parallel-size",
        "1",
        "--dtype",
        "bfloat16",
        "--quantization",
        "none",
        "--kv-cache-dtype",
        "fp8",
        "--max-num-batched-tokens",
        "4096",
        "--max-num-seqs",
        "64",
        "--engine",
        "vllm",
        "--output",
        "json",
    ]
    out = CliRunner().invoke(plan_command, args)
    assert out.exit_code == 0, out.output
    plan = json.loads(out.output)
    assert plan["tensor_parallel_size"] == 2 and plan["max_num_batched_tokens"] == 4096
    assert plan["kv_bytes_per_token"] == 2 * 28 * 2 * 128 * 1
    assert plan["usable_gib"] == round(79.19 * 0.85, 2)


def test_table_lists_every_part() -> None:
    out = CliRunner().invoke(plan_command, ["--model", "Qwen/Qwen3-8B", "--gpu", "L40S"])
    assert out.exit_code == 0, out.output
    for label in ("weights", "activations", "non-torch", "CUDA graphs", "KV cache", "headroom", "fits: yes"):
        assert label in out.output


def test_user_errors_exit_2_without_traceback() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "llmdeploy.cli.main", "plan", "--model", "acme/unknown-9B", "--gpu", "H100"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "unknown model 'acme/unknown-9B'" in proc.stderr and "Traceback" not in proc.stderr


def test_offline_planning_with_a_config_folder_and_gpu_memory_for_every_engine(tmp_path: Path) -> None:
    # issue 44: a model the catalog lacks (a folder with its config.json) on a GPU the catalog lacks
    # (--gpu-memory-gib) plans offline for every engine; the errors name exactly those two fixes
    config = {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 896,
        "intermediate_size": 4864, "num_attention_heads": 14, "num_key_value_heads": 2,
        "num_hidden_layers": 24, "vocab_size": 151936, "max_position_embeddings": 32768,
        "torch_dtype": "bfloat16", "tie_word_embeddings": True, "rope_theta": 1000000.0,
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    for engine in ("vllm", "sglang", "tgi", "builtin"):
        args = ["--model", str(tmp_path), "--gpu-memory-gib", "15", "--engine", engine]
        result = CliRunner().invoke(plan_command, [*args, "--max-model-len", "4096", "--output", "json"])
        assert result.exit_code == 0, (engine, result.output)
        plan = json.loads(result.output)
        assert plan["engine"] == engine and plan["fits"] and plan["kv_cache_tokens"] > 0
    unknown_gpu = CliRunner().invoke(plan_command, ["--model", str(tmp_path), "--gpu", "P100"])
    assert unknown_gpu.exit_code != 0 and "--gpu-memory-gib" in str(unknown_gpu.exception.problems[0].fix)  # type: ignore[union-attr]


def test_recipes_plan_offline_with_model_path_and_gpu_memory_for_every_engine(tmp_path: Path) -> None:
    # the recipe form of the same: model.path and hardware.gpu_memory_gib, no catalog entry, no hub
    from llmdeploy.planner.plan import make_plan
    from llmdeploy.recipe.loader import load_recipe

    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048,
        "intermediate_size": 5632, "num_attention_heads": 32, "num_key_value_heads": 4,
        "num_hidden_layers": 22, "vocab_size": 32000, "max_position_embeddings": 4096,
        "torch_dtype": "bfloat16", "tie_word_embeddings": False, "rope_theta": 10000.0,
    }  # fmt: skip
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    for engine in ("vllm", "sglang", "tgi", "builtin"):
        recipe = tmp_path / f"{engine}.yaml"
        recipe.write_text(
            f"name: offline-{engine}\nmodel:\n  id: someorg/uncatalogued-1b\n  path: {folder}\n"
            f"engine:\n  type: {engine}\nhardware:\n  gpu_memory_gib: 14.5\nlimits:\n  max_model_len: 4096\n"
        )
        plan = make_plan(load_recipe(recipe))
        assert plan.fits and plan.engine == engine and plan.kv_cache_tokens > 0, engine
