"""Seeded mutations of model files, for the model-file fuzzer (`test_model_files_fuzz.py`).

Each `ModelCase` is either a checkpoint folder (a `config.json` of a real architecture's shape, and
sometimes a safetensors header) or a GGUF file (written here field by field, so a header can be
wrong in any way a damaged download or a hostile file could be), changed by one to three operators:
a field set to a wrongly typed or absurd value, a field deleted, the file cut short, bytes
flipped, counts and lengths past the file's size, arrays nested in arrays, tensors with too many
dimensions or an unknown type. The same seed gives the same cases.
"""

from __future__ import annotations

import copy
import json
import random
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "vocab_size": 49152,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_theta": 100000.0,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
}
_QWEN3_MOE = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": 256,
    "intermediate_size": 512,
    "moe_intermediate_size": 128,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "vocab_size": 1000,
    "max_position_embeddings": 4096,
    "rope_theta": 1000000.0,
    "sliding_window": None,
}
_GEMMA3 = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "model_type": "gemma3",
    "text_config": {
        "model_type": "gemma3_text",
        "hidden_size": 640,
        "intermediate_size": 2048,
        "num_hidden_layers": 6,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 256,
        "vocab_size": 262144,
        "sliding_window": 512,
        "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
    },
    "vision_config": {
        "model_type": "siglip_vision_model",
        "hidden_size": 64,
        "intermediate_size": 128,
        "patch_size": 14,
        "image_size": 224,
        "num_hidden_layers": 2,
    },
}
CONFIGS = {"llama": _LLAMA, "qwen3-moe": _QWEN3_MOE, "gemma3": _GEMMA3}

BIG = 2**63
HOSTILE: list[Any] = [
    0, -1, 1, 3, BIG, 10**30, 1e308, 3.5, 4096.0, float("inf"), float("nan"), True, False, None, "",
    "abc", "4096", "1e400", [], [1], [None], ["x"] * 3, {}, {"a": 1}, ["sliding_attention"] * 5000,
    "x" * 5000,
]  # fmt: skip
_GGUF_KEYS = (
    "block_count", "context_length", "embedding_length", "feed_forward_length", "attention.head_count",
    "attention.head_count_kv", "attention.key_length", "rope.freq_base", "attention.layer_norm_rms_epsilon",
    "vocab_size", "expert_count", "expert_used_count", "attention.sliding_window",
)  # fmt: skip


@dataclass
class ModelCase:
    index: int
    kind: str  # "folder" or "gguf"
    files: dict[str, bytes] = field(default_factory=dict)  # name -> content
    steps: list[str] = field(default_factory=list)

    @property
    def model_name(self) -> str:
        return "model.gguf" if self.kind == "gguf" else "model"

    def write(self, folder: Path) -> Path:
        """Write the case's files under `folder`; the path a recipe's model.path names."""
        target = folder / self.model_name
        if self.kind == "gguf":
            target.write_bytes(self.files["model.gguf"])
            return target
        target.mkdir()
        for name, content in self.files.items():
            (target / name).write_bytes(content)
        return target

    def describe(self) -> str:
        return f"case {self.index} ({self.kind}): " + "; ".join(self.steps)


def cases(seed: int, n: int) -> Iterator[ModelCase]:
    rng = random.Random(seed)
    for index in range(n):
        yield _folder_case(rng, index) if rng.random() < 0.5 else _gguf_case(rng, index)


# --- checkpoint folders ---------------------------------------------------------------------------


def _folder_case(rng: random.Random, index: int) -> ModelCase:
    name = rng.choice(sorted(CONFIGS))
    case = ModelCase(index, "folder", steps=[name])
    config = copy.deepcopy(CONFIGS[name])
    raw: bytes | None = None
    for _ in range(rng.choice((1, 1, 2, 3))):
        op = rng.choices(["set", "delete", "text", "tensors"], weights=[55, 15, 15, 15])[0]
        if op == "set":
            holder, key = _pick_key(rng, config)
            value = copy.deepcopy(rng.choice(HOSTILE))  # never the shared list's own object
            holder[key] = value
            case.steps.append(f"{key}={_short(value)}")
        elif op == "delete":
            holder, key = _pick_key(rng, config)
            holder.pop(key, None)
            case.steps.append(f"delete {key}")
        elif op == "text":
            raw, what = _text_damage(rng, _json(config))
            case.steps.append(what)
        else:
            case.files["model.safetensors"] = _safetensors(rng, case)
    case.files["config.json"] = raw if raw is not None else _json(config)
    return case


def _pick_key(rng: random.Random, config: dict[str, Any]) -> tuple[dict[str, Any], str]:
    holders = [config] + [v for v in config.values() if isinstance(v, dict)]
    holder = rng.choice(holders)
    keys = [
        *sorted(holder),
        "layer_types",
        "full_attention_interval",
        "sliding_window_pattern",
        "rope_scaling",
    ]
    return holder, rng.choice(keys)


