"""Grammars: one engine's structured-output compiler, built on the first constrained request, and
the bitmask of a step's constrained rows (filled on the host while the device runs the step's
forward pass). Not in the torch-free core: structured_output reads the vocabulary with the grammar
library. Any thread may call `compiler()` and its `compile` (the server compiles off the engine
loop); the engine's OutputProcessor calls `mask` on the engine thread."""

from __future__ import annotations

import threading
from typing import Any


class Grammars:
    def __init__(self, tokenizer: Any, vocab_size: int | None) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size  # the model's (None: the tokenizer's)
        self._compiler: Any = None
        self._lock = threading.Lock()

    def compiler(self) -> Any:
        """The structured-output compiler for the engine's tokenizer (built once, on first use)."""
        with self._lock:
            if self._compiler is None:
                from llmdeploy_engine.structured_output import GrammarCompiler

                self._compiler = GrammarCompiler(self.tokenizer, self.vocab_size or self.tokenizer.vocab_size)
            return self._compiler

    def mask(self, matchers: list[Any]) -> Any:
        """The bitmask of the rows whose sequence has a grammar (None when none has)."""
        if all(m is None for m in matchers):
            return None
        from llmdeploy_engine.structured_output import fill_grammar_mask

        return fill_grammar_mask(self.compiler(), matchers)
