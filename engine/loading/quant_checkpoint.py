"""Write quantized checkpoint folders the way the quantization tools do, from dense weights.

AutoAWQ (GEMM), GPTQ (AutoGPTQ / GPTQModel, formats `gptq` and `gptq_v2`, with or without
act-order) and compressed-tensors fp8 (llm-compressor: per-tensor or per-channel weight scales):
config.json with its `quantization_config`, the quantized projections' tensors under their names,
everything else as it was. The quantization is round-to-nearest (no calibration): these folders are
for tests and benchmarks of the loader and kernels, which read them exactly as a hub download.

    python -m llmdeploy_engine.loading.quant_checkpoint SRC_FOLDER_OR_GGUF DEST --method awq
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from llmdeploy_engine.config import ModelConfig
from llmdeploy_engine.facts import ARCHITECTURES
from llmdeploy_engine.kernels.int4_formats import pack_awq, pack_gptq, quantize_int4

METHODS = ("awq", "gptq", "fp8")
_PROJECTION = re.compile(r"^model\.layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj)\.weight$")


def hf_config_dict(mc: ModelConfig) -> dict[str, Any]:
    """A config.json for ModelConfig (what transformers writes for these fields)."""
    rope: dict[str, Any] | None = None
    if mc.rope_scaling.rope_type == "linear":
        rope = {"rope_type": "linear", "factor": mc.rope_scaling.factor}
    elif mc.rope_scaling.rope_type == "llama3":
        r = mc.rope_scaling
        rope = {
            "rope_type": "llama3",
            "factor": r.factor,
            "low_freq_factor": r.low_freq_factor,
            "high_freq_factor": r.high_freq_factor,
            "original_max_position_embeddings": r.original_max_position_embeddings,
        }
    classes = {arch: name for name, arch in ARCHITECTURES.items()}
    return {
        "architectures": [classes[mc.architecture]],
        "model_type": mc.architecture,
        "vocab_size": mc.vocab_size,
        "hidden_size": mc.hidden_size,
        "intermediate_size": mc.intermediate_size,
        "num_hidden_layers": mc.num_hidden_layers,
        "num_attention_heads": mc.num_attention_heads,
        "num_key_value_heads": mc.num_key_value_heads,
        "head_dim": mc.head_dim,
        "max_position_embeddings": mc.max_position_embeddings,
        "rms_norm_eps": mc.rms_norm_eps,
        "rope_theta": mc.rope_theta,
        "rope_scaling": rope,
        "tie_word_embeddings": mc.tie_word_embeddings,
        "attention_bias": mc.attention_bias,
        "bos_token_id": mc.bos_token_id,
        "eos_token_id": mc.eos_token_id,
        "torch_dtype": "bfloat16",
    }


def quantization_config(
    method: str, group_size: int = 128, sym: bool = False, desc_act: bool = False,
    checkpoint_format: str = "gptq", fp8_strategy: str = "channel",
) -> dict[str, Any]:  # fmt: skip
    """The `quantization_config` each tool writes (the fields the engine and vLLM read)."""
    if method == "awq":
        return {"quant_method": "awq", "bits": 4, "group_size": group_size, "zero_point": True,
                "version": "gemm", "modules_to_not_convert": None}  # fmt: skip
    if method == "gptq":
        return {"quant_method": "gptq", "bits": 4, "group_size": group_size, "sym": sym,
                "desc_act": desc_act, "damp_percent": 0.01, "true_sequential": True,
                "checkpoint_format": checkpoint_format, "lm_head": False}  # fmt: skip
    if method == "fp8":
        return {
            "quant_method": "compressed-tensors",
            "format": "float-quantized",
            "quantization_status": "compressed",
            "config_groups": {
                "group_0": {
                    "targets": ["Linear"],
                    "weights": {
                        "num_bits": 8,
                        "type": "float",
                        "strategy": fp8_strategy,
                        "symmetric": True,
                        "dynamic": False,
                    },
                    "input_activations": {
                        "num_bits": 8,
                        "type": "float",
                        "strategy": "token",
                        "symmetric": True,
                        "dynamic": True,
                    },
                }
            },
            "ignore": ["lm_head"],
        }
    raise ValueError(f"method {method!r}: choose one of {', '.join(METHODS)}")


def quantize_tensors(
    name: str, w: torch.Tensor, method: str, qcfg: dict[str, Any], gen: torch.Generator | None = None,
    order: torch.Tensor | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:  # fmt: skip
    """The checkpoint tensors of projection weight `name` ([N, K], any float dtype), on CPU. GPTQ
    act-order: the inputs are grouped in `order` (a permutation of K), else in one drawn from gen."""
    base = name.removesuffix(".weight")
    k = w.shape[1]
    if method == "fp8":
        wf = w.float()
        if qcfg["config_groups"]["group_0"]["weights"]["strategy"] == "channel":
            scale = (wf.abs().amax(1, keepdim=True) / 448.0).clamp(min=1e-12)  # [N, 1], as llm-compressor
        else:
            scale = (wf.abs().amax() / 448.0).clamp(min=1e-12).reshape(1)
        q = (wf / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
        yield f"{base}.weight", q.cpu()
        yield f"{base}.weight_scale", scale.cpu()
        return
    group = k if qcfg["group_size"] == -1 else qcfg["group_size"]
    g_idx = None
    if method == "gptq" and qcfg["desc_act"]:
        # act-order: groups over a permutation of the inputs (GPTQ orders by the Hessian's diagonal)
        if order is None:
            order = torch.randperm(k, generator=gen)
        g_idx = torch.empty(k, dtype=torch.int64)
        g_idx[order] = torch.arange(k) // group
    offset = 1 if method == "gptq" and qcfg["checkpoint_format"] == "gptq" else 0
    sym = method == "gptq" and qcfg["sym"]
    codes, scales, zeros = quantize_int4(w, group, sym, g_idx, min_zero=offset)
    codes, scales, zeros = codes.cpu(), scales.cpu(), zeros.cpu()
    if method == "awq":
        tensors = pack_awq(codes, scales, zeros)
    else:
        plain = torch.arange(k) // group
        tensors = pack_gptq(codes, scales, zeros, plain if g_idx is None else g_idx, offset)
    for kind, t in tensors.items():
        yield f"{base}.{kind}", t


def write_quantized(
    dest: str | Path,
    config: dict[str, Any],
    weights: Iterator[tuple[str, torch.Tensor]] | dict[str, torch.Tensor],
    method: str,
    seed: int = 0,
    **options: Any,
) -> Path:
    """Write DEST/config.json (+ quantize_config.json for GPTQ) and DEST/model.safetensors from dense
    Hugging Face-named weights; the decoder's projections are quantized, the rest kept as bf16."""
    from safetensors.torch import save_file

    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    qcfg = quantization_config(method, **options)
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    # act-order: projections of one input (q/k/v, gate/up) share its order, as GPTQ's equal Hessians give
    orders: dict[str, torch.Tensor] = {}
    items = weights.items() if isinstance(weights, dict) else weights
    for name, w in items:
        if _PROJECTION.match(name):
            key = re.sub(r"self_attn\.[qkv]_proj\.weight$|mlp\.(gate|up)_proj\.weight$", "shared input", name)
            if key not in orders:
                orders[key] = torch.randperm(w.shape[1], generator=gen)
            out.update(quantize_tensors(name, w, method, qcfg, order=orders[key]))
        else:
            out[name] = w.to(torch.bfloat16).cpu().contiguous()
    save_file(out, str(dest / "model.safetensors"), metadata={"format": "pt"})
    (dest / "config.json").write_text(json.dumps({**config, "quantization_config": qcfg}, indent=2))
    if method == "gptq":
        (dest / "quantize_config.json").write_text(json.dumps(qcfg, indent=2))
    return dest


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("source", help="a checkpoint folder or a .gguf file (dense or dequantized at load)")
    p.add_argument("dest")
    p.add_argument("--method", choices=METHODS, required=True)
    p.add_argument("--group-size", type=int, default=128)
    p.add_argument("--sym", action="store_true", help="GPTQ: symmetric (no zero points)")
    p.add_argument("--desc-act", action="store_true", help="GPTQ: act-order")
    p.add_argument("--checkpoint-format", choices=("gptq", "gptq_v2"), default="gptq")
    p.add_argument("--fp8-strategy", choices=("tensor", "channel"), default="channel")
    args = p.parse_args(argv)
    if args.source.endswith(".gguf"):
        from llmdeploy_engine.loading.gguf_loader import load_gguf

        mc, weights = load_gguf(args.source)
    else:
        from llmdeploy_engine.loading.hf_loader import load_hf

        mc, weights = load_hf(args.source)
    options: dict[str, Any] = {}
    if args.method != "fp8":
        options["group_size"] = args.group_size
    if args.method == "gptq":
        options.update(sym=args.sym, desc_act=args.desc_act, checkpoint_format=args.checkpoint_format)
    if args.method == "fp8":
        options["fp8_strategy"] = args.fp8_strategy
    path = write_quantized(args.dest, hf_config_dict(mc), weights, args.method, **options)
    print(f"wrote {args.method} checkpoint to {path}")


if __name__ == "__main__":
    main()
