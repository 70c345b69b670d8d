"""The start-up memory accounting of each engine, from `PlanInputs` to a `MemoryPlan` (no suggestions).

- vLLM (V1): usable = total x gpu_memory_utilization; KV = usable - weights - activation peak -
  non-torch - CUDA graphs (graphs are profiled and subtracted by default since v0.20, `cuda_graphs`;
  earlier releases capture them afterwards, in the headroom); blocks = floor(KV / (block x bytes/token)).
- TGI: after warm-up, the free memory (x its 0.95 wiggle room) becomes blocks; "max batch total tokens".
- builtin: `llmdeploy_engine.facts`, with an explicit KV budget on CPU (like vLLM's CPU KV space).
"""

from __future__ import annotations

import math

from llmdeploy_engine import facts as builtin_rule

from llmdeploy.planner import cuda_graphs
from llmdeploy.planner.footprint import (
    CUDA_CONTEXT_GIB,
    activation_bytes,
    cuda_graph_bytes,
    non_torch_bytes,
    release,
    vllm_load_overhead_bytes,
    weights_bytes_per_gpu,
)
from llmdeploy.planner.kv_layout import LINEAR_STATE_BLOCKS_PER_REQUEST, KVLayout, kv_layout
from llmdeploy.planner.memory_plan import MemoryPlan
from llmdeploy.planner.plan_inputs import CPU_DEFAULT_KV_GIB, GIB, PlanInputs

TGI_WIGGLE_ROOM = 0.95
BUILTIN_ATTENTION_BYTES_PER_SCORE = 9.55  # calibrated: built-in engine, H200, Llama-3.1-8B and Qwen2.5-0.5B
BUILTIN_NON_TORCH_GIB = 0.67  # calibrated: built-in engine's measured non-torch (CUDA context, cuBLAS), H200
TGI_DEFAULT_PREFILL_TOKENS = 4096
KV_TOKENS_FROM_CONCURRENCY_SINCE = (0, 21)


def graphs_in_budget(inputs: PlanInputs) -> bool:
    """vLLM profiles CUDA graphs into the KV budget since 0.20; before, they took the headroom."""
    return cuda_graphs.graphs_in_budget(inputs.engine_version)


def vllm_defaults(inputs: PlanInputs) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) as vLLM's API server picks them when not given:
    large GPUs (>= 70 GiB, not A100) get 8192 / 1024, others 2048 / 256."""
    total = inputs.total_memory_gib if inputs.device == "cuda" else 0.0
    big = total >= 70 and not (inputs.gpu and inputs.gpu.name.startswith("A100"))
    seqs = inputs.max_num_seqs or (1024 if big else 256)
    batched = inputs.max_num_batched_tokens or (8192 if big else 2048)
    return max(batched, seqs), seqs


def _pool_blocks(layout: KVLayout, kv_bytes: int, block_size: int) -> int:
    """Blocks per pool: every group slot (group_size layers) gets the same number of blocks."""
    return builtin_rule.num_kv_blocks(kv_bytes, layout.pool_bytes_per_token, block_size)


def _blocks_per_request(layout: KVLayout, block_size: int, max_model_len: int, batched: int) -> int:
    """Pool blocks one request of max_model_len takes, summed over the groups
    (kv_cache_utils.py `get_max_concurrency_for_kv_cache_config`): a full group the whole length,
    a sliding group its window plus one batch (SlidingWindowSpec), a chunked group one chunk plus
    one batch (ChunkedLocalAttentionSpec.max_admission_blocks_per_request), a linear group its
    fixed state blocks (MambaSpec.max_memory_usage_bytes)."""
    full_blocks = -(-max_model_len // block_size)
    total = 0
    for kind in layout.group_kinds or ("full",):
        if kind == "sliding":
            assert layout.sliding_window is not None
            total += min(full_blocks, -(-(layout.sliding_window - 1 + batched) // block_size) + 1)
        elif kind == "chunked":
            assert layout.attention_chunk_size is not None
            total += -(-min(layout.attention_chunk_size + batched, max_model_len) // block_size)
        elif kind == "linear":
            total += LINEAR_STATE_BLOCKS_PER_REQUEST
        else:
            total += full_blocks
    return total


def _concurrency(layout: KVLayout, blocks: int, block_size: int, max_model_len: int, batched: int) -> float:
    """vLLM's max concurrency: pool blocks / blocks one request needs across all groups."""
    if layout.is_plain:
        return builtin_rule.max_concurrency(blocks, block_size, max_model_len)
    return blocks / _blocks_per_request(layout, block_size, max_model_len, batched)


