"""A `MemoryPlan` from the terms an engine's memory rule computed: KV blocks, concurrency, problems.

The rule of each engine (`memory_plan`) decides the budget and its terms; this module turns them
into the plan every engine reports the same way.
"""

from __future__ import annotations

from collections.abc import Callable

from llmdeploy_engine import facts as builtin_rule

from llmdeploy.memory.footprint import CUDA_CONTEXT_GIB
from llmdeploy.memory.kv_layout import LINEAR_STATE_BLOCKS_PER_REQUEST, KVLayout, kv_layout
from llmdeploy.memory.memory_plan import MemoryPlan
from llmdeploy.memory.plan_inputs import GIB, PlanInputs

# (inputs, KV bytes, batched tokens) -> (block size, blocks per pool, reported KV tokens, max concurrency)
KVSizing = Callable[[PlanInputs, int, int], tuple[int, int, int, float]]


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


def pool_capacity(
    layout: KVLayout, kv_bytes: int, block: int, max_model_len: int, batched: int
) -> tuple[int, float]:
    """(blocks per pool, max concurrency): every group slot (group_size layers) gets the same number
    of blocks; concurrency is pool blocks / blocks one request needs across all groups."""
    blocks = builtin_rule.num_kv_blocks(max(0, kv_bytes), layout.pool_bytes_per_token, block)
    if layout.is_plain:
        return blocks, builtin_rule.max_concurrency(blocks, block, max_model_len)
    return blocks, blocks / _blocks_per_request(layout, block, max_model_len, batched)


def plain_kv_sizing(inputs: PlanInputs, kv_bytes: int, batched: int) -> tuple[int, int, int, float]:
    """The recipe's block size, and blocks x block size as the KV cache's tokens."""
    block = inputs.block_size
    blocks, concurrency = pool_capacity(kv_layout(inputs), kv_bytes, block, inputs.context_len, batched)
    return block, blocks, blocks * block, concurrency


def assemble_plan(
    inputs: PlanInputs,
    usable_bytes: int,
    weights: int,
    activation: int,
    non_torch: int,
    graphs: int,
    kv_bytes: int,
    batched: int,
    seqs: int,
    notes: tuple[str, ...] = (),
    sizing: KVSizing = plain_kv_sizing,
) -> MemoryPlan:
    layout = kv_layout(inputs)
    max_len = inputs.context_len
    block, blocks, tokens, concurrency = sizing(inputs, kv_bytes, batched)
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
