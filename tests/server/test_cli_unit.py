"""The engine's serve flags (vLLM names), `flags --json`, and `llmdeploy serve --dry-run`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from default_model import default_model_gguf
from llmdeploy_engine.cli_args import build_parser, config_from_args, flag_catalogue, resolve_api_key
from llmdeploy_engine.cli_values import human_readable_int
from llmdeploy_engine.facts import AUTO_MAX_MODEL_LEN

VLLM_FLAGS = (
    "--model",
    "--tokenizer",
    "--served-model-name",
    "--host",
    "--port",
    "--dtype",
    "--device",
    "--max-model-len",
    "--gpu-memory-utilization",
    "--kv-cache-memory-bytes",
    "--kv-cache-dtype",
    "--block-size",
    "--max-num-seqs",
    "--max-num-batched-tokens",
    "--enable-prefix-caching",
    "--tensor-parallel-size",
    "--seed",
    "--api-key",
    "--max-queue-len",
    "--quantization",
    "--enforce-eager",
)


def parse(*argv: str):  # type: ignore[no-untyped-def]
    parser = build_parser()
    args = parser.parse_args(["serve", *argv])
    return args, config_from_args(args, parser)


def test_human_readable_int() -> None:
    assert human_readable_int("4096") == 4096
    assert human_readable_int("32k") == 32_000
    assert human_readable_int("4K") == 4096
    assert human_readable_int("1G") == 2**30
    assert human_readable_int("512M") == 512 * 2**20
    with pytest.raises(Exception, match="expected an integer"):
        human_readable_int("lots")


def test_serve_flags_map_to_engine_config() -> None:
    args, cfg = parse(
        "--model",
        "m.gguf",
        "--max-model-len",
        "2k",
        "--kv-cache-memory-bytes",
        "64M",
        "--no-enable-prefix-caching",
        "--served-model-name",
        "a",
        "b",
        "--dtype",
        "half",
        "--max-num-seqs",
        "8",
        "--block-size",
        "32",
        "-tp",
        "2",
        "--max-queue-len",
        "3",
    )
    assert cfg.model == "m.gguf" and cfg.max_model_len == 2000 and cfg.kv_cache_memory_bytes == 64 * 2**20
    assert (
        cfg.enable_prefix_caching is False
        and cfg.served_model_name == "a"
        and args.served_model_name == ["a", "b"]
    )
    assert cfg.dtype == "float16" and cfg.max_num_seqs == 8 and cfg.block_size == 32
    assert cfg.tensor_parallel_size == 2 and cfg.max_queue_len == 3
    _, positional = parse("m.gguf")
    assert positional.model == "m.gguf"


def test_max_model_len_takes_auto_as_vllm_does() -> None:
    assert parse("m.gguf")[1].max_model_len is None  # the model's context, refused when it does not fit
    assert parse("m.gguf", "--max-model-len", "auto")[1].max_model_len == AUTO_MAX_MODEL_LEN
    assert parse("m.gguf", "--max-model-len", "-1")[1].max_model_len == AUTO_MAX_MODEL_LEN
    with pytest.raises(SystemExit):
        parse("m.gguf", "--max-model-len", "lots")


def test_flag_catalogue_has_vllm_names() -> None:
    flags = {row["flag"] for row in flag_catalogue()}
    assert set(VLLM_FLAGS) <= flags
    row = next(r for r in flag_catalogue() if r["flag"] == "--enable-prefix-caching")
    assert row["kind"] == "bool_optional" and "--no-enable-prefix-caching" in row["option_strings"]


def test_api_key_from_env() -> None:
    args, _ = parse("--model", "m")
    assert resolve_api_key(args, {"VLLM_API_KEY": "k1"}) == "k1"
    assert resolve_api_key(args, {"LLMDEPLOY_API_KEY": "k0", "VLLM_API_KEY": "k1"}) == "k0"
    assert resolve_api_key(args, {}) is None
    args, _ = parse("--model", "m", "--api-key", "flag")
    assert resolve_api_key(args, {"VLLM_API_KEY": "k1"}) == "flag"


def run_engine_cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llmdeploy_engine.cli", *argv], capture_output=True, text=True, timeout=60
    )


def test_flags_json_subprocess_and_no_torch() -> None:
    code = (
        "import sys, llmdeploy_engine.cli as c; c.main(['flags', '--json']); "
        "assert 'torch' not in sys.modules, 'flags must not import torch'"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "--kv-cache-memory-bytes" in {row["flag"] for row in json.loads(out.stdout)}


@pytest.mark.parametrize(
    "argv, message",
    [
        (("serve", "--model", "m", "--bogus"), "unrecognized arguments: --bogus"),
        (("serve", "--model", "m", "--gpu-memory-utilization", "1.5"), "must be in (0, 1]"),
        (("serve", "--model", "m", "--port", "99999"), "port must be in"),
        (("serve",), "no model given"),
        (("serve", "--model", "/no/such/model.gguf"), "no such file or folder"),
    ],
)
def test_bad_flags_exit_2(argv: tuple[str, ...], message: str) -> None:
    out = run_engine_cli(*argv)
    assert out.returncode == 2
    assert message in out.stderr


def test_serve_help_lists_flags() -> None:
    out = run_engine_cli("serve", "--help")
    assert out.returncode == 0
    for flag in VLLM_FLAGS:
        assert flag in out.stdout


@pytest.mark.slow
def test_llmdeploy_serve_dry_run(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    code = "import sys; from llmdeploy.cli.main import main; main(sys.argv[1:])"
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            "serve",
            "--dry-run",
            "--model",
            str(model),
            "--port",
            "8123",
            "--kv-cache-memory-bytes",
            "64M",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert (
        "llmdeploy" in out.stdout
        and f"serve --model {model} --port 8123 --kv-cache-memory-bytes 64M" in out.stdout
    )
    bad = subprocess.run(
        [sys.executable, "-c", code, "serve", "--dry-run"], capture_output=True, text=True, timeout=60
    )
    assert bad.returncode == 2 and "exactly one of RECIPE and --model" in bad.stderr


@pytest.mark.slow
def test_busy_port_fails_before_loading(tmp_path: Path) -> None:
    import socket

    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        out = run_engine_cli("serve", "--model", str(model), "--port", str(port))
    assert out.returncode == 2 and "cannot listen there" in out.stderr


def run_llmdeploy(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    code = "import sys; from llmdeploy.cli.main import main; main(sys.argv[1:])"
    return subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120, env=env
    )


@pytest.mark.slow
def test_llmdeploy_serve_recipe_dry_run(tmp_path: Path) -> None:
    gguf = default_model_gguf()
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "name: served\nmodel:\n  id: HuggingFaceTB/SmolLM2-135M-Instruct\n"
        f"  path: {gguf}\n  quantization: gguf\nhardware:\n  device: cpu\n"
        "limits:\n  max_model_len: 1024\n  kv_cache_memory_gib: 0.25\nengine:\n  type: builtin\n"
        "server:\n  port: 8123\n  served_model_name: tiny\n  api_key:\n    env: MY_KEY\n"
    )
    missing = run_llmdeploy(
        "serve", str(recipe), "--dry-run", env={k: v for k, v in os.environ.items() if k != "MY_KEY"}
    )
    assert missing.returncode == 2 and "MY_KEY is not set" in missing.stderr
    out = run_llmdeploy(
        "serve", str(recipe), "--dry-run", "--max-num-seqs", "4", env={**os.environ, "MY_KEY": "k"}
    )
    assert out.returncode == 0, out.stderr
    line = out.stdout.strip()
    for part in (
        f"--model {gguf}",
        "--port 8123",
        "--max-model-len 1024",
        "--served-model-name tiny",
        "--kv-cache-memory-bytes 268435456",
    ):
        assert part in line, (part, line)
    assert line.endswith("--max-num-seqs 4") and "k" not in line.split()
    tgi = recipe.with_name("t.yaml")
    tgi.write_text(recipe.read_text().replace("type: builtin", "type: tgi"))
    refused = run_llmdeploy("serve", str(tgi), "--dry-run")
    assert refused.returncode == 2 and "runs the built-in engine" in refused.stderr


def test_cpu_threads_reaches_the_engine_config_and_must_be_positive() -> None:
    from llmdeploy_engine.config import EngineConfig

    assert parse("--model", "random:x", "--cpu-threads", "1")[1].cpu_threads == 1
    assert parse("--model", "random:x")[1].cpu_threads is None  # torch's own count
    for bad in (0, True, 1.5):
        with pytest.raises(ValueError, match="cpu_threads must be a whole number"):
            EngineConfig(model="random:x", cpu_threads=bad)  # type: ignore[arg-type]