def kv_capacity(inputs: PlanInputs, kv_bytes: int, batched: int) -> tuple[int, int, int, float]:
    """(block size, blocks per pool, "GPU KV cache size" tokens, max concurrency) for a KV budget."""
    layout = kv_layout(inputs)
    block = inputs.block_size
    if layout.is_mla and inputs.engine == "vllm" and block == 16:
        block = 64  # vLLM's MLA backends (FlashMLA) use 64-token blocks
    if inputs.engine == "vllm":
        block = layout.hybrid_block_size(block)
    max_len = inputs.context_len
    blocks = _pool_blocks(layout, max(0, kv_bytes), block)
    concurrency = _concurrency(layout, blocks, block, max_len, batched)
    return block, blocks, reported_tokens(inputs, layout, blocks, block, concurrency), concurrency


def reported_tokens(inputs: PlanInputs, layout: KVLayout, blocks: int, block: int, concurrency: float) -> int:
    """vLLM's "GPU KV cache size: N tokens" (v1/core/kv_cache_utils.py `_report_kv_cache_config`):
    up to 0.20 the shared pool's blocks divided among the KV cache groups, times the block size
    (num_blocks // num_groups * block_size); since 0.21 max concurrency x max_model_len, which
    counts a sliding-window or chunked group only for its window or chunk and a linear group for
    its state. One full-attention group: both are blocks x block size (up to the rounding of
    max_model_len to whole blocks). Other engines: blocks x block size."""
    version = release(inputs.engine_version)
    if inputs.engine != "vllm" or layout.is_plain:
        return blocks * block
    if version is not None and version < KV_TOKENS_FROM_CONCURRENCY_SINCE:
        return blocks // layout.num_groups * block
    return int(concurrency * inputs.context_len)


def _plan(
    inputs: PlanInputs,
    usable_bytes: int,
    weights: int,
    activation: int,
    non_torch: int,
    graphs: int,
    graphs_in_budget: bool,
    kv_bytes: int,
    batched: int,
    seqs: int,
    notes: tuple[str, ...] = (),
) -> MemoryPlan:
    layout = kv_layout(inputs)
    max_len = inputs.context_len
    block, blocks, tokens, concurrency = kv_capacity(inputs, kv_bytes, batched)
    total_bytes = int(inputs.total_memory_gib * GIB) if inputs.device == "cuda" else usable_bytes
    planned = weights + activation + non_torch + max(0, kv_bytes) + graphs
    problems = []
    if kv_bytes <= 0:
        short = (-kv_bytes) / GIB
        problems.append(
            f"no memory left for the KV cache: weights, activations and overheads exceed the usable "
            f"{usable_bytes / GIB:.2f} GiB by {short:.2f} GiB"
        )
    elif concurrency < 1 and layout.is_plain:
        problems.append(f"max_model_len {max_len:,} exceeds the KV cache's {tokens:,} tokens")
    elif concurrency < 1:
        need = kv_bytes / concurrency / GIB
        problems.append(
            f"one request of max_model_len {max_len:,} needs {need:.2f} GiB of KV cache "
            f"(every layer group included); only {kv_bytes / GIB:.2f} GiB is available"
        )
    spec_max = inputs.spec.max_position_embeddings
    if inputs.max_model_len and spec_max and inputs.max_model_len > spec_max:
        problems.append(
            f"max_model_len {inputs.max_model_len:,} exceeds the model's max_position_embeddings {spec_max:,}"
        )
    headroom = total_bytes - planned if inputs.device == "cuda" else 0
    if inputs.device == "cuda" and headroom / GIB < CUDA_CONTEXT_GIB and not problems:
        problems.append(
            f"only {headroom / GIB:.2f} GiB left outside the budget for the CUDA context (~{CUDA_CONTEXT_GIB} GiB); "
            "lower gpu_memory_utilization"
        )
    return MemoryPlan(
        engine=inputs.engine,
        model=inputs.spec.hf_id,
        gpu=inputs.gpu.name if inputs.gpu else ("cpu" if inputs.device == "cpu" else "custom"),
        device=inputs.device,
        tensor_parallel_size=inputs.tensor_parallel_size,
        pipeline_parallel_size=inputs.pipeline_parallel_size,
        total_gib=total_bytes / GIB,
        gpu_memory_utilization=inputs.gpu_memory_utilization,
        usable_gib=usable_bytes / GIB,
        weights_gib=weights / GIB,
        activation_gib=activation / GIB,
        non_torch_gib=non_torch / GIB,
        cuda_graph_gib=graphs / GIB,
        kv_cache_gib=max(0, kv_bytes) / GIB,
        headroom_gib=headroom / GIB,
        kv_bytes_per_token=layout.bytes_per_token,
        kv_cache_tokens=tokens,
        num_kv_blocks=blocks,
        block_size=block,
        max_model_len=max_len,
        max_num_seqs=seqs,
        max_num_batched_tokens=batched,
        max_concurrency=concurrency,
        kv_cache_dtype=inputs.kv_cache_dtype,
        quantization=inputs.effective_quantization,
        fits=not problems,
        problems=tuple(problems),
        notes=notes,
    )


