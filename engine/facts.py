"""Facts about the built-in engine that the toolkit needs too: the architectures and KV-cache dtypes it
runs, its default budgets, its context-length rule, its KV-cache sizing rule, its decode CUDA-graph
sizes and llmdeploy's cache folder. Each is written here once; the engine and the toolkit read it.

The engine's allocator calls these functions with measured values; the planner calls them with its
estimates, so the two can only differ in the inputs. Pure Python (no torch, pydantic or PyYAML), so
`llmdeploy` can import it without pulling the engine's dependencies; tests/engine_core/test_core_no_torch.py
holds it to that.
"""

from __future__ import annotations

import math
import os
from pathlib import Path


def cache_root() -> Path:
    """llmdeploy's cache on this machine (installed models, the engine's compiled CPU kernels):
    $LLMDEPLOY_CACHE_DIR, else the XDG cache's llmdeploy folder."""
    base = os.environ.get("LLMDEPLOY_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "llmdeploy"
    )
    return Path(base)


# seconds the server drains in-flight requests after SIGTERM before it answers the rest 503 and exits;
# a Kubernetes pod's terminationGracePeriodSeconds must cover it (the toolkit refuses less)
DRAIN_TIMEOUT_S = 30

# transformers class name -> the engine's architecture (engine/model/model.py); dense, full RoPE, gated MLP
ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}

