"""BlockManager: reference counts, free list, chained-hash prefix caching, LRU eviction."""

from __future__ import annotations

from llmdeploy_engine.core.block_manager import BlockManager, chain_hash
from llmdeploy_engine.core.sequence import Sequence
from llmdeploy_engine.sampling_params import SamplingParams


def seq_of(tokens: list[int], rid: str = "r") -> Sequence:
    return Sequence(rid, tokens, SamplingParams())


def compute_all(bm: BlockManager, seq: Sequence) -> None:
    """Admit with prefix hits, allocate the rest, and mark everything computed (as one prefill)."""
    cached = bm.find_cached_blocks(seq)
    num_new = seq.num_tokens - len(cached) * bm.block_size
    assert bm.allocate_slots(seq, num_new, cached)
    seq.num_computed_tokens = seq.num_tokens
    bm.cache_full_blocks(seq)


def test_allocate_and_free_returns_every_block() -> None:
    bm = BlockManager(8, 4, enable_prefix_caching=False)
    seq = seq_of(list(range(10)))
    assert bm.allocate_slots(seq, 10)
    assert len(seq.block_table) == 3
    assert bm.num_free_blocks == 5
    assert abs(bm.usage - 3 / 8) < 1e-9
    bm.free(seq)
    assert bm.num_free_blocks == 8 and bm.usage == 0.0
    assert all(b.ref_count == 0 for b in bm.blocks)
    assert seq.block_table == [] and seq.num_computed_tokens == 0


def test_allocation_is_all_or_nothing() -> None:
    bm = BlockManager(2, 4, enable_prefix_caching=False)
    seq = seq_of(list(range(12)))
    assert not bm.allocate_slots(seq, 12)
    assert seq.block_table == [] and bm.num_free_blocks == 2


def test_append_grows_one_block_at_a_boundary() -> None:
    bm = BlockManager(4, 4, enable_prefix_caching=False)
    seq = seq_of([1, 2, 3, 4])
    assert bm.allocate_slots(seq, 4)
    seq.num_computed_tokens = 4
    seq.append_token(5)
    assert bm.allocate_slots(seq, 1)
    assert len(seq.block_table) == 2
    seq.num_computed_tokens = 5
    seq.append_token(6)
    assert bm.allocate_slots(seq, 1)
    assert len(seq.block_table) == 2


def test_prefix_hit_shares_full_blocks_and_counts_tokens() -> None:
    bm = BlockManager(16, 4)
    a = seq_of(list(range(10)), "a")
    compute_all(bm, a)
    assert bm.prefix_cache_stats().num_hit_tokens == 0
    b = seq_of([*range(8), 99, 98, 97], "b")
    cached = bm.find_cached_blocks(b)
    assert cached == a.block_table[:2]
    assert bm.allocate_slots(b, b.num_tokens - 8, cached)
    assert b.num_computed_tokens == 8 and b.num_cached_tokens == 8
    assert bm.blocks[a.block_table[0]].ref_count == 2
    assert b.block_table[2] != a.block_table[2]
    stats = bm.prefix_cache_stats()
    assert stats.num_query_tokens == 10 + 11 and stats.num_hit_tokens == 8


def test_hit_always_leaves_the_last_token_to_compute() -> None:
    bm = BlockManager(16, 4)
    a = seq_of(list(range(8)), "a")
    compute_all(bm, a)
    b = seq_of(list(range(8)), "b")
    assert len(bm.find_cached_blocks(b)) == 1  # 8 tokens = 2 full blocks, but only 1 may be reused


def test_hash_is_chained_over_the_whole_prefix() -> None:
    bm = BlockManager(16, 4)
    compute_all(bm, seq_of([1, 2, 3, 4, 5, 6, 7, 8, 9], "a"))
    # same second block, different first block: no hit on the second block
    assert bm.find_cached_blocks(seq_of([0, 2, 3, 4, 5, 6, 7, 8, 9], "b")) == []
    assert chain_hash(1, [1, 2]) != chain_hash(2, [1, 2])


def test_freed_cached_blocks_are_reused_then_evicted_lru() -> None:
    bm = BlockManager(4, 2)
    a = seq_of([1, 2, 3, 4, 5], "a")  # 3 blocks, 2 full
    compute_all(bm, a)
    bm.free(a)
    assert bm.num_free_blocks == 4 and len(bm.hash_to_block) == 2
    # a hit on a freed block revives it
    b = seq_of([1, 2, 3, 4, 9], "b")
    compute_all(bm, b)
    assert b.num_cached_tokens == 4
    bm.free(b)
    # a new unrelated sequence needing every block evicts the cached ones
    c = seq_of([7] * 8, "c")
    assert bm.allocate_slots(c, 8)
    assert bm.hash_to_block == {}
    bm.free(c)


