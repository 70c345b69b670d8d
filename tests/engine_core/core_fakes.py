"""Helpers for the scheduling-core unit tests: a fake KV store that checks every read, invariants."""

from __future__ import annotations

from dataclasses import dataclass

from llmdeploy_engine.core.block_manager import BlockManager
from llmdeploy_engine.core.runner_interface import Runner
from llmdeploy_engine.core.scheduler import Scheduler, SchedulerOutput
from llmdeploy_engine.core.sequence import Sequence, SequenceStatus
from llmdeploy_engine.outputs import Logprob


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


# ---- a fake model side for LLMEngine unit tests (plain Python, no torch) --------------------------
# vocab: 0 = EOS (special, decodes to ""), 1..26 = "a".."z", 27 = " ", 28 = "ab", 29 = "\n"
VOCAB = 30
_TEXT = ["", *[chr(ord("a") + i) for i in range(26)], " ", "ab", "\n"]


def successor_rule(context: list[int]) -> int:
    """Next token = the one after the last; so "a" continues "bcdef..." and "y" ends "z", " ", "ab", "\\n", EOS."""
    return (context[-1] + 1) % VOCAB


def mixing_rule(context: list[int]) -> int:
    """Depends on the whole context, so a wrong KV read changes the output; never EOS."""
    return (sum(t * (i + 1) for i, t in enumerate(context)) + context[-1]) % (VOCAB - 1) + 1


class FakeTokenizer:
    eos_token_ids = frozenset({0})
    vocab_size = VOCAB

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [_TEXT.index(c) for c in text]

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        return "".join(m["content"] for m in messages) + (" " if add_generation_prompt else "")

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join("<eos>" if (t == 0 and not skip_special_tokens) else _TEXT[t] for t in ids)

    def token_text(self, token_id: int) -> str:
        return self.decode([token_id], skip_special_tokens=False)

    def incremental_decoder(
        self, skip_special_tokens: bool = True, prompt_token_ids: list[int] | None = None
    ) -> FakeDecoder:
        return FakeDecoder(self, skip_special_tokens)


class FakeDecoder:
    def __init__(self, tok: FakeTokenizer, skip_special_tokens: bool) -> None:
        self.tok = tok
        self.skip = skip_special_tokens

    def add(self, new_ids: list[int]) -> str:
        return self.tok.decode(new_ids, self.skip)

    def flush(self) -> str:
        return ""


class FakeRunner(Runner):
    """Keeps its own paged "KV cache" of (position, token) per slot and reads contexts through it."""

    def __init__(
        self, num_kv_blocks: int = 64, block_size: int = 4, max_model_len: int = 96, rule=mixing_rule
    ):
        self.num_kv_blocks = num_kv_blocks
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.rule = rule
        self.slots: dict[int, tuple[int, int]] = {}
        self.startup_report = {"num_kv_blocks": num_kv_blocks}
        self.num_forward_tokens = 0

    def execute(self, batch) -> list[list[float]]:  # type: ignore[no-untyped-def]
        self.num_forward_tokens += batch.num_tokens
        for tok, pos, slot in zip(batch.input_ids, batch.positions, batch.slot_mapping, strict=True):
            self.slots[slot] = (pos, tok)
        logits = []
        bs = self.block_size
        for i in batch.sample_indices:
            table = batch.block_tables[i]
            context = []
            for pos in range(batch.context_len[i]):
                got_pos, tok = self.slots[table[pos // bs] * bs + pos % bs]
                assert got_pos == pos, "block table points at another position's KV"
                context.append(tok)
            row = [0.0] * VOCAB
            row[self.rule(context)] = 1.0
            logits.append(row)
        return logits


class FakeSampler:
    """Greedy over list logits; 'logprobs' reports the chosen token with logprob 0."""

    def make_generator(self, seed: int) -> object:
        return ("generator", seed)

    def sample(self, logits, params, prompt_token_ids, output_token_ids, generators):  # type: ignore[no-untyped-def]
        ids = [max(range(len(row)), key=row.__getitem__) for row in logits]
        lps = [None if p.logprobs is None else {t: Logprob(0.0, 1)} for t, p in zip(ids, params, strict=True)]
        return FakeSamplerOutput(ids, lps)


@dataclass(frozen=True)
class FakeSamplerOutput:
    token_ids: list[int]
    logprobs: list[dict[int, Logprob] | None]