def plan_vllm(inputs: PlanInputs) -> MemoryPlan:
    batched, seqs = vllm_defaults(inputs)
    weights = weights_bytes_per_gpu(inputs) + vllm_load_overhead_bytes(inputs)
    if inputs.device == "cpu":
        kv = int((inputs.kv_cache_memory_gib or CPU_DEFAULT_KV_GIB) * GIB)
        act = activation_bytes(inputs, batched, seqs)
        note = ("vLLM CPU backend: KV space is fixed (VLLM_CPU_KVCACHE_SPACE), not a share of memory",)
        return _plan(inputs, kv, weights, act, 0, 0, False, kv, batched, seqs, note)
    total = int(inputs.total_memory_gib * GIB)
    usable = int(total * inputs.gpu_memory_utilization)
    act = activation_bytes(inputs, batched, seqs)
    non_torch = non_torch_bytes(inputs)
    graphs = cuda_graphs.vllm_graph_bytes(inputs, batched, seqs)
    graphs_counted = graphs_in_budget(inputs)
    explicit = int(inputs.kv_cache_memory_gib * GIB) if inputs.kv_cache_memory_gib else None
    kv = builtin_rule.kv_cache_bytes(
        total,
        inputs.gpu_memory_utilization,
        weights,
        act,
        non_torch,
        graphs if graphs_counted else 0,
        explicit,
    )
    notes: tuple[str, ...] = ()
    if inputs.flashinfer_sampler is not None:
        backend = "FlashInfer" if inputs.flashinfer_sampler else "PyTorch"
        notes = (f"sampler warm-up planned for {backend} top-k/top-p sampling (VLLM_USE_FLASHINFER_SAMPLER)",)
    if allreduce_fusion_unplanned(inputs):
        notes += (
            "not in this estimate: vLLM 0.17+ creates its allreduce + RMSNorm fusion workspace (FlashInfer) "
            "inside the memory profile on this GPU with tensor parallelism; public 0.19 logs show about "
            "1.9 GiB more non-torch memory per GPU than planned, so expect that much less KV cache",
        )
    if inputs.pipeline_parallel_size > 1:
        notes += (
            "per-GPU figures are the last pipeline stage's (the one that runs the sampler warm-up); "
            "vLLM gives every stage the smallest stage's KV block count",
        )
    return _plan(inputs, usable, weights, act, non_torch, graphs, graphs_counted, kv, batched, seqs, notes)


def allreduce_fusion_unplanned(inputs: PlanInputs) -> bool:
    """vLLM >= 0.17 turns the allreduce + RMSNorm fusion on for TP > 1 on compute capability 9.0 and
    10.x (`config/vllm.py`, `enable_allreduce_rms_fusion`); its workspace is rounded to a driver
    granularity no source states, so the planner names the gap instead of charging a guess."""
    version = release(inputs.engine_version)
    capability = inputs.gpu.compute_capability if inputs.gpu is not None else ""
    return (
        (version is None or version >= (0, 17, 0))
        and inputs.tensor_parallel_size > 1
        and (capability == "9.0" or capability.startswith("10."))
        and not inputs.enforce_eager
    )


def plan_tgi(inputs: PlanInputs) -> MemoryPlan:
    seqs = inputs.max_num_seqs or 128
    prefill = inputs.max_num_batched_tokens or max(TGI_DEFAULT_PREFILL_TOKENS, min(inputs.context_len, 8192))
    total = int(inputs.total_memory_gib * GIB)
    usable = int(total * inputs.gpu_memory_utilization)  # TGI's --cuda-memory-fraction
    weights = weights_bytes_per_gpu(inputs)
    act = activation_bytes(inputs, prefill, min(seqs, prefill))
    non_torch = non_torch_bytes(inputs) + int(CUDA_CONTEXT_GIB * GIB)
    graphs = cuda_graph_bytes(inputs, min(seqs, 128))
    free = usable - weights - act - non_torch - graphs
    kv = int(free * TGI_WIGGLE_ROOM) if free > 0 else free
    note = (f"TGI: --max-batch-total-tokens from the KV cache; --max-batch-prefill-tokens {prefill:,}",)
    return _plan(inputs, usable, weights, act, non_torch, graphs, True, kv, prefill, seqs, note)