def _json(config: dict[str, Any]) -> bytes:
    return json.dumps(config).encode()  # NaN / Infinity as Python writes and reads them


def _text_damage(rng: random.Random, text: bytes) -> tuple[bytes, str]:
    choice = rng.randrange(6)
    if choice == 0:
        cut = rng.randrange(len(text))
        return text[:cut], f"cut at byte {cut}"
    if choice == 1:
        return b"[" * 100_000 + b"]" * 100_000, "nested 100,000 deep"
    if choice == 2:
        return bytes(rng.randrange(256) for _ in range(64)), "random bytes"
    if choice == 3:
        return b"[1, 2, 3]", "a JSON list"
    if choice == 4:
        return b'"just a string"', "a JSON string"
    data = bytearray(text)
    for _ in range(rng.randint(1, 8)):
        data[rng.randrange(len(data))] = rng.randrange(256)
    return bytes(data), "bytes flipped"


def _safetensors(rng: random.Random, case: ModelCase) -> bytes:
    header: Any = {
        "model.embed_tokens.weight": {"dtype": "BF16", "shape": [1000, 64], "data_offsets": [0, 128000]},
        "__metadata__": {"format": "pt"},
    }
    choice = rng.randrange(6)
    if choice == 0:
        body = json.dumps(header).encode()
        case.steps.append("safetensors: header length past the file")
        return struct.pack("<Q", 2**62) + body
    if choice == 1:
        case.steps.append("safetensors: header not JSON")
        body = b"{not json"
    elif choice == 2:
        case.steps.append("safetensors: shape of strings")
        header["model.embed_tokens.weight"]["shape"] = ["a", None]
        body = json.dumps(header).encode()
    elif choice == 3:
        case.steps.append("safetensors: a list header")
        body = b"[1, 2]"
    elif choice == 4:
        case.steps.append("safetensors: no data_offsets")
        del header["model.embed_tokens.weight"]["data_offsets"]
        body = json.dumps(header).encode()
    else:
        case.steps.append("safetensors: absurd shape")
        header["model.embed_tokens.weight"]["shape"] = [2**62, 2**62]
        body = json.dumps(header).encode()
    return struct.pack("<Q", len(body)) + body


# --- GGUF headers ---------------------------------------------------------------------------------

_U32, _I32, _F32, _BOOL, _STRING, _ARRAY, _U64 = 4, 5, 6, 7, 8, 9, 10


@dataclass
class _Gguf:
    """A GGUF file as a list of fields and tensors, each written as given (any type, any value)."""

    fields: list[tuple[str, int, Any]]
    tensors: list[tuple[str, list[int], int]]
    version: int = 3
    n_fields: int | None = None
    n_tensors: int | None = None

    def encode(self) -> bytes:
        out = bytearray(b"GGUF" + struct.pack("<I", self.version))
        out += struct.pack("<QQ", _n(self.n_tensors, len(self.tensors)), _n(self.n_fields, len(self.fields)))
        for key, vtype, value in self.fields:
            out += _str(key) + struct.pack("<I", vtype) + _encode_value(vtype, value)
        offset = 0
        for name, dims, qtype in self.tensors:
            out += _str(name) + struct.pack("<I", len(dims))
            out += b"".join(struct.pack("<Q", d % 2**64) for d in dims)
            out += struct.pack("<IQ", qtype, offset)
            offset += 64
        return bytes(out)


def _n(override: int | None, actual: int) -> int:
    return actual if override is None else override


def _str(text: str) -> bytes:
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def _encode_value(vtype: int, value: Any) -> bytes:
    formats = {_U32: "<I", _I32: "<i", _F32: "<f", _BOOL: "<?", _U64: "<Q"}
    if vtype in formats:
        return struct.pack(formats[vtype], value)
    if vtype == _STRING:
        return _str(str(value))
    assert vtype == _ARRAY
    item_type, items, claimed = value
    body = b"".join(_encode_value(item_type, item) for item in items)
    return struct.pack("<IQ", item_type, claimed) + body


def _base_gguf() -> _Gguf:
    arch = "llama"
    fields: list[tuple[str, int, Any]] = [
        ("general.architecture", _STRING, arch),
        ("general.name", _STRING, "fuzz"),
        (f"{arch}.block_count", _U32, 2),
        (f"{arch}.context_length", _U32, 2048),
        (f"{arch}.embedding_length", _U32, 64),
        (f"{arch}.feed_forward_length", _U32, 128),
        (f"{arch}.attention.head_count", _U32, 4),
        (f"{arch}.attention.head_count_kv", _U32, 2),
        (f"{arch}.rope.freq_base", _F32, 10000.0),
        (f"{arch}.attention.layer_norm_rms_epsilon", _F32, 1e-5),
        ("tokenizer.ggml.tokens", _ARRAY, (_STRING, ["a", "b", "c"], 3)),
    ]
    tensors: list[tuple[str, list[int], int]] = [("token_embd.weight", [64, 1000], 0)]
    for layer in range(2):
        for part, dims in (
            ("attn_q", [64, 64]),
            ("attn_k", [64, 32]),
            ("attn_v", [64, 32]),
            ("ffn_up", [64, 128]),
        ):
            tensors.append((f"blk.{layer}.{part}.weight", dims, 0))
    return _Gguf(fields, tensors)


