"""The host side of CUDA-graph replays (cuda_graph_runner.py): the warm-up batches, and the numpy
packing of a step's or a window's inputs into the pinned buffer one copy sends. No torch."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
from llmdeploy_engine.core.forward_batch import ForwardBatch
from llmdeploy_engine.runner.multi_step import NO_CAP, DecodeWindow, pack_window_steps


@dataclass(frozen=True)
class PackedTables:
    """The block tables a window was packed with, kept for the window that follows it: rows [n, nb]
    as packed (zeros past each row's blocks), blocks per row and each row's last block id."""

    window: DecodeWindow
    tables: np.ndarray
    lens: np.ndarray
    lasts: np.ndarray


def warm_up_batch(prompt_len: int, decode_contexts: list[int], pad: int, block_size: int) -> ForwardBatch:
    """A prompt of prompt_len tokens and one decode row per context in decode_contexts, every slot and
    block the padding block `pad` (writes of positions past one block collide; the outputs are
    dropped). The start-up warm-ups' steps."""
    ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    query_start: list[int] = []
    query_len: list[int] = []
    context_len: list[int] = []
    tables: list[list[int]] = []
    for first, count in [(0, prompt_len), *((c - 1, 1) for c in decode_contexts)]:
        query_start.append(len(ids))
        ids += [0] * count
        positions += range(first, first + count)
        slots += [pad * block_size + p % block_size for p in range(first, first + count)]
        query_len.append(count)
        context_len.append(first + count)
        tables.append([pad] * -(-(first + count) // block_size))
    return ForwardBatch(
        input_ids=ids,
        positions=positions,
        slot_mapping=slots,
        query_start=query_start,
        query_len=query_len,
        context_len=context_len,
        block_tables=tables,
        sample_indices=list(range(len(query_len))),
    )


def follow_tables(
    out: np.ndarray, lens: np.ndarray, block_tables: list[list[int]], prev: PackedTables, rows: list[int]
) -> bool:
    """Pack the block tables of a window that follows `prev`'s window (row i continues prev's row
    rows[i]) into out [n, nb] from prev's packed rows, rewriting only the rows whose number of blocks
    or last block changed (a window's reservation appends blocks; flattening every table again was
    most of a follow-on's packing at 256 sequences). False, with nothing written, when prev's width
    differs or a table does not fit nb: the caller packs them all. A running sequence's blocks never
    change between a window and its follow-on (no preemption or re-admission runs in between, and
    blocks are shared only when full), so equal counts and last blocks mean equal tables."""
    n, nb = out.shape
    if prev.tables.shape[1] != nb or (n and int(lens.max()) > nb):
        return False
    index = np.asarray(rows, dtype=np.int64)
    np.take(prev.tables, index, axis=0, out=out)
    lasts = last_blocks(block_tables, n)
    stale = np.flatnonzero((lens != prev.lens[index]) | (lasts != prev.lasts[index]))
    for i in stale.tolist():
        table = block_tables[i]
        out[i] = 0
        out[i, : len(table)] = table
    return True


def last_blocks(block_tables: list[list[int]], n: int) -> np.ndarray:
    """Each of the n tables' last block id (-1 for an empty table)."""
    return np.fromiter((t[-1] if t else -1 for t in block_tables), dtype=np.int64, count=n)


def packed_tables(window: DecodeWindow, tables: np.ndarray, batch: ForwardBatch) -> PackedTables:
    """What `follow_tables` needs of a window just packed: a copy of its rows (the host buffer is
    rewritten by the next window), blocks per row (cut to the width) and each row's last block."""
    n, nb = tables.shape
    lens = np.fromiter(map(len, batch.block_tables), dtype=np.int64, count=n)
    np.minimum(lens, nb, out=lens)
    lasts = last_blocks(batch.block_tables, n)
    return PackedTables(window, tables.copy(), lens, lasts)


def spaced_rows(rows: list[int]) -> slice | None:
    """`rows` as a slice when they are evenly spaced and increasing (every token of a step, or the last
    token of each of its sequences of q tokens: q - 1, 2q - 1, ...), else None."""
    if not rows:
        return None
    step = rows[1] - rows[0] if len(rows) > 1 else 1
    if step <= 0 or rows != list(range(rows[0], rows[-1] + 1, step)):
        return None
    return slice(rows[0], rows[-1] + 1, step)


def window_size(b: int, nb: int, num_steps: int) -> int:
    """int64 values `pack_decode_window` writes for a graph of b rows and nb context blocks."""
    return b * (4 + nb) + b + (num_steps - 1) * 3 * b


def pack_decode_window(
    out: np.ndarray,
    batch: ForwardBatch,
    num_steps: int,
    b: int,
    nb: int,
    block_size: int,
    max_position: int = NO_CAP,
    padding_block: int | None = None,
    following: tuple[PackedTables, list[int]] | None = None,
) -> int:
    """Lay a decode window out for a graph of b rows and nb blocks: step 0 exactly as
    `pack_decode_inputs` packs it (ids, positions, slots, lengths, block tables), then the padding
    gather index (b: rows past the batch take row 0's sampled token), then per later step its
    positions, slots and lengths (3 x b; padding rows at positions 1, 2, ... of the padding block).
    `following`: the tables of the window this one follows and, per row, its row there; the block
    tables are then taken from those rows (`follow_tables`). Returns the number of int64 written."""
    n = batch.num_seqs
    step0 = pack_decode_inputs(out, batch, b, nb, padding_block, block_size, following)
    out[step0 : step0 + n] = np.arange(n)
    out[step0 + n : step0 + b] = 0
    size = window_size(b, nb, num_steps)
    later = out[step0 + b : size].reshape(num_steps - 1, 3, b)
    pack_window_steps(
        later, out[4 * b : step0].reshape(b, nb), out[b : 2 * b], num_steps, block_size, max_position
    )
    return size


def pack_decode_inputs(
    out: np.ndarray,
    batch: ForwardBatch,
    b: int,
    nb: int,
    padding_block: int | None = None,
    block_size: int = 0,
    following: tuple[PackedTables, list[int]] | None = None,
) -> int:
    """Lay a uniform batch out as a graph of b rows and nb context blocks reads it, one row per new
    token: ids, positions, slots, context lengths (position + 1: each token sees its own prefix; b
    each), then b x nb block ids (each token's sequence's table, cut to nb and padded with block 0).
    Rows past the batch's tokens take row 0's token at position 0 of `padding_block` (slot, length 1,
    a table of that block only); without one they repeat row 0. `following` (one token per
    sequence): see `follow_tables`. Returns the number of int64 written."""
    n, rows = batch.num_seqs, batch.num_tokens
    positions = np.asarray(batch.positions, dtype=np.int64)
    padded = (batch.input_ids[0], 0, padding_block * block_size, 1) if padding_block is not None else None
    for k, values in enumerate((batch.input_ids, positions, batch.slot_mapping, positions + 1)):
        out[k * b : k * b + rows] = values
        out[k * b + rows : (k + 1) * b] = values[0] if padded is None else padded[k]
    tables = out[4 * b : 4 * b + b * nb].reshape(b, nb)
    q = batch.query_len[0]
    per_seq = tables[:n] if q == 1 else np.empty((n, nb), dtype=np.int64)
    lens = np.fromiter(map(len, batch.block_tables), dtype=np.int64, count=n)
    if q == 1 and following is not None and follow_tables(per_seq, lens, batch.block_tables, *following):
        tables[rows:] = tables[0] if padding_block is None else padding_block
        return b * (4 + nb)
    per_seq[:] = 0
    if n and int(lens.max()) > nb:
        cut = [t[:nb] for t in batch.block_tables]
        lens = np.minimum(lens, nb)
    else:
        cut = batch.block_tables
    total = int(lens.sum())
    flat = np.fromiter(itertools.chain.from_iterable(cut), dtype=np.int64, count=total)
    seq_rows = np.repeat(np.arange(n), lens)
    cols = np.arange(total) - np.repeat(np.cumsum(lens) - lens, lens)
    per_seq[seq_rows, cols] = flat
    if q != 1:
        tables[:rows] = np.repeat(per_seq, q, axis=0)
    tables[rows:] = tables[0] if padding_block is None else padding_block
    return b * (4 + nb)
