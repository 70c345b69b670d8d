"""Scheduler: continuous batching, chunked prefill, budgets, preemption by recompute, abort, n > 1."""

from __future__ import annotations

import random

import pytest
from core_fakes import FakeKV, check_invariants, drive, next_token, step
from llmdeploy_engine.config import EngineConfig
from llmdeploy_engine.core.block_manager import BlockManager
from llmdeploy_engine.core.scheduler import Scheduler, SchedulerConfig
from llmdeploy_engine.core.sequence import Sequence, SequenceStatus
from llmdeploy_engine.sampling_params import SamplingParams


def make(
    num_blocks: int = 64,
    block_size: int = 4,
    max_num_seqs: int = 8,
    budget: int = 32,
    max_model_len: int = 128,
    chunked: bool = True,
    prefix: bool = True,
) -> Scheduler:
    bm = BlockManager(num_blocks, block_size, prefix)
    if not chunked:
        budget = max(budget, max_model_len)
    return Scheduler(SchedulerConfig(max_num_seqs, budget, max_model_len, chunked), bm)


def seq(rid: str, n_prompt: int, max_tokens: int = 4, base: int = 0, index: int = 0) -> Sequence:
    tokens = [(base + i) % 50 + 1 for i in range(n_prompt)]
    return Sequence(rid, tokens, SamplingParams(max_tokens=max_tokens), index=index)


def test_config_defaults_follow_vllm() -> None:
    cfg = SchedulerConfig.from_engine(EngineConfig(model="m"), max_model_len=1024)
    assert cfg.max_num_batched_tokens == 2048 and cfg.max_num_seqs == 256
    cfg = SchedulerConfig.from_engine(EngineConfig(model="m", enable_chunked_prefill=False), 16384)
    assert cfg.max_num_batched_tokens == 16384


def test_prefill_then_decode_one_token_per_step() -> None:
    sched, kv = make(), FakeKV()
    s = seq("a", 10, max_tokens=3)
    sched.add(s)
    out = step(sched, kv)
    assert out.batch.query_len == [10] and out.batch.sample_indices == [0]
    assert out.batch.positions == list(range(10))
    out = step(sched, kv)
    assert out.batch.query_len == [1] and out.batch.positions == [10] and out.batch.context_len == [11]
    step(sched, kv)
    assert s.status is SequenceStatus.FINISHED_LENGTH and s.num_output_tokens == 3
    assert sched.block_manager.num_free_blocks == 64


def test_slot_mapping_follows_the_block_table() -> None:
    sched = make(block_size=4)
    s = seq("a", 6)
    sched.add(s)
    out = sched.schedule()
    b0, b1 = s.block_table
    assert out.batch.slot_mapping == [b0 * 4, b0 * 4 + 1, b0 * 4 + 2, b0 * 4 + 3, b1 * 4, b1 * 4 + 1]
    assert out.batch.block_tables == [[b0, b1]]


def test_chunked_prefill_respects_the_token_budget_and_samples_once() -> None:
    sched, kv = make(budget=16), FakeKV()
    s = seq("a", 40, max_tokens=2)
    sched.add(s)
    lens, samples = [], []
    while s.num_output_tokens == 0:
        out = step(sched, kv)
        lens.append(out.batch.num_tokens)
        samples.append(out.batch.sample_indices)
    assert lens == [16, 16, 8]
    assert samples == [[], [], [0]]


def test_decode_goes_first_and_new_prompts_join_running_batch() -> None:
    sched, kv = make(budget=12), FakeKV()
    a = seq("a", 8, max_tokens=10)
    sched.add(a)
    step(sched, kv)
    b = seq("b", 20, max_tokens=2, base=7)
    sched.add(b)
    out = step(sched, kv)
    assert [e.seq.request_id for e in out.scheduled] == ["a", "b"]
    assert out.batch.query_len == [1, 11]  # a decodes, b's prefill takes the rest of the budget
    out = step(sched, kv)
    assert out.batch.query_len == [1, 9] and out.batch.sample_indices == [0, 1]


def test_finished_sequences_leave_and_waiting_ones_join() -> None:
    sched, kv = make(max_num_seqs=2), FakeKV()
    seqs = [seq(str(i), 5, max_tokens=1 + i, base=i) for i in range(4)]
    for s in seqs:
        sched.add(s)
    out = step(sched, kv)
    assert len(out.scheduled) == 2  # max_num_seqs
    out = step(sched, kv)  # "0" finished after one token; "2" joins
    assert {e.seq.request_id for e in out.scheduled} == {"1", "2"}
    drive(sched, kv)
    assert all(s.num_output_tokens == int(s.request_id) + 1 for s in seqs)


def test_without_chunked_prefill_a_prompt_waits_for_room() -> None:
    sched, kv = make(budget=20, max_model_len=20, chunked=False), FakeKV()
    a1, a2 = seq("a1", 5, max_tokens=3), seq("a2", 5, max_tokens=3, base=1)
    b = seq("b", 19, max_tokens=1, base=3)
    for s in (a1, a2, b):
        sched.add(s)
    out = step(sched, kv)
    assert [e.seq.request_id for e in out.scheduled] == ["a1", "a2"]
    out = step(sched, kv)
    assert out.batch.query_len == [1, 1]  # 1 + 1 + 19 > 20: b waits for a whole-prompt slot
    drive(sched, kv)
    assert b.num_output_tokens == 1


