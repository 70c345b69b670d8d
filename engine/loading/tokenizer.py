"""Tokenizer: encode/decode, incremental detokenization and the chat template, from a GGUF or a folder.

The fast tokenizer is transformers' (from tokenizer.json in a folder; from a GGUF's vocabulary and
merges, which `gguf_tokenizer` turns into the same tokenizer without transformers' second parse of
the file where it knows the file's kind). The chat template is rendered here with a sandboxed
Jinja2 environment, the way transformers renders it, so GGUF and folder models behave alike.

End-of-sequence ids: the model's eos token plus every end-of-turn token the chat template writes
(`<|im_end|>`, `<|eot_id|>`, `<|end|>`, `<end_of_turn>`, ...) and that exists in the vocabulary. A chat
model ends its turn with that token even when its config names a different eos (SmolLM2's GGUF
says eos = `<|im_end|>` = 2; its `<|endoftext|>` = 0 is not written by the template and is not added).
"""

from __future__ import annotations

import functools
import json
from datetime import datetime
from pathlib import Path
from typing import Any

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

# Tokens that end an assistant turn in common chat templates.
END_OF_TURN_TOKENS = (
    "<|im_end|>",
    "<|eot_id|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
)


CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


class Tokenizer:
    def __init__(self, hf_tokenizer: Any, chat_template: str | None) -> None:
        self.hf = hf_tokenizer
        self.chat_template = chat_template
        self.bos_token_id: int | None = hf_tokenizer.bos_token_id
        self.eos_token_id: int | None = hf_tokenizer.eos_token_id
        self.vocab_size: int = len(hf_tokenizer)
        self.eos_token_ids: set[int] = self._end_ids()
        self.all_special_ids: set[int] = set(hf_tokenizer.all_special_ids)

    @classmethod
    def from_model(cls, path: str | Path) -> Tokenizer:
        """From a GGUF file or a folder with tokenizer.json; `random:<id>` models get the byte-level
        tokenizer (`byte_level()`), since they have no files and their text means nothing anyway."""
        if str(path).startswith("random:"):
            return cls.byte_level()
        p = Path(path)
        if p.is_file() and p.suffix == ".gguf":
            hf = _gguf_tokenizer(p)
            template = getattr(hf, "chat_template", None) or _gguf_chat_template(p)
        elif p.is_dir():
            from transformers import AutoTokenizer

            hf = AutoTokenizer.from_pretrained(str(p))
            template = getattr(hf, "chat_template", None)
        else:
            raise ValueError(f"{path}: not a GGUF file or a model folder")
        if isinstance(template, dict):  # several named templates: use the default one
            template = template.get("default")
        return cls(hf, template)

    @classmethod
    def byte_level(cls) -> Tokenizer:
        """A tokenizer that needs no files: one token per byte (GPT-2's byte alphabet, no merges) plus
        `<|im_end|>` (eos), `<|im_start|>`, `<|endoftext|>`, with a ChatML template. For random-weight
        benchmark models: ids stay below 259, inside any real vocabulary."""
        from tokenizers import Tokenizer as RawTokenizer
        from tokenizers import decoders, models, pre_tokenizers
        from transformers import PreTrainedTokenizerFast

        alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
        raw = RawTokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
        raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        raw.decoder = decoders.ByteLevel()
        hf = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<|im_end|>")
        hf.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|endoftext|>"]})
        return cls(hf, CHATML_TEMPLATE)

    def _end_ids(self) -> set[int]:
        ids: set[int] = set()
        if self.eos_token_id is not None:
            ids.add(int(self.eos_token_id))
        vocab = self.hf.get_vocab()
        for token in END_OF_TURN_TOKENS:
            if token in vocab and self.chat_template and token in self.chat_template:
                ids.add(int(vocab[token]))
        return ids

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=add_special_tokens))

    @functools.cached_property
    def max_chars_per_token(self) -> int | None:
        """The most characters of input text one token can stand for, or None where that has no bound.

        Known only for byte-level BPE with no normalizer and pre-tokenizers that split without
        dropping text (GPT-2, Llama 3, Qwen, SmolLM): there every token is a vocabulary entry of at
        most this many bytes (or an added token of at most this many characters), and a text has at
        least as many bytes as characters, so a text of C characters has at least C / this tokens.
        The server refuses a prompt that cannot fit before it tokenizes it in full."""
        backend = getattr(self.hf, "backend_tokenizer", None)
        if backend is None:
            return None
        spec = json.loads(backend.to_str())
        model = spec.get("model") or {}
        if spec.get("normalizer") is not None or model.get("type") != "BPE":
            return None
        if model.get("unk_token") is not None and model.get("fuse_unk"):
            return None  # one fused unknown token can stand for any length
        pre = spec.get("pre_tokenizer") or {}
        steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
        if not any(step.get("type") == "ByteLevel" for step in steps):
            return None
        for step in steps:
            kind = step.get("type")
            if kind not in ("ByteLevel", "Split", "Digits", "Punctuation"):
                return None
            if kind == "Split" and step.get("behavior") == "Removed":
                return None
        longest = max((len(token) for token in model.get("vocab", {})), default=0)
        added = max((len(t.get("content", "")) for t in spec.get("added_tokens", [])), default=0)
        return max(longest, added, 1)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        backend = self._backend
        if backend is not None:
            return str(backend.decode(ids, skip_special_tokens=skip_special_tokens))
        return str(self.hf.decode(ids, skip_special_tokens=skip_special_tokens))

    @functools.cached_property
    def _backend(self) -> Any:
        """The fast tokenizer's Rust tokenizer when decoding through it gives what `hf.decode` gives
        (no clean-up of tokenization spaces): `hf.decode` first checks every id's type in Python,
        which was ~40 % of the engine's final detokenization (`git show c2170a2:benchmarks/host_overhead.py`)."""
        backend = getattr(self.hf, "_tokenizer", None)
        if (
            backend is None
            or not hasattr(backend, "decode")
            or getattr(self.hf, "clean_up_tokenization_spaces", True)
        ):
            return None
        return backend

    def token_text(self, token_id: int) -> str:
        """How one token reads on its own (for logprobs' decoded_token)."""
        return str(self.hf.decode([token_id], skip_special_tokens=False))

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **extra: Any
    ) -> str:
        if not self.chat_template:
            raise ValueError("this model has no chat template; use completions instead of chat")
        template = _jinja_env().from_string(self.chat_template)
        return template.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.hf.bos_token or "",
            eos_token=self.hf.eos_token or "",
            **extra,
        )

    def incremental_decoder(
        self, skip_special_tokens: bool = True, prompt_token_ids: list[int] | None = None
    ) -> IncrementalDecoder:
        return IncrementalDecoder(self, skip_special_tokens, prompt_token_ids)


