"""vLLM's CUDA-graph memory per release: which graphs are captured, and what their memory is.

Graph sizes and modes, per release family (read in the wheels of 0.7.3, 0.8.5, 0.9.2, 0.10.1.1,
0.11.0, 0.12.0, 0.14.0, 0.17.0, 0.20.0, 0.21.0 and 0.32.0: `config.py` / `config/vllm.py`
`_set_cudagraph_sizes`, `v1/cudagraph_dispatcher.py`):

- V0 (before 0.8, the planner's reading of those releases): one full graph per decode batch of 1, 2,
  4, then every 8 up to the first such size >= max_num_seqs.
- V1 0.8-0.9: PIECEWISE graphs only (the model split at every attention layer: num_layers + 1 graphs
  per size) for 1, 2, 4 and every 8 up to 512, kept to sizes <= max_num_batched_tokens.
- 0.10 (read in 0.10.1.1): the same up to min(2 x max_num_seqs, 512).
- 0.11: FULL_AND_PIECEWISE becomes the default mode: one FULL graph of the whole forward is added for
  each size up to max_num_seqs (uniform decode).
- 0.12: above 256 the sizes step by 16 (1, 2, 4, every 8 below 256, every 16 up to the top).
- 0.21: the top is also capped by max_num_batched_tokens, which is captured itself when it fits.
- 0.32: the top is 1024 on data-centre Blackwell (the releases between 0.21 and 0.32 were not read
  for this; the planner gives it to 0.32 and later).

The LMCache 3430 log ("PIECEWISE=51 (largest=512), FULL=35 (largest=256)" at 256 sequences and 8192
batched tokens) agrees.

Graph memory inside the KV budget: the profiling below exists since 0.18, off by default there and in
0.19 (`VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS` "0"), and is on by default since 0.20.0 (its envs.py
says "1"; the log line it prints says "default since v0.21.0"). Before, graphs are captured after the
KV cache is sized and only take the headroom.

Memory: since 0.20 vLLM measures it before sizing the KV cache (`profile_cudagraph_memory`): it
captures the two largest sizes of each mode into one pool, charges the first capture whole and the
second capture's increase of device memory in use for each further graph of the mode, and adds the
largest first capture to the per-graph terms of all modes. The two parts are:

- the pool: the private graph pool of the largest PIECEWISE size, where the widest piece (o_proj out,
  residual, gate/up out and the activated MLP width: 2h + 3 x intermediate per token, per GPU) lives
  at once; later sizes reuse it;
- per graph: the driver's memory for each instantiated CUDA graph, in 2 MiB steps.

Neither is in vLLM's source as a formula, so both were measured on the GPU machine (one H200, torch
2.11, CUDA driver 580): a Qwen3-8B-shaped stack (36 layers, h 4096, intermediate 12288, GQA 32/8 x
128, bf16) captured the way `profile_cudagraph_memory` captures (one pool, one side stream, largest
size first, PIECEWISE pieces split at attention, then FULL graphs; eager torch ops in the pieces,
not vLLM's compiled ones), with device memory in use read before and after each size. The pool took 140 MiB at 512 tokens (torch reserved); every further
PIECEWISE size took 6.0 MiB of driver memory (median and mean of 50 sizes, 2-10 MiB each, for 37
piece graphs) and every FULL size 2.5 MiB (mean of 35; 2-4 MiB each). With these the Qwen3-8B log's
0.52 GiB is met: 140 MiB + 51 x 6.0 MiB + 34 x 2.5 MiB = 0.52 GiB. vLLM's own figure rests on one
sample per mode, so a run of the same settings may log up to ~0.1 GiB either way (one 2 MiB step
more or less on the second PIECEWISE size, times 50 graphs). The rule charges the steady per-size
driver memory for every size: in the eager measurement the second size also grew the pool once (by
12 MiB, an 18 MiB sample), which vLLM's rule would have multiplied into 1.1 GiB; the log's 0.52 GiB
caps vLLM's own second sample at ~10 MiB, so its compiled pieces did not grow the pool there.
Tensor parallelism shrinks the pool (the MLP width per GPU); the NCCL / custom all-reduce nodes TP
adds to each captured graph were not measured.
"""

from __future__ import annotations

import math

from llmdeploy.memory.footprint import release
from llmdeploy.memory.plan_inputs import PlanInputs

