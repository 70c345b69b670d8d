"""Helpers for the scheduling-core unit tests: a fake KV store that checks every read, invariants."""

from __future__ import annotations

from llmdeploy_engine.block_manager import BlockManager
from llmdeploy_engine.scheduler import Scheduler, SchedulerOutput
from llmdeploy_engine.sequence import Sequence, SequenceStatus


def fingerprints(token_ids: list[int]) -> list[int]:
    """fp[i] names the whole prefix token_ids[: i + 1], like the KV entry at position i would."""
    out: list[int] = []
    h = 17
    for t in token_ids:
        h = hash((h, t))
        out.append(h)
    return out


def next_token(token_ids: list[int], vocab: int = 50) -> int:
    return hash(tuple(token_ids[-3:])) % vocab


def check_invariants(bm: BlockManager, live: list[Sequence]) -> None:
    owners: dict[int, int] = {}
    for seq in live:
        assert len(set(seq.block_table)) == len(seq.block_table), f"{seq} lists a block twice"
        assert len(seq.block_table) * bm.block_size >= seq.num_computed_tokens
        for b in seq.block_table:
            owners[b] = owners.get(b, 0) + 1
    for block in bm.blocks:
        assert block.ref_count == owners.get(block.block_id, 0), f"block {block.block_id} ref count"
        assert (block.ref_count == 0) == (block.block_id in bm.free_ids)
    for h, b in bm.hash_to_block.items():
        assert bm.blocks[b].block_hash == h
    # a block held by several sequences is full and computed for each of them
    for seq in live:
        for i, b in enumerate(seq.block_table):
            if owners[b] > 1:
                assert (i + 1) * bm.block_size <= seq.num_computed_tokens, f"shared block {b} not full"


class FakeKV:
    """Stands in for the KV cache: each slot remembers which prefix was written to it."""

    def __init__(self) -> None:
        self.slots: dict[int, int] = {}

    def run(self, bm: BlockManager, out: SchedulerOutput) -> None:
        batch = out.batch
        assert len(set(batch.slot_mapping)) == len(batch.slot_mapping), "two tokens write one slot"
        bs = bm.block_size
        for slot in batch.slot_mapping:
            assert bm.blocks[slot // bs].ref_count == 1, "write into a shared block"
        for i, entry in enumerate(out.scheduled):
            seq = entry.seq
            fps = fingerprints(seq.token_ids)
            start = batch.query_start[i]
            for k in range(batch.query_len[i]):
                pos = batch.positions[start + k]
                assert batch.input_ids[start + k] == seq.token_ids[pos]
                self.slots[batch.slot_mapping[start + k]] = fps[pos]
            table = batch.block_tables[i]
            for pos in range(batch.context_len[i]):
                slot = table[pos // bs] * bs + pos % bs
                assert self.slots.get(slot) == fps[pos], f"{seq} reads a wrong KV entry at {pos}"


def drive(sched: Scheduler, kv: FakeKV, max_steps: int = 10_000) -> int:
    """Run every queued sequence to its max_tokens; return the number of steps."""
    steps = 0
    while sched.has_unfinished():
        steps += 1
        assert steps <= max_steps, "scheduler made no progress"
        step(sched, kv)
    return steps


def step(sched: Scheduler, kv: FakeKV) -> SchedulerOutput:
    out = sched.schedule()
    kv.run(sched.block_manager, out)
    sched.update_computed(out)
    for seq in out.sampled_seqs:
        seq.append_token(next_token(seq.token_ids))
        max_tokens = seq.params.max_tokens or 1
        if seq.num_output_tokens >= max_tokens or seq.num_tokens >= sched.config.max_model_len:
            sched.finish(seq, SequenceStatus.FINISHED_LENGTH)
    check_invariants(sched.block_manager, [*sched.running, *sched.waiting])
    return out
