"""Quantized copies of the default model (SmolLM2-135M quantized with AWQ's, GPTQ's and
compressed-tensors' real packing, written as those tools write them) load through the checkpoint
loader users hit, give the logits of the same weights dequantized into a dense checkpoint, and
generate text."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from llmdeploy_engine.config import EngineConfig
from llmdeploy_engine.core.forward_batch import ForwardBatch
from llmdeploy_engine.facts import AUTO_MAX_MODEL_LEN
from llmdeploy_engine.kernels.int4_formats import dequantize_int4, unpack_awq, unpack_gptq
from llmdeploy_engine.llm import LLM
from llmdeploy_engine.loading.quant_checkpoint import hf_config_dict, write_quantized
from llmdeploy_engine.model.quant_config import load_quant_spec
from llmdeploy_engine.runner.model_runner import ModelRunner
from llmdeploy_engine.sampling_params import SamplingParams

pytestmark = pytest.mark.slow  # the model is loaded: seconds a test on 2 cores

KV_BYTES = 16 * 2**20
# SmolLM2-135M's hidden size (576) is not a multiple of 128: its int4 copies use groups of 64
CASES: list[tuple[str, dict[str, Any]]] = [
    ("awq", {"group_size": 64}),
    ("gptq", {"sym": False, "desc_act": True, "group_size": 64}),
    ("fp8", {"fp8_strategy": "channel"}),
]


@pytest.fixture(scope="module")
def source(gguf_path: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    from llmdeploy_engine.loading.gguf_loader import load_gguf

    mc, weights = load_gguf(gguf_path)
    return hf_config_dict(mc), weights


def _dequantized_copy(folder: Path, dest: Path) -> Path:
    """A dense checkpoint of the quantized folder's weights, dequantized by the formats' definitions."""
    from safetensors.torch import load_file, save_file

    spec = load_quant_spec(folder)
    assert spec is not None
    stored = load_file(str(folder / "model.safetensors"))
    dense: dict[str, torch.Tensor] = {}
    for name, t in stored.items():
        base, _, kind = name.rpartition(".")
        if kind == "qweight":
            if spec.method == "awq":
                codes, scales, zeros = unpack_awq(t, stored[f"{base}.qzeros"], stored[f"{base}.scales"])
                g_idx = torch.arange(codes.shape[1]) // spec.group(codes.shape[1])
            else:
                codes, scales, zeros = unpack_gptq(
                    t, stored[f"{base}.qzeros"], stored[f"{base}.scales"], spec.zeros_offset
                )
                g_idx = stored[f"{base}.g_idx"]
            dense[f"{base}.weight"] = dequantize_int4(codes, scales, zeros, g_idx).float()
        elif kind == "weight" and t.dtype == torch.float8_e4m3fn:
            dense[name] = t.float() * stored[f"{base}.weight_scale"].float().reshape(-1, 1)
        elif kind not in ("qzeros", "scales", "g_idx", "weight_scale"):
            dense[name] = t.float()
    dest.mkdir()
    save_file(dense, str(dest / "model.safetensors"))
    config = json.loads((folder / "config.json").read_text())
    del config["quantization_config"]
    (dest / "config.json").write_text(json.dumps(config))
    return dest


def _logits(runner: ModelRunner, ids: list[int]) -> torch.Tensor:
    n = len(ids)
    table = list(range(-(-n // runner.block_size)))
    batch = ForwardBatch(ids, list(range(n)), list(range(n)), [0], [n], [n], [table], [0])
    with torch.inference_mode():
        return runner.execute(batch)[0]


@pytest.fixture(scope="module")
def folders(
    tmp_path_factory: pytest.TempPathFactory, source: tuple[dict[str, Any], dict[str, torch.Tensor]]
) -> dict[str, Path]:
    """One quantized copy per case (written once: quantizing takes a while on a CI machine)."""
    config, weights = source
    root = tmp_path_factory.mktemp("quantized")
    return {
        method + str(i): write_quantized(root / f"{method}{i}", config, weights, method, **options)
        for i, (method, options) in enumerate(CASES)
    }


@pytest.mark.parametrize(("case", "method"), [(m + str(i), m) for i, (m, _) in enumerate(CASES)])
def test_quantized_default_model_loads_and_matches_its_dequantized_weights(
    tmp_path: Path, gguf_path: Path, folders: dict[str, Path], case: str, method: str
) -> None:
    folder = folders[case]
    stored = json.loads((folder / "config.json").read_text())["quantization_config"]
    assert stored["quant_method"] == ("compressed-tensors" if method == "fp8" else method)
    dense = _dequantized_copy(folder, tmp_path / "dense")
    engine = EngineConfig(
        model=str(folder),
        tokenizer=str(gguf_path),
        device="cpu",
        kv_cache_memory_bytes=KV_BYTES,
        max_model_len=AUTO_MAX_MODEL_LEN,
    )
    runner = ModelRunner(engine)
    assert runner.model_config.quantization is not None
    ref_runner = ModelRunner(
        EngineConfig(
            model=str(dense), device="cpu", kv_cache_memory_bytes=KV_BYTES, max_model_len=AUTO_MAX_MODEL_LEN
        )
    )
    ids = torch.randint(0, 49152, (24,), generator=torch.Generator().manual_seed(0)).tolist()
    got, want = _logits(runner, ids), _logits(ref_runner, ids)
    assert float((got - want).abs().max() / want.abs().max()) < 1e-4
    del runner, ref_runner


def test_quantized_default_model_generates(gguf_path: Path, folders: dict[str, Path]) -> None:
    folder = folders["awq0"]
    llm = LLM(
        str(folder),
        tokenizer=str(gguf_path),
        device="cpu",
        kv_cache_memory_bytes=KV_BYTES,
        max_model_len=AUTO_MAX_MODEL_LEN,
        quantization="awq",
    )
    out = llm.generate(["The capital of France is"], SamplingParams(max_tokens=8, temperature=0.0))
    assert len(out[0].outputs[0].token_ids) == 8
    assert out[0].outputs[0].text.strip()


def test_quantization_flag_must_match_the_checkpoint(gguf_path: Path, folders: dict[str, Path]) -> None:
    folder = folders["fp82"]
    with pytest.raises(ValueError, match="--quantization awq but the checkpoint is fp8-quantized"):
        ModelRunner(
            EngineConfig(model=str(folder), tokenizer=str(gguf_path), device="cpu",
                         kv_cache_memory_bytes=KV_BYTES, max_model_len=AUTO_MAX_MODEL_LEN, quantization="awq")
        )  # fmt: skip
