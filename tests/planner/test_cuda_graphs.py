"""vLLM's CUDA-graph rule (memory/cuda_graphs.py): capture sizes per release and the memory term."""

from __future__ import annotations

from dataclasses import replace

import pytest

from llmdeploy.catalog.gpus import resolve_gpu
from llmdeploy.catalog.models import resolve_model
from llmdeploy.memory import cuda_graphs
from llmdeploy.memory.memory_plan import GIB
from llmdeploy.planner import PlanInputs, accuracy, plan_from_inputs

MIB = 2**20


def _qwen3_8b(**kw: object) -> PlanInputs:
    return PlanInputs(spec=resolve_model("Qwen/Qwen3-8B"), gpu=resolve_gpu("RTX-4090"), **kw)  # type: ignore[arg-type]


def test_v1_capture_sizes_match_the_logged_graph_counts() -> None:
    # LMCache 3430 (>= 0.21): "PIECEWISE=51 (largest=512), FULL=35 (largest=256)" at 256 seqs / 8192 tokens
    sizes = cuda_graphs.v1_capture_sizes(None, 256, 8192)
    assert (len(sizes), sizes[-1]) == (51, 512)
    assert sizes[:5] == (1, 2, 4, 8, 16) and sizes[-3:] == (480, 496, 512)
    full = cuda_graphs.full_decode_sizes(None, sizes, 256)
    assert (len(full), full[-1]) == (35, 256)


def test_v1_capture_sizes_per_release() -> None:
    # 0.8-0.9: every 8 up to 512 whatever max_num_seqs; 0.10: up to 2 x max_num_seqs
    assert cuda_graphs.v1_capture_sizes((0, 8, 5), 8, 8192) == (1, 2, 4, *range(8, 513, 8))
    assert cuda_graphs.v1_capture_sizes((0, 9, 2), 256, 2048)[-1] == 512
    assert cuda_graphs.v1_capture_sizes((0, 10, 1), 8, 8192) == (1, 2, 4, 8, 16)
    assert len(cuda_graphs.v1_capture_sizes((0, 11, 0), 256, 8192)) == 3 + 64
    # 0.12: every 16 above 256
    assert len(cuda_graphs.v1_capture_sizes((0, 12, 0), 256, 8192)) == 51
    assert cuda_graphs.v1_capture_sizes((0, 20, 0), 1024, 8192)[-1] == 512
    # sizes above max_num_batched_tokens are dropped; since 0.21 the budget itself is captured
    assert cuda_graphs.v1_capture_sizes((0, 20, 0), 256, 100)[-2:] == (88, 96)
    assert cuda_graphs.v1_capture_sizes((0, 21, 0), 256, 100)[-3:] == (88, 96, 100)
    # 1024 on data-centre Blackwell in 0.32
    assert len(cuda_graphs.v1_capture_sizes((0, 32, 0), 1024, 8192, blackwell=True)) == 51 + 32
    assert cuda_graphs.v1_capture_sizes((0, 21, 0), 1024, 8192, blackwell=True)[-1] == 512


def test_full_graphs_since_0_11() -> None:
    sizes = cuda_graphs.v1_capture_sizes((0, 10, 1), 256, 8192)
    assert cuda_graphs.full_decode_sizes((0, 10, 1), sizes, 256) == ()
    assert len(cuda_graphs.full_decode_sizes((0, 11, 0), sizes, 256)) == 35


def test_v0_capture_sizes() -> None:
    assert cuda_graphs.v0_capture_sizes(256) == (1, 2, 4, *range(8, 257, 8))
    assert cuda_graphs.v0_capture_sizes(12) == (1, 2, 4, 8, 16)  # up to the first size that holds 12
    assert cuda_graphs.v0_capture_sizes(1000)[-1] == 1000


def test_estimate_is_pool_plus_graphs_per_size() -> None:
    inputs = _qwen3_8b(engine_version="0.21.0")
    got = cuda_graphs.vllm_graph_bytes(inputs, 8192, 256)
    # the measured terms (module docstring): 140 MiB pool at 512 tokens for these shapes, 51 sizes x
    # 37 piece graphs, 34 further FULL graphs of 36 layers
    want = 140 * MIB + 51 * 37 * cuda_graphs.PIECE_GRAPH_BYTES + 34 * 36 * cuda_graphs.FULL_GRAPH_LAYER_BYTES
    assert got == pytest.approx(want, abs=MIB)
    tp2 = cuda_graphs.vllm_graph_bytes(replace(inputs, tensor_parallel_size=2), 8192, 256)
    assert 0 < got - tp2 < 140 * MIB  # TP shrinks the MLP width of the pool, not the graph count
    assert cuda_graphs.vllm_graph_bytes(replace(inputs, enforce_eager=True), 8192, 256) == 0
    assert cuda_graphs.vllm_graph_bytes(inputs, 8192, 8) < got / 4  # 5 sizes up to 16


def test_qwen3_8b_graph_estimate_against_the_lmcache_3430_log() -> None:
    # vLLM logged "Estimated CUDA graph memory: 0.52 GiB total"; its figure rests on one 2 MiB-stepped
    # sample of the second PIECEWISE size times 50 graphs, so +-0.1 GiB between runs of the same settings
    entry = next(e for e in accuracy.load()["logs"] if e["id"] == "lmcache-issue-3430-qwen3-8b-24gb")
    plan = plan_from_inputs(accuracy._inputs(entry))
    assert plan.cuda_graph_gib == pytest.approx(entry["logged"]["cuda_graph_gib"], abs=0.1)
    assert plan.cuda_graph_gib == pytest.approx(0.52, abs=0.02)  # the measured terms give 0.52


def test_graphs_in_budget_since_0_20() -> None:
    # 0.18 and 0.19 have the profiler with VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS "0"; 0.20.0 "1"
    assert not cuda_graphs.graphs_in_budget("0.19.1")
    assert cuda_graphs.graphs_in_budget("0.20.0")
    assert cuda_graphs.graphs_in_budget(None)
    old = plan_from_inputs(_qwen3_8b(engine_version="0.19.1"))
    assert old.cuda_graph_gib * GIB == cuda_graphs.vllm_graph_bytes(
        _qwen3_8b(engine_version="0.19.1"), 2048, 256
    )