def test_preemption_by_recompute_when_blocks_run_out() -> None:
    sched, kv = make(num_blocks=6, block_size=4, budget=64, prefix=False), FakeKV()
    a, b = seq("a", 8, max_tokens=12), seq("b", 8, max_tokens=12, base=5)
    sched.add(a)
    sched.add(b)
    preempted = []
    for _ in range(40):
        if not sched.has_unfinished():
            break
        preempted += step(sched, kv).preempted
    assert not sched.has_unfinished()
    assert preempted and preempted[0] is b  # the newest running sequence gives way
    assert sched.num_preemptions >= 1 and b.num_preemptions >= 1
    # recomputed sequences carry on exactly as if never preempted
    for s in (a, b):
        expected = s.prompt_token_ids
        for _ in range(12):
            expected = [*expected, next_token(expected)]
        assert s.token_ids == expected
    assert sched.block_manager.num_free_blocks == 6


def test_abort_running_and_waiting_frees_blocks() -> None:
    sched, kv = make(max_num_seqs=1), FakeKV()
    a, b = seq("a", 9, max_tokens=50), seq("b", 9, max_tokens=50)
    sched.add(a)
    sched.add(b)
    step(sched, kv)
    assert sched.block_manager.num_free_blocks < 64
    assert sched.abort("b") == [b]
    assert b.status is SequenceStatus.FINISHED_ABORTED
    assert sched.abort("a") == [a]
    assert sched.abort("nope") == []
    assert not sched.has_unfinished() and sched.block_manager.num_free_blocks == 64


def test_prefix_hits_skip_computed_tokens() -> None:
    sched, kv = make(block_size=4), FakeKV()
    a = seq("a", 13, max_tokens=1)
    sched.add(a)
    drive(sched, kv)
    b = seq("b", 13, max_tokens=1)
    sched.add(b)
    out = step(sched, kv)
    assert out.batch.query_len == [1] and out.batch.positions == [12]
    assert b.num_cached_tokens == 12
    assert sched.block_manager.prefix_cache_stats().num_hit_tokens == 12


def test_n_children_fork_after_the_parent_prompt() -> None:
    sched, kv = make(block_size=4, prefix=False), FakeKV()
    parent = seq("r", 10, max_tokens=3)
    children = [seq("r", 10, max_tokens=3, index=i) for i in (1, 2)]
    for c in children:
        c.parent = parent
    for s in (parent, *children):
        sched.add(s)
    out = step(sched, kv)
    assert [e.seq for e in out.scheduled] == [parent]
    assert all(c.parent is None and c.num_computed_tokens == 8 for c in children)
    out = step(sched, kv)
    assert out.batch.query_len == [1, 2, 2]  # children only compute the partial last block
    drive(sched, kv)
    assert all(s.num_output_tokens == 3 for s in (parent, *children))
    assert sched.block_manager.num_free_blocks == 64


@pytest.mark.parametrize("seed", range(40))
def test_randomized_invariants(seed: int) -> None:
    rng = random.Random(seed)
    block_size = rng.choice([1, 2, 4, 16])
    num_blocks = rng.randint(40, 120) // block_size + 8
    max_model_len = num_blocks * block_size // 2
    sched = make(
        num_blocks=num_blocks,
        block_size=block_size,
        max_num_seqs=rng.randint(1, 10),
        budget=rng.randint(max(8, max_model_len // 4), max_model_len * 2),
        max_model_len=max_model_len,
        chunked=rng.random() < 0.8,
        prefix=rng.random() < 0.7,
    )
    kv = FakeKV()
    shared_prefixes = [[rng.randint(1, 49) for _ in range(rng.randint(1, 24))] for _ in range(3)]
    live: list[Sequence] = []
    aborted: set[str] = set()
    for i in range(rng.randint(10, 40)):
        prompt = (rng.choice(shared_prefixes) if rng.random() < 0.5 else []) + [
            rng.randint(1, 49) for _ in range(rng.randint(1, 20))
        ]
        prompt = prompt[: max_model_len - 2]
        max_tokens = rng.randint(1, max_model_len - len(prompt))
        n = rng.choice([1, 1, 1, 2, 3])
        parent = None
        for k in range(n):
            s = Sequence(f"r{i}", prompt, SamplingParams(max_tokens=max_tokens), index=k, parent=parent)
            parent = parent or s
            sched.add(s)
            live.append(s)
        for _ in range(rng.randint(0, 3)):
            if not sched.has_unfinished():
                break
            step(sched, kv)
            if rng.random() < 0.1:
                victim = rng.choice(live).request_id
                sched.abort(victim)
                aborted.add(victim)
    drive(sched, kv)
    for s in live:
        if s.request_id in aborted and s.status is SequenceStatus.FINISHED_ABORTED:
            continue
        assert s.status is SequenceStatus.FINISHED_LENGTH
        expected = s.prompt_token_ids
        while len(expected) - s.num_prompt_tokens < (s.params.max_tokens or 1):
            expected = [*expected, next_token(expected)]
        assert s.token_ids == expected
    check_invariants(sched.block_manager, [])
    assert sched.block_manager.num_free_blocks == num_blocks
    assert all(b.ref_count == 0 for b in sched.block_manager.blocks)
