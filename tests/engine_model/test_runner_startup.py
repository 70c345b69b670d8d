"""ModelRunner start-up: KV sizing by the planner's rule, the start-up report, refused settings."""

from __future__ import annotations

from pathlib import Path

import pytest
from llmdeploy_engine import facts as builtin_rule
from llmdeploy_engine.config import EngineConfig
from llmdeploy_engine.runner.model_runner import ModelRunner
from llmdeploy_engine.runner.startup_report import StartupReport


def test_kv_pool_follows_the_builtin_rule(runner: ModelRunner) -> None:
    mc = runner.model_config
    per_token = builtin_rule.kv_bytes_per_token(mc.num_hidden_layers, mc.num_key_value_heads, mc.head_dim, 4)
    assert runner.kv_bytes_per_token == per_token == 2 * 30 * 3 * 64 * 4
    budget = runner.config.kv_cache_memory_bytes
    assert budget is not None
    assert runner.num_kv_blocks == builtin_rule.num_kv_blocks(budget, per_token, runner.block_size)
    k, v = runner.kv_caches[0]
    assert len(runner.kv_caches) == mc.num_hidden_layers
    assert tuple(k.shape) == (runner.num_kv_blocks, runner.block_size, mc.num_key_value_heads, mc.head_dim)
    assert v.shape == k.shape
    # max_model_len defaults to the model's context, capped by what the KV pool holds
    assert runner.max_model_len == min(8192, runner.num_kv_blocks * runner.block_size)


def test_startup_report_lines(runner: ModelRunner) -> None:
    report = runner.startup_report
    assert isinstance(report, StartupReport) and report.device == "cpu"
    assert 0.4 < report.weights_gib < 0.6  # 134.5M float32 parameters (tied embeddings counted once)
    assert report.kv_cache_tokens == runner.num_kv_blocks * runner.block_size
    lines = report.log_lines()
    assert lines[0].startswith("Model loading took ") and " GiB and " in lines[0]
    assert lines[1] == f"Available KV cache memory: {report.available_kv_gib:.2f} GiB"
    assert lines[2] == f"CPU KV cache size: {report.kv_cache_tokens:,} tokens"
    assert lines[3].startswith(f"Maximum concurrency for {runner.max_model_len:,} tokens per request: ")
    assert report.to_dict()["num_kv_blocks"] == runner.num_kv_blocks
    # no CUDA graphs on CPU: nothing set aside, nothing captured, no graph lines
    assert report.cuda_graph_reserved_bytes == 0 and report.num_cuda_graphs == 0
    assert not any("graph" in line.lower() for line in lines)


def test_startup_report_cuda_graph_lines() -> None:
    import dataclasses

    report = StartupReport(
        device="cuda",
        dtype="bfloat16",
        weights_bytes=2**30,
        peak_activation_bytes=0,
        non_torch_bytes=0,
        kv_cache_bytes=2**30,
        kv_bytes_per_token=1024,
        num_kv_blocks=64,
        block_size=16,
        max_model_len=1024,
        max_concurrency=1.0,
        load_time_s=1.0,
        cuda_graph_reserved_bytes=2**29,
    )
    assert "CUDA graph memory set aside before sizing the KV cache: 0.50 GiB" in report.log_lines()
    assert not any(line.startswith("Graph capturing") for line in report.log_lines())
    captured = dataclasses.replace(
        report, num_cuda_graphs=45, cuda_graph_bytes=3 * 2**28, cuda_graph_capture_s=2.5
    )
    assert "Graph capturing finished in 2.50 secs, took 0.75 GiB (45 graphs)" in captured.log_lines()
    d = captured.to_dict()
    assert d["cuda_graph_gib"] == 0.75 and d["num_cuda_graphs"] == 45 and d["cuda_graph_reserved_gib"] == 0.5
    assert d["held_gib"] == 0 and not any("held" in line for line in report.log_lines())
    held = dataclasses.replace(report, held_bytes=3 * 2**30)
    assert any(
        line.startswith("GPU memory this process held before the engine started: 3.00 GiB")
        for line in held.log_lines()
    )
    assert held.to_dict()["held_gib"] == 3


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"tensor_parallel_size": 2}, "tensor_parallel_size"),
        ({"quantization": "awq"}, "quantization"),
        ({"kv_cache_dtype": "int8"}, "kv_cache_dtype"),
        ({"max_model_len": 100_000}, "max_model_len"),
        ({"kv_cache_memory_bytes": 1000}, "KV cache"),
        ({"dtype": "float64"}, "dtype"),
    ],
)
@pytest.mark.slow
def test_impossible_settings_are_refused(gguf_path: Path, overrides: dict[str, object], message: str) -> None:
    settings: dict[str, object] = {"model": str(gguf_path), "device": "cpu", "kv_cache_memory_bytes": 2**24}
    settings.update(overrides)
    with pytest.raises(ValueError, match=message):
        ModelRunner(EngineConfig(**settings))  # type: ignore[arg-type]


def test_unknown_model_path_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"not a \.gguf file"):
        ModelRunner(EngineConfig(model=str(tmp_path / "missing.gguf"), device="cpu"))


@pytest.mark.slow
def test_the_first_engine_of_a_process_is_freed_when_dropped(gguf_path: Path, tmp_path: Path) -> None:
    """The first engine a process builds (the first imports of torch's modules: were torch._dynamo
    among them, its torch.fx frame cycle would take in every frame on the stack) is freed by its last
    reference, without the cyclic collector, as every later one is: its KV cache is not held; and its
    start imports no torch._dynamo (1-3 s)."""
    import subprocess
    import sys
    import textwrap

    script = tmp_path / "first_engine.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import gc, weakref
            gc.disable()  # what the engine's raised thresholds come to between its rare passes
            from llmdeploy_engine.config import EngineConfig
            from llmdeploy_engine.llm_engine import LLMEngine

            def build():
                engine = LLMEngine(EngineConfig(model={str(gguf_path)!r}, device="cpu", max_model_len=256,
                                                kv_cache_memory_bytes=2**24))
                return weakref.ref(engine), weakref.ref(engine.runner)

            for i in range(2):
                engine, runner = build()
                print(i, engine() is None, runner() is None, flush=True)
            import sys
            print("torch._dynamo" in sys.modules)
            """
        )
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[:3] == ["0 True True", "1 True True", "False"], out.stdout
