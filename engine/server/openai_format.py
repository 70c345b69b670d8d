"""Engine outputs -> OpenAI response bodies and stream chunks (completions and chat)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from llmdeploy_engine.outputs import CompletionOutput, Logprob, RequestOutput
from llmdeploy_engine.server.tool_parser import parse_tool_calls

# JSON has no -inf; vLLM reports this floor for impossible tokens too.
MIN_LOGPROB = -9999.0


def sse(payload: dict[str, Any] | str) -> str:
    body = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {body}\n\n"


def finite(value: float) -> float:
    return MIN_LOGPROB if math.isinf(value) or math.isnan(value) else float(value)


def token_text(tokenizer: Any, token_id: int, entry: Logprob | None) -> str:
    if entry is not None and entry.decoded_token is not None:
        return entry.decoded_token
    if hasattr(tokenizer, "token_text"):
        return str(tokenizer.token_text(token_id))
    return str(tokenizer.decode([token_id]))


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _top_entries(step: dict[int, Logprob], limit: int) -> list[tuple[int, Logprob]]:
    # A step holds the top-N plus the chosen token; the N most likely are the top-N.
    return sorted(step.items(), key=lambda kv: -kv[1].logprob)[:limit]


def completion_logprobs(
    tokenizer: Any, token_ids: list[int], steps: list[dict[int, Logprob]], num: int, offset: int
) -> dict[str, Any]:
    """OpenAI's legacy completions logprobs: tokens, token_logprobs, top_logprobs, text_offset."""
    tokens, token_lps, tops, offsets = [], [], [], []
    for token_id, step in zip(token_ids, steps, strict=False):
        entry = step.get(token_id)
        text = token_text(tokenizer, token_id, entry)
        tokens.append(text)
        token_lps.append(finite(entry.logprob) if entry is not None else None)
        offsets.append(offset)
        offset += len(text)
        if num > 0:
            tops.append({token_text(tokenizer, t, e): finite(e.logprob) for t, e in _top_entries(step, num)})
        else:
            tops.append(None)
    return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops, "text_offset": offsets}


def chat_logprobs(
    tokenizer: Any, token_ids: list[int], steps: list[dict[int, Logprob]], num: int
) -> dict[str, Any]:
    content = []
    for token_id, step in zip(token_ids, steps, strict=False):
        entry = step.get(token_id)
        text = token_text(tokenizer, token_id, entry)
        top = [
            {
                "token": token_text(tokenizer, t, e),
                "logprob": finite(e.logprob),
                "bytes": list(token_text(tokenizer, t, e).encode()),
            }
            for t, e in _top_entries(step, num)
        ]
        content.append(
            {
                "token": text,
                "logprob": finite(entry.logprob) if entry is not None else MIN_LOGPROB,
                "bytes": list(text.encode()),
                "top_logprobs": top,
            }
        )
    return {"content": content, "refusal": None}


@dataclass
class ChoiceCursor:
    """How much of one choice has been sent so far (outputs are cumulative)."""

    num_chars: int = 0
    num_tokens: int = 0
    started: bool = False
    finished: bool = False


@dataclass
class Delta:
    text: str
    token_ids: list[int]
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None
    stop_reason: int | str | None
    first: bool


@dataclass
class StreamTracker:
    """Turns cumulative outputs into per-choice deltas; counts tokens for the usage chunk."""

    index_base: int = 0
    cursors: dict[int, ChoiceCursor] = field(default_factory=dict)
    num_prompt_tokens: int = 0

    def deltas(self, output: RequestOutput) -> list[tuple[int, Delta]]:
        self.num_prompt_tokens = len(output.prompt_token_ids)
        out = []
        for c in output.outputs:
            cur = self.cursors.setdefault(c.index, ChoiceCursor())
            if cur.finished:
                continue
            text = c.text[cur.num_chars :] if len(c.text) > cur.num_chars else ""
            new_ids = c.token_ids[cur.num_tokens :]
            lps = c.logprobs[cur.num_tokens :] if c.logprobs is not None else None
            if not text and not new_ids and c.finish_reason is None and cur.started:
                continue
            first = not cur.started
            cur.started = True
            cur.num_chars = max(cur.num_chars, len(c.text))
            cur.num_tokens = len(c.token_ids)
            cur.finished = c.finish_reason is not None
            out.append(
                (self.index_base + c.index, Delta(text, new_ids, lps, c.finish_reason, c.stop_reason, first))
            )
        return out

    @property
    def num_completion_tokens(self) -> int:
        return sum(c.num_tokens for c in self.cursors.values())


def completion_choice(
    tokenizer: Any, index: int, c: CompletionOutput, num_logprobs: int | None, prefix: str
) -> dict[str, Any]:
    lps = None
    if num_logprobs is not None and c.logprobs is not None:
        lps = completion_logprobs(tokenizer, c.token_ids, c.logprobs, num_logprobs, len(prefix))
    return {
        "index": index,
        "text": prefix + c.text,
        "logprobs": lps,
        "finish_reason": c.finish_reason,
        "stop_reason": c.stop_reason,
    }


def chat_choice(
    tokenizer: Any, index: int, c: CompletionOutput, num_logprobs: int | None, tool_format: str | None = None
) -> dict[str, Any]:
    """One chat choice; with `tool_format` (the request has tools) the reply's tool calls are parsed
    out of the text (tool_parser.py) and a stopped reply that called tools ends with "tool_calls"."""
    lps = None
    if num_logprobs is not None and c.logprobs is not None:
        lps = chat_logprobs(tokenizer, c.token_ids, c.logprobs, num_logprobs)
    content: str | None = c.text
    calls: list[dict[str, Any]] = []
    finish_reason = c.finish_reason
    if tool_format is not None:
        content, parsed = parse_tool_calls(tool_format, c.text)
        calls = [
            {"id": p.id, "type": "function", "function": {"name": p.name, "arguments": p.arguments}}
            for p in parsed
        ]
        if calls and finish_reason == "stop":
            finish_reason = "tool_calls"
    return {
        "index": index,
        "message": {"role": "assistant", "content": content, "refusal": None, "tool_calls": calls},
        "logprobs": lps,
        "finish_reason": finish_reason,
        "stop_reason": c.stop_reason,
    }