# --kv-cache-dtype names (vLLM's: plain fp8 is e4m3) -> the format the cache stores (torch's name; the
# engine's kernels/kv_cache.py maps it to the torch dtype). "auto" stores the model's dtype. An fp8 cache
# also keeps one float32 scale per layer for K and for V, which the plan leaves out.
KV_CACHE_STORAGE = {
    "fp16": "float16",
    "bf16": "bfloat16",
    "fp8": "float8_e4m3fn",
    "fp8_e4m3": "float8_e4m3fn",
    "fp8_e5m2": "float8_e5m2",
}
KV_CACHE_DTYPES = ("auto", *KV_CACHE_STORAGE)  # the --kv-cache-dtype choices
_STORAGE_BYTES = {"float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1}
KV_CACHE_DTYPE_BYTES = {name: _STORAGE_BYTES[storage] for name, storage in KV_CACHE_STORAGE.items()}


def kv_cache_dtype_bytes(kv_cache_dtype: str, model_dtype_bytes: int) -> int:
    """Bytes per KV element: the named format's, or the model dtype's for auto."""
    if kv_cache_dtype == "auto":
        return model_dtype_bytes
    return KV_CACHE_DTYPE_BYTES[kv_cache_dtype]


# ---- default budgets (vLLM's defaults, which the engine keeps) ------------------------------------
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
DEFAULT_BLOCK_SIZE = 16  # tokens per KV block
DEFAULT_MAX_NUM_SEQS = 256
# the default token budget of a step: max_model_len, at least 2048 and at most 8192
MIN_DEFAULT_BATCHED_TOKENS = 2048
MAX_DEFAULT_BATCHED_TOKENS = 8192


def default_max_num_batched_tokens(max_model_len: int) -> int:
    """The step's token budget when max_num_batched_tokens is unset: max(max_model_len, 2048) capped at
    8192. The start-up profile runs one prefill of this many tokens, so it also sets the activation peak."""
    return min(max(max_model_len, MIN_DEFAULT_BATCHED_TOKENS), MAX_DEFAULT_BATCHED_TOKENS)


# bytes the engine stores per parameter of a quantized decoder projection (engine/kernels/quant_linear.py):
# int4 codes, plus per group of 128 inputs a scale and a zero point, both in the model dtype in the
# tinygemm layout CUDA GPUs hold them in (int4_tinygemm.py; added in weights_bytes); fp8 one byte (a
# float32 scale per output row is negligible)
INT4_GROUP_SIZE = 128
STORED_BYTES_PER_LINEAR_PARAM = {"awq": 0.5, "gptq": 0.5, "fp8": 1.0}


def weights_bytes(num_params: int, num_linear_params: int, dtype_bytes: int, quantization: str) -> int:
    """Weight bytes as the engine holds them (all ranks together): the decoder projections
    (num_linear_params) stored quantized for awq / gptq / fp8, everything else, and every weight of a
    dense or GGUF checkpoint (dequantized at load on CUDA; on the CPU see compact_gguf_weights_bytes),
    in the model dtype."""
    per_param = STORED_BYTES_PER_LINEAR_PARAM.get(quantization)
    if per_param is None:
        return num_params * dtype_bytes
    if quantization in ("awq", "gptq"):
        per_param += 2 * dtype_bytes / INT4_GROUP_SIZE
    return math.ceil(num_linear_params * per_param) + (num_params - num_linear_params) * dtype_bytes


# On the CPU the engine keeps a GGUF file's weights compact (engine/loading/gguf_compact.py, --cpu-weights
# auto at tensor_parallel_size 1): bytes per weight of each storage it picks
GGUF_DENSE_TYPES = ("F32", "F16", "BF16")
GGUF_INT4_TYPES = ("Q4_0", "Q4_1", "Q4_K")
INT4PACK_BYTES = 0.5 + 4 / 32  # codes, plus a 16-bit scale and zero per group of 32
FP16PACK_BYTES = 2
Q8_ROWS_BYTES = 1 + 2 / 32  # int8 codes, plus a float16 scale per 32
# GGUF tensor name suffix -> the engine's merged projection it is stacked into
_MERGED = {
    "attn_q.weight": "qkv",
    "attn_k.weight": "qkv",
    "attn_v.weight": "qkv",
    "attn_output.weight": "o",
    "ffn_gate.weight": "gate_up",
    "ffn_up.weight": "gate_up",
    "ffn_down.weight": "down",
}


def compact_gguf_weights_bytes(
    tensors: list[tuple[str, tuple[int, ...], str]], dtype_bytes: int = 4, dot_kernels: bool = True
) -> int:
    """Weight bytes the CPU engine holds for a GGUF file kept compact, from its tensor table
    (name, GGUF shape [in, out, ...], type): each merged projection as 4-bit codes when all its parts
    are 4-bit types (inputs a multiple of 32, outputs of 16); else, with the integer dot-product
    kernels (dot_kernels: they build on x86-64 with AVX2 and a C compiler), as int8 rows when all its
    parts are Q8_0; else as fp16; dense projections and the other tensors (norms, biases) in the
    compute dtype; the embedding as int8 rows for Q8_0, else fp16 (dense: compute dtype); the LM head
    like a projection, except that a tied Q8_0 head shares the embedding's rows with the kernels."""
    groups: dict[str, list[tuple[tuple[int, ...], str]]] = {}
    total = 0
    embed: tuple[tuple[int, ...], str] | None = None
    head: tuple[tuple[int, ...], str] | None = None
    for name, shape, kind in tensors:
        if name == "rope_freqs.weight":
            continue  # read into the config, not a weight
        if name == "token_embd.weight":
            embed = (shape, kind)
        elif name == "output.weight":
            head = (shape, kind)
        elif name.startswith("blk.") and name.split(".", 2)[2] in _MERGED:
            layer, suffix = name.split(".", 2)[1:]
            groups.setdefault(f"{layer}.{_MERGED[suffix]}", []).append((shape, kind))
        else:
            total += math.prod(shape) * dtype_bytes
    assert embed is not None, "a GGUF model without token_embd.weight"
    for parts in [*groups.values(), [head or embed]]:
        kinds = {kind for _, kind in parts}
        params = sum(math.prod(shape) for shape, _ in parts)
        if kinds <= set(GGUF_DENSE_TYPES):
            total += params * dtype_bytes
        elif (
            kinds <= set(GGUF_INT4_TYPES)
            and all(shape[0] % 32 == 0 for shape, _ in parts)
            and sum(shape[1] for shape, _ in parts) % 16 == 0
        ):
            total += math.ceil(params * INT4PACK_BYTES)
        elif dot_kernels and kinds == {"Q8_0"} and all(shape[0] % 32 == 0 for shape, _ in parts):
            total += 0 if head is None and parts[0] is embed else math.ceil(params * Q8_ROWS_BYTES)
        else:
            total += params * FP16PACK_BYTES
    shape, kind = embed
    per = dtype_bytes if kind in GGUF_DENSE_TYPES else Q8_ROWS_BYTES if kind == "Q8_0" else FP16PACK_BYTES
    return total + math.ceil(math.prod(shape) * per)


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, kv_dtype_bytes: int) -> int:
    """2 (K and V) x layers x KV heads (per GPU) x head dim x bytes."""
    assert min(num_layers, num_kv_heads, head_dim, kv_dtype_bytes) > 0
    return 2 * num_layers * num_kv_heads * head_dim * kv_dtype_bytes


