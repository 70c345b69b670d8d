"""cpu_decode.py's decode step against the module path (model.py) on the same KV cache."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from engine_model_helpers import BlockPlan, make_batch
from gguf import GGMLQuantizationType
from llmdeploy_engine.config import EngineConfig
from llmdeploy_engine.kernels.attention import build_attention_metadata
from llmdeploy_engine.model.cpu_decode import CpuDecodePath
from llmdeploy_engine.model.cpu_quant import int4pack_available
from llmdeploy_engine.runner.model_runner import ModelRunner
from test_gguf_loader import tiny_llama, write_gguf

pytestmark = pytest.mark.skipif(not int4pack_available(), reason="no vectorized int4pack kernel on this CPU")

# both paths round the activations to bfloat16 for the int4 kernel, at different points of RMSNorm: on
# two layers the logits and the stored K/V moved by up to 0.5 % and 0.9 % of their range. A wrong
# rotation moved the stored keys by over 100 %, a wrong key stride the logits by 40 %.
MAX_REL_DIFF = 2e-2
LENGTHS = (37, 5, 60)  # three contexts: the middle one inside its first block


def _runner(tmp_path: Path, qtype: GGMLQuantizationType) -> ModelRunner:
    path = tmp_path / f"tiny-{qtype.name}.gguf"
    write_gguf(path, tiny_llama(), qtype)
    config = EngineConfig(
        model=str(path), device="cpu", kv_cache_memory_bytes=4 * 2**20, cpu_weights="quantized"
    )
    return ModelRunner(config)


def _prefilled(runner: ModelRunner) -> tuple[BlockPlan, list[list[int]]]:
    plan = BlockPlan(runner, max(LENGTHS) + 4)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 250, (n,), generator=g).tolist() for n in LENGTHS]
    for seq, prompt in enumerate(prompts):
        runner.execute(make_batch(plan, [seq], [prompt], [0]))
    return plan, prompts


@pytest.mark.parametrize(
    "qtype,qkv_bias",
    [
        (GGMLQuantizationType.Q4_0, False),
        (GGMLQuantizationType.Q4_1, False),
        (GGMLQuantizationType.Q4_1, True),
    ],
)
@pytest.mark.slow
def test_decode_steps_match_the_module_path(
    tmp_path: Path, qtype: GGMLQuantizationType, qkv_bias: bool
) -> None:
    runner = _runner(tmp_path, qtype)
    model = runner.model
    if qkv_bias:  # Qwen2's q/k/v bias, on the Llama layers (both paths read the projection's bias)
        g = torch.Generator().manual_seed(1)
        for layer in model.model.layers:
            proj = layer.self_attn.qkv_proj
            proj.bias = torch.nn.Parameter(torch.randn(proj.weight.shape[0], generator=g) * 0.5)
    path = CpuDecodePath.build(model)
    assert path is not None, "every projection of a Q4 GGUF is an int4pack weight"
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
        assert _rel(fast, ref) < MAX_REL_DIFF, seqs
        # the stored keys (rotated) and values of the new tokens, every layer
        assert _rel(fast_kv, ref_kv) < MAX_REL_DIFF, seqs


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
def test_other_weights_keep_the_module_path(tmp_path: Path) -> None:
    # Q8_0 projections are float16 packs (cpu_quant.Fp16PackWeight), not int4pack
    assert CpuDecodePath.build(_runner(tmp_path, GGMLQuantizationType.Q8_0).model) is None
