"""The GGUF tokenizer built from the engine's parse of the file is transformers' own conversion of it:
the same backend, special tokens and flags, and the same ids on text of every kind."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from llmdeploy_engine.loading import gguf_tokenizer
from llmdeploy_engine.loading.gguf_loader import tokenizer_fields
from llmdeploy_engine.loading.tokenizer import Tokenizer

pytestmark = pytest.mark.slow  # the model is loaded: seconds a test on 2 cores

TEXTS = [
    "",
    " ",
    "Hello, world! How are you today?",
    "  leading spaces and\ttabs\nnew lines  ",
    "a     b\n\n\n\nc\r\n\td \u00a0 e\u3000f",
    "         ",
    "\n",
    "Ünïcödé: naïve café, Straße, смысл, 東京タワー, emoji 🦙🚀 and 👩‍👩‍👧",
    "中文字符和日本語のテキスト، العربية, हिन्दी, 한국어, ελληνικά",
    "e\u0301 vs é, ﬁ ligature, ＦＵＬＬＷＩＤＴＨ, zero\u200bwidth, \ufeffbom",
    "def f(x):\n    return x ** 2  # squares\n\n\tif x != 0: pass",
    "Numbers 1234567890 3.14159 -42 1e-9 2024-12-02 $1,000,000",
    "I'm sure they'll say it's what we'd've done, DON'T YOU'RE",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more<|im_end|><|im_end|><repo_name>x<file_sep>y",
    "<|im_start|",
    "<|im_end|> spaced <|im_start|>  ",
    "https://example.org/path?q=1&r=%20#frag <tag attr='v'>&amp;</tag>",
    "\x00\x01\x7f control bytes \U0001f600\U0010ffff",
    "word " * 200,
]


def _transformers_tokenizer(path: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@pytest.fixture(scope="module")
def pair(gguf_path: Path) -> tuple[Any, Any]:
    return _transformers_tokenizer(gguf_path), Tokenizer.from_model(gguf_path).hf


def test_the_default_gguf_is_built_directly(gguf_path: Path) -> None:
    assert gguf_tokenizer.build(tokenizer_fields(gguf_path)) is not None


def test_same_backend_and_special_tokens(pair: tuple[Any, Any]) -> None:
    ref, ours = pair
    assert json.loads(ours.backend_tokenizer.to_str()) == json.loads(ref.backend_tokenizer.to_str())
    for attr in ("bos_token", "eos_token", "unk_token", "pad_token", "all_special_ids", "add_bos_token"):
        assert getattr(ours, attr) == getattr(ref, attr), attr
    assert ours.clean_up_tokenization_spaces == ref.clean_up_tokenization_spaces
    assert ours.chat_template == ref.chat_template
    assert len(ours) == len(ref) and ours.get_vocab() == ref.get_vocab()


@pytest.mark.parametrize("add_special_tokens", [True, False])
def test_same_ids_and_text(pair: tuple[Any, Any], add_special_tokens: bool) -> None:
    ref, ours = pair
    for text in TEXTS:
        ids = ref.encode(text, add_special_tokens=add_special_tokens)
        assert ours.encode(text, add_special_tokens=add_special_tokens) == ids, text
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == ref.decode(ids, skip_special_tokens=skip)


def test_same_ids_on_the_chat_template(pair: tuple[Any, Any], gguf_path: Path) -> None:
    ref, _ = pair
    tokenizer = Tokenizer.from_model(gguf_path)
    messages = [
        {"role": "system", "content": "Be brief.  Answer in   one line.\n"},
        {"role": "user", "content": "What's 2+2? 🦙 <|im_end|> Ünï"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "\n\nAnd\tthen?"},
    ]
    prompt = tokenizer.apply_chat_template(messages)
    assert tokenizer.encode(prompt) == ref.encode(prompt)
    assert tokenizer.encode(prompt, add_special_tokens=False) == ref.encode(prompt, add_special_tokens=False)


def _write_gpt2_vocab_gguf(
    path: Path, tokens: list[str], types: list[int], merges: list[str], pre: str
) -> None:
    """A tiny llama GGUF (random float32 weights) with a byte-level BPE vocabulary."""
    from gguf import GGUFWriter

    hidden, ffn = 32, 64
    writer = GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_context_length(64)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(2)
    writer.add_head_count_kv(2)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_chat_template("{% for m in messages %}{{ m['content'] }}<|end|>{% endfor %}")
    rng = np.random.default_rng(0)
    shapes = {
        "token_embd.weight": (len(tokens), hidden),
        "output_norm.weight": (hidden,),
        "blk.0.attn_norm.weight": (hidden,),
        "blk.0.ffn_norm.weight": (hidden,),
        "blk.0.attn_q.weight": (hidden, hidden),
        "blk.0.attn_k.weight": (hidden, hidden),
        "blk.0.attn_v.weight": (hidden, hidden),
        "blk.0.attn_output.weight": (hidden, hidden),
        "blk.0.ffn_gate.weight": (ffn, hidden),
        "blk.0.ffn_up.weight": (ffn, hidden),
        "blk.0.ffn_down.weight": (hidden, ffn),
    }
    for name, shape in shapes.items():
        writer.add_tensor(name, rng.standard_normal(shape).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_a_vocabulary_with_added_respelled_and_mislabelled_tokens(tmp_path: Path) -> None:
    """User-defined tokens stay whole, a token spelled in plain UTF-8 is respelled in the byte
    alphabet, a control token outside that alphabet is left out, bos is added: as transformers does."""
    from tokenizers import pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    specials = ["<|endoftext|>", "<|begin|>", "<|end|>", "<think>", "ctrl with space", "→"]
    tokens = [*specials, *alphabet, "he", "ll", "hell", "hello", "Ġw", "Ġwo"]
    types = [3, 3, 3, 4, 3, 1] + [1] * (len(tokens) - len(specials))
    merges = ["h e", "l l", "he ll", "hell o", "Ġ w", "Ġw o"]
    path = tmp_path / "vocab.gguf"
    _write_gpt2_vocab_gguf(path, tokens, types, merges, pre="gpt-2")
    ref, ours = _transformers_tokenizer(path), Tokenizer.from_model(path).hf
    assert json.loads(ours.backend_tokenizer.to_str()) == json.loads(ref.backend_tokenizer.to_str())
    assert (ours.bos_token, ours.eos_token, ours.add_bos_token) == (
        ref.bos_token,
        ref.eos_token,
        ref.add_bos_token,
    )
    for text in ["hello world<think>→ ctrl with space<|end|>", "  wow\n", "<|begin|>hello<|endoftext|>"]:
        assert ours.encode(text) == ref.encode(text), text
    assert ours.encode("hello")[0] == 1  # the file asks for bos


def test_other_vocabularies_go_through_transformers() -> None:
    base = {"tokenizer.ggml.tokens": ["a"], "tokenizer.ggml.merges": []}
    assert (
        gguf_tokenizer.build({**base, "tokenizer.ggml.model": "llama", "tokenizer.ggml.pre": "default"})
        is None
    )
    assert (
        gguf_tokenizer.build({**base, "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "llama-bpe"})
        is None
    )
    fields = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "smollm", "tokenizer.ggml.tokens": ["a"]}
    assert gguf_tokenizer.build(fields) is None  # no merges: transformers derives them from scores
    # transformers adds <|endoftext|> past the vocabulary's end when the file lacks it
    assert gguf_tokenizer.build({**fields, "tokenizer.ggml.merges": []}) is None
