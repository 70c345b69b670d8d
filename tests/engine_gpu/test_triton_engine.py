"""On a CUDA GPU: a bf16 random-weight Qwen2.5-0.5B runner (GQA 7, head_dim 64) with the Triton
kernels (fused norms, RoPE, KV write, varlen and decode attention) against the same runner with
every kernel switched off (pure torch), both measured against a float32 runner with the same
weights, over steps that mix prefills, a prefix hit, decodes and a multi-token verification."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from llmdeploy_engine.config import EngineConfig
from llmdeploy_engine.core.forward_batch import ForwardBatch
from llmdeploy_engine.kernels import attention, ops
from llmdeploy_engine.runner.model_runner import ModelRunner

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton"),
]
BS = 16


def step(seqs: list[tuple[list[int], int, int]], num_logits: list[int] | None = None) -> ForwardBatch:
    """seqs: (block table, query_len, context_len) per sequence; token ids from positions."""
    ids, positions, slots, starts = [], [], [], []
    for table, qlen, ctx in seqs:
        starts.append(len(ids))
        for p in range(ctx - qlen, ctx):
            ids.append((p * 7919 + len(table) * 31) % 5000 + 10)
            positions.append(p)
            slots.append(table[p // BS] * BS + p % BS)
    return ForwardBatch(
        ids,
        positions,
        slots,
        starts,
        [s[1] for s in seqs],
        [s[2] for s in seqs],
        [s[0] for s in seqs],
        list(range(len(seqs))),
        num_logits,
    )


STEPS = [
    step([([0, 1, 2], 40, 40), ([3, 4], 20, 20)]),  # two fresh prefills
    step([([0, 1, 2], 1, 41), ([3, 4], 1, 21)]),  # decode only
    # decode, a prefix hit on A's first two full blocks (10 new tokens), a 3-token verification
    step([([0, 1, 2], 1, 42), ([0, 1, 5], 10, 42), ([3, 4], 3, 24)], num_logits=[1, 1, 3]),
    step([([0, 1, 2], 1, 43), ([0, 1, 5], 1, 43), ([3, 4], 1, 25)]),  # decode only, 3 sequences
]


def run_steps(runner: ModelRunner) -> list[torch.Tensor]:
    for k, v in runner.kv_caches:
        k.zero_()
        v.zero_()
    return [runner.execute(b).float() for b in STEPS]


def test_bf16_runner_with_kernels_matches_pure_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    def config(dtype: str) -> EngineConfig:
        return EngineConfig(
            model="random:Qwen/Qwen2.5-0.5B",
            device="cuda",
            dtype=dtype,
            max_model_len=512,
            kv_cache_memory_bytes=2**28,
        )

    bf16 = ModelRunner(config("bfloat16"))
    f32 = ModelRunner(config("float32"))
    f32.model.load_state_dict({k: v.float() for k, v in bf16.model.state_dict().items()})
    ref = run_steps(f32)
    with_kernels = run_steps(bf16)
    monkeypatch.setattr(attention, "_triton_attention", lambda: None)
    monkeypatch.setattr(ops, "_fused", lambda x, weight=None: None)
    pure = run_steps(bf16)
    for i, (a, b, r) in enumerate(zip(with_kernels, pure, ref, strict=True)):
        err_kernels = float((a - r).norm() / r.norm())
        err_torch = float((b - r).norm() / r.norm())
        print(f"step {i}: rel. error vs float32: kernels {err_kernels:.2e}, pure torch {err_torch:.2e}")
        assert torch.isfinite(a).all() and a.shape == r.shape
        assert err_kernels < 1.5 * err_torch + 1e-3, (i, err_kernels, err_torch)
