"""On a CUDA GPU: an fp8 KV cache through the CUDA path (pure torch unless a kernel reads fp8) gives the
CPU float32 result, and decode steps replayed from CUDA graphs give the eager runner's logits."""

from __future__ import annotations

import random

import pytest
import torch
from gpu_engine_helpers import batch_for
from llmdeploy_engine.config import EngineConfig
from llmdeploy_engine.kernels import kv_cache
from llmdeploy_engine.kernels.attention import build_attention_metadata, paged_attention
from llmdeploy_engine.runner.cuda_graph_runner import CudaGraphRunner
from llmdeploy_engine.runner.model_runner import ModelRunner

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
FP8 = ["fp8_e4m3", "fp8_e5m2"]


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max())


@pytest.mark.parametrize("name", FP8)
def test_cuda_decode_over_fp8_matches_cpu(name: str) -> None:
    """Pure-decode batch (the case the Triton dispatch sees) in bf16 on CUDA vs float32 on CPU."""
    dtype = kv_cache.KV_CACHE_DTYPES[name]
    torch.manual_seed(0)
    rng = random.Random(0)
    heads, kv_heads, dim, bs, num_blocks = 32, 8, 128, 16, 256
    k_scale, v_scale = torch.tensor([0.05]), torch.tensor([0.01])
    k_cache = kv_cache.quantize(torch.randn(num_blocks, bs, kv_heads, dim) * 5, k_scale, dtype)
    v_cache = kv_cache.quantize(torch.randn(num_blocks, bs, kv_heads, dim), v_scale, dtype)
    lengths = [1000, 17, 300, 2048, 64]
    free = list(range(num_blocks))
    rng.shuffle(free)
    tables = []
    for n in lengths:
        need = -(-(n + 1) // bs)
        tables.append(free[:need])
        free = free[need:]
    batch = batch_for([[0]] * len(lengths), lengths, tables, bs)
    # inputs exact in bf16, so both devices quantize the same new K/V (bf16-then-fp8 double rounding
    # would move e5m2 values by a whole fp8 step)
    q = torch.randn(len(lengths), heads, dim).bfloat16().float()
    k = (torch.randn(len(lengths), kv_heads, dim) * 5).bfloat16().float()
    v = torch.randn(len(lengths), kv_heads, dim).bfloat16().float()
    outs = {}
    for device, compute in (("cpu", torch.float32), ("cuda", torch.bfloat16)):
        dev = torch.device(device)
        caches = (k_cache.clone().to(dev), v_cache.clone().to(dev))
        meta = build_attention_metadata(batch, bs, dev)
        outs[device] = paged_attention(
            q.to(dev, compute),
            k.to(dev, compute),
            v.to(dev, compute),
            caches,
            meta,
            dim**-0.5,
            k_scale=k_scale.to(dev),
            v_scale=v_scale.to(dev),
        )
        assert outs[device].dtype == compute
    # bf16 inputs and outputs: about 3 significant digits
    assert rel_err(outs["cuda"].cpu(), outs["cpu"]) < 3e-2


@pytest.mark.parametrize("name", FP8)
def test_fp8_graph_decode_matches_eager(name: str) -> None:
    runner = ModelRunner(
        EngineConfig(
            model="random:Qwen/Qwen2.5-0.5B",
            device="cuda",
            dtype="bfloat16",
            kv_cache_dtype=name,
            max_model_len=512,
            max_num_seqs=8,
            gpu_memory_utilization=0.3,
        )
    )
    assert runner.kv_caches[0][0].dtype == kv_cache.KV_CACHE_DTYPES[name]
    attn = runner.model.model.layers[0].self_attn
    scale_before = attn.k_scale.data_ptr()
    assert float(attn.k_scale) != 1.0  # calibrated at start-up (calculate_kv_scales defaults on)
    graphs = CudaGraphRunner(runner, batch_sizes=(1, 2, 4, 8))
    assert attn.k_scale.data_ptr() == scale_before  # the graphs hold the calibrated buffers
    bs = runner.block_size
    gen = torch.Generator().manual_seed(1)
    lengths = [5, 40, 300]
    prompts = [torch.randint(0, 1000, (n,), generator=gen).tolist() for n in lengths]
    per_seq = -(-(max(lengths) + 8) // bs)
    tables = [list(range(i, 3 * per_seq, 3)) for i in range(3)]
    logits = graphs.execute(batch_for(prompts, [0] * 3, tables, bs))
    last = [int(t) for t in logits.argmax(-1).tolist()]
    ctx = list(lengths)
    for step in range(4):
        batch = batch_for([[t] for t in last], ctx, tables, bs)
        ours = graphs.execute(batch)
        assert graphs.num_replays == step + 1
        ref = runner.execute(batch)  # eager, same inputs (rewrites the same slots with the same bytes)
        assert torch.isfinite(ours).all()
        assert rel_err(ours, ref) < 3e-2, (step, rel_err(ours, ref))
        last = [int(t) for t in ref.argmax(-1).tolist()]
        ctx = [c + 1 for c in ctx]