MIB = 2**20
V1_SINCE = (0, 8, 0)
SEQS_CAP_SINCE = (0, 10, 0)  # top = min(2 x max_num_seqs, 512)
FULL_AND_PIECEWISE_SINCE = (0, 11, 0)
STRIDE_16_SINCE = (0, 12, 0)
BATCHED_TOKENS_CAPTURED_SINCE = (0, 21, 0)
BLACKWELL_1024_SINCE = (0, 32, 0)
GRAPHS_IN_BUDGET_SINCE = (0, 20, 0)  # VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS on by default
DEFAULT_MAX_CAPTURE_SIZE = 512
BLACKWELL_MAX_CAPTURE_SIZE = 1024  # data-centre Blackwell (compute capability 10.0)
V0_POSSIBLE_SIZES = (1, 2, 4, *range(8, 8193, 8))

# measured, see the module docstring: pool bytes per (2h + 3 x intermediate) element of the largest
# PIECEWISE size (140 MiB / (512 x 45,056))
POOL_BYTES_PER_ELEMENT = 140 * MIB / (512 * (2 * 4096 + 3 * 12288))
PIECE_GRAPH_BYTES = int(6.0 * MIB / 37)  # driver memory per PIECEWISE graph (one layer's piece)
FULL_GRAPH_LAYER_BYTES = int(2.5 * MIB / 36)  # driver memory per layer of one FULL graph

Release = tuple[int, int, int] | None


def _since(version: Release, first: tuple[int, int, int]) -> bool:
    return version is None or version >= first


def v0_capture_sizes(max_num_seqs: int) -> tuple[int, ...]:
    """V0's decode batches: up to the first possible size that holds max_num_seqs."""
    top = next((s for s in V0_POSSIBLE_SIZES if s >= max_num_seqs), V0_POSSIBLE_SIZES[-1])
    return tuple(s for s in V0_POSSIBLE_SIZES if s <= top)


def v1_capture_sizes(
    version: Release, max_num_seqs: int, max_num_batched_tokens: int, blackwell: bool = False
) -> tuple[int, ...]:
    """PIECEWISE capture sizes of a V1 release, ascending (no release: the newest family)."""
    ceiling = (
        BLACKWELL_MAX_CAPTURE_SIZE
        if blackwell and _since(version, BLACKWELL_1024_SINCE)
        else DEFAULT_MAX_CAPTURE_SIZE
    )
    top = min(2 * max_num_seqs, ceiling) if _since(version, SEQS_CAP_SINCE) else ceiling
    if _since(version, STRIDE_16_SINCE):
        grid = [1, 2, 4, *range(8, 256, 8), *range(256, top + 1, 16)]
    else:
        grid = [1, 2, 4, *range(8, top + 1, 8)]
    sizes = [s for s in grid if s <= min(top, max_num_batched_tokens)]
    fits = max_num_batched_tokens <= top and max_num_batched_tokens not in sizes
    if _since(version, BATCHED_TOKENS_CAPTURED_SINCE) and fits:
        sizes.append(max_num_batched_tokens)
    return tuple(sorted(sizes))


def full_decode_sizes(version: Release, sizes: tuple[int, ...], max_num_seqs: int) -> tuple[int, ...]:
    """FULL graphs of FULL_AND_PIECEWISE (0.11+): the capture sizes a batch of one-token decodes fills."""
    if not _since(version, FULL_AND_PIECEWISE_SINCE):
        return ()
    return tuple(s for s in sizes if s <= max_num_seqs)


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
    """What vLLM's graph profiling charges (0.20+) or its graphs take after the KV cache (earlier)."""
    if inputs.enforce_eager or inputs.device == "cpu":
        return 0
    layers = math.ceil(inputs.spec.num_layers / inputs.pipeline_parallel_size)
    version = release(inputs.engine_version)
    if not _since(version, V1_SINCE):
        v0 = v0_capture_sizes(max_num_seqs)
        return _pool_bytes(inputs, v0[-1]) + len(v0) * layers * FULL_GRAPH_LAYER_BYTES
    blackwell = inputs.gpu is not None and inputs.gpu.compute_capability == "10.0"
    sizes = v1_capture_sizes(version, max_num_seqs, max_num_batched_tokens, blackwell)
    full = full_decode_sizes(version, sizes, max_num_seqs)
    piecewise = len(sizes) * (layers + 1) * PIECE_GRAPH_BYTES
    further_full = max(0, len(full) - 1) * layers * FULL_GRAPH_LAYER_BYTES
    return _pool_bytes(inputs, sizes[-1]) + piecewise + further_full


def graphs_in_budget(engine_version: str | None) -> bool:
    """vLLM profiles CUDA graphs into the KV budget by default since 0.20; before, they took the headroom."""
    return _since(release(engine_version), GRAPHS_IN_BUDGET_SINCE)
