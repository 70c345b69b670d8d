"""vLLM's CUDA-graph memory per release: which graphs are captured, and what their memory is.

Graph sizes and modes (read from vLLM 0.32's `config/vllm.py` `_set_cudagraph_sizes` and
`v1/cudagraph_dispatcher.py`; the LMCache 3430 log of a >= 0.21 release, "PIECEWISE=51 (largest=512),
FULL=35 (largest=256)" at 256 sequences and 8192 batched tokens, agrees):

- V1 (0.8 and later): PIECEWISE graphs (the model split at every attention layer, num_layers + 1 graphs
  per size) for the sizes 1, 2, 4, every 8 below 256, every 16 from 256 up to min(2 x max_num_seqs, 512)
  (1024 on data-centre Blackwell), kept to sizes <= max_num_batched_tokens, plus max_num_batched_tokens
  itself where it fits below the top; and FULL_AND_PIECEWISE mode adds one FULL graph of the whole
  forward for each of those sizes up to max_num_seqs (uniform decode). The lists of releases before
  0.21 were not read: their graphs are captured after the KV cache is sized, so the term only enters
  the plan's headroom, never its KV tokens.
- V0 (before 0.8): one full graph per decode batch of 1, 2, 4, 8, ..., 256 (every 8) up to max_num_seqs.

Memory: since 0.21 vLLM measures it before sizing the KV cache (`profile_cudagraph_memory`): it
captures the two largest sizes of each mode into one pool, charges the first capture whole and the
second capture's increase of device memory in use for each further graph of the mode, and adds the
largest first capture to the per-graph terms of all modes. The two parts are:

- the pool: the private graph pool of the largest PIECEWISE size, where the widest piece (o_proj out,
  residual, gate/up out and the activated MLP width: 2h + 3 x intermediate per token, per GPU) lives
  at once; later sizes reuse it;
- per graph: the driver's memory for each instantiated CUDA graph, in 2 MiB steps.

Neither is in vLLM's source as a formula, so both were measured on the GPU machine (one H200, torch
2.11, CUDA driver 580): a Qwen3-8B-shaped stack (36 layers, h 4096, intermediate 12288, GQA 32/8 x
128, bf16) captured exactly as `profile_cudagraph_memory` does (one pool, one side stream, largest
size first, PIECEWISE pieces split at attention, then FULL graphs), with device memory in use read
before and after each size. The pool took 140 MiB at 512 tokens (torch reserved); every further
PIECEWISE size took 6.0 MiB of driver memory (median and mean of 50 sizes, 2-10 MiB each, for 37
piece graphs) and every FULL size 2.5 MiB (mean of 35; 2-4 MiB each). With these the Qwen3-8B log's
0.52 GiB is met: 140 MiB + 51 x 6.0 MiB + 34 x 2.5 MiB = 0.52 GiB. vLLM's own figure rests on one
sample per mode, so a run of the same settings may log up to ~0.1 GiB either way (one 2 MiB step
more or less on the second PIECEWISE size, times 50 graphs).
"""

from __future__ import annotations

import math

from llmdeploy.planner.footprint import release
from llmdeploy.planner.plan_inputs import PlanInputs

MIB = 2**20
V1_SINCE = (0, 8, 0)
GRAPHS_IN_BUDGET_SINCE = (0, 21, 0)  # VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS on by default
DEFAULT_MAX_CAPTURE_SIZE = 512  # 1024 on data-centre Blackwell (compute capability 10.0)
BLACKWELL_MAX_CAPTURE_SIZE = 1024
V0_MAX_CAPTURE_SIZE = 256

# measured, see the module docstring: pool bytes per (2h + 3 x intermediate) element of the largest
# PIECEWISE size (140 MiB / (512 x 45,056))
POOL_BYTES_PER_ELEMENT = 140 * MIB / (512 * (2 * 4096 + 3 * 12288))
PIECE_GRAPH_BYTES = int(6.0 * MIB / 37)  # driver memory per PIECEWISE graph (one layer's piece)
FULL_GRAPH_LAYER_BYTES = int(2.5 * MIB / 36)  # driver memory per layer of one FULL graph


def v1_capture_sizes(
    max_num_seqs: int, max_num_batched_tokens: int, blackwell: bool = False
) -> tuple[int, ...]:
    """PIECEWISE capture sizes, ascending (vLLM 0.32 `_set_cudagraph_sizes`)."""
    ceiling = BLACKWELL_MAX_CAPTURE_SIZE if blackwell else DEFAULT_MAX_CAPTURE_SIZE
    top = min(2 * max_num_seqs, ceiling)
    sizes = [1, 2, 4, *range(8, 256, 8), *range(256, top + 1, 16)]
    sizes = [s for s in sizes if s <= top and s <= max_num_batched_tokens]
    if max_num_batched_tokens <= top and max_num_batched_tokens not in sizes:
        sizes.append(max_num_batched_tokens)
    return tuple(sorted(sizes))


def full_decode_sizes(sizes: tuple[int, ...], max_num_seqs: int) -> tuple[int, ...]:
    """FULL graphs of FULL_AND_PIECEWISE: the capture sizes a batch of one-token decodes can fill."""
    return tuple(s for s in sizes if s <= max_num_seqs)


def v0_capture_sizes(max_num_seqs: int) -> tuple[int, ...]:
    return tuple(s for s in (1, 2, 4, *range(8, V0_MAX_CAPTURE_SIZE + 1, 8)) if s <= max(1, max_num_seqs))


def _pool_bytes(inputs: PlanInputs, tokens: int) -> int:
    """The private pool of the widest piece at `tokens` tokens, per GPU."""
    spec, tp = inputs.spec, inputs.tensor_parallel_size
    inter = spec.intermediate_size
    if spec.is_moe:
        inter = max(
            spec.num_experts_per_tok * spec.moe_intermediate_size, inter if spec.first_k_dense_replace else 0
        )
    width = 2 * spec.hidden_size + 3 * inter // tp
    return int(POOL_BYTES_PER_ELEMENT * tokens * width * inputs.model_dtype_bytes / 2)


def vllm_graph_bytes(inputs: PlanInputs, max_num_batched_tokens: int, max_num_seqs: int) -> int:
    """What vLLM's graph profiling charges (>= 0.21) or its graphs take after the KV cache (earlier)."""
    if inputs.enforce_eager or inputs.device == "cpu":
        return 0
    layers = math.ceil(inputs.spec.num_layers / inputs.pipeline_parallel_size)
    version = release(inputs.engine_version)
    if version is not None and version < V1_SINCE:
        sizes = v0_capture_sizes(max_num_seqs)
        return _pool_bytes(inputs, sizes[-1]) + len(sizes) * layers * FULL_GRAPH_LAYER_BYTES
    blackwell = inputs.gpu is not None and inputs.gpu.compute_capability == "10.0"
    sizes = v1_capture_sizes(max_num_seqs, max_num_batched_tokens, blackwell)
    full = full_decode_sizes(sizes, max_num_seqs)
    piecewise = len(sizes) * (layers + 1) * PIECE_GRAPH_BYTES
    return (
        _pool_bytes(inputs, sizes[-1]) + piecewise + max(0, len(full) - 1) * layers * FULL_GRAPH_LAYER_BYTES
    )


def graphs_in_budget(engine_version: str | None) -> bool:
    """vLLM profiles CUDA graphs into the KV budget since 0.21; before, they took the headroom."""
    version = release(engine_version)
    return version is None or version >= GRAPHS_IN_BUDGET_SINCE
