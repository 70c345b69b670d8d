"""Structured outputs: JSON schema, JSON object, regex, choice and EBNF grammar constraints (xgrammar).

xgrammar is the library vLLM uses for this; it compiles a constraint against the tokenizer's
vocabulary once (`GrammarCompiler`, cached per constraint) and keeps one matcher per sequence that
says, at every step, which tokens may come next (a bitmask over the vocabulary, 1 bit a token).

The engine's step: launch the forward pass, then fill the bitmask rows of the batch's constrained
sequences on the host (the device is busy with the forward pass meanwhile), then the sampler sets the
forbidden tokens' logits to -inf before anything else reads them. Unconstrained rows of the same
batch are left alone, so constrained and unconstrained requests share one batch, and the logits of
a CUDA-graph replay are masked after the graph, so graphs stay on. After a token is appended the
sequence's matcher advances; a matcher that reaches the end of its grammar ends the sequence.

Compilation happens before a request reaches the engine loop where the server can do it
(server/grammar_pool.py: bounded in size and time, proven in a worker process it can kill, then
compiled on the pool's own threads, so the event loop and the engine loop never wait on a large
schema); the engine's own call is then a cache hit. JSON schemas compile through
`json_schema_grammar`, which keeps every reply strict JSON.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections import OrderedDict
from typing import Any

import torch
from llmdeploy_engine.sampling_params import StructuredOutputsParams

# Compiled grammars kept per engine (the least recently used leaves first).
GRAMMAR_CACHE_SIZE = 256
# From this many constrained rows a step fills their masks on xgrammar's thread pool (half the
# host's cores): one matcher's fill is tens of microseconds to a millisecond, 64 in a row would add
# up to the device's step time.
BATCH_FILL_MIN_ROWS = 4


def choice_grammar(choices: tuple[str, ...]) -> str:
    """An EBNF grammar whose only sentences are the given strings."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