def plan_builtin(inputs: PlanInputs) -> MemoryPlan:
    seqs = inputs.max_num_seqs or 256
    batched = inputs.max_num_batched_tokens or min(max(inputs.context_len, 2048), 8192)
    # int4 / fp8 checkpoints stay quantized; GGUF files are dequantized to the compute dtype on CUDA
    # and kept compact on the CPU (one process: tensor_parallel_size 1)
    if inputs.device == "cpu" and inputs.spec.gguf_tensors and inputs.tensor_parallel_size == 1:
        weights = builtin_rule.compact_gguf_weights_bytes(
            list(inputs.spec.gguf_tensors), inputs.model_dtype_bytes
        )
    else:
        weights = math.ceil(
            builtin_rule.weights_bytes(
                inputs.spec.num_params,
                inputs.spec.params.linear,
                inputs.model_dtype_bytes,
                inputs.effective_quantization,
            )
            / inputs.tensor_parallel_size
        )
    act = activation_bytes(inputs, batched, min(seqs, batched))
    if inputs.device == "cpu":
        budget = int((inputs.kv_cache_memory_gib or CPU_DEFAULT_KV_GIB) * GIB)
        kv = builtin_rule.kv_cache_bytes(0, 0.0, 0, 0, 0, 0, budget)
        note = ("built-in engine on CPU: the KV cache is limits.kv_cache_memory_gib (default 4 GiB)",)
        return _plan(inputs, budget, weights, act, 0, 0, False, kv, batched, seqs, note)
    total = int(inputs.total_memory_gib * GIB)
    usable = int(total * inputs.gpu_memory_utilization)
    # the engine profiles one prefill of `batched` tokens through its torch attention path, which
    # materializes the scores: heads x tokens^2 x ~9.5 bytes (measured on an H200, see docs/planner.md)
    heads = max(1, inputs.spec.num_attention_heads // inputs.tensor_parallel_size)
    act = max(act, int(heads * batched * batched * BUILTIN_ATTENTION_BYTES_PER_SCORE))
    # it counts everything outside torch's pool, the CUDA context included (0.67 GiB measured)
    non_torch = int(BUILTIN_NON_TORCH_GIB * GIB)
    explicit = int(inputs.kv_cache_memory_gib * GIB) if inputs.kv_cache_memory_gib else None
    graphs = 0 if inputs.enforce_eager else builtin_graph_bytes(inputs, seqs)
    kv = builtin_rule.kv_cache_bytes(
        total, inputs.gpu_memory_utilization, weights, act, non_torch, graphs, explicit
    )
    return _plan(inputs, usable, weights, act, non_torch, graphs, True, kv, batched, seqs)


def builtin_graph_bytes(inputs: PlanInputs, seqs: int) -> int:
    """What the built-in engine sets aside for its decode CUDA graphs (builtin_rule.cuda_graph_bytes);
    assumes the Triton kernels are installed, which read 16-bit caches of the model's dtype and fp8
    caches in place (a float32 model or another cache dtype takes the gathering torch path)."""
    spec, tp = inputs.spec, inputs.tensor_parallel_size
    return builtin_rule.cuda_graph_bytes(
        max_num_seqs=seqs,
        max_model_len=inputs.context_len,
        block_size=inputs.block_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size // tp,
        q_size=spec.num_attention_heads * spec.head_dim // tp,
        kv_size=max(1, spec.num_kv_heads // tp) * spec.head_dim,
        vocab_size=spec.vocab_size,
        dtype_bytes=inputs.model_dtype_bytes,
        gathered_kv=inputs.model_dtype_bytes == 4
        or inputs.kv_dtype_bytes not in (inputs.model_dtype_bytes, 1),
    )


def plan_for(inputs: PlanInputs) -> MemoryPlan:
    rule = {"vllm": plan_vllm, "tgi": plan_tgi, "builtin": plan_builtin}[inputs.engine]
    plan = rule(inputs)
    assert math.isfinite(plan.max_concurrency)
    return plan
