"""A GGUF file's byte-level BPE vocabulary as a `tokenizers` tokenizer, straight from its metadata.

transformers builds the same tokenizer from a GGUF (`AutoTokenizer.from_pretrained(gguf_file=...)`),
but it parses the file again with its own reader and goes through its GPT-2 tokenizer class: ~9 s of
an engine start on the default model's 49k-token vocabulary, against well under a second here, from
the metadata the engine's shared gguf-py reader has already parsed. The result is transformers' own,
field for field (tests/engine_model/test_gguf_tokenizer.py compares the two): the vocabulary in
GPT-2's byte alphabet, the file's merges, GPT-2's byte-level pre-tokenizer and decoder, the tokens the
file marks as control added as special tokens and the user-defined ones as plain added tokens.

Only files whose tokenizer transformers builds that way are handled (`tokenizer.ggml.model` "gpt2"
with a pre-tokenizer it leaves at GPT-2's split, `tokenizer.ggml.pre` in `GPT2_SPLIT_PRE`, merges in
the file and `<|endoftext|>` in the vocabulary); for any other, `build` returns None and the caller
falls back to transformers.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

# `tokenizer.ggml.pre` values whose vocabulary transformers splits with GPT-2's own regex (it has a
# regex of its own for llama-bpe, qwen2, tekken, ...; those files go through transformers)
GPT2_SPLIT_PRE = frozenset({"smollm", "gpt-2"})

# llama.cpp's token types (gguf.TokenType)
_CONTROL = 3
_USER_DEFINED = 4


@functools.cache
def _byte_alphabet() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table: the printable Latin-1 bytes stand for
    themselves, every other byte for a character from U+0100 on, in byte order."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def special_token_names(fields: Mapping[str, Any], tokens: list[str]) -> dict[str, str | None]:
    """bos/eos/unk/pad token strings from the file's ids (None where the file names none)."""
    names: dict[str, str | None] = {}
    for name, key in (
        ("bos", "bos_token_id"),
        ("eos", "eos_token_id"),
        ("unk", "unknown_token_id"),
        ("pad", "padding_token_id"),
    ):
        token_id = fields.get(f"tokenizer.ggml.{key}")
        names[f"{name}_token"] = None if token_id is None else tokens[int(token_id)]
    return names


def build(fields: Mapping[str, Any]) -> Any:
    """The `tokenizers.Tokenizer` of a GGUF file's metadata (`fields`: name -> decoded contents, with
    the tokenizer arrays), or None when this file's tokenizer is not one this module builds."""
    if fields.get("tokenizer.ggml.model") != "gpt2" or fields.get("tokenizer.ggml.pre") not in GPT2_SPLIT_PRE:
        return None
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    tokens: list[str] = list(fields["tokenizer.ggml.tokens"])
    merges = fields.get("tokenizer.ggml.merges")
    if merges is None:
        return None  # transformers derives merges from the scores; not done here
    if "<|endoftext|>" not in tokens:
        return None  # transformers' GPT-2 class adds it as a special token past the vocabulary's end
    token_types: list[int] = list(fields.get("tokenizer.ggml.token_type") or ())
    spelling = _byte_alphabet()
    alphabet = set(spelling.values())
    vocab = {
        token if set(token) <= alphabet else "".join(spelling[b] for b in token.encode("utf-8")): index
        for index, token in enumerate(tokens)
    }
    tokenizer = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=[tuple(m.split(" ")) for m in merges],
            dropout=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
        )
    )
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.TemplateProcessing(single="$A", pair="$A $B:1", special_tokens=[])
    # a control token outside the byte alphabet is a converter's mislabel: adding it would grow the
    # vocabulary past the model's rows (transformers skips those too)
    control = [
        AddedToken(token, normalized=False, special=True)
        for token, kind in zip(tokens, token_types, strict=False)
        if kind == _CONTROL and set(token) <= alphabet
    ]
    if control:
        tokenizer.add_special_tokens(control)
    known = tokenizer.get_vocab(with_added_tokens=True)
    user_defined = [
        AddedToken(token, normalized=False, special=False)
        for token, kind in zip(tokens, token_types, strict=False)
        if kind == _USER_DEFINED and token in known
    ]
    if user_defined:
        tokenizer.add_tokens(user_defined)
    return tokenizer
