"""cpu_decode.py's decode step against the module path (model.py) on the same KV cache."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from engine_model_helpers import BlockPlan, make_batch
from gguf import GGMLQuantizationType
from llmdeploy_engine.config import EngineConfig
from llmdeploy_engine.kernels import cpu_native
from llmdeploy_engine.kernels.attention import build_attention_metadata
from llmdeploy_engine.model.cpu_decode import CpuDecodePath
from llmdeploy_engine.model.cpu_quant import int4pack_available
from llmdeploy_engine.runner.model_runner import ModelRunner
from test_gguf_loader import tiny_llama, write_gguf

pytestmark = pytest.mark.skipif(not int4pack_available(), reason="no vectorized int4pack kernel on this CPU")

# torch's int4 kernel: both paths round the activations to bfloat16, at different points of RMSNorm;
# on two layers the logits and the stored K/V moved by up to 0.5 % and 0.9 % of their range. cpu_dot's
# kernels take the same quantized activations on both paths (the fused RMSNorm and SwiGLU round in
# float32 as the module path's ops do, but a code can round the other way): 4e-7 to 4e-5. A wrong rotation moved
# the stored keys by over 100 %, a wrong key stride the logits by 40 %.
MAX_REL_DIFF = 2e-2
MAX_REL_DIFF_DOT = 2e-4
DOT = cpu_native.library() is not None
LENGTHS = (37, 5, 60)  # three contexts: the middle one inside its first block


def _runner(
    tmp_path: Path, qtype: GGMLQuantizationType, dot: bool = DOT, mode: str = "quantized"
) -> ModelRunner:
    path = tmp_path / f"tiny-{qtype.name}.gguf"
    write_gguf(path, tiny_llama(), qtype)
    config = EngineConfig(model=str(path), device="cpu", kv_cache_memory_bytes=4 * 2**20, cpu_weights=mode)
    with pytest.MonkeyPatch.context() as patch:
        if not dot:  # torch's kernels, as on a machine without a C compiler
            patch.setattr(cpu_native, "library", lambda: None)
        return ModelRunner(config)


def _prefilled(runner: ModelRunner) -> tuple[BlockPlan, list[list[int]]]:
    plan = BlockPlan(runner, max(LENGTHS) + 4)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 250, (n,), generator=g).tolist() for n in LENGTHS]
    for seq, prompt in enumerate(prompts):
        runner.execute(make_batch(plan, [seq], [prompt], [0]))
    return plan, prompts


@pytest.mark.parametrize(
    "dot",
    [pytest.param(True, marks=pytest.mark.skipif(not DOT, reason="no cpu_dot kernels here")), False],
    ids=["cpu_dot", "torch"],
)
@pytest.mark.parametrize(
    "qtype,qkv_bias",
    [
        (GGMLQuantizationType.Q4_0, False),
        (GGMLQuantizationType.Q4_1, False),
        (GGMLQuantizationType.Q4_1, True),
        (GGMLQuantizationType.Q8_0, False),
    ],
)
@pytest.mark.slow
def test_decode_steps_match_the_module_path(
    tmp_path: Path, qtype: GGMLQuantizationType, qkv_bias: bool, dot: bool
) -> None:
    runner = _runner(tmp_path, qtype, dot)
    model = runner.model
    if qkv_bias:  # Qwen2's q/k/v bias, on the Llama layers (both paths read the projection's bias)
        g = torch.Generator().manual_seed(1)
        for layer in model.model.layers:
            proj = layer.self_attn.qkv_proj
            proj.bias = torch.nn.Parameter(torch.randn(proj.weight.shape[0], generator=g) * 0.5)
    path = CpuDecodePath.build(model)
    assert path is not None, "every projection of a quantized GGUF is a compact CPU weight"
    path.native_attention = dot  # torch's attention ops, as where the kernels do not load
    plan, prompts = _prefilled(runner)
    for seqs in ([0], [1], [0, 1, 2], [2, 1]):
        batch = make_batch(plan, seqs, [[prompts[s][-1]] for s in seqs], [LENGTHS[s] for s in seqs])
        ids, positions = torch.tensor(batch.input_ids), torch.tensor(batch.positions)
        meta = build_attention_metadata(batch, runner.block_size, runner.device)
        assert CpuDecodePath.applies(ids, meta, runner.kv_caches, None)
        slots = torch.tensor(batch.slot_mapping)
        with torch.inference_mode():
            fast = model.compute_logits(path.forward(ids, positions, meta, runner.kv_caches))
            fast_kv = _new_kv(runner, slots)
            ref = model.compute_logits(model.module_forward(ids, positions, meta, runner.kv_caches))
            ref_kv = _new_kv(runner, slots)
        bound = MAX_REL_DIFF_DOT if dot else MAX_REL_DIFF
        assert _rel(fast, ref) < bound, seqs
        # the stored keys (rotated) and values of the new tokens, every layer
        assert _rel(fast_kv, ref_kv) < bound, seqs


def _new_kv(runner: ModelRunner, slots: torch.Tensor) -> torch.Tensor:
    """The K and V rows at these slots of every layer's pool, stacked."""
    rows = [pool.flatten(0, 1)[slots] for pair in runner.kv_caches for pool in pair]
    return torch.stack(rows)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.slow
