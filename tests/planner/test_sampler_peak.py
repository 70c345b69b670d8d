"""vLLM V1's dummy sampler run per release family (llmdeploy/memory/sampler_peak.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmdeploy.catalog.gpus import resolve_gpu
from llmdeploy.catalog.models import resolve_model
from llmdeploy.engines.vllm import vllm_activation_bytes as activation_bytes
from llmdeploy.memory import sampler_peak
from llmdeploy.memory.plan_inputs import GIB, PlanInputs

PRODUCTION_H100 = Path(__file__).resolve().parents[2] / "recipes" / "production-h100.yaml"


def test_release_families_in_order() -> None:
    since = [f.since for f in sampler_peak.SAMPLER_FAMILIES]
    assert since == sorted(since) and len(set(since)) == len(since)
    assert sampler_peak.family((0, 8, 5)).flashinfer == "probs"
    assert sampler_peak.family((0, 10, 2)).topk_topp == "sort"
    assert not sampler_peak.family((0, 13, 0)).flashinfer_by_default
    assert sampler_peak.family((0, 16, 0)).topk_topp == "sort"
    assert sampler_peak.family((0, 17, 1)).topk_topp == "triton"
    assert sampler_peak.family((0, 21, 0)).native_after_flashinfer
    assert sampler_peak.family(None) is sampler_peak.SAMPLER_FAMILIES[-1]
    assert sampler_peak.family((0, 6, 0)) is sampler_peak.SAMPLER_FAMILIES[0]


@pytest.mark.parametrize(
    ("version", "per_entry"),
    [
        # bf16 logits 2 + fp32 copy 4 + sorted values 4 + int64 indices 8 + sort scratch 20
        ((0, 11, 0), 38.0),
        ((0, 9, 0), 38.0),
        # bf16 2 + fp32 4 + probabilities 4 + noise 4 (+ the Triton scratch, below)
        ((0, 19, 0), 14.0),
    ],
)
def test_native_path_bytes_per_entry(version: tuple[int, int, int], per_entry: float) -> None:
    assert sampler_peak.native_bytes_per_entry(sampler_peak.family(version), 2) == per_entry


def test_flashinfer_paths() -> None:
    # 0.8: probabilities only; 0.9+: a masked copy of the logits and its softmax
    assert sampler_peak.flashinfer_bytes_per_entry(sampler_peak.family((0, 8, 0)), 2) == 10.0
    assert sampler_peak.flashinfer_bytes_per_entry(sampler_peak.family((0, 10, 0)), 2) == 14.0
    vocab, seqs = 128_256, 1024
    fi_on_old = sampler_peak.sampler_peak_bytes((0, 10, 1), seqs, vocab, flashinfer=True)
    assert fi_on_old == 14 * seqs * vocab
    # since 0.21 the dummy run also warms the PyTorch path, so the larger call counts
    newest = sampler_peak.sampler_peak_bytes((0, 21, 0), seqs, vocab)
    assert newest == 14 * seqs * vocab + 132 * vocab * 4


def test_triton_scratch_rows() -> None:
    assert sampler_peak.triton_scratch_bytes(1024, 1000, 132) == 132 * 1000 * 4
    assert sampler_peak.triton_scratch_bytes(100, 1000, 132) == 128 * 1000 * 4
    assert sampler_peak.triton_scratch_bytes(1, 1000, 132) == 1000 * 4


def test_v1_activation_peak_uses_the_release_formula() -> None:
    spec = resolve_model("meta-llama/Llama-3.1-8B-Instruct")
    h100 = resolve_gpu("H100")

    def act(version: str | None) -> float:
        inputs = PlanInputs(spec=spec, engine_version=version, gpu=h100)
        return activation_bytes(inputs, 8192, 1024) / GIB

    # 1024 rows x 128,256 vocab: 38 B/entry on the sort path, ~14.5 on the Triton path
    hidden = 8192 * 4096 * 2 / GIB
    assert act("0.11.0") == pytest.approx(38 * 1024 * 128_256 / GIB + hidden, rel=1e-6)
    assert act("0.22.0") == pytest.approx((14 * 1024 * 128_256 + 132 * 128_256 * 4) / GIB + hidden, rel=1e-6)
    # V0 (before 0.8) keeps its calibrated 40 B/entry
    assert act("0.6.5") == pytest.approx(40 * 1024 * 128_256 / GIB + hidden, rel=1e-6)


def test_recipe_env_picks_the_sampler_backend() -> None:
    from llmdeploy.errors import UserError
    from llmdeploy.planner.plan import plan_for
    from llmdeploy.planner.plan import recipe_inputs as inputs_from_recipe
    from llmdeploy.recipe import load_recipe

    base = ["engine.version=0.10.1"]
    default = inputs_from_recipe(load_recipe(PRODUCTION_H100, base))
    assert default.flashinfer_sampler is None
    on = inputs_from_recipe(
        load_recipe(PRODUCTION_H100, [*base, 'engine.env.VLLM_USE_FLASHINFER_SAMPLER="1"'])
    )
    off = inputs_from_recipe(
        load_recipe(PRODUCTION_H100, [*base, 'engine.env.VLLM_USE_FLASHINFER_SAMPLER="0"'])
    )
    assert (on.flashinfer_sampler, off.flashinfer_sampler) == (True, False)
    # 0.10 samples from the logits with FlashInfer (14 B/entry) instead of the sort path's 38
    seqs, vocab = 256, on.spec.vocab_size
    saved = activation_bytes(default, 2048, seqs) - activation_bytes(on, 2048, seqs)
    assert saved == pytest.approx((38 - 14) * seqs * vocab, rel=1e-6)
    assert activation_bytes(off, 2048, seqs) == activation_bytes(default, 2048, seqs)
    assert any("FlashInfer" in n for n in plan_for(on).notes)
    assert not plan_for(default).notes
    with pytest.raises(UserError, match="VLLM_USE_FLASHINFER_SAMPLER"):
        inputs_from_recipe(
            load_recipe(PRODUCTION_H100, [*base, "engine.env.VLLM_USE_FLASHINFER_SAMPLER=yes"])
        )
