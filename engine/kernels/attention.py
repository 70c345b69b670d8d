"""Paged attention, pure torch (CPU and CUDA).

Each layer's KV pool is a pair of tensors [num_blocks, block_size, num_kv_heads, head_dim]. A step
writes its new K/V into the slots the scheduler chose, then reads every sequence's context back
through its block table. Decodes (one new token) run as one padded SDPA call for the whole batch;
prefill chunks run one SDPA call each (causal, offset by the cached prefix when there is one).

GQA in decode without copying K/V: the query heads that share a KV head are folded into the
query-length axis, so q is [n, num_kv_heads, group, head_dim] against k/v [n, num_kv_heads, ctx,
head_dim]. Prefill chunks use SDPA's own GQA support (enable_gqa).

An fp8 cache (kv_cache.py) is quantized on write with the layer's k_scale / v_scale and dequantized
to q's dtype right after the block gather; a prefill without a cached prefix attends over its own
unquantized K/V, as it never reads the cache. This path is the reference for every fp8 kernel.

On CUDA, 16-bit queries go to the Triton kernels instead (triton_attention.py: decode rows;
triton_varlen.py: every prefill chunk of a step in one launch, from `AttentionMetadata.varlen`), which
also take fp8 caches; this module's torch code stays the reference and the CPU path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from llmdeploy_engine.core.forward_batch import ForwardBatch
from llmdeploy_engine.kernels.kv_cache import read_blocks, write_kv
from torch.nn.attention import SDPBackend, sdpa_kernel

# cuDNN attention builds a graph per new shape; decode contexts change shape every step, so leave it out
_SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


@dataclass(frozen=True)
class PrefillChunk:
    token_start: int  # first of this sequence's new tokens in the flattened batch
    query_len: int
    context_len: int  # cached + new tokens
    context_blocks: torch.Tensor | None  # [ceil(context_len / block_size)] blocks to read; None: no prefix


@dataclass(frozen=True)
class VarlenMetadata:
    """Every scheduled sequence of a step as int32 device tensors, for kernels that run the whole
    batch in one launch (triton_varlen.py). Built on CUDA only."""

    query_start: torch.Tensor  # [num_seqs] first new token of each sequence in the flattened batch
    query_len: torch.Tensor  # [num_seqs]
    context_len: torch.Tensor  # [num_seqs] cached + new tokens
    block_tables: torch.Tensor  # [num_seqs, max_blocks], padded with block 0
    max_query_len: int  # host bound on query_len: sizes the launch grid without reading the device


def pack_aligned(parts: list[list[int]], dtype: torch.dtype, device: torch.device) -> list[torch.Tensor]:
    """The parts as 1-D tensors on device from one host-to-device copy, each starting on a 16-byte
    boundary of the buffer. Triton specialises pointer arguments on 16-byte alignment, so parts at
    arbitrary offsets compiled new kernel variants in the middle of serving whenever the sizes'
    residues changed (a 0.6 s stall for Qwen2.5-0.5B, 1.1 s for Llama-3.1-8B on an H200: the varlen
    kernel at the first step with n % 4 == 2 sequences)."""
    per_16 = 16 // torch.empty(0, dtype=dtype).element_size()
    flat: list[int] = []
    starts = []
    for part in parts:
        starts.append(len(flat))
        flat += part
        flat += [0] * (-len(flat) % per_16)
    buffer = torch.tensor(flat, dtype=dtype).to(device, non_blocking=True)  # one copy
    return [buffer[start : start + len(part)] for start, part in zip(starts, parts, strict=True)]


def build_varlen_metadata(
    batch: ForwardBatch, block_size: int, device: torch.device, seqs: list[int] | None = None
) -> VarlenMetadata:
    """The varlen kernel's metadata for the sequences `seqs` of the batch (None: all of them); their
    rows keep their places in the flattened batch."""
    if seqs is None:
        seqs = list(range(batch.num_seqs))
    n = len(seqs)
    context = [batch.context_len[i] for i in seqs]
    max_blocks = max((-(-c // block_size) for c in context), default=0)
    tables: list[int] = []
    for i, ctx in zip(seqs, context, strict=True):
        row = batch.block_tables[i][: -(-ctx // block_size)]
        tables += row + [0] * (max_blocks - len(row))
    query_len = [batch.query_len[i] for i in seqs]
    parts = [[batch.query_start[i] for i in seqs], query_len, context, tables]
    query_start, query_len_t, context_len, flat_tables = pack_aligned(parts, torch.int32, device)
    return VarlenMetadata(
        query_start=query_start,
        query_len=query_len_t,
        context_len=context_len,
        block_tables=flat_tables.view(n, max_blocks),
        max_query_len=max(query_len, default=0),
    )


@dataclass(frozen=True)
class AttentionMetadata:
    slot_mapping: torch.Tensor | None  # [num_tokens] where new K/V go; None: no KV cache (profiling)
    decode_token_index: torch.Tensor  # [num_decodes] token index of each decode in the flat batch
    decode_blocks: torch.Tensor  # [num_decodes * max_blocks] block tables, flattened, padded with block 0
    decode_mask: torch.Tensor  # [num_decodes, 1, 1, max_blocks * block_size] True where the key is real
    prefills: tuple[PrefillChunk, ...]
    varlen: VarlenMetadata | None = None  # CUDA batches with prefills: the varlen kernel's, prefills only
    # [num_decodes] int32 context length of each decode, built once per step so kernels need not
    # reduce decode_mask in every layer; None: derived from decode_mask (decode_context_lens())
    decode_lengths: torch.Tensor | None = None
    # host fact: decode_token_index is arange(num_decodes), so the decodes' queries are q[:num_decodes]
    decodes_in_order: bool = False
    # host fact: every decode row is a different sequence (not so when CUDA graphs replay speculative
    # verification, where a sequence's new tokens are rows that read each other's new K/V), so one
    # launch may store each row's K/V and attend (fused_rope_decode)
    decode_one_token_per_seq: bool = False

    @property
    def num_decodes(self) -> int:
        return int(self.decode_token_index.numel())

    def decode_context_lens(self) -> torch.Tensor:
        """[num_decodes] context lengths (int32 when built per step; else a reduction of decode_mask)."""
        if self.decode_lengths is not None:
            return self.decode_lengths
        return self.decode_mask.view(self.num_decodes, -1).sum(-1)


def build_attention_metadata(batch: ForwardBatch, block_size: int, device: torch.device) -> AttentionMetadata:
    decode_rows = [i for i, n in enumerate(batch.query_len) if n == 1 and batch.context_len[i] > 1]
    decode_set = set(decode_rows)
    prefills = []
    prefill_seqs: list[int] = []
    for i in range(batch.num_seqs):
        if i in decode_set:
            continue
        prefill_seqs.append(i)
        start, qlen, ctx = batch.query_start[i], batch.query_len[i], batch.context_len[i]
        blocks = None
        if ctx > qlen:
            table = batch.block_tables[i][: -(-ctx // block_size)]
            blocks = torch.tensor(table, dtype=torch.long, device=device)
        prefills.append(PrefillChunk(start, qlen, ctx, blocks))
    # decode contexts padded to whole blocks and to the longest one (with block 0, masked out)
    contexts = [batch.context_len[i] for i in decode_rows]
    max_blocks = -(-max(contexts, default=0) // block_size)
    padded: list[int] = []
    for i in decode_rows:
        table = batch.block_tables[i][:max_blocks]
        padded += table + [0] * (max_blocks - len(table))
    lengths = torch.tensor(contexts, dtype=torch.int32, device=device)
    mask = torch.arange(max_blocks * block_size, device=device)[None, :] < lengths[:, None]
    decode_tokens = [batch.query_start[i] for i in decode_rows]
    return AttentionMetadata(
        slot_mapping=torch.tensor(batch.slot_mapping, dtype=torch.long, device=device),
        decode_token_index=torch.tensor(decode_tokens, dtype=torch.long, device=device),
        decode_blocks=torch.tensor(padded, dtype=torch.long, device=device),
        decode_mask=mask[:, None, None, :],
        prefills=tuple(prefills),
        decode_lengths=lengths,
        decodes_in_order=decode_tokens == list(range(len(decode_tokens))),
        decode_one_token_per_seq=True,  # decode rows are the sequences with query_len 1
        # the prefill sequences only: a step's decode rows go to the decode kernel (paged_attention_triton)
        varlen=build_varlen_metadata(batch, block_size, device, prefill_seqs)
        if device.type == "cuda" and prefills
        else None,
    )


# the largest query rows per program `default_block_m` picks (the warm-up stops at its class)
LARGEST_BLOCK_M = 64


def default_block_m(rows: int) -> int:
    """Query rows per program (a sequence's new tokens times the GQA group) for the longest query of
    a step. H200, bf16: 4-token verification (16 rows with GQA 4) ran 2x faster at 16 than at 128;
    prefills ran faster at 64 rows with 4 warps (`varlen_launch`) than at 128 with 8, 1.07-1.31x
    (8,192-token chunks of 100-1,024-token prompts 1.21x, 1 x 8,192 1.07x, 32 x 256 1.31x; fp8 cache
    1.35x; `git show c2170a2:benchmarks/gpu_varlen_sweep.py`)."""
    return 16 if rows <= 16 else 32 if rows <= 32 else LARGEST_BLOCK_M


def varlen_launch(block_m: int, fp8: bool) -> tuple[int, int, int]:
    """(BLOCK_N keys per inner tile, num_warps, num_stages) of the varlen kernel for block_m rows per
    program and the cache's dtype: the fastest of `git show c2170a2:benchmarks/gpu_varlen_sweep.py` for 64 rows (bf16 cache: 32 keys, 3
    stages; fp8: 64 keys, 2 stages, where 32 keys ran 1.1-1.3x slower), as before for the rest."""
    if block_m <= 32:
        return 64, 4, 2
    if block_m == 64:
        return (64, 4, 2) if fp8 else (32, 4, 3)
    return 64, 8, 2


def warm_query_lens(group: int, limit: int) -> list[int]:
    """One query length (2..limit tokens) for each BLOCK_M `triton_varlen.varlen_attention` can pick with this GQA
    group: a prefill of each, run once at start-up, compiles every variant a step may need (each
    compilation is ~0.5 s, which would otherwise hold up every stream the first time a step's longest
    query falls in a new class; measured on the H200). A block_m's launch
    configuration (`varlen_launch`) depends only on it and the engine's cache dtype."""
    lens: list[int] = []
    seen: set[int] = set()
    for q in range(2, limit + 1):
        block_m = default_block_m(q * group)
        if block_m not in seen:
            seen.add(block_m)
            lens.append(q)
        if block_m == LARGEST_BLOCK_M:
            break
    return lens