def test_the_runner_takes_the_path_for_decode_steps_only(tmp_path: Path) -> None:
    runner = _runner(tmp_path, GGMLQuantizationType.Q4_0)
    plan, _ = _prefilled(runner)  # prefill steps: the module path, nothing built yet
    assert not runner.model._cpu_decode_built
    runner.execute(make_batch(plan, [0, 1], [[4], [5]], [LENGTHS[0], LENGTHS[1]]))
    assert isinstance(runner.model._cpu_decode, CpuDecodePath)
    batch = make_batch(plan, [0], [[4]], [LENGTHS[0]])
    meta = build_attention_metadata(batch, runner.block_size, runner.device)
    ids = torch.tensor(batch.input_ids)
    assert not CpuDecodePath.applies(ids, meta, runner.kv_caches, torch.tensor([0]))  # kept rows
    assert not CpuDecodePath.applies(ids, meta, None, None)  # no cache (profiling)
    # a prefill chunk in the step: the module path
    mixed = make_batch(plan, [0, 2], [[4], [6, 7]], [LENGTHS[0], LENGTHS[2]])
    meta = build_attention_metadata(mixed, runner.block_size, runner.device)
    assert not CpuDecodePath.applies(torch.tensor(mixed.input_ids), meta, runner.kv_caches, None)


@pytest.mark.slow
def test_float32_weights_keep_the_module_path(tmp_path: Path) -> None:
    assert CpuDecodePath.build(_runner(tmp_path, GGMLQuantizationType.Q4_0, mode="float32").model) is None


@pytest.mark.skipif(not DOT, reason="no cpu_dot kernels here")
def test_native_decode_attention_against_sdpa() -> None:
    """cpu_dot.c's decode attention against RoPE + SDPA in float64 on a paged cache whose tables
    name blocks out of order, for contexts inside one block, across blocks and of unequal length."""
    heads, kv_heads, d, block_size, blocks = 6, 2, 16, 4, 12
    g = torch.Generator().manual_seed(0)
    k_pool = torch.randn(blocks, block_size, kv_heads, d, generator=g)
    v_pool = torch.randn(blocks, block_size, kv_heads, d, generator=g)
    tables = torch.tensor([[7, 2, 9], [4, 0, 0], [11, 1, 5]])
    lengths = torch.tensor([10, 3, 12], dtype=torch.int32)
    slots = torch.tensor(
        [
            int(tables[s, (n - 1) // block_size]) * block_size + (n - 1) % block_size
            for s, n in enumerate(lengths.tolist())
        ]
    )
    n, width = 3, (heads + 2 * kv_heads) * d
    qkv = torch.randn(n, width, generator=g) * 2
    angles = torch.rand(n, d // 2, generator=g) * 6
    cos, sin = torch.cat((angles.cos(), angles.cos()), -1), torch.cat((angles.sin(), angles.sin()), -1)
    out = torch.empty(n, heads * d)
    ref_k, ref_v, ref_qkv = k_pool.double().clone(), v_pool.double().clone(), qkv.double()

    def rope(x: torch.Tensor, s: int) -> torch.Tensor:  # [h, d]
        half = d // 2
        turned = torch.cat((-x[:, half:], x[:, :half]), -1)
        return x * cos[s].double() + turned * sin[s].double()

    expected = []
    for s in range(n):
        q = rope(ref_qkv[s, : heads * d].view(heads, d), s)
        k = rope(ref_qkv[s, heads * d : (heads + kv_heads) * d].view(kv_heads, d), s)
        v = ref_qkv[s, (heads + kv_heads) * d :].view(kv_heads, d)
        ref_k.view(-1, kv_heads, d)[slots[s]] = k
        ref_v.view(-1, kv_heads, d)[slots[s]] = v
        keys = ref_k[tables[s]].flatten(0, 1)[: lengths[s]].transpose(0, 1)  # [kv_heads, ctx, d]
        values = ref_v[tables[s]].flatten(0, 1)[: lengths[s]].transpose(0, 1)
        o = torch.nn.functional.scaled_dot_product_attention(
            q.view(kv_heads, heads // kv_heads, d), keys, values, scale=0.3
        )
        expected.append(o.reshape(-1))
    attention = cpu_native.DecodeAttention(heads, kv_heads, d, cos, sin, slots, tables, lengths, 0.3, out)
    attention(qkv, k_pool, v_pool)
    assert _rel(out.double(), torch.stack(expected)) < 1e-5
    assert _rel(k_pool.double(), ref_k) < 1e-6 and _rel(v_pool.double(), ref_v) == 0
    # a table naming a block the pools do not have: an error, nothing written
    bad = tables.clone()
    bad[2, 2] = blocks
    before = k_pool.clone()
    with pytest.raises(ValueError, match="outside the KV pools"):
        cpu_native.DecodeAttention(heads, kv_heads, d, cos, sin, slots, bad, lengths, 0.3, out)(
            qkv, k_pool, v_pool
        )
    assert torch.equal(k_pool, before)
    # a context longer than its table row holds (the next row's blocks are valid ids): an error too
    longer = lengths.clone()
    longer[0] = tables.shape[1] * block_size + 1
    with pytest.raises(ValueError, match="outside the KV pools"):
        cpu_native.DecodeAttention(heads, kv_heads, d, cos, sin, slots, tables, longer, 0.3, out)(
            qkv, k_pool, v_pool
        )
    assert torch.equal(k_pool, before)
    with pytest.raises(ValueError, match="qkv must be contiguous"):
        attention(qkv[:, :-1], k_pool, v_pool)
