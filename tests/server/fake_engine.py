"""A small in-test stand-in for AsyncLLMEngine, for unit tests of the HTTP layer ONLY.

Tokens are characters (id = code point); it "generates" the letters of REPLY in order, honouring
max_tokens, stop strings, n and logprobs, and records aborts. Integration tests use the real engine.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from llmdeploy_engine.outputs import CompletionOutput, Logprob, RequestOutput
from llmdeploy_engine.sampling_params import SamplingParams

REPLY = "hello world, this is the fake engine speaking. "
EOS = 3


class QueueFull(Exception):
    pass


class FakeTokenizer:
    vocab_size = 512
    eos_token_ids = (EOS,)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return ([1] if add_special_tokens else []) + [ord(c) % self.vocab_size for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(i) for i in ids if i > 3)

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        text = "".join(f"<{m['role']}>{m['content']}\n" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")


@dataclass
class FakeStats:
    num_running: int
    num_waiting: int
    kv_usage: float
    counters: dict[str, int] = field(default_factory=dict)
    startup_report: object | None = None


@dataclass
class FakeReport:
    weights_gib: float = 0.25
    available_kv_gib: float = 0.5
    kv_cache_tokens: int = 4096
    num_kv_blocks: int = 256
    max_concurrency: float = 2.0

    def log_lines(self) -> list[str]:
        return [f"KV cache size: {self.kv_cache_tokens} tokens"]


class FakeStream:
    """What `generate_batch` hands out: an async iterator whose close() aborts an unfinished request."""

    def __init__(self, engine: FakeEngine, source: AsyncIterator[RequestOutput], request_id: str) -> None:
        self.engine, self.source, self.request_id = engine, source, request_id
        self.finished = False

    def __aiter__(self) -> FakeStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        out = await self.source.__anext__()
        self.finished = out.finished
        return out

    def close(self) -> None:
        if not self.finished:
            self.finished = True
            self.engine.aborted.append(self.request_id)
            self.engine.running.discard(self.request_id)


class FakeEngine:
    def __init__(
        self,
        max_model_len: int = 256,
        token_delay_s: float = 0.0,
        queue_full: bool = False,
        reply: str = REPLY,
    ) -> None:
        self.tokenizer = FakeTokenizer()
        self.max_model_len = max_model_len
        self.token_delay_s = token_delay_s
        self.queue_full = queue_full
        self.reply = reply
        self.running: set[str] = set()
        self.aborted: list[str] = []
        self.seen: list[tuple[list[int], SamplingParams]] = []

    def stats(self) -> FakeStats:
        return FakeStats(len(self.running), 0, len(self.running) / 10, {"num_preemptions": 0}, FakeReport())

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)
        self.running.discard(request_id)

    def generate_batch(self, requests: list[tuple[list[int], SamplingParams, str]]) -> list[FakeStream]:
        if self.queue_full:
            raise QueueFull("waiting queue is full (1 requests)")
        return [FakeStream(self, self.generate(p, params, rid), rid) for p, params, rid in requests]

    async def generate(
        self, prompt: str | list[int], params: SamplingParams, request_id: str
    ) -> AsyncIterator[RequestOutput]:
        if self.queue_full:
            raise QueueFull("waiting queue is full (1 requests)")
        assert isinstance(prompt, list)
        self.seen.append((prompt, params))
        self.running.add(request_id)
        outs = [
            CompletionOutput(
                index=i, text="", token_ids=[], logprobs=[] if params.logprobs is not None else None
            )
            for i in range(params.n)
        ]
        limit = params.max_tokens or self.max_model_len - len(prompt)
        try:
            for step in range(limit):
                if self.token_delay_s:
                    await asyncio.sleep(self.token_delay_s)
                else:
                    await asyncio.sleep(0)
                for c in outs:
                    if c.finish_reason is not None:
                        continue
                    ch = self.reply[(step + c.index) % len(self.reply)]
                    c.token_ids.append(ord(ch))
                    c.text += ch
                    if c.logprobs is not None:
                        top = {ord(ch): Logprob(math.log(0.5), 1, ch)}
                        for k in range(params.logprobs or 0):
                            alt = ord("A") + k
                            top.setdefault(alt, Logprob(math.log(0.1) - k, k + 2, chr(alt)))
                        c.logprobs.append(top)
                    hit = next((s for s in params.stop_strings if c.text.endswith(s)), None)
                    if hit is not None:
                        c.text = c.text[: -len(hit)]
                        c.finish_reason, c.stop_reason = "stop", hit
                    elif len(c.token_ids) >= limit:
                        c.finish_reason = "length"
                done = all(c.finish_reason is not None for c in outs)
                yield RequestOutput(
                    request_id,
                    None,
                    list(prompt),
                    [
                        CompletionOutput(
                            c.index,
                            c.text,
                            list(c.token_ids),
                            None,
                            list(c.logprobs) if c.logprobs is not None else None,
                            c.finish_reason,
                            c.stop_reason,
                        )
                        for c in outs
                    ],
                    done,
                )
                if done:
                    return
        finally:
            self.running.discard(request_id)
