"""The plain-Python description of one forward step, handed from the scheduler to the model runner.

The scheduler never touches tensors: it fills this with lists of ints and the runner turns them into
tensors. Tokens of all scheduled sequences are flattened in order; sequence i owns
input_ids[query_start[i]:query_start[i] + query_len[i]].
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ForwardBatch:
    input_ids: list[int]  # flattened new tokens of every scheduled sequence
    positions: list[int]  # position of each of those tokens in its sequence
    slot_mapping: list[int]  # KV slot (block_id * block_size + offset) each new token is written to
    query_start: list[int]  # per sequence: offset of its first new token in input_ids
    query_len: list[int]  # per sequence: number of new tokens this step (prefill chunk or 1)
    context_len: list[int]  # per sequence: tokens in the KV cache after this step (cached + new)
    block_tables: list[list[int]]  # per sequence: its block ids, in order
    sample_indices: list[int]  # sequences whose last new token produces a next token this step
    # per entry of sample_indices: how many of that sequence's trailing new tokens need logits
    # (speculative verification); None means one each. Logits come back in that order, concatenated.
    num_logits: list[int] | None = None

    @property
    def num_seqs(self) -> int:
        return len(self.query_len)

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)

    def logit_rows(self) -> list[int]:
        """Flat token indices whose logits the runner returns, in the order it returns them."""
        rows: list[int] = []
        counts = self.num_logits or [1] * len(self.sample_indices)
        for i, count in zip(self.sample_indices, counts, strict=True):
            end = self.query_start[i] + self.query_len[i]
            rows.extend(range(end - count, end))
        return rows