def kv_cache_bytes(
    total_memory_bytes: int,
    gpu_memory_utilization: float,
    weights_bytes: int,
    peak_activation_bytes: int,
    non_torch_bytes: int,
    cuda_graph_bytes: int = 0,
    kv_cache_memory_bytes: int | None = None,
) -> int:
    """An explicit `kv_cache_memory_bytes` wins; else total x utilization minus everything else.
    May be negative: the caller reports that as "does not fit"."""
    if kv_cache_memory_bytes is not None:
        return int(kv_cache_memory_bytes)
    usable = int(total_memory_bytes * gpu_memory_utilization)
    return usable - weights_bytes - peak_activation_bytes - non_torch_bytes - cuda_graph_bytes


def num_kv_blocks(kv_cache_bytes: int, kv_bytes_per_token: int, block_size: int) -> int:
    """Whole blocks only (floor); never negative."""
    assert kv_bytes_per_token > 0 and block_size > 0
    return max(0, kv_cache_bytes // (kv_bytes_per_token * block_size))


def max_concurrency(num_kv_blocks: int, block_size: int, max_model_len: int) -> float:
    """How many requests of max_model_len tokens fit at once: blocks / ceil(len / block_size)."""
    blocks_per_request = -(-max_model_len // block_size)
    return num_kv_blocks / blocks_per_request


# ---- context length (vLLM's rule) ------------------------------------------------------------------
# vLLM derives an unset max_model_len from the model's config and refuses to start when the KV cache
# cannot hold one request of that length, naming the longest one it could hold
# (v1/core/kv_cache_utils.py, check_enough_kv_cache_memory); `--max-model-len auto` (stored as -1)
# starts with that longest length instead, never past the model's own (_auto_fit_max_model_len).
# The engine follows both. "Holds one request" is max_concurrency >= 1, which the planner's verdict
# (llmdeploy/engines/plan_assembly.py) reads too, so a plan that says "fits" is an engine that starts.
AUTO_MAX_MODEL_LEN = -1


def requested_context_len(max_model_len: int | None, model_max_len: int) -> int:
    """The context the engine sizes its start-up for (activation profile, CUDA graphs, step budget) and
    the planner plans: max_model_len when set, else (unset or auto) the model's own."""
    if max_model_len is None or max_model_len == AUTO_MAX_MODEL_LEN:
        return model_max_len
    return max_model_len


def longest_context(num_kv_blocks: int, block_size: int, model_max_len: int) -> int:
    """The longest request the KV cache holds, never past the model's context."""
    return min(num_kv_blocks * block_size, model_max_len)


def context_problem(
    max_model_len: int | None, model_max_len: int, num_kv_blocks: int, block_size: int
) -> str | None:
    """Why the engine refuses to start with this context, or None: an unset or explicit length must
    fit in the KV cache whole (one request at max_concurrency >= 1); auto needs one block."""
    if max_model_len == AUTO_MAX_MODEL_LEN:
        return None if num_kv_blocks > 0 else "max_model_len auto: the KV cache holds no block"
    length = requested_context_len(max_model_len, model_max_len)
    if max_concurrency(num_kv_blocks, block_size, length) >= 1:
        return None
    which = (
        f"max_model_len {length}"
        if max_model_len is not None
        else (f"the model's context of {length} tokens (max_model_len unset)")
    )
    return (
        f"{which} needs more KV cache than is available ({num_kv_blocks * block_size} tokens); the "
        f"longest context it holds is {longest_context(num_kv_blocks, block_size, model_max_len)}: set "
        "max_model_len to at most that (or auto), or raise gpu_memory_utilization / kv_cache_memory_bytes"
    )


def max_model_len_for(
    max_model_len: int | None, model_max_len: int, num_kv_blocks: int, block_size: int
) -> int:
    """The context the engine serves: the requested (or the model's) length, or for auto the longest
    one the KV cache holds. ValueError with context_problem's reason when it refuses."""
    problem = context_problem(max_model_len, model_max_len, num_kv_blocks, block_size)
    if problem is not None:
        raise ValueError(problem)
    if max_model_len == AUTO_MAX_MODEL_LEN:
        return longest_context(num_kv_blocks, block_size, model_max_len)
    return requested_context_len(max_model_len, model_max_len)


# ---- activation peak (the start-up profile, CUDA) -----------------------------------------------
# The engine profiles one prefill step of max_num_batched_tokens tokens through the path the server
# runs (engine/runner/startup.py `profile_memory`): paged K/V and the varlen attention kernel, which
# keeps no scores, so the peak is linear in the tokens. It comes in the MLP of a layer, while the
# down projection writes its output: the residual stream and the previous layer's output (2 hidden,
# held by the layer loop), the attention output and the summed residual (2 hidden), gate/up
# (2 intermediate), SiLU(gate) * up (1 intermediate) and the output (1 hidden); in the attention half
# the same stream with q/k/v, the rotated q and k and the attention output (4 hidden + 3 q + 3 kv),
# whichever is wider. Then the logits of up to max_num_seqs rows (16-bit, then float32).
PROFILE_FIXED_BYTES = 64 * 2**20  # cuBLAS workspace first allocated in the profile step, rope tables


def prefill_activation_bytes(
    *,
    num_tokens: int,
    logit_rows: int,
    hidden_size: int,
    intermediate_size: int,
    q_size: int,
    kv_size: int,
    vocab_size: int,
    dtype_bytes: int,
    quantization_temp_bytes: int = 0,
) -> int:
    """Peak activation bytes of the engine's profile step of num_tokens tokens (per GPU: sizes of this
    rank's shards). quantization_temp_bytes: what quantized weights add to the widest point, 0 for
    16-bit weights (see llmdeploy/engines/builtin.py)."""
    mlp = 5 * hidden_size + 3 * intermediate_size
    attention = 4 * hidden_size + 3 * q_size + 3 * kv_size
    layer = num_tokens * max(mlp, attention) * dtype_bytes + quantization_temp_bytes
    logits = num_tokens * hidden_size * dtype_bytes + logit_rows * vocab_size * (4 + dtype_bytes)
    return max(layer, logits) + PROFILE_FIXED_BYTES


# ---- CUDA graphs (decode steps) ------------------------------------------------------------------
# The engine captures one graph per (batch size, context bucket) at start-up, after the KV cache is
# allocated (the graphs hold its addresses), so their memory must be set aside before the KV cache is
# sized. These functions are what the engine captures and reserves; the planner shows the same term.

# 1, 2, 4, then every 8 up to 64 and every 16 up to 256: a batch replays the smallest graph that holds
# it, so the padding rows are at most 16 (powers of two padded 129 sequences to 256: the GEMMs of a
# large batch cost in proportion to their rows)
CUDA_GRAPH_BATCH_SIZES = (1, 2, 4, *range(8, 64, 8), *range(64, 257, 16))
CUDA_GRAPH_LOGITS_MAX_BATCH = 64  # graphs of up to this many rows compute the logits inside the graph
CUDA_GRAPH_FIXED_BYTES = 256 * 2**20  # cuBLAS workspace of the capture stream, graph objects, rounding


def cuda_graph_batch_sizes(max_num_seqs: int) -> tuple[int, ...]:
    """Captured batch sizes: CUDA_GRAPH_BATCH_SIZES up to max_num_seqs, and max_num_seqs itself (up to
    256) when the list skips it, so every batch the scheduler may form up to 256 has a graph."""
    top = max(1, min(max_num_seqs, CUDA_GRAPH_BATCH_SIZES[-1]))
    sizes = tuple(b for b in CUDA_GRAPH_BATCH_SIZES if b <= top)
    return sizes if sizes[-1] == top else (*sizes, top)


def cuda_graph_context_buckets(max_model_len: int, block_size: int) -> tuple[int, ...]:
    """Captured context sizes in KV blocks: 8, 16, 32, ... with the last one covering max_model_len."""
    top = -(-max_model_len // block_size)
    buckets = [8]
    while buckets[-1] < top:
        buckets.append(buckets[-1] * 2)
    if top > 8:
        buckets[-1] = top
    return tuple(buckets)


def cuda_graph_bytes(
    *,
    max_num_seqs: int,
    max_model_len: int,
    block_size: int,
    hidden_size: int,
    intermediate_size: int,
    q_size: int,
    kv_size: int,
    vocab_size: int,
    dtype_bytes: int,
    gathered_kv: bool,
) -> int:
    """Device memory the decode graphs take: their shared pool holds the largest graph's step.

    - activations of one decode step at the largest batch B, all of a layer's tensors at once
      (hidden states, q/k/v, attention output, gate/up/act, down; float32 norm temporaries):
      B x (5 hidden + 2 q + 2 kv + 3 intermediate) x dtype + B x 2 hidden x 4;
    - with the pure-torch decode attention (`gathered_kv`: no Triton kernel, e.g. float32), the K and
      V copies gathered over the largest context bucket: 2 x B x bucket tokens x kv size x dtype
      (Llama-3.1-8B, 256 x 2048 tokens: 2.0 GiB; measured 1.97 GiB in all);
    - the logits computed inside graphs of up to 64 rows: one shared float32 output plus the capture's
      16-bit and float32 temporaries, min(B, 64) x vocab x (8 + dtype);
    - a fixed 256 MiB (cuBLAS workspace of the capture stream, graph objects, allocator rounding).
    Measured before this rule: 45 graphs took 1.32 GiB (Qwen2.5-0.5B, gathered
    attention: 0.27 GiB of copies), 1.97 GiB (Llama-3.1-8B, gathered: 2.0 GiB by this rule) and
    1.01 GiB (Llama-3.1-8B, Triton kernel). The ~1 GiB those leave unexplained came from warming each
    graph up on its own new CUDA stream (a cuBLAS workspace and a block cache per stream); the runner
    now uses one warm-up stream, and reports the measured figure next to this reservation.
    """
    batch = max(cuda_graph_batch_sizes(max_num_seqs))
    bucket_tokens = max(cuda_graph_context_buckets(max_model_len, block_size)) * block_size
    activations = batch * (5 * hidden_size + 2 * q_size + 2 * kv_size + 3 * intermediate_size) * dtype_bytes
    activations += batch * 2 * hidden_size * 4
    gathered = 2 * batch * bucket_tokens * kv_size * dtype_bytes if gathered_kv else 0
    logits = min(batch, CUDA_GRAPH_LOGITS_MAX_BATCH) * vocab_size * (8 + dtype_bytes)
    return activations + gathered + logits + CUDA_GRAPH_FIXED_BYTES
