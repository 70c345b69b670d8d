"""The KV block pool: reference counts, a free list, and prefix caching by chained block hashes.

Plain Python, no torch. A block is `block_size` KV slots; a sequence owns an ordered block table.
Full blocks get a hash chained from their parent block's hash and their own token ids, so a hash names
a whole prefix. A full block whose KV is computed is registered under its hash; later sequences with
the same prefix take it (reference count + 1) instead of recomputing it. Blocks whose count falls to
zero go back to the free list but keep their hash, so they can still be hit until a new allocation
evicts them, least recently freed first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence as Seq
from dataclasses import dataclass

from llmdeploy_engine.core.sequence import Sequence

_ROOT_HASH = 0x9E3779B97F4A7C15  # arbitrary start of every hash chain


def chain_hash(parent_hash: int, token_ids: Seq[int]) -> int:
    """Hash of a full block given its parent's hash. Python hashes ints/tuples without salting."""
    return hash((parent_hash, tuple(token_ids)))


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    block_hash: int | None = None  # set once the block is full, computed and registered
    token_ids: tuple[int, ...] = ()  # of a registered block, to rule out hash collisions on hits


@dataclass(frozen=True)
class PrefixCacheStats:
    num_query_tokens: int
    num_hit_tokens: int


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        assert num_blocks > 0 and block_size > 0
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        # front = next to be handed out; unhashed blocks go to the front, hashed ones to the back (LRU)
        self.free_ids: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.hash_to_block: dict[int, int] = {}
        self.num_query_tokens = 0
        self.num_hit_tokens = 0

    # ---- accounting ---------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self.free_ids)

    @property
    def usage(self) -> float:
        """Fraction of blocks held by live sequences (cached-but-free blocks count as free)."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    def prefix_cache_stats(self) -> PrefixCacheStats:
        return PrefixCacheStats(self.num_query_tokens, self.num_hit_tokens)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # ---- hashing ------------------------------------------------------------------------------
    def _extend_hashes(self, seq: Sequence, num_full_blocks: int) -> None:
        bs = self.block_size
        while len(seq.block_hashes) < num_full_blocks:
            i = len(seq.block_hashes)
            parent = seq.block_hashes[-1] if seq.block_hashes else _ROOT_HASH
            seq.block_hashes.append(chain_hash(parent, seq.token_ids[i * bs : (i + 1) * bs]))

    # ---- admission ----------------------------------------------------------------------------
    def find_cached_blocks(self, seq: Sequence) -> list[int]:
        """Registered blocks matching the longest full-block prefix of a new sequence.

        At least one token is always left to compute, so the model produces logits for the last one.
        """
        if not self.enable_prefix_caching or seq.block_table:
            return []
        max_blocks = (seq.num_tokens - 1) // self.block_size
        self._extend_hashes(seq, max_blocks)
        hits: list[int] = []
        bs = self.block_size
        for i in range(max_blocks):
            block_id = self.hash_to_block.get(seq.block_hashes[i])
            if block_id is None:
                break
            if self.blocks[block_id].token_ids != tuple(seq.token_ids[i * bs : (i + 1) * bs]):
                break  # hash collision: treat as a miss
            hits.append(block_id)
        return hits

    def can_allocate(self, seq: Sequence, num_new_tokens: int, cached_block_ids: Seq[int] = ()) -> bool:
        return self._num_blocks_to_take(seq, num_new_tokens, cached_block_ids) <= self.num_free_blocks

    def _num_blocks_to_take(self, seq: Sequence, num_new_tokens: int, cached_block_ids: Seq[int]) -> int:
        num_computed = seq.num_computed_tokens + len(cached_block_ids) * self.block_size
        total = self.blocks_needed(num_computed + num_new_tokens)
        fresh = max(0, total - len(seq.block_table) - len(cached_block_ids))
        if not cached_block_ids:  # every decode step of every sequence: skip the generator
            return fresh
        revived = sum(1 for b in cached_block_ids if self.blocks[b].ref_count == 0)
        return fresh + revived

    def allocate_slots(self, seq: Sequence, num_new_tokens: int, cached_block_ids: Seq[int] = ()) -> bool:
        """Make room for `num_new_tokens` more tokens after the computed ones; all or nothing.

        `cached_block_ids` (from `find_cached_blocks`, only for a sequence without blocks) are
        attached first and counted as computed.
        """
        assert not cached_block_ids or not seq.block_table
        if not self.can_allocate(seq, num_new_tokens, cached_block_ids):
            return False
        if not seq.block_table and seq.num_computed_tokens == 0:
            # first admission (or re-admission after preemption): count the lookup
            self.num_query_tokens += seq.num_tokens
            self.num_hit_tokens += len(cached_block_ids) * self.block_size
        for block_id in cached_block_ids:
            self._take_cached(block_id)
            seq.block_table.append(block_id)
        if cached_block_ids:
            seq.num_computed_tokens = len(cached_block_ids) * self.block_size
            seq.num_cached_tokens = seq.num_computed_tokens
        total = self.blocks_needed(seq.num_computed_tokens + num_new_tokens)
        while len(seq.block_table) < total:
            seq.block_table.append(self._take_fresh())
        return True

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Let a fresh child share the parent's full computed blocks (n > 1 sampling)."""
        assert not child.block_table and child.num_computed_tokens == 0
        num_full = min(parent.num_computed_tokens, child.num_tokens - 1) // self.block_size
        for block_id in parent.block_table[:num_full]:
            self.blocks[block_id].ref_count += 1
            child.block_table.append(block_id)
        child.num_computed_tokens = num_full * self.block_size
        child.num_cached_tokens = child.num_computed_tokens
        child.block_hashes = list(parent.block_hashes[:num_full])
        child.num_registered_blocks = 0  # its first cache_full_blocks looks at the shared blocks once

    # ---- after a step -------------------------------------------------------------------------
    def cache_full_blocks(self, seq: Sequence) -> None:
        """Register the sequence's computed full blocks under their chained hashes. Each block is looked
        at once (from seq.num_registered_blocks on): the cost per call is the new blocks, not the
        context (an 8k-token sequence has 500 blocks, and a decode step calls this every 16 tokens).
        A block left out because an identical one was registered stays out, even once that one is
        evicted."""
        if not self.enable_prefix_caching:
            return
        num_full = seq.num_computed_tokens // self.block_size
        self._extend_hashes(seq, num_full)
        bs = self.block_size
        start = min(seq.num_registered_blocks, num_full)
        seq.num_registered_blocks = num_full
        for i in range(start, num_full):
            block = self.blocks[seq.block_table[i]]
            if block.block_hash is not None:
                continue
            h = seq.block_hashes[i]
            if h in self.hash_to_block:
                continue  # an identical block computed by another sequence is already registered
            block.block_hash = h
            block.token_ids = tuple(seq.token_ids[i * bs : (i + 1) * bs])
            self.hash_to_block[h] = block.block_id

    def free(self, seq: Sequence) -> None:
        """Drop the sequence's references; its computed state goes back to zero."""
        # tail first, so the tail of a prefix is evicted before its head
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            assert block.ref_count > 0, f"block {block_id} freed twice"
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free_ids[block_id] = None
                if block.block_hash is None:
                    self.free_ids.move_to_end(block_id, last=False)
        seq.block_table = []
        seq.num_computed_tokens = 0
        seq.num_registered_blocks = 0

    def trim(self, seq: Sequence, num_tokens: int) -> None:
        """Give back trailing blocks beyond the first `num_tokens` slots (speculative lookahead that was
        rejected). Such blocks hold only unverified KV and are never registered in the prefix cache."""
        keep = self.blocks_needed(num_tokens)
        assert keep * self.block_size >= seq.num_computed_tokens
        for block_id in reversed(seq.block_table[keep:]):
            block = self.blocks[block_id]
            assert block.ref_count == 1 and block.block_hash is None, (
                f"block {block_id} is not a private tail"
            )
            block.ref_count = 0
            self.free_ids[block_id] = None
            self.free_ids.move_to_end(block_id, last=False)
        del seq.block_table[keep:]

    def reset_prefix_cache(self) -> None:
        """Forget every cached-but-free block (live blocks stay registered)."""
        for block in self.blocks:
            if block.ref_count == 0 and block.block_hash is not None:
                del self.hash_to_block[block.block_hash]
                block.block_hash = None
                block.token_ids = ()

    # ---- internals ----------------------------------------------------------------------------
    def _take_cached(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self.free_ids[block_id]
        block.ref_count += 1

    def _take_fresh(self) -> int:
        block_id, _ = self.free_ids.popitem(last=False)
        block = self.blocks[block_id]
        assert block.ref_count == 0
        if block.block_hash is not None:  # evict the least recently freed cached block
            if self.hash_to_block.get(block.block_hash) == block_id:
                del self.hash_to_block[block.block_hash]
            block.block_hash = None
            block.token_ids = ()
        block.ref_count = 1
        return block_id
