"""GGUF weights kept compact on the CPU (`--cpu-weights`): a loaded model's projections, LM head and
embedding take the CPU kernels' weights of cpu_quant.py in place of float32 tensors.

The GGUF blocks are decoded here, not dequantized: Q4_0, Q4_1 and Q4_K become 4-bit codes with one
scale and one offset per 32 input features (`Int4PackWeight`); other quantized types (Q8_0, Q6_K,
Q5_*, ...) are dequantized by gguf-py and kept as float16 (`Fp16PackWeight`); the embedding keeps
Q8_0's int8 codes and scales (else float16 rows) and dequantizes the rows it looks up. Unquantized
tensors (norms, biases, F32/F16/BF16 weights) load as they do on the float32 path.
The arithmetic differs from the float32 path only by rounding: activations and the int4 scales and
zeros in bfloat16 (the int4 kernel's inputs), Q8_0 / Q6_K weights in float16. The model is built
as usual first; its float32 projection tensors are never written, so their pages never become
resident and are freed when the compact weights replace them.

Modes: `float32` (dequantize everything at load, the path of gguf_loader.load_gguf), `quantized`
(compact; an error where torch lacks the kernels), `auto` (compact on a CPU whose torch kernels are
vectorized, AVX2 or AVX-512, at tensor_parallel_size 1; float32 otherwise).
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch
from llmdeploy_engine.kernels import cpu_native
from llmdeploy_engine.loading.gguf_kinds import DENSE_TYPES, projection_storage
from llmdeploy_engine.loading.gguf_loader import (
    _PERMUTED_QK,
    _fields,
    _unpermute,
    gguf_reader,
    weight_tensors,
)
from llmdeploy_engine.model import cpu_quant
from torch import nn

logger = logging.getLogger("llmdeploy_engine")

CPU_WEIGHTS = ("auto", "quantized", "float32")


def use_compact(mode: str, device: torch.device, model: str, tensor_parallel_size: int) -> bool:
    """Whether this engine keeps the GGUF weights compact; a clear error where `quantized` cannot."""
    if mode not in CPU_WEIGHTS:
        raise ValueError(f"cpu_weights {mode!r}: use {', '.join(CPU_WEIGHTS)}")
    if mode == "float32" or device.type != "cpu" or not model.endswith(".gguf"):
        return False
    problems = []
    if tensor_parallel_size > 1:
        problems.append(f"tensor_parallel_size {tensor_parallel_size} (compact weights are not sharded)")
    if not cpu_quant.int4pack_available():
        problems.append(
            f"this torch/CPU ({torch.backends.cpu.get_cpu_capability()}) has no vectorized int4 kernel"
        )
    if not cpu_quant.fp16pack_available():
        problems.append("this torch build has no fbgemm (fp16 GEMM)")
    if problems and mode == "quantized":
        raise ValueError(
            f"--cpu-weights quantized is not possible here: {'; '.join(problems)}; use --cpu-weights float32"
        )
    return not problems


# ---- GGUF blocks -> codes, scales, offsets (w = codes * scale + offset, groups of 32) ----------------
def _f16(blocks: np.ndarray, start: int) -> np.ndarray:
    return blocks[:, start : start + 2].copy().view(np.float16).astype(np.float32)  # [blocks, 1]


def _low_high(qs: np.ndarray) -> np.ndarray:
    """[blocks, 16 * m] bytes -> [blocks, 32 * m] codes: per 16 bytes, the low nibbles then the high."""
    nb = qs.shape[0]
    qs = qs.reshape(nb, -1, 1, 16) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    return (qs & 0x0F).reshape(nb, -1)


def decode_int4(data: np.ndarray, kind: str, rows: int, cols: int) -> tuple[torch.Tensor, ...]:
    """GGUF Q4_0 / Q4_1 / Q4_K bytes [rows, row bytes] -> codes uint8 [rows, cols], scales and offsets
    float32 [rows, cols / 32]."""
    blocks = np.asarray(data, dtype=np.uint8)
    if kind in ("Q4_0", "Q4_1"):
        blocks = blocks.reshape(-1, 18 if kind == "Q4_0" else 20)
        d = _f16(blocks, 0)
        qs = blocks[:, 2:] if kind == "Q4_0" else blocks[:, 4:]
        codes = _low_high(qs)  # Q4_0/Q4_1: byte j holds elements j and j + 16
        offset = -8 * d if kind == "Q4_0" else _f16(blocks, 2)
        scale = d
    elif kind == "Q4_K":
        from gguf.quants import Q4_K

        blocks = blocks.reshape(-1, 144)
        d, dmin = _f16(blocks, 0), _f16(blocks, 2)
        sc, mn = Q4_K.get_scale_min(blocks[:, 4:16].copy())
        qs = blocks[:, 16:].reshape(-1, 4, 32)  # sub-blocks 2j / 2j + 1: low / high nibbles of 32 bytes
        codes = np.stack((qs & 0x0F, qs >> 4), axis=2).reshape(-1, 256)
        scale = (d * sc.astype(np.float32)).reshape(-1, 1)  # one per sub-block of 32
        offset = (-dmin * mn.astype(np.float32)).reshape(-1, 1)
    else:
        raise ValueError(f"{kind} is not a 4-bit type with groups of 32")
    groups = cols // 32
    return (
        torch.from_numpy(np.ascontiguousarray(codes.reshape(rows, cols))),
        torch.from_numpy(np.ascontiguousarray(scale.reshape(rows, groups))),
        torch.from_numpy(np.ascontiguousarray(offset.reshape(rows, groups))),
    )


def _dequantized(t: Any, rows: int, cols: int) -> torch.Tensor:
    from gguf.quants import dequantize

    w = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(rows, cols)
    return torch.from_numpy(np.array(w, dtype=np.float32, order="C"))


class _Tensor:
    """One GGUF tensor, its HF name and its [rows, cols] shape; rows un-permuted for Q/K on read."""

    def __init__(self, t: Any, name: str, unpermute_heads: int | None) -> None:
        self.t, self.name, self.heads = t, name, unpermute_heads
        self.kind = t.tensor_type.name
        self.shape = tuple(int(d) for d in reversed(t.shape))

    def _rows(self, x: torch.Tensor) -> torch.Tensor:
        if self.heads is None:
            return x
        return torch.from_numpy(np.ascontiguousarray(_unpermute(x.numpy(), self.heads)))

    def dense(self) -> torch.Tensor:
        rows = self.shape[0]
        cols = int(np.prod(self.shape[1:])) if len(self.shape) > 1 else 1
        w = _dequantized(self.t, rows, cols).reshape(self.shape)
        return self._rows(w)

    def int4(self) -> tuple[torch.Tensor, ...]:
        rows, cols = self.shape
        return tuple(self._rows(x) for x in decode_int4(self.t.data, self.kind, rows, cols))

    @functools.cached_property
    def q8(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Q8_0 -> int8 codes [rows, cols] and float16 scales [rows, cols / 32] (decoded once: a tied
        LM head and the embedding share them)."""
        blocks = np.asarray(self.t.data, dtype=np.uint8).reshape(-1, 34)
        rows, cols = self.shape
        values = torch.from_numpy(blocks[:, 2:].copy().view(np.int8).reshape(rows, cols))
        scales = torch.from_numpy(blocks[:, :2].copy().view(np.float16).reshape(rows, cols // 32))
        return self._rows(values), self._rows(scales)


def load_compact(model: nn.Module, path: str | Path, dot_kernels: bool = True) -> dict[str, int]:
    """Load the GGUF file at `path` into `model` (a CausalLM at tensor_parallel_size 1), its weights
    kept compact; returns how many tensors each kernel took. dot_kernels=False keeps to torch's
    kernels even where cpu_dot.c's build."""
    reader = gguf_reader(path)
    fields = _fields(reader)
    config = model.config
    permuted = fields["general.architecture"] in _PERMUTED_QK
    dtype = model.model.norm.weight.dtype
    # cpu_dot.c's kernels where they build (float32 activations only), else torch's
    dot = dot_kernels and dtype == torch.float32 and cpu_native.library() is not None
    tensors: dict[str, _Tensor] = {}
    for name, t in weight_tensors(reader, config.architecture):
        heads = None
        if permuted and name.endswith("q_proj.weight"):
            heads = config.num_attention_heads
        elif permuted and name.endswith("k_proj.weight"):
            heads = config.num_key_value_heads
        tensors[name] = _Tensor(t, name, heads)

    counts: dict[str, int] = {}
    dense: dict[str, torch.Tensor] = {}

    def take(name: str) -> _Tensor:
        if name not in tensors:
            raise ValueError(f"{path}: GGUF file lacks the tensor for {name}")
        return tensors.pop(name)

    def place(owner: nn.Module, parts: list[_Tensor]) -> None:
        """owner.weight <- the parts' rows stacked, in the kernel their types allow."""
        kernel = projection_storage((p.kind, p.shape[1], p.shape[0]) for p in parts)
        if kernel == "dense":
            if owner is model.lm_head:
                owner.weight = nn.Parameter(parts[0].dense().to(dtype))
                return
            for p in parts:
                dense[p.name] = p.dense()
            return
        weight: cpu_quant.QuantWeight
        if kernel == "int4pack":
            decoded = [p.int4() for p in parts]
            codes, scales, offsets = (torch.cat([d[i] for d in decoded]) for i in range(3))
            if dot and codes.shape[0] % 2 == 0:
                weight, kernel = cpu_quant.Int4DotWeight(codes, scales, offsets, dtype), "q4dot"
            else:
                weight = cpu_quant.Int4PackWeight(codes, scales, offsets, dtype)
        elif dot and all(p.kind == "Q8_0" and p.shape[1] % 32 == 0 for p in parts):
            if len(parts) == 1:
                values, scales = parts[0].q8  # a tied LM head: the embedding's RowTable shares them
            else:
                values, scales = (torch.cat([p.q8[i] for p in parts]) for i in range(2))
            weight, kernel = cpu_quant.Int8DotWeight(values, scales, dtype), "q8dot"
        else:
            weight = cpu_quant.Fp16PackWeight(torch.cat([p.dense() for p in parts]), dtype)
        del owner.weight
        owner.weight = weight
        counts[kernel] = counts.get(kernel, 0) + len(parts)

    for i, layer in enumerate(model.model.layers):
        prefix = f"model.layers.{i}."
        attn, mlp = layer.self_attn, layer.mlp
        place(attn.qkv_proj, [take(f"{prefix}self_attn.{p}_proj.weight") for p in "qkv"])
        place(attn.o_proj, [take(f"{prefix}self_attn.o_proj.weight")])
        place(mlp.gate_up_proj, [take(f"{prefix}mlp.{p}_proj.weight") for p in ("gate", "up")])
        place(mlp.down_proj, [take(f"{prefix}mlp.down_proj.weight")])

    embed = take("model.embed_tokens.weight")
    head = tensors.pop("lm_head.weight", None)
    if config.tie_word_embeddings:
        head = embed
    assert head is not None, "an untied model without lm_head.weight"  # the config says tied then
    model.lm_head.weight = torch.nn.Parameter(torch.empty(0))  # untie before replacing either
    place(model.lm_head, [head])
    if embed.kind in DENSE_TYPES:
        table = cpu_quant.RowTable(embed.dense(), None, dtype)  # unquantized: as the float32 path
    elif embed.kind == "Q8_0":
        table = cpu_quant.RowTable(*embed.q8, dtype)
    else:
        table = cpu_quant.RowTable(embed.dense().to(torch.float16), None, dtype)
    model.model.embed_tokens = _Embedding(table)
    counts["embedding"] = 1

    for name, rest in tensors.items():
        dense[name] = rest.dense()
    slots = model._hf_slots()
    needed = {n for n, (mod, _, _) in slots.items() if mod is None or n.endswith(".bias")}
    missing = sorted(needed - set(dense))
    if missing:
        raise ValueError(f"{path}: GGUF file lacks tensors the model needs: {missing[:5]}")
    model.load_hf_tensors(dense.items(), retie=False)  # the LM head and embedding no longer share a weight
    _release_freed_heap()
    return counts


def _release_freed_heap() -> None:
    """Hand the decoding's freed temporaries back to the OS: glibc keeps the heap pages of allocations
    under its mmap threshold (most per-tensor arrays here), ~170 MB of resident memory for the
    default model that the process would otherwise hold for its lifetime."""
    import contextlib
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if name is None:
        return
    with contextlib.suppress(OSError, AttributeError):  # not glibc
        ctypes.CDLL(name).malloc_trim(0)


class _Embedding(nn.Module):
    """The embedding layer over a compact row table (tensor_parallel_size 1)."""

    def __init__(self, table: cpu_quant.RowTable) -> None:
        super().__init__()
        self.weight = table

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows: torch.Tensor = self.weight(ids)
        return rows