def _gguf_case(rng: random.Random, index: int) -> ModelCase:
    case = ModelCase(index, "gguf")
    gguf = _base_gguf()
    cut: int | None = None
    flips = 0
    for _ in range(rng.choice((1, 1, 2, 3))):
        op = rng.choices(
            ["value", "type", "delete", "counts", "nesting", "tensor", "arch", "cut", "flip"],
            weights=[25, 15, 10, 10, 5, 15, 5, 10, 5],
        )[0]
        if op == "value":
            key = f"llama.{rng.choice(_GGUF_KEYS)}"
            vtype, value = rng.choice(
                [(_U32, 0), (_U64, 2**63), (_U64, 2**64 - 1), (_I32, -1), (_F32, float("nan")), (_F32, 3.5),
                 (_F32, float("inf")), (_BOOL, True), (_STRING, "abc"), (_STRING, ""),
                 (_ARRAY, (_U32, [1, 2], 2))]
            )  # fmt: skip
            _put_field(gguf, key, vtype, value)
            case.steps.append(f"{key}={_short(value)}")
        elif op == "type":
            position = rng.randrange(len(gguf.fields))
            key, _, value = gguf.fields[position]
            gguf.fields[position] = (key, rng.choice([_STRING, _BOOL, _F32, _ARRAY]), value)
            case.steps.append(f"{key}: value type changed")
            if gguf.fields[position][1] == _ARRAY:
                gguf.fields[position] = (key, _ARRAY, (_U32, [], 0))
            elif gguf.fields[position][1] == _BOOL:
                gguf.fields[position] = (key, _BOOL, bool(value))
            elif gguf.fields[position][1] == _F32:
                gguf.fields[position] = (key, _F32, 1.0)
        elif op == "delete":
            position = rng.randrange(len(gguf.fields))
            case.steps.append(f"delete {gguf.fields.pop(position)[0]}")
        elif op == "counts":
            which = rng.choice(["n_fields", "n_tensors", "string", "array"])
            huge = rng.choice([2**62, 2**64 - 1, 10**9])
            if which == "n_fields":
                gguf.n_fields = huge
            elif which == "n_tensors":
                gguf.n_tensors = huge
            elif which == "array":
                _put_field(gguf, "tokenizer.ggml.tokens", _ARRAY, (_STRING, ["a"], huge))
            else:
                gguf.fields.append(("x", _ARRAY, (_U64, [], huge)))
            case.steps.append(f"{which} count {huge}")
        elif op == "nesting":
            depth = rng.choice([2, 50, 300])
            value: Any = (_U32, [1], 1)
            for _ in range(depth):
                value = (_ARRAY, [value], 1)
            gguf.fields.append(("nested", _ARRAY, value))
            case.steps.append(f"arrays nested {depth} deep")
        elif op == "tensor":
            position = rng.randrange(len(gguf.tensors))
            name, dims, qtype = gguf.tensors[position]
            change = rng.randrange(4)
            if change == 0:
                dims = [2**40, 2**40]
            elif change == 1:
                dims = [1] * rng.choice([5, 100])
            elif change == 2:
                qtype = rng.choice([99, 2**31])
            else:
                dims = [0]
            gguf.tensors[position] = (name, dims, qtype)
            case.steps.append(f"tensor {name}: dims {len(dims)} x {dims[0]}, type {qtype}")
        elif op == "arch":
            arch = rng.choice(["", "llama\x00", "qwen2", "unknownarch", "x" * 300])
            _put_field(gguf, "general.architecture", _STRING, arch)
            case.steps.append(f"architecture {arch[:20]!r}")
        elif op == "cut":
            cut = rng.randrange(4, 600)
            case.steps.append(f"cut at byte {cut}")
        else:
            flips += rng.randint(1, 8)
            case.steps.append("bytes flipped")
    data = bytearray(gguf.encode())
    for _ in range(flips):
        data[rng.randrange(len(data))] = rng.randrange(256)
    case.files["model.gguf"] = bytes(data[:cut] if cut is not None else data)
    return case


def _put_field(gguf: _Gguf, key: str, vtype: int, value: Any) -> None:
    gguf.fields = [f for f in gguf.fields if f[0] != key] + [(key, vtype, value)]


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 50 else text[:47] + "..."