class GrammarCompiler:
    """Compiles constraints for one tokenizer; thread-safe, cached per constraint (LRU).

    Raises ValueError with the library's reason for a schema, regex or grammar it cannot compile (the
    server answers 400)."""

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        import xgrammar as xgr

        self._xgr = xgr
        self.vocab_size = vocab_size
        stop_ids = sorted(int(t) for t in getattr(tokenizer, "eos_token_ids", ()) if 0 <= int(t) < vocab_size)
        info = xgr.TokenizerInfo.from_huggingface(
            tokenizer.hf, vocab_size=vocab_size, stop_token_ids=stop_ids or None
        )
        self._info = info
        self._compiler = xgr.GrammarCompiler(info, max_threads=2, cache_enabled=False)
        self._cache: OrderedDict[StructuredOutputsParams, Any] = OrderedDict()
        self._lock = threading.Lock()
        self._batch: Any = None  # xgrammar's BatchGrammarMatcher, built on the first large step

    def compile(self, spec: StructuredOutputsParams) -> Any:
        with self._lock:
            hit = self._cache.get(spec)
            if hit is not None:
                self._cache.move_to_end(spec)
                return hit
        compiled = self._compile(spec)
        with self._lock:
            self._cache[spec] = compiled
            while len(self._cache) > GRAMMAR_CACHE_SIZE:
                self._cache.popitem(last=False)
        return compiled

    def _compile(self, spec: StructuredOutputsParams) -> Any:
        return compile_spec(self._compiler, spec)

    def cached(self, spec: StructuredOutputsParams) -> bool:
        with self._lock:
            return spec in self._cache

    def tokenizer_info_json(self) -> str:
        """The tokenizer's vocabulary and metadata as xgrammar serializes them (for a worker process)."""
        return str(self._info.serialize_json())

    def batch_fill(self, matchers: list[GrammarMatcher], bitmask: torch.Tensor, rows: list[int]) -> None:
        """Fill row rows[k] of `bitmask` from matchers[k], on xgrammar's threads."""
        if self._batch is None:
            self._batch = self._xgr.BatchGrammarMatcher(max_threads=max(1, (os.cpu_count() or 2) // 2))
        self._batch.batch_fill_next_token_bitmask([m.xgr_matcher for m in matchers], bitmask, indices=rows)

    def matcher(self, compiled: Any) -> GrammarMatcher:
        return GrammarMatcher(self._xgr.GrammarMatcher(compiled))

    def allocate_bitmask(self, num_rows: int) -> torch.Tensor:
        """An int32 [num_rows, ceil(vocab / 32)] bitmask on the host, every token allowed."""
        return self._xgr.allocate_token_bitmask(num_rows, self.vocab_size)

    def apply_bitmask(self, logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> None:
        """Forbidden tokens' logits of `rows` become -inf, in place; other rows are untouched."""
        mask = bitmask.to(logits.device, non_blocking=True) if logits.device.type != "cpu" else bitmask
        self._xgr.apply_token_bitmask_inplace(logits, mask, vocab_size=self.vocab_size, indices=rows)


class GrammarMatcher:
    """One sequence's position in its grammar."""

    def __init__(self, matcher: Any) -> None:
        self._m = matcher

    @property
    def xgr_matcher(self) -> Any:
        return self._m

    def accept(self, token_id: int) -> bool:
        return bool(self._m.accept_token(token_id))

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        self._m.fill_next_token_bitmask(bitmask, row)

    @property
    def is_terminated(self) -> bool:
        return bool(self._m.is_terminated())


def compile_spec(compiler: Any, spec: StructuredOutputsParams) -> Any:
    """`spec` compiled by an xgrammar GrammarCompiler; ValueError with the library's reason."""
    try:
        if spec.json is not None:
            return compiler.compile_grammar(json_schema_grammar(spec.json))
        if spec.json_object:
            return compiler.compile_json_schema('{"type": "object"}', any_whitespace=False, strict_mode=False)
        if spec.regex is not None:
            return compiler.compile_regex(spec.regex)
        if spec.choice is not None:
            return compiler.compile_grammar(choice_grammar(spec.choice))
        if spec.structural_tag is not None:
            return compiler.compile_structural_tag(spec.structural_tag)
        assert spec.grammar is not None
        return compiler.compile_grammar(spec.grammar)
    except Exception as e:  # xgrammar raises RuntimeError/ValueError subclasses with its reason
        what = {"json": "JSON schema", "regex": "regex", "choice": "choice", "grammar": "grammar"}
        raise ValueError(f"invalid {what.get(spec.kind, spec.kind)}: {clean_reason(e)}") from e


def json_schema_grammar(schema: str) -> str:
    r"""The EBNF grammar of JSON texts valid against `schema`: compact (", " and ": "; with any
    whitespace allowed a sampled model can emit newlines and spaces without end) and strict JSON.

    xgrammar (0.2.9) writes the characters of a string with minLength / maxLength (and of property
    names with those bounds) as `[^"\\\r\n]`, which admits the raw control characters U+0000-U+001F
    that RFC 8259 forbids inside strings, so a sampled reply could fail `json.loads`. In a JSON grammar
    a negated character class can only match inside a string, so every one of them is given
    `\0-\x1f` too (`strict_character_classes`). Raises what xgrammar raises for a bad schema."""
    import xgrammar as xgr

    grammar = xgr.Grammar.from_json_schema(schema, any_whitespace=False, strict_mode=True)
    return strict_character_classes(str(grammar))


def strict_character_classes(ebnf: str) -> str:
    r"""`ebnf` with every negated character class `[^...]` outside quoted literals also excluding the
    control characters `\0-\x1f` (those already excluding them are left as they are)."""
    out: list[str] = []
    i, n = 0, len(ebnf)
    while i < n:
        ch = ebnf[i]
        if ch == '"' or ch == "[":
            close = '"' if ch == '"' else "]"
            j = i + 1
            while j < n and ebnf[j] != close:
                j += 2 if ebnf[j] == "\\" else 1
            token = ebnf[i : j + 1]
            if token.startswith("[^") and not token.startswith(_CONTROLS_EXCLUDED):
                token = _CONTROLS_EXCLUDED + token[2:]
            out.append(token)
            i = j + 1
        else:
            out.append(ch)
            i += 1
    return "".join(out)


_CONTROLS_EXCLUDED = "[^\\0-\\x1f"


def clean_reason(e: BaseException) -> str:
    """xgrammar's message without its time stamp and C++ source location."""
    text = str(e).strip() or type(e).__name__
    text = _LOCATION.sub("", text).strip()
    return text if len(text) <= 500 else text[:500] + " ..."


_LOCATION = re.compile(r"\[[\d:]+\]\s*\S+\.(?:cc|h|cpp):\d+:\s*")


class GrammarMask:
    """One step's bitmask: rows `rows` of the step's logits are constrained (the sampler applies it)."""

    def __init__(self, compiler: GrammarCompiler, bitmask: torch.Tensor, rows: list[int]) -> None:
        self.compiler = compiler
        self.bitmask = bitmask
        self.rows = rows

    def apply(self, logits: torch.Tensor) -> None:
        self.compiler.apply_bitmask(logits, self.bitmask, self.rows)


def fill_grammar_mask(compiler: GrammarCompiler, matchers: list[GrammarMatcher | None]) -> GrammarMask:
    """The bitmask for a step whose logits row i belongs to a sequence with grammar `matchers[i]`
    (None: unconstrained; its bitmask row stays all-allowed and is not applied)."""
    bitmask = compiler.allocate_bitmask(len(matchers))
    rows = [i for i, m in enumerate(matchers) if m is not None]
    if len(rows) >= BATCH_FILL_MIN_ROWS:
        compiler.batch_fill([m for m in matchers if m is not None], bitmask, rows)
    else:
        for i in rows:
            m = matchers[i]
            assert m is not None
            m.fill(bitmask, i)
    return GrammarMask(compiler, bitmask, rows)
