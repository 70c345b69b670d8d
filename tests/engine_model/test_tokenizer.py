"""Tokenizer from the default GGUF: round trips, incremental decoding, chat template, end ids."""

from __future__ import annotations

import pytest
from llmdeploy_engine.loading.tokenizer import IncrementalDecoder, Tokenizer

TEXTS = [
    "Hello, world! How are you today?",
    "  leading spaces and\ttabs\nnew lines  ",
    "Ünïcödé: naïve café, Straße, смысл, 東京タワー, emoji 🦙🚀 and 👩‍👩‍👧",
    "def f(x):\n    return x ** 2  # squares",
]


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(tokenizer: Tokenizer, text: str) -> None:
    ids = tokenizer.encode(text)
    assert ids and all(0 <= i < tokenizer.vocab_size for i in ids)
    assert tokenizer.decode(ids) == text


def test_facts_from_the_gguf(tokenizer: Tokenizer) -> None:
    assert tokenizer.vocab_size == 49152
    assert tokenizer.bos_token_id == 1
    im_end = tokenizer.encode("<|im_end|>", add_special_tokens=False)
    assert im_end == [2]
    assert 2 in tokenizer.eos_token_ids
    # the GGUF does not ask for a BOS token, so none is added
    assert tokenizer.encode("Hi")[0] != 1


@pytest.mark.parametrize("text", [*TEXTS[2:3], "中文字符和日本語のテキスト", "🦙" * 5])
def test_incremental_decoding_never_splits_a_character(tokenizer: Tokenizer, text: str) -> None:
    ids = tokenizer.encode(text)
    decoder = IncrementalDecoder(tokenizer)
    deltas = [decoder.add([i]) for i in ids]
    deltas.append(decoder.flush())
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == text == decoder.text
    # multi-byte characters span several tokens: some steps must have held text back
    assert any(d == "" for d in deltas[:-1])


def test_incremental_decoding_in_chunks_and_with_special_tokens(tokenizer: Tokenizer) -> None:
    ids = [*tokenizer.encode("Answer: 42 🦙"), 2]
    decoder = tokenizer.incremental_decoder(skip_special_tokens=True)
    out = decoder.add(ids[:3]) + decoder.add(ids[3:]) + decoder.flush()
    assert out == "Answer: 42 🦙"
    keep = tokenizer.incremental_decoder(skip_special_tokens=False)
    assert (keep.add(ids) + keep.flush()).endswith("<|im_end|>")


def test_incremental_decoding_seeded_with_the_prompt(tokenizer: Tokenizer) -> None:
    prompt = tokenizer.encode("The answer is")
    generated = tokenizer.encode(" forty-two, 四十二.")
    decoder = tokenizer.incremental_decoder(prompt_token_ids=prompt)
    text = "".join(decoder.add([i]) for i in generated) + decoder.flush()
    assert text == " forty-two, 四十二." and decoder.token_ids == generated


def test_chat_template_renders_like_transformers(tokenizer: Tokenizer) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3+3?"},
    ]
    ours = tokenizer.apply_chat_template(messages)
    assert ours == tokenizer.hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert ours.endswith("<|im_start|>assistant\n")
    assert ours.startswith("<|im_start|>system\nBe brief.<|im_end|>\n")


def test_chat_template_adds_the_default_system_prompt(tokenizer: Tokenizer) -> None:
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=False)
    assert text == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
    )


def test_chat_template_is_sandboxed(tokenizer: Tokenizer) -> None:
    evil = Tokenizer(tokenizer.hf, "{{ messages.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(Exception, match=r"unsafe|not safely|access"):
        evil.apply_chat_template([{"role": "user", "content": "x"}])


def test_random_models_get_the_byte_level_tokenizer() -> None:
    tok = Tokenizer.from_model("random:Qwen/Qwen2.5-0.5B")
    text = "Héllo 🦙, wörld"
    ids = tok.encode(text)
    assert len(ids) == len(text.encode()) and max(ids) < 256 and tok.vocab_size == 259
    assert tok.decode(ids) == text
    assert tok.eos_token_ids == {tok.encode("<|im_end|>")[0]}
    decoder = tok.incremental_decoder()
    assert "".join(decoder.add([i]) for i in ids) + decoder.flush() == text
    chat = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert chat == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("which", ["gguf", "byte_level"])
def test_decode_through_the_rust_tokenizer_matches_transformers(tokenizer: Tokenizer, which: str) -> None:
    """Tokenizer.decode skips transformers' Python wrapper (it type-checks every id) when that gives
    the same text: random ids with special ones among them, with and without skipping those."""
    import random

    tok = tokenizer if which == "gguf" else Tokenizer.byte_level()
    assert tok._backend is not None  # the fast path is what is tested here
    rng = random.Random(which)
    special = sorted(tok.all_special_ids)
    for n in (0, 1, 7, 300):
        ids = [rng.randrange(tok.vocab_size) for _ in range(n)]
        ids[::5] = [rng.choice(special) for _ in ids[::5]]
        for skip in (True, False):
            assert tok.decode(ids, skip) == tok.hf.decode(ids, skip_special_tokens=skip), (n, skip)


def test_decode_keeps_transformers_path_when_it_cleans_up_spaces() -> None:
    tok = Tokenizer.byte_level()
    tok.hf.clean_up_tokenization_spaces = True
    assert tok._backend is None
    ids = tok.encode("a , b .")
    assert tok.decode(ids) == tok.hf.decode(ids, skip_special_tokens=True)