class IncrementalDecoder:
    """Turns a growing list of generated ids into text deltas that never split a character.

    Decodes a short window of recent ids twice (with and without the new ones) and emits the
    difference, holding it back while it ends in U+FFFD (an incomplete multi-byte character). Given
    the prompt's ids, its last few seed the window, so tokenizers that drop a leading space at the
    start of a decode (SentencePiece) keep the space before the first generated word.
    """

    SEED_TOKENS = 5

    def __init__(
        self,
        tokenizer: Tokenizer,
        skip_special_tokens: bool = True,
        prompt_token_ids: list[int] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self._ids: list[int] = list((prompt_token_ids or [])[-self.SEED_TOKENS :])
        self._num_seed = len(self._ids)
        self.text = ""
        self._prefix_offset = 0
        self._read_offset = self._num_seed

    @property
    def token_ids(self) -> list[int]:
        return self._ids[self._num_seed :]

    def _decode(self, start: int, end: int | None = None) -> str:
        return self.tokenizer.decode(self._ids[start:end], self.skip_special_tokens)

    def add(self, new_ids: list[int]) -> str:
        """Append generated ids; return the newly stable text (possibly empty)."""
        self._ids.extend(new_ids)
        prefix_text = self._decode(self._prefix_offset, self._read_offset)
        full_text = self._decode(self._prefix_offset)
        if len(full_text) > len(prefix_text) and not full_text.endswith("\ufffd"):
            delta = full_text[len(prefix_text) :]
            self._prefix_offset = self._read_offset
            self._read_offset = len(self._ids)
            self.text += delta
            return delta
        return ""

    def flush(self) -> str:
        """At the end of generation: whatever is still held back (an incomplete character as U+FFFD)."""
        delta = self._decode(self._prefix_offset)[len(self._decode(self._prefix_offset, self._read_offset)) :]
        self._prefix_offset = self._read_offset = len(self._ids)
        self.text += delta
        return delta


def _raise(message: str) -> None:
    raise TemplateError(message)


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: int | None = None, sort_keys: bool = False
) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, sort_keys=sort_keys)


def _jinja_env() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def _gguf_tokenizer(path: Path) -> Any:
    """The fast tokenizer of a GGUF file: built from the engine's parse of the file where
    `gguf_tokenizer` knows its kind (transformers' own result, without its second parse of the file),
    else by transformers."""
    from llmdeploy_engine.loading import gguf_tokenizer
    from llmdeploy_engine.loading.gguf_loader import tokenizer_fields
    from transformers import PreTrainedTokenizerFast

    fields = tokenizer_fields(path)
    backend = gguf_tokenizer.build(fields)
    if backend is None:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    options: dict[str, Any] = dict(
        gguf_tokenizer.special_token_names(fields, fields["tokenizer.ggml.tokens"])
    )
    for flag in ("add_bos_token", "add_eos_token"):
        if f"tokenizer.ggml.{flag}" in fields:
            options[flag] = bool(fields[f"tokenizer.ggml.{flag}"])
    if "tokenizer.chat_template" in fields:
        options["chat_template"] = str(fields["tokenizer.chat_template"])
    return PreTrainedTokenizerFast(tokenizer_object=backend, **options)


def _gguf_chat_template(path: Path) -> str | None:
    from llmdeploy_engine.loading.gguf_loader import gguf_reader

    field = gguf_reader(path).fields.get("tokenizer.chat_template")
    return None if field is None else str(field.contents())