def test_unhashed_free_blocks_are_handed_out_before_cached_ones() -> None:
    bm = BlockManager(4, 2)
    a = seq_of([1, 2, 3], "a")  # one full (cached) block + one partial
    compute_all(bm, a)
    bm.free(a)
    c = seq_of([5, 6, 7, 8, 9, 10], "c")
    assert bm.allocate_slots(c, 6)  # 3 blocks of 4: the cached one stays
    assert len(bm.hash_to_block) == 1
    d = seq_of([1, 2, 3], "d")
    assert bm.find_cached_blocks(d) != []


def test_duplicate_computation_registers_one_block() -> None:
    bm = BlockManager(8, 2)
    a, b = seq_of([1, 2, 3], "a"), seq_of([1, 2, 3], "b")
    for s in (a, b):
        assert bm.allocate_slots(s, 3)
    for s in (a, b):
        s.num_computed_tokens = 3
        bm.cache_full_blocks(s)
    assert len(bm.hash_to_block) == 1
    bm.free(a)
    bm.free(b)
    assert bm.num_free_blocks == 8


def test_fork_shares_only_full_computed_blocks() -> None:
    bm = BlockManager(8, 4, enable_prefix_caching=False)
    parent = seq_of(list(range(10)), "r")
    assert bm.allocate_slots(parent, 10)
    parent.num_computed_tokens = 10
    child = Sequence("r", list(range(10)), SamplingParams(), index=1)
    bm.fork(parent, child)
    assert child.block_table == parent.block_table[:2]
    assert child.num_computed_tokens == 8
    assert bm.blocks[parent.block_table[0]].ref_count == 2
    assert bm.blocks[parent.block_table[2]].ref_count == 1
    bm.free(parent)
    bm.free(child)
    assert bm.num_free_blocks == 8


def test_reset_prefix_cache_forgets_free_blocks_only() -> None:
    bm = BlockManager(8, 2)
    a, b = seq_of([1, 2, 3], "a"), seq_of([4, 5, 6], "b")
    compute_all(bm, a)
    compute_all(bm, b)
    bm.free(a)
    bm.reset_prefix_cache()
    assert list(bm.hash_to_block.values()) == [b.block_table[0]]


class _CountingBlocks(list):  # type: ignore[type-arg]
    """The block list, counting lookups by index."""

    lookups = 0

    def __getitem__(self, i):  # type: ignore[no-untyped-def]
        type(self).lookups += 1
        return super().__getitem__(i)


def test_cache_full_blocks_looks_at_each_block_once() -> None:
    """Decode calls cache_full_blocks at every block boundary: the work is the new block, not the
    whole context (a long sequence would otherwise rescan hundreds of blocks every 16 tokens)."""
    bm = BlockManager(64, 4)
    bm.blocks = _CountingBlocks(bm.blocks)
    seq = seq_of(list(range(40)))
    compute_all(bm, seq)  # 10 full blocks
    assert seq.num_registered_blocks == 10 and len(bm.hash_to_block) == 10
    looked = 0
    for t in range(40, 80):  # one token a step, as decode appends them
        seq.append_token(t)
        assert bm.allocate_slots(seq, 1)
        seq.num_computed_tokens += 1
        _CountingBlocks.lookups = 0
        bm.cache_full_blocks(seq)
        looked += _CountingBlocks.lookups
    assert len(bm.hash_to_block) == 20 and seq.num_registered_blocks == 20
    assert looked == 10  # one lookup per new full block (the old code: 10 + 11 + ... + 20 = 165)
    assert all(bm.blocks[b].block_hash is not None for b in seq.block_table[:20])


def test_a_preempted_sequence_registers_its_blocks_again() -> None:
    """free() resets the watermark: recomputed blocks are registered again (here after the cache
    forgot them), and a re-admitted sequence that hits the cache leaves the hit blocks as they are."""
    bm = BlockManager(16, 4)
    seq = seq_of(list(range(12)))
    compute_all(bm, seq)
    registered = set(bm.hash_to_block)
    bm.free(seq)
    assert seq.num_registered_blocks == 0
    bm.reset_prefix_cache()
    assert not bm.hash_to_block
    compute_all(bm, seq)
    assert set(bm.hash_to_block) == registered
    bm.free(seq)
    compute_all(bm, seq)  # a hit on the first two blocks, the third recomputed
    assert seq.num_cached_tokens == 8 and set(bm.hash_to_block) == registered
