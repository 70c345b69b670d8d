"""GGUF weights kept compact on the CPU (cpu_quant.py, gguf_compact.py) against the float32 path."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from engine_model_helpers import BlockPlan, greedy_generate, make_batch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize
from llmdeploy_engine.config import EngineConfig
from llmdeploy_engine.facts import AUTO_MAX_MODEL_LEN
from llmdeploy_engine.kernels import cpu_native
from llmdeploy_engine.loading.gguf_compact import decode_int4, use_compact
from llmdeploy_engine.loading.tokenizer import Tokenizer
from llmdeploy_engine.model import cpu_quant
from llmdeploy_engine.runner.model_runner import ModelRunner

pytestmark = pytest.mark.skipif(not cpu_quant.int4pack_available(), reason="no vectorized int4 CPU kernel")

# measured on the default model: 4.8e-3 on an AVX2 host and 1.51e-2 on an AVX-512 one (torch's int4pack
# kernel takes another path there; bfloat16 activations, scales and zeros both); zero points off by even
# a quarter of a step give several times the AVX2 figure
MAX_LOGIT_REL_ERR = 2e-2
# cpu_dot.c's kernels round the activations to 15-bit codes per 32: 2.2e-4 on the default model's first
# prompt below (decoded through the kernels), 6.2e-4 to 7.3e-4 on the tiny GGUFs (37 prompt rows: a
# bfloat16 prefill GEMM where this CPU has a fast one); 8-bit activations gave 2.7e-2 to 4.5e-2
MAX_LOGIT_REL_ERR_DOT = 2e-3
DOT = cpu_native.library() is not None
needs_dot = pytest.mark.skipif(not DOT, reason=f"cpu_dot kernels off: {cpu_native.unavailable_reason()}")


def _reference(codes: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    g = torch.arange(codes.shape[1]) // (codes.shape[1] // scales.shape[1])
    return codes.double() * scales.double()[:, g] + offsets.double()[:, g]


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1"])
def test_q4_blocks_decode_to_what_gguf_dequantizes(kind: str) -> None:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((48, 256)).astype(np.float32)
    data = quantize(w, GGMLQuantizationType[kind])
    codes, scales, offsets = decode_int4(data, kind, 48, 256)
    ref = dequantize(data, GGMLQuantizationType[kind]).reshape(48, 256)
    np.testing.assert_allclose(_reference(codes, scales, offsets).numpy(), ref, rtol=1e-6, atol=1e-6)


def test_q4_k_blocks_decode_to_what_gguf_dequantizes() -> None:
    rng = np.random.default_rng(1)
    rows, cols = 32, 512  # two super-blocks of 256 per row
    blocks = rng.integers(0, 256, size=(rows * cols // 256, 144), dtype=np.uint8)
    blocks[:, 0:2] = np.full((len(blocks), 1), 0.01, dtype=np.float16).view(np.uint8)  # d
    blocks[:, 2:4] = np.full((len(blocks), 1), 0.02, dtype=np.float16).view(np.uint8)  # dmin
    data = blocks.reshape(rows, -1)
    codes, scales, offsets = decode_int4(data, "Q4_K", rows, cols)
    ref = dequantize(data, GGMLQuantizationType.Q4_K).reshape(rows, cols)
    np.testing.assert_allclose(_reference(codes, scales, offsets).numpy(), ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("rows", [1, 3, cpu_quant.CPU_DEQUANT_ROWS + 5])
def test_int4pack_linear_matches_float64_within_bfloat16(rows: int) -> None:
    torch.manual_seed(0)
    n, k = 96, 320
    codes = torch.randint(0, 16, (n, k), dtype=torch.uint8)
    scales, offsets = torch.rand(n, k // 32) * 0.05 + 0.01, -torch.rand(n, k // 32) * 0.4
    weight = cpu_quant.Int4PackWeight(codes, scales, offsets, torch.float32)
    assert torch.equal(weight.codes(), codes)  # the kernel's layout read back
    x = torch.randn(rows, k)
    ref = x.double() @ _reference(codes, scales, offsets).t()
    got = weight.linear(x)
    assert got.dtype == torch.float32
    assert float((got - ref).abs().max() / ref.abs().max()) < 1e-2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_batches_match_float64_whichever_gemm_this_cpu_picks(dtype, monkeypatch) -> None:
    """Both dense GEMMs of a prefill batch (prefill_gemm_dtype picks one per CPU, so one of them is
    never taken on a given machine unless forced) stay within the bfloat16 rounding bound."""
    assert cpu_quant.prefill_gemm_dtype() in (torch.float32, torch.bfloat16)
    monkeypatch.setattr(cpu_quant, "prefill_gemm_dtype", lambda: dtype)
    torch.manual_seed(1)
    n, k = 96, 320
    codes = torch.randint(0, 16, (n, k), dtype=torch.uint8)
    scales, offsets = torch.rand(n, k // 32) * 0.05 + 0.01, -torch.rand(n, k // 32) * 0.4
    weight = cpu_quant.Int4PackWeight(codes, scales, offsets, torch.float32)
    x = torch.randn(cpu_quant.CPU_DEQUANT_ROWS * 2, k)
    ref = x.double() @ _reference(codes, scales, offsets).t()
    got = weight.linear(x)
    assert got.dtype == torch.float32
    assert float((got - ref).abs().max() / ref.abs().max()) < 1e-2


# whole blocks of the CPU's layout (32 features on AVX2, 64 on AVX-512) unpack without a gather: 128 on
# both, 96 on AVX2 only, 80 on neither
@pytest.mark.parametrize("n", [80, 96, 128])
def test_int4pack_dequantize_is_the_weight_in_natural_order(n: int) -> None:
    torch.manual_seed(0)
    k = 320
    codes = torch.randint(0, 16, (n, k), dtype=torch.uint8)
    scales, offsets = torch.rand(n, k // 32) * 0.05 + 0.01, -torch.rand(n, k // 32) * 0.4
    weight = cpu_quant.Int4PackWeight(codes, scales, offsets, torch.float32)
    sz = weight.scale_zeros.float()  # the stored (bfloat16) scales and zeros: w = (q - 8) * s + z
    s, z = sz[..., 0].t().repeat_interleave(32, 1), sz[..., 1].t().repeat_interleave(32, 1)
    assert torch.equal(weight.dequantize(torch.float32), (codes.float() - 8) * s + z)


def test_quantized_mode_refuses_what_it_cannot_do() -> None:
    with pytest.raises(ValueError, match="tensor_parallel_size 2"):
        use_compact("quantized", torch.device("cpu"), "m.gguf", 2)
    assert not use_compact("auto", torch.device("cpu"), "m.gguf", 2)
    assert not use_compact("quantized", torch.device("cpu"), "folder", 1)  # GGUF files only
    with pytest.raises(ValueError, match="cpu_weights 'int4'"):
        use_compact("int4", torch.device("cpu"), "m.gguf", 1)


def _compact(path: Path, dot: bool) -> ModelRunner:
    config = EngineConfig(
        model=str(path),
        device="cpu",
        kv_cache_memory_bytes=64 * 2**20,
        max_model_len=AUTO_MAX_MODEL_LEN,
        cpu_weights="quantized",
    )
    with pytest.MonkeyPatch.context() as patch:
        if not dot:  # torch's kernels, as on a machine without a C compiler
            patch.setattr(cpu_native, "library", lambda: None)
        return ModelRunner(config)


@pytest.fixture(scope="module")
def compact_runner(gguf_path: Path) -> ModelRunner:
    """The compact weights as this machine runs them (cpu_dot kernels where they build)."""
    torch.set_num_threads(1)
    return _compact(gguf_path, DOT)


@pytest.fixture(scope="module")
def torch_kernel_runner(gguf_path: Path) -> ModelRunner:
    torch.set_num_threads(1)
    return _compact(gguf_path, False)


def _last_logits(runner: ModelRunner, ids: list[int]) -> torch.Tensor:
    batch = make_batch(BlockPlan(runner, len(ids)), [0], [ids], [0])
    return runner.execute(batch)[0]


@pytest.mark.slow
def test_compact_weights_hold_under_a_third_of_float32(
    compact_runner: ModelRunner, runner: ModelRunner
) -> None:
    kernel = cpu_quant.Int4DotWeight if DOT else cpu_quant.Int4PackWeight
    assert isinstance(compact_runner.model.model.layers[0].mlp.down_proj.weight, kernel)
    assert compact_runner.startup_report.weights_bytes < runner.startup_report.weights_bytes / 3


@pytest.mark.slow
def test_compact_logits_match_the_float32_path(
    compact_runner: ModelRunner, runner: ModelRunner, tokenizer: Tokenizer
) -> None:
    """Same GGUF weights: the logits differ by the kernels' rounding of the activations only (bfloat16
    for torch's, int8 per 32 for cpu_dot's; the long prompt prefills through a dense GEMM)."""
    bound = MAX_LOGIT_REL_ERR_DOT if DOT else MAX_LOGIT_REL_ERR
    for text in ("Once upon a time, in a small village by the sea, there lived", "The capital of France is"):
        ids = tokenizer.encode(text)
        ours, ref = _last_logits(compact_runner, ids), _last_logits(runner, ids)
        assert float((ours - ref).abs().max() / ref.abs().max()) < bound, text


@pytest.mark.parametrize("kernels", ["compact_runner", "torch_kernel_runner"])
@pytest.mark.slow
def test_compact_greedy_tokens_match_the_float32_path(
    kernels: str, request: pytest.FixtureRequest, runner: ModelRunner, tokenizer: Tokenizer
) -> None:
    # this machine's kernels (cpu_dot's where they build) and torch's (bfloat16 activations); prompts
    # whose greedy continuations keep a clear top-1 margin ("def fibonacci(n):" does not: its first
    # two float32 logits are 0.04 apart, and torch's kernels pick the other one)
    compact: ModelRunner = request.getfixturevalue(kernels)
    prompts = [tokenizer.encode(p) for p in ("The capital of France is", "1, 2, 3, 4,")]
    ours = greedy_generate(compact, prompts, max_tokens=16, eos_token_ids={2})
    assert ours == greedy_generate(runner, prompts, max_tokens=16, eos_token_ids={2})


@pytest.mark.parametrize("dot", [pytest.param(True, marks=needs_dot), False], ids=["cpu_dot", "torch"])
@pytest.mark.parametrize(
    "qtype,kernels",
    [
        (GGMLQuantizationType.Q4_0, (cpu_quant.Int4DotWeight, cpu_quant.Int4PackWeight)),
        (GGMLQuantizationType.Q4_1, (cpu_quant.Int4DotWeight, cpu_quant.Int4PackWeight)),
        (GGMLQuantizationType.Q8_0, (cpu_quant.Int8DotWeight, cpu_quant.Fp16PackWeight)),
    ],
)
@pytest.mark.slow
def test_tiny_llama_gguf_compact_matches_float32(
    tmp_path: Path, qtype: GGMLQuantizationType, kernels: tuple[type, type], dot: bool, monkeypatch
) -> None:
    """An untied Llama (Q/K rows permuted by llama.cpp's converter) in each type, both weight paths."""
    from llmdeploy_engine.core.forward_batch import ForwardBatch
    from test_gguf_loader import tiny_llama, write_gguf

    path = tmp_path / f"tiny-{qtype.name}.gguf"
    write_gguf(path, tiny_llama(), qtype)
    if not dot:
        monkeypatch.setattr(cpu_native, "library", lambda: None)
    kernel = kernels[0] if dot else kernels[1]
    logits = {}
    for mode in ("float32", "quantized"):
        config = EngineConfig(
            model=str(path),
            device="cpu",
            kv_cache_memory_bytes=4 * 2**20,
            max_model_len=AUTO_MAX_MODEL_LEN,
            cpu_weights=mode,
        )
        runner = ModelRunner(config)
        ids = list(range(3, 40))
        n = len(ids)
        batch = ForwardBatch(ids, list(range(n)), list(range(n)), [0], [n], [n], [[0, 1, 2]], [0])
        logits[mode] = runner.execute(batch)[0]
    # the planner's rule for the stored bytes agrees with what this runner holds
    from llmdeploy_engine.facts import compact_gguf_weights_bytes

    from llmdeploy.catalog.gguf_spec import spec_from_gguf

    table = list(spec_from_gguf(path).gguf_tensors)
    assert compact_gguf_weights_bytes(table, dot_kernels=dot) == runner.startup_report.weights_bytes
    layer = runner.model.model.layers[0]
    assert isinstance(layer.self_attn.qkv_proj.weight, kernel)
    assert isinstance(runner.model.lm_head.weight, kernel)
    ref = logits["float32"]
    bound = MAX_LOGIT_REL_ERR_DOT if dot else MAX_LOGIT_REL_ERR
    assert float((logits["quantized"] - ref).abs().max() / ref.abs().max()) < bound


# ---- cpu_dot.c's kernels (cpu_native.py) against their definition --------------------------------
def _quantized_rows(x: torch.Tensor) -> torch.Tensor:
    """x quantized per 32 as the kernels quantize it (scale max|x| / (127 * 128), round half to even),
    in float64: what the integer products multiply."""
    blocks = x.double().reshape(x.shape[0], -1, 32)
    scale = blocks.abs().amax(-1, keepdim=True) / (127 * 128)
    codes = torch.where(scale > 0, torch.round(blocks / scale), 0)
    return (codes * scale).reshape(x.shape)


def _q4_weight(n: int, k: int) -> tuple[cpu_quant.Int4DotWeight, torch.Tensor]:
    torch.manual_seed(n)
    codes = torch.randint(0, 16, (n, k), dtype=torch.uint8)
    scales = (torch.rand(n, k // 32) * 0.05 + 0.01).half().float()
    offsets = (-torch.rand(n, k // 32) * 0.4).half().float()
    weight = cpu_quant.Int4DotWeight(codes, scales, offsets, torch.float32)
    assert torch.equal(weight.codes(), codes)
    return weight, _reference(codes, scales, offsets)


def _q8_weight(n: int, k: int) -> tuple[cpu_quant.Int8DotWeight, torch.Tensor]:
    torch.manual_seed(n)
    codes = torch.randint(-127, 128, (n, k), dtype=torch.int8)
    scales = (torch.rand(n, k // 32) * 0.01 + 0.001).half()
    weight = cpu_quant.Int8DotWeight(codes, scales, torch.float32)
    return weight, codes.double() * scales.double().repeat_interleave(32, 1)


# float32 accumulation of the exactly scaled integer sums: ~1e-7 of the largest output
EXACT = 1e-5


@needs_dot
@pytest.mark.parametrize("make", [_q4_weight, _q8_weight], ids=["q4", "q8"])
@pytest.mark.parametrize("n", [6, 7, 64])  # a tail of 2 (q4) or 3 (q8) outputs after the tiles of 4
@pytest.mark.parametrize("rows", [1, 2, 3, 5])
def test_dot_kernels_compute_the_quantized_activation_product(make, n: int, rows: int) -> None:
    if make is _q4_weight and n % 2:
        with pytest.raises(ValueError, match="even number of outputs"):
            make(n, 320)
        return
    weight, w = make(n, 320)  # 10 blocks of 32: the offsets' dot product ends in a scalar tail
    x = torch.randn(rows, 320) * torch.linspace(0.1, 3, 320)
    got = weight.linear(x)
    ref = _quantized_rows(x) @ w.t()
    assert float((got - ref).abs().max() / ref.abs().max()) < EXACT
    assert torch.equal(weight.dequantize(torch.float64), w)
    # and within the activations' int8 rounding of the float64 product
    exact = x.double() @ w.t()
    assert float((got - exact).abs().max() / exact.abs().max()) < 1e-4


@needs_dot
@pytest.mark.parametrize("make", [_q4_weight, _q8_weight], ids=["q4", "q8"])
def test_dot_kernels_fuse_the_step_around_the_product(make) -> None:
    """RMSNorm before, SwiGLU before, bias and an in-place residual add after: as the torch ops."""
    n, k, rows, eps = 64, 256, 3, 1e-5
    weight, w = make(n, k)
    x = torch.randn(rows, k) * 4
    norm = torch.rand(k) + 0.5
    bias, residual = torch.randn(n), torch.randn(rows, n)

    def rel(got: torch.Tensor, ref: torch.Tensor) -> float:
        return float((got - ref).abs().max() / ref.abs().max())

    normed = torch.nn.functional.rms_norm(x, (k,), norm, eps)
    got = weight.fused_linear(x, norm=norm, eps=eps, bias=bias)
    # float32 RMSNorm may round a code differently from the float64 one: one code step at most
    assert rel(got, _quantized_rows(normed) @ w.t() + bias.double()) < 1e-4
    gate_up = torch.randn(rows, 2 * k) * 2
    activated = torch.nn.functional.silu(gate_up[:, :k]) * gate_up[:, k:]
    h = residual.clone()
    got = weight.fused_linear(gate_up, swiglu=True, add=h, out=h)
    assert got.data_ptr() == h.data_ptr()
    assert rel(h - residual, _quantized_rows(activated) @ w.t()) < 1e-4
    # a row slice of a wider tensor: the kernel reads it through its row stride
    wide = torch.randn(rows, 2 * k)
    assert rel(weight.linear(wide[:, :k]), weight.linear(wide[:, :k].contiguous())) == 0
    with pytest.raises(ValueError, match="input rows of 100 values"):
        weight.linear(torch.randn(rows, 100))


@needs_dot
def test_dot_weights_prefill_through_the_dense_gemm() -> None:
    weight, w = _q4_weight(64, 320)
    x = torch.randn(cpu_quant.CPU_DEQUANT_ROWS + 3, 320)
    got = weight.linear(x)  # no int8 rounding of the activations: bfloat16 at most
    exact = x.double() @ w.t()
    assert float((got - exact).abs().max() / exact.abs().max()) < 1e-2


@pytest.fixture
def fresh_library(monkeypatch, tmp_path: Path):
    """cpu_native.library() looked up again under this test's environment, and again after it."""
    monkeypatch.setenv("LLMDEPLOY_CACHE_DIR", str(tmp_path))
    cpu_native.library.cache_clear()
    yield
    cpu_native.library.cache_clear()


def test_dot_kernels_say_why_they_are_off(fresh_library, monkeypatch) -> None:
    monkeypatch.setenv("LLMDEPLOY_CPU_DOT", "0")
    assert cpu_native.library() is None
    assert cpu_native.unavailable_reason() == "LLMDEPLOY_CPU_DOT=0"
    cpu_native.library.cache_clear()
    monkeypatch.setenv("LLMDEPLOY_CPU_DOT", "fast")
    assert cpu_native.library() is None
    assert cpu_native.unavailable_reason() == "LLMDEPLOY_CPU_DOT='fast' is not 1, avx2 or 0"
    cpu_native.library.cache_clear()
    monkeypatch.delenv("LLMDEPLOY_CPU_DOT")
    monkeypatch.setenv("CC", "no-such-compiler-here")
    assert cpu_native.library() is None
    assert "no C compiler" in str(cpu_native.unavailable_reason())


@needs_dot
def test_dot_kernels_report_a_failed_build_and_reuse_a_good_one(
    fresh_library, monkeypatch, tmp_path: Path
) -> None:
    broken = tmp_path / "broken.c"
    broken.write_text("this is not C\n")
    monkeypatch.setattr(cpu_native, "SOURCE", broken)
    assert cpu_native.library() is None
    assert "building them failed" in str(cpu_native.unavailable_reason())
    assert not list((tmp_path / "kernels").glob("*.so"))  # no half-written library left behind
    monkeypatch.undo()
    monkeypatch.setenv("LLMDEPLOY_CACHE_DIR", str(tmp_path))
    cpu_native.library.cache_clear()
    assert cpu_native.library() is not None
    built = list((tmp_path / "kernels").glob("cpu_dot-*.so"))
    assert len(built) == 1
    stamp = built[0].stat().st_mtime_ns
    cpu_native.library.cache_clear()
    assert cpu_native.library() is not None
    assert built[0].stat().st_mtime_ns == stamp  # found in the cache, not compiled again


def _products(x: torch.Tensor) -> list[torch.Tensor]:
    """The q4 and q8 products of x (3 rows: a tile of 2 and 1) through the library loaded now."""
    return [make(64, 320)[0].linear(x) for make in (_q4_weight, _q8_weight)]


@needs_dot
def test_vnni_and_plain_builds_compute_the_same_products(fresh_library, monkeypatch) -> None:
    """The integer sums are exact either way, and the float work around them is the same."""
    if len(cpu_native._isa_flags()) == 1:
        pytest.skip("this CPU has no VNNI: only the plain build runs here")
    x = torch.randn(3, 320) * 3
    vnni = _products(x)
    monkeypatch.setenv("LLMDEPLOY_CPU_DOT", "avx2")
    assert cpu_native._isa_flags() == [()]
    cpu_native.library.cache_clear()
    plain = _products(x)
    for a, b in zip(vnni, plain, strict=True):
        assert torch.equal(a, b)


@needs_dot
def test_a_compiler_without_the_vnni_flags_builds_the_plain_kernels(
    fresh_library, monkeypatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(cpu_native, "_cpu_flags", lambda: {"avx_vnni"})
    monkeypatch.setitem(cpu_native.VNNI_FLAGS, "avx_vnni", ("-mno-such-option-anywhere",))
    assert cpu_native.library() is not None
    assert len(list((tmp_path / "kernels").glob("cpu_dot-*.so"))) == 1