def profile_batch(num_tokens: int, max_seq_len: int, block_size: int) -> ForwardBatch:
    """A step of new sequences only: num_tokens prompt tokens in sequences of up to max_seq_len, each
    sequence's K/V in its own run of blocks from block 0 on (a cache of ceil(num_tokens / block_size)
    blocks holds them all), every sequence sampled. The engine's memory profile runs it, so it
    measures the path a served prefill takes."""
    starts = list(range(0, num_tokens, max_seq_len))
    lens = [min(max_seq_len, num_tokens - s) for s in starts]
    tables, positions, slots = [], [], []
    first_block = 0
    for length in lens:
        blocks = -(-length // block_size)
        tables.append(list(range(first_block, first_block + blocks)))
        positions += range(length)
        slots += range(first_block * block_size, first_block * block_size + length)
        first_block += blocks
    return ForwardBatch(
        input_ids=[0] * num_tokens,
        positions=positions,
        slot_mapping=slots,
        query_start=starts,
        query_len=lens,
        context_len=lens,
        block_tables=tables,
        sample_indices=list(range(len(lens))),
    )


def build_profile_metadata(num_tokens: int, max_seq_len: int, device: torch.device) -> AttentionMetadata:
    """Metadata for a cache-free prefill of num_tokens tokens split into sequences of max_seq_len."""
    chunks = []
    for start in range(0, num_tokens, max_seq_len):
        n = min(max_seq_len, num_tokens - start)
        chunks.append(PrefillChunk(start, n, n, None))
    empty = torch.zeros(0, dtype=torch.long, device=device)
    return AttentionMetadata(
        slot_mapping=None,
        decode_token_index=empty,
        decode_blocks=empty,
        decode_mask=torch.zeros(0, 1, 1, 0, dtype=torch.bool, device=device),
        prefills=tuple(chunks),
    )


def paged_attention(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    v: torch.Tensor,
    kv_cache: tuple[torch.Tensor, torch.Tensor] | None,
    meta: AttentionMetadata,
    scale: float,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    kv_written: bool = False,
) -> torch.Tensor:
    """Write k/v to their slots, then attend. k_scale/v_scale (float32, one element) are the per-tensor
    scales of an fp8 KV cache: stored = (x / scale) cast to fp8, read = stored.float() * scale; None
    for a 16/32-bit cache. Every kernel behind this function follows that rule. kv_written: k/v are
    already in their slots (ops.rope_and_cache stored them with RoPE); only attend."""
    if q.is_cuda and q.dtype in (torch.bfloat16, torch.float16):
        # Triton kernels for 16-bit q (float32 products would run in tf32, looser than the float32
        # checks of the torch path), 16-bit or fp8 caches; they write the cache and read it in place
        triton_path = _triton_attention()
        if triton_path is not None and triton_path.supports(q, kv_cache, meta):
            return triton_path.paged_attention_triton(
                q, k, v, kv_cache, meta, scale, k_scale, v_scale, kv_written=kv_written
            )
    if not q.is_cuda:
        # no cuDNN backend to leave out; entering the context costs ~20 us a layer on a CPU decode step
        return _paged_attention(q, k, v, kv_cache, meta, scale, k_scale, v_scale, kv_written)
    with sdpa_kernel(_SDPA_BACKENDS):
        return _paged_attention(q, k, v, kv_cache, meta, scale, k_scale, v_scale, kv_written)


def fused_rope_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    kv_cache: tuple[torch.Tensor, torch.Tensor] | None,
    meta: AttentionMetadata,
    scale: float,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """RoPE on q and the new k, the KV-cache store and decode attention in one Triton launch
    (triton_attention.paged_decode with `rope`), for decode-only batches of 16-bit CUDA queries with
    one token per sequence, in order. Returns None where that does not apply; the caller then runs
    ops.rope_and_cache and paged_attention in two launches, which store the same cache bytes and
    give the same output within one ulp; the one launch measured ~5 % faster on a 0.5B model's
    single stream and ~2 % on an 8B's (H200)."""
    if not q.is_cuda or q.dtype not in (torch.bfloat16, torch.float16):
        return None
    if kv_cache is None or meta.slot_mapping is None or meta.prefills:
        return None
    n = meta.num_decodes
    if not (meta.decode_one_token_per_seq and meta.decodes_in_order and n == q.shape[0] and n > 0):
        return None
    half = q.shape[-1] // 2
    if half & (half - 1):
        return None
    triton_path = _triton_attention()
    if triton_path is None or not triton_path.supports(q, kv_cache, meta):
        return None
    out: torch.Tensor = triton_path.paged_decode(
        q,
        kv_cache[0],
        kv_cache[1],
        meta.decode_blocks.view(n, -1),
        meta.decode_context_lens(),
        scale,
        k_scale,
        v_scale,
        rope=triton_path.RopeStore(k, v, cos, sin, meta.slot_mapping),
    )
    return out


def _triton_attention() -> Any:
    """The triton_attention module when Triton is installed (GPU machines), else None."""
    try:
        from llmdeploy_engine.kernels import triton_attention
    except ImportError:
        return None
    return triton_attention


def _paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_cache: tuple[torch.Tensor, torch.Tensor] | None,
    meta: AttentionMetadata,
    scale: float,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    kv_written: bool = False,
) -> torch.Tensor:
    if kv_cache is not None and not kv_written:
        assert meta.slot_mapping is not None
        write_kv(kv_cache[0], meta.slot_mapping, k, k_scale)
        write_kv(kv_cache[1], meta.slot_mapping, v, v_scale)
    if meta.num_decodes and not meta.prefills and meta.decodes_in_order and meta.num_decodes == q.shape[0]:
        # a decode-only step: every row is a decode, in order; attend straight into the output
        assert kv_cache is not None, "decode needs a KV cache"
        return _decode_attention(q, kv_cache, meta, scale, k_scale, v_scale).view(q.shape)
    out = torch.empty_like(q)

    if meta.num_decodes:
        assert kv_cache is not None, "decode needs a KV cache"
        out[meta.decode_token_index] = _decode_attention(q, kv_cache, meta, scale, k_scale, v_scale)

    for chunk in meta.prefills:
        rows = slice(chunk.token_start, chunk.token_start + chunk.query_len)
        # 4-D [1, heads, len, head_dim]: SDPA's fused kernels (the CPU flash kernel among them) take
        # only 4-D inputs; 3-D ones fall back to the math path, which materializes the scores
        qp = q[rows].transpose(0, 1)[None]
        if chunk.context_blocks is None:
            kp, vp = k[rows].transpose(0, 1)[None], v[rows].transpose(0, 1)[None]
            if q.is_cuda and kp.shape[1] != qp.shape[1]:
                # not every fused CUDA backend takes enable_gqa (the memory-efficient one does not), and
                # the math path SDPA falls back to materializes heads x tokens^2 scores: K/V expanded to
                # every head (linear in the tokens) keep the fused backends open
                group = qp.shape[1] // kp.shape[1]
                kp, vp = kp.repeat_interleave(group, dim=1), vp.repeat_interleave(group, dim=1)
            op = F.scaled_dot_product_attention(qp, kp, vp, is_causal=True, scale=scale, enable_gqa=True)
        else:
            assert kv_cache is not None
            ctx = chunk.context_len
            kp = read_blocks(kv_cache[0], chunk.context_blocks, 1, k_scale, q.dtype)[:, :, :ctx]
            vp = read_blocks(kv_cache[1], chunk.context_blocks, 1, v_scale, q.dtype)[:, :, :ctx]
            offset = chunk.context_len - chunk.query_len
            token_pos = torch.arange(chunk.query_len, device=q.device) + offset
            mask = torch.arange(chunk.context_len, device=q.device)[None, :] <= token_pos[:, None]
            op = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask, scale=scale, enable_gqa=True)
        out[rows] = op[0].transpose(0, 1)
    return out


def _decode_attention(
    q: torch.Tensor,
    kv_cache: tuple[torch.Tensor, torch.Tensor],
    meta: AttentionMetadata,
    scale: float,
    k_scale: torch.Tensor | None,
    v_scale: torch.Tensor | None,
) -> torch.Tensor:
    """[num_decodes, num_heads, head_dim]: the decode rows' attention over their paged contexts."""
    n, (num_heads, head_dim) = meta.num_decodes, q.shape[1:]
    num_kv_heads = kv_cache[0].shape[2]
    # rows in order are the first n: a view, no gather
    rows = q[:n] if meta.decodes_in_order else q[meta.decode_token_index]
    qd = rows.reshape(n, num_kv_heads, num_heads // num_kv_heads, head_dim)
    kd = read_blocks(kv_cache[0], meta.decode_blocks, n, k_scale, q.dtype)  # [n, kv_heads, ctx, head_dim]
    vd = read_blocks(kv_cache[1], meta.decode_blocks, n, v_scale, q.dtype)
    od = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=meta.decode_mask, scale=scale)
    return od.reshape(n, num_heads, head_dim)
