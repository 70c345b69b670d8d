"""fp8 KV cache on the default model (SmolLM2-135M, float32 compute on CPU) against a bf16 KV cache.

Quality is measured teacher-forced: every runner decodes the bf16 runner's own greedy continuation
(4 prompts x 32 tokens), so one early near-tie cannot shift the rest of a sequence; we count where
the fp8 runner's argmax equals the bf16 runner's token and compare the logits. The prompts' prefill
attends over unquantized K/V; every decode step reads the fp8 cache.

Measured here (CPU, calibrated scales): top-1 agreement e4m3 0.945, e5m2 0.914; logits relative
error (L2, per row) at the first decode step at most 0.023 (e4m3) / 0.079 (e5m2), over all steps
mean 0.040 / 0.094. A float32 KV cache is at 0.0027 from bf16 at the first decode step. The
thresholds below leave about 2x margin on the errors and ~7 points on agreement.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from engine_model_helpers import BlockPlan, greedy_generate, make_batch
from llmdeploy_engine.config import EngineConfig
from llmdeploy_engine.facts import AUTO_MAX_MODEL_LEN
from llmdeploy_engine.kernels.attention import build_profile_metadata
from llmdeploy_engine.kernels.kv_cache import KVAmaxObserver
from llmdeploy_engine.loading.tokenizer import Tokenizer
from llmdeploy_engine.runner.model_runner import ModelRunner

pytestmark = pytest.mark.slow  # the model is loaded: seconds a test on 2 cores

KV_BYTES = 32 * 2**20
NUM_TOKENS = 32
TEXTS = [
    "The capital of France is Paris, and the capital of Germany is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "Once upon a time, in a small village by the sea, there lived",
    "Explain how photosynthesis works in plants. Photosynthesis is",
]
# kv dtype -> (min top-1 agreement, max first-decode-step logits error, max mean logits error)
THRESHOLDS = {"fp8_e4m3": (0.87, 0.05, 0.08), "fp8_e5m2": (0.84, 0.16, 0.19)}


def _runner(gguf_path: Path, kv_cache_dtype: str, **kwargs: object) -> ModelRunner:
    torch.set_num_threads(1)
    config = EngineConfig(
        model=str(gguf_path),
        device="cpu",
        kv_cache_memory_bytes=KV_BYTES,
        max_model_len=AUTO_MAX_MODEL_LEN,  # the longest context the small pool holds
        kv_cache_dtype=kv_cache_dtype,
        **kwargs,  # type: ignore[arg-type]
    )
    return ModelRunner(config)


def _teacher_forced_logits(
    runner: ModelRunner, prompts: list[list[int]], conts: list[list[int]]
) -> torch.Tensor:
    """[num_prompts, NUM_TOKENS, vocab]: logits after each prompt, then after each continuation token."""
    plan = BlockPlan(runner, max(len(p) for p in prompts) + NUM_TOKENS)
    seqs = list(range(len(prompts)))
    steps = [runner.execute(make_batch(plan, seqs, prompts, [0] * len(prompts)))]
    for j in range(NUM_TOKENS - 1):
        tokens = [[c[j]] for c in conts]
        steps.append(runner.execute(make_batch(plan, seqs, tokens, [len(p) + j for p in prompts])))
    return torch.stack(steps, dim=1)


@pytest.fixture(scope="module")
def reference(
    gguf_path: Path, tokenizer: Tokenizer
) -> Iterator[tuple[list[list[int]], list[list[int]], torch.Tensor]]:
    """(prompts, bf16-KV greedy continuations, bf16-KV teacher-forced logits)."""
    runner = _runner(gguf_path, "bf16")
    prompts = [tokenizer.encode(t) for t in TEXTS]
    conts = greedy_generate(runner, prompts, NUM_TOKENS, set(tokenizer.eos_token_ids))
    logits = _teacher_forced_logits(runner, prompts, conts)
    assert torch.equal(logits.argmax(-1), torch.tensor(conts))  # the loop reproduces greedy decoding
    yield prompts, conts, logits


@pytest.mark.parametrize("kv_cache_dtype", ["fp8_e4m3", "fp8_e5m2"])
def test_fp8_kv_agrees_with_bf16_kv(
    gguf_path: Path, reference: tuple[list[list[int]], list[list[int]], torch.Tensor], kv_cache_dtype: str
) -> None:
    prompts, conts, ref = reference
    runner = _runner(gguf_path, kv_cache_dtype)
    assert runner.kv_caches[0][0].element_size() == 1
    logits = _teacher_forced_logits(runner, prompts, conts)
    min_agree, max_first_err, max_mean_err = THRESHOLDS[kv_cache_dtype]

    agreement = float((logits.argmax(-1) == torch.tensor(conts)).float().mean())
    rel_err = (logits - ref).norm(dim=-1) / ref.norm(dim=-1)  # [num_prompts, NUM_TOKENS]
    # step 0 comes from the prefill, which never reads the cache: identical to bf16 KV
    torch.testing.assert_close(logits[:, 0], ref[:, 0])
    first_decode = rel_err[:, 1]
    assert agreement >= min_agree, agreement
    assert float(first_decode.max()) <= max_first_err, first_decode.tolist()
    assert float(rel_err[:, 1:].mean()) <= max_mean_err, float(rel_err[:, 1:].mean())
    assert torch.equal(logits[:, 1].argmax(-1), ref[:, 1].argmax(-1))  # top-1 at the first decode step
    # and the cache really changed the numbers (a path that silently kept 16-bit K/V would not)
    assert float(first_decode.min()) > 1e-3


def test_fp8_start_up_reports_the_dtype_and_doubles_the_tokens(gguf_path: Path) -> None:
    bf16 = _runner(gguf_path, "bf16")
    fp8 = _runner(gguf_path, "fp8", calculate_kv_scales=False)  # vLLM's plain fp8 is e4m3
    assert fp8.kv_caches[0][0].dtype == torch.float8_e4m3fn
    assert fp8.kv_bytes_per_token * 2 == bf16.kv_bytes_per_token == 2 * 30 * 3 * 64 * 2
    assert fp8.num_kv_blocks in (2 * bf16.num_kv_blocks, 2 * bf16.num_kv_blocks + 1)  # floors
    report = fp8.startup_report
    assert report.kv_cache_tokens == fp8.num_kv_blocks * fp8.block_size
    assert report.to_dict()["kv_cache_dtype"] == "float8_e4m3fn"
    assert f"KV cache dtype: float8_e4m3fn, {fp8.kv_bytes_per_token:,} bytes per token" in report.log_lines()
    assert bf16.startup_report.kv_cache_dtype == "bfloat16"
    # without calibration every scale stays 1.0 (float32, one element)
    for layer in fp8.model.model.layers:
        attn = layer.self_attn
        assert attn.k_scale.dtype == torch.float32 and attn.k_scale.tolist() == [1.0]
        assert attn.v_scale.tolist() == [1.0]


def test_calibrated_scales_follow_the_observed_amax(gguf_path: Path, tokenizer: Tokenizer) -> None:
    runner = _runner(gguf_path, "fp8_e4m3")  # calculate_kv_scales defaults to True
    k_scales = torch.cat([layer.self_attn.k_scale for layer in runner.model.model.layers])
    v_scales = torch.cat([layer.self_attn.v_scale for layer in runner.model.model.layers])
    assert k_scales.dtype == torch.float32 and bool((k_scales != 1.0).all())
    # the calibration amax (random tokens) is close to what real text produces: SmolLM2's K reaches
    # ~10-21 and V ~0.4-11 per layer; scale = amax x 2 / 448, so 2.5x either way covers both
    real: dict[str, list[float]] = {
        "k": [],
        "v": [],
    }  # amax of K and V on real text, per layer, through the same observer
    attns = [layer.self_attn for layer in runner.model.model.layers]
    for attn in attns:
        attn.kv_observer = KVAmaxObserver(runner.device)
    try:
        for text in TEXTS:
            ids = tokenizer.encode(text)
            meta = build_profile_metadata(len(ids), len(ids), runner.device)
            with torch.inference_mode():
                runner.model(torch.tensor(ids), torch.arange(len(ids)), meta, None)
        for attn in attns:
            assert attn.kv_observer is not None
            real["k"].append(float(attn.kv_observer.k_amax))
            real["v"].append(float(attn.kv_observer.v_amax))
    finally:
        for attn in attns:
            attn.kv_observer = None
    ratio_k = k_scales.double() * 448 / 2 / torch.tensor(real["k"], dtype=torch.float64)
    ratio_v = v_scales.double() * 448 / 2 / torch.tensor(real["v"], dtype=torch.float64)
    assert bool(((ratio_k > 0.4) & (ratio_k < 2.5)).all()), ratio_k.tolist()
    assert bool(((ratio_v > 0.4) & (ratio_v < 2.5)).all()), ratio_v.tolist()
