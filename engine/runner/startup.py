"""ModelRunner's start-up as plain functions, in order, each returning a frozen value: `load_model`
(the weights on the device and their bytes), `profile_memory` (one profiling forward pass of
max_num_batched_tokens tokens without a KV cache; CUDA: the allocator's peak is the activation peak),
`size_kv_cache` (the planner's rule, `llmdeploy_engine.facts`: blocks, budget, longest context), then
`allocate_kv_cache` (one K and one V tensor [num_blocks, block_size, num_kv_heads, head_dim] per
layer). On CPU there is no memory to measure against: the KV budget is `kv_cache_memory_bytes`
(default 4 GiB, as vLLM's CPU KV space). fp8 KV scales are calibrated between profiling and sizing
(`calibrate_kv_scales`, which sets the model's scale buffers)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch
from llmdeploy_engine import facts
from llmdeploy_engine.config import EngineConfig, ModelConfig
from llmdeploy_engine.kernels import kv_cache
from llmdeploy_engine.kernels.attention import build_attention_metadata, build_profile_metadata, profile_batch
from llmdeploy_engine.kernels.quant_linear import Int4Weight, QuantWeight
from llmdeploy_engine.model.model import CausalLM
from llmdeploy_engine.parallel.distributed import ParallelState, all_reduce_min
from llmdeploy_engine.runner.setup import local_kv_heads

logger = logging.getLogger("llmdeploy_engine")

CPU_DEFAULT_KV_CACHE_BYTES = 4 * 2**30
# fp8 KV scale calibration (calculate_kv_scales): 512 tokens in 4 sequences
CALIBRATION_TOKENS = 512
CALIBRATION_SEQ_LEN = 128


@dataclass(frozen=True)
class LoadedModel:
    model: CausalLM
    weights_bytes: int  # parameters plus quantized buffers, a shared buffer counted once


@dataclass(frozen=True)
class MemoryProfile:
    peak_activation_bytes: int
    non_torch_bytes: int
    total_bytes: int  # the device's memory (the host's on the CPU)


@dataclass(frozen=True)
class KVCacheSize:
    num_kv_blocks: int  # the same on every rank
    kv_cache_bytes: int
    kv_bytes_per_token: int  # per rank
    num_local_kv_heads: int
    max_model_len: int
    # CUDA graphs pad a batch up to a captured size: the padding rows write and read one block of
    # their own past the pool (the scheduler never hands it out), 2 MiB for an 8B model at 16
    # tokens a block, inside the graphs' fixed reserve (facts.CUDA_GRAPH_FIXED_BYTES)
    padding_block: int | None


def load_model(
    config: EngineConfig, mc: ModelConfig, parallel: ParallelState, device: torch.device, dtype: torch.dtype
) -> LoadedModel:
    from llmdeploy_engine.loading import random_weights

    with torch.device("meta"):
        model = CausalLM(mc, parallel).to(dtype)
    model = model.to_empty(device=device)
    if mc.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.reset_rope()
    for layer in model.model.layers:
        layer.self_attn.reset_kv_scales(device)
    if random_weights.is_random(config.model):
        random_weights.init_random_weights(model, config.seed)
    elif _compact_gguf(config, device):
        from llmdeploy_engine.loading.gguf_compact import load_compact

        counts = load_compact(model, config.model)
        logger.info("GGUF weights kept compact on the CPU (tensors per kernel: %s)", counts)
    else:
        model.load_weights(_checkpoint_weights(config.model))
    repacked = sum(w.repack_tinygemm() for w in model.modules() if isinstance(w, Int4Weight))
    if repacked:
        logger.info(
            "int4 weights of %d projections repacked for tinygemm (torch._weight_int4pack_mm)", repacked
        )
    model = model.eval()
    weights_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    # quantized projections hold their weights in buffers (quant_linear.py); a tied compact LM head
    # shares its buffers with the embedding (gguf_compact.py), counted once
    seen: set[int] = set()
    for w in model.modules():
        if isinstance(w, QuantWeight):
            buffers = list(w.buffers())
            shared = sum(b.numel() * b.element_size() for b in buffers if b.data_ptr() in seen)
            seen.update(b.data_ptr() for b in buffers)
            weights_bytes += w.stored_bytes() - shared
    return LoadedModel(model, weights_bytes)


def _compact_gguf(config: EngineConfig, device: torch.device) -> bool:
    from llmdeploy_engine.loading.gguf_compact import use_compact

    return use_compact(config.cpu_weights, device, config.model, config.tensor_parallel_size)


def _checkpoint_weights(model: str) -> dict[str, torch.Tensor]:
    if model.endswith(".gguf"):
        from llmdeploy_engine.loading.gguf_loader import load_gguf

        return load_gguf(model)[1]
    from llmdeploy_engine.loading.hf_loader import load_hf

    return load_hf(model)[1]


def profile_memory(
    model: CausalLM,
    config: EngineConfig,
    mc: ModelConfig,
    parallel: ParallelState,
    device: torch.device,
    kv_dtype: torch.dtype,
    max_num_batched_tokens: int,
    model_len: int,
) -> MemoryProfile:
    """The activation peak of one step of max_num_batched_tokens tokens, the memory outside torch,
    the device's total."""
    if device.type != "cuda":
        return MemoryProfile(0, 0, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    n = max_num_batched_tokens
    # the server's path: a prefill step of n tokens in sequences of up to model_len, its K/V written
    # to a paged cache and attended in place (the varlen kernel, linear in the tokens). Every layer
    # shares one scratch cache of n tokens, allocated before the baseline: the real cache is budgeted
    # apart, so only what the step itself allocates counts as activation
    batch = profile_batch(n, model_len, config.block_size)
    kv_heads = local_kv_heads(mc.num_key_value_heads, parallel.world_size)
    scratch_blocks = sum(len(table) for table in batch.block_tables)
    scratch_shape = (scratch_blocks, config.block_size, kv_heads, mc.head_dim)
    scratch = (
        torch.zeros(scratch_shape, dtype=kv_dtype, device=device),
        torch.zeros(scratch_shape, dtype=kv_dtype, device=device),
    )
    ids = torch.zeros(n, dtype=torch.long, device=device)
    positions = torch.tensor(batch.positions, dtype=torch.long, device=device)
    meta = build_attention_metadata(batch, config.block_size, device)
    num_rows = min(config.max_num_seqs, n)
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    with torch.inference_mode():
        hidden = model(ids, positions, meta, [scratch] * mc.num_hidden_layers)
        model.compute_logits(hidden[:num_rows])
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before
    del scratch, meta, hidden
    free, total = torch.cuda.mem_get_info(device)
    non_torch = max(0, (total - free) - torch.cuda.memory_reserved(device))
    torch.cuda.empty_cache()
    return MemoryProfile(peak, non_torch, total)


def calibrate_kv_scales(
    model: CausalLM,
    config: EngineConfig,
    mc: ModelConfig,
    device: torch.device,
    kv_dtype: torch.dtype,
    max_num_batched_tokens: int,
) -> None:
    """Per-layer fp8 scales from the |K| / |V| maxima of one cache-free prefill of fixed pseudo-random
    tokens (CALIBRATION_TOKENS, in sequences of CALIBRATION_SEQ_LEN so several see position 0).
    Runs before any CUDA graph is captured; the scale buffers are updated in place."""
    n = min(CALIBRATION_TOKENS, max_num_batched_tokens)
    gen = torch.Generator().manual_seed(config.seed)
    ids = torch.randint(0, mc.vocab_size, (n,), generator=gen).to(device)
    positions = torch.arange(n, device=device) % CALIBRATION_SEQ_LEN
    meta = build_profile_metadata(n, CALIBRATION_SEQ_LEN, device)
    attns = [layer.self_attn for layer in model.model.layers]
    for attn in attns:
        attn.kv_observer = kv_cache.KVAmaxObserver(device)
    try:
        with torch.inference_mode():
            model(ids, positions, meta, None)
    finally:
        observers = [attn.kv_observer for attn in attns]
        for attn in attns:
            attn.kv_observer = None
    for attn, obs in zip(attns, observers, strict=True):
        assert obs is not None
        attn.k_scale.copy_(kv_cache.calibrated_scale(obs.k_amax, kv_dtype))
        attn.v_scale.copy_(kv_cache.calibrated_scale(obs.v_amax, kv_dtype))
    k_scales = torch.cat([a.k_scale for a in attns]).tolist()
    v_scales = torch.cat([a.v_scale for a in attns]).tolist()
    logger.info(
        "fp8 KV scales from %d calibration tokens: k %.3g..%.3g, v %.3g..%.3g",
        n, min(k_scales), max(k_scales), min(v_scales), max(v_scales),
    )  # fmt: skip


def size_kv_cache(
    config: EngineConfig,
    mc: ModelConfig,
    parallel: ParallelState,
    device: torch.device,
    kv_dtype: torch.dtype,
    loaded: LoadedModel,
    memory: MemoryProfile,
    held_bytes: int,
    cuda_graph_bytes: int,
    num_kv_blocks: int | None,
) -> KVCacheSize:
    """The KV pool by the planner's rule (`num_kv_blocks`: exactly this many blocks instead), the same
    on every rank, and the longest context it allows."""
    block_size = config.block_size
    num_local_kv_heads = local_kv_heads(mc.num_key_value_heads, parallel.world_size)
    kv_bytes_per_token = facts.kv_bytes_per_token(  # per rank
        mc.num_hidden_layers, num_local_kv_heads, mc.head_dim, kv_dtype.itemsize
    )
    explicit = config.kv_cache_memory_bytes
    if device.type == "cpu" and explicit is None:
        explicit = CPU_DEFAULT_KV_CACHE_BYTES
    kv_budget = facts.kv_cache_bytes(
        memory.total_bytes,
        config.gpu_memory_utilization,
        loaded.weights_bytes,
        memory.peak_activation_bytes,
        memory.non_torch_bytes + held_bytes,
        cuda_graph_bytes=cuda_graph_bytes,
        kv_cache_memory_bytes=explicit,
    )
    blocks = facts.num_kv_blocks(kv_budget, kv_bytes_per_token, block_size)
    if num_kv_blocks is not None:
        blocks = num_kv_blocks
        kv_budget = num_kv_blocks * block_size * kv_bytes_per_token
    # every rank must hold the same blocks: the smallest pool of all ranks
    blocks = all_reduce_min(blocks, parallel, device)
    if blocks < 1:
        raise ValueError(
            f"no memory left for the KV cache (budget {kv_budget / 2**30:.2f} GiB after "
            f"{loaded.weights_bytes / 2**30:.2f} GiB weights and "
            f"{memory.peak_activation_bytes / 2**30:.2f} GiB activations"
            + (
                f", {held_bytes / 2**30:.2f} GiB this process held before the engine started"
                if held_bytes
                else ""
            )
            + "); raise gpu_memory_utilization or kv_cache_memory_bytes, or use a smaller model"
        )
    graphs = device.type == "cuda" and not config.enforce_eager
    return KVCacheSize(
        num_kv_blocks=blocks,
        kv_cache_bytes=kv_budget,
        kv_bytes_per_token=kv_bytes_per_token,
        num_local_kv_heads=num_local_kv_heads,
        max_model_len=facts.max_model_len_for(
            config.max_model_len, mc.max_position_embeddings, blocks, block_size
        ),
        padding_block=blocks if graphs else None,
    )


def allocate_kv_cache(
    size: KVCacheSize, mc: ModelConfig, block_size: int, kv_dtype: torch.dtype, device: torch.device
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    blocks = size.num_kv_blocks + (size.padding_block is not None)
    shape = (blocks, block_size, size.num_local_kv_heads, mc.head_dim)
    # zeros, not empty: padded context positions read slot 0 and must never hold NaN
    return [
        (
            torch.zeros(shape, dtype=kv_dtype, device=device),
            torch.zeros(shape, dtype=kv_dtype, device=device),
        )
        for _ in range(mc.num_hidden_layers)
    ]
