"""GGUF files: model shape from the header, weights dequantized to Hugging Face-named tensors.

Every quantization `gguf.quants.dequantize` knows is accepted (F32, F16, BF16, Q8_0, Q4_0, Q4_1,
Q4_K, Q6_K among them); weights are dequantized once at load and served in the engine's dtype.
llama.cpp's converter permutes the rows of Q and K of Llama-type models (llama, mistral) into an
interleaved RoPE layout; that permutation is undone so the model uses the rotate-half layout.
Llama 3.1 files carry their long-context RoPE as a `rope_freqs` tensor of per-frequency divisors;
it goes into the config (`rope_freq_factors`), not the weights.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from llmdeploy_engine.config import ModelConfig, RopeScaling

# GGUF architecture name -> ours; Mistral GGUFs say "llama".
_ARCHITECTURES = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}
_PERMUTED_QK = {"llama"}

_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


_TOKENIZER_ARRAYS = ("tokens", "merges", "token_type", "scores")


def is_gguf(path: str | Path) -> bool:
    return str(path).endswith(".gguf") and Path(path).is_file()


def _fields(reader: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, field in reader.fields.items():
        if name.startswith("tokenizer.ggml.") and name.rsplit(".", 1)[-1] in _TOKENIZER_ARRAYS:
            continue  # large arrays, read by the tokenizer
        try:
            out[name] = field.contents()
        except Exception:  # a field type this gguf version cannot decode; not one we need
            continue
    return out


_shared_readers: dict[tuple[str, int, int], Any] | None = None


@contextmanager
def shared_gguf_reader() -> Iterator[None]:
    """Within it, every read of one GGUF file shares one parsed reader: gguf-py's reader takes seconds
    to parse a large vocabulary, and an engine start reads the file for its config, its weights and its
    chat template. The parsed fields (~160 MB for the default model) are dropped when it ends."""
    global _shared_readers
    if _shared_readers is not None:  # an outer scope already shares
        yield
        return
    _shared_readers = {}
    try:
        yield
    finally:
        _shared_readers = None


@functools.cache
def _reader_class() -> Any:
    from gguf import GGUFReader

    class PlainMapReader(GGUFReader):  # type: ignore[misc]
        """gguf-py's reader over a plain ndarray view of its memory map: the reader slices its map a
        few times per vocabulary entry, and each slice of a `np.memmap` runs that subclass's Python
        hooks (the default model's parse: 4-5 s over the memmap, ~1.6 s over the plain view). The
        view shares the read-only map, so tensors still read the file in place."""

        @property
        def data(self) -> Any:
            return self._plain_data

        @data.setter
        def data(self, value: Any) -> None:
            self._plain_data = value.view(np.ndarray)

    return PlainMapReader


def _open_reader(path: str) -> Any:
    return _reader_class()(path)


def gguf_reader(path: str | Path) -> Any:
    """gguf-py's reader of the file at `path`: parsed once per `shared_gguf_reader` scope."""
    if _shared_readers is None:
        return _open_reader(str(path))
    resolved = Path(path).resolve()
    st = resolved.stat()
    key = (str(resolved), st.st_size, st.st_mtime_ns)
    if key not in _shared_readers:
        _shared_readers[key] = _open_reader(str(resolved))
    return _shared_readers[key]


def tokenizer_fields(path: str | Path) -> dict[str, Any]:
    """The file's `tokenizer.*` metadata, its vocabulary arrays included, and its architecture."""
    reader = gguf_reader(path)
    out: dict[str, Any] = {}
    for name, field in reader.fields.items():
        if name.startswith("tokenizer.") or name == "general.architecture":
            out[name] = field.contents()
    return out


def load_gguf_config(path: str | Path) -> ModelConfig:
    reader = gguf_reader(path)
    return _config_from_fields(_fields(reader), reader.tensors)


def _rope_freq_factors(tensors: list[Any]) -> tuple[float, ...] | None:
    """Llama 3.1 GGUFs store their long-context RoPE as per-frequency divisors (rope_freqs.weight)."""
    for t in tensors:
        if t.name == "rope_freqs.weight":
            return tuple(float(x) for x in np.asarray(t.data, dtype=np.float32).reshape(-1))
    return None


def _config_from_fields(f: dict[str, Any], tensors: list[Any]) -> ModelConfig:
    tensor_names = {t.name for t in tensors}
    arch = f.get("general.architecture")
    if arch not in _ARCHITECTURES:
        raise ValueError(
            f"GGUF architecture {arch!r} is not supported; supported: {', '.join(_ARCHITECTURES)}"
        )

    def key(name: str, default: Any = None) -> Any:
        value = f.get(f"{arch}.{name}", default)
        if value is None:
            raise ValueError(f"GGUF file lacks {arch}.{name}")
        return value

    hidden = int(key("embedding_length"))
    heads = int(key("attention.head_count"))
    head_dim = int(f.get(f"{arch}.attention.key_length", hidden // heads))
    vocab = f.get(f"{arch}.vocab_size")
    if vocab is None:
        vocab = len(f.get("tokenizer.ggml.tokens", []))
    scaling = RopeScaling()
    if f.get(f"{arch}.rope.scaling.type") == "linear":
        scaling = RopeScaling(rope_type="linear", factor=float(f[f"{arch}.rope.scaling.factor"]))
    return ModelConfig(
        architecture=_ARCHITECTURES[arch],
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(key("feed_forward_length")),
        num_hidden_layers=int(key("block_count")),
        num_attention_heads=heads,
        num_key_value_heads=int(f.get(f"{arch}.attention.head_count_kv", heads)),
        head_dim=head_dim,
        max_position_embeddings=int(key("context_length")),
        rms_norm_eps=float(key("attention.layer_norm_rms_epsilon", 1e-6)),
        rope_theta=float(f.get(f"{arch}.rope.freq_base", 10000.0)),
        rope_scaling=scaling,
        rope_freq_factors=_rope_freq_factors(tensors),
        tie_word_embeddings="output.weight" not in tensor_names,
        attention_bias="blk.0.attn_q.bias" in tensor_names,
        qk_norm="blk.0.attn_q_norm.weight" in tensor_names,
        bos_token_id=f.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=f.get("tokenizer.ggml.eos_token_id"),
    )


def _hf_name(gguf_name: str) -> str | None:
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    if gguf_name.startswith("blk."):
        _, layer, rest = gguf_name.split(".", 2)
        if rest in _LAYER_NAMES:
            return f"model.layers.{layer}.{_LAYER_NAMES[rest]}"
    return None


def _unpermute(w: np.ndarray, num_heads: int) -> np.ndarray:
    """Inverse of llama.cpp's Q/K permutation: per head, interleaved (x0,y0,x1,y1..) back to halves."""
    rows = w.shape[0]
    rest = w.shape[1:]
    return w.reshape(num_heads, rows // num_heads // 2, 2, *rest).swapaxes(1, 2).reshape(w.shape)


def weight_tensors(reader: Any, architecture: str) -> Iterator[tuple[str, Any]]:
    """(Hugging Face name, GGUF tensor) of every weight in the file; a tensor with no place in the
    model is an error."""
    for t in reader.tensors:
        if t.name == "rope_freqs.weight":
            continue  # read into the config
        name = _hf_name(t.name)
        if name is None:
            raise ValueError(f"GGUF tensor {t.name!r} has no place in a {architecture} model")
        yield name, t


def load_gguf(path: str | Path) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """(config, float32 state dict with Hugging Face names) from a GGUF file."""
    from gguf.quants import dequantize

    reader = gguf_reader(path)
    fields = _fields(reader)
    config = _config_from_fields(fields, reader.tensors)
    permuted = fields["general.architecture"] in _PERMUTED_QK
    weights: dict[str, torch.Tensor] = {}
    for name, t in weight_tensors(reader, config.architecture):
        w = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        # ne0 is the fastest axis: GGUF shape [in, out] is numpy/torch [out, in]
        w = w.reshape(tuple(int(d) for d in reversed(t.shape)))
        if permuted and name.endswith("q_proj.weight"):
            w = _unpermute(w, config.num_attention_heads)
        elif permuted and name.endswith("k_proj.weight"):
            w = _unpermute(w, config.num_key_value_heads)
        # a copy: the reader maps the file read-only
        weights[name] = torch.from_numpy(np.array(w, dtype=np.float32, order="C"))
    return config, weights
