"""Per-GPU memory estimates for one model under one set of knobs: weights, activation peak,
non-torch memory and TGI's CUDA graphs (vLLM's: `cuda_graphs`; the KV layout is `kv_layout`).

The constants marked "calibrated" were fitted on the public vLLM start-up logs in
llmdeploy/planner/vllm_logs.json (see docs/planner.md); everything else is arithmetic on the
architecture.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llmdeploy.catalog.model_spec import ModelSpec
from llmdeploy.memory import sampler_peak
from llmdeploy.memory.plan_inputs import PlanInputs

GIB = 2**30

# bits stored per parameter of a quantized linear layer (weights + group scales/zeros)
LINEAR_BITS = {
    "fp8": 8.0,
    "int8": 8.0,
    "awq": 4.0 + 20 / 128,  # 4-bit weights, fp16 scale + 4-bit zero per group of 128
    "gptq": 4.0 + 20 / 128,
    "int4": 4.0 + 20 / 128,
    "bitsandbytes": 4.0 + 8.5 / 64,  # nf4, double-quantized absmax per 64
    "gguf": 4.5,  # used only when the file's own size is unknown (Q4_K_M-ish)
    "mxfp4": 4.25,  # 4-bit values + one e8m0 scale per 32
}

# calibrated: live activation bytes per token per (2h + MLP width) element in the profile run
ACTIVATION_FACTOR = 1.1
# calibrated: bytes per vocab entry per sequence in V0's sampler warm-up (vLLM before 0.8, and TGI):
# ~40 in the Llama-3-8B V0 log (256 rows x 128,256 -> 1.26 GiB). V1 (0.8 and later, vLLM's default
# engine) is derived per release in `sampler_peak`.
SAMPLER_BYTES_PER_LOGIT = 40
V1_SAMPLER_SINCE = (0, 8, 0)
# streaming multiprocessors for the Triton top-k/top-p scratch (one vocab row each, at most);
# H100/H200 have 132, A100 108: a few MiB either way
DEFAULT_NUM_SMS = 132
CUDA_CONTEXT_GIB = 0.5  # outside vLLM's accounting, but it occupies the GPU
# vLLM's unquantized fused-MoE (TritonExperts through FusedMoEModularKernel) takes its intermediate
# caches from one workspace shared by every MoE layer and kept after the forward (WorkspaceManager):
# since 0.14 (0.11-0.12 allocate them per call; 0.13 not read); 0.14-0.18 size it for chunks of
# VLLM_FUSED_MOE_CHUNK_SIZE tokens, 0.19 and later for the whole batch
MOE_WORKSPACE_SINCE = (0, 14, 0)
MOE_UNCHUNKED_SINCE = (0, 19, 0)
MOE_CHUNK_TOKENS = 16 * 1024
WORKSPACE_ALIGN_BYTES = 256


@dataclass(frozen=True)
class NonTorchRule:
    """vLLM's "non-torch" memory (GPU memory in use that torch's allocator does not hold: cuBLAS
    workspaces, NCCL and custom all-reduce buffers) for one family of releases that measure it the
    same way. Each figure is the median of the non-torch lines logged by the releases of the family
    (llmdeploy/planner/vllm_logs.json, "non_torch_observations"; tests check the medians)."""

    since: tuple[int, int, int]  # first vLLM release of the family
    single_gpu_gib: float
    multi_gpu_gib: float  # TP/PP > 1 (NCCL, custom all-reduce)
    accounting: str
    fitted_on: tuple[str, ...]  # observation ids in the fixtures


NON_TORCH_RULES = (
    NonTorchRule(
        (0, 0, 0),
        0.35,
        3.58,
        "before 0.7: device memory in use minus torch's *allocated* bytes, so blocks the caching "
        "allocator keeps after the profile run count as non-torch (varies with the run; rough)",
        (
            "vllm-pr-10511-llama3-8b-h100-tp1",
            "vllm-pr-10511-llama3-8b-h100-tp2",
            "vllm-issue-10517-llama31-8b-3090-20k",
            "vllm-issue-10517-llama31-8b-3090-29k",
        ),
    ),
    NonTorchRule(
        (0, 7, 0),
        0.08,
        0.25,
        "0.7 and later (V0 and V1): the increase of device memory in use minus torch's *reserved* "
        "bytes, measured from a snapshot taken after the CUDA context exists",
        (
            "vllm-pr-12126-llama32-11b-vision-h100",
            "vllm-issue-12330-llama3-8b-a100-40gb",
            "vllm-issue-17327-qwen3-30b-a3b-w4a16-3090",
            "vllm-issue-13882-qwen25-7b-int4-4060",
            "vllm-issue-13061-r1-distill-qwen-14b-2x4090-tp2",
            "vllm-issue-16570-qwen25-vl-72b-4xa100-40gb-tp4",
            "vllm-issue-50722-qwen35-35b-a3b-h100-tp",
            "vllm-pr-14447-moe-wna16-3090-multi-gpu",
            "vllm-issue-15815-qwen25-32b-2xl40s-tp2",
        ),
    ),
)
# engines without their own measured figure (TGI): the earlier single constant, + NCCL with TP/PP
OTHER_ENGINE_NON_TORCH_GIB = 0.15
OTHER_ENGINE_NON_TORCH_PARALLEL_GIB = 0.1


def release(text: str | None) -> tuple[int, int, int] | None:
    """'0.8.5', 'v0.10.1.dev3', '0.6.x', '>=0.21' -> (major, minor, patch); None when not given."""
    if not text:
        return None
    parts = [
        int("".join(ch for ch in piece if ch.isdigit()) or 0) for piece in text.lstrip(">=v ").split(".")[:3]
    ]
    parts += [0] * (3 - len(parts))
    return parts[0], parts[1], parts[2]


def non_torch_rule(engine_version: str | None) -> NonTorchRule:
    """The family of the given vLLM release (the newest family when no release is given)."""
    version = release(engine_version)
    rules = [r for r in NON_TORCH_RULES if version is None or version >= r.since]
    return rules[-1]


def expert_matrix_params(spec: ModelSpec) -> int:
    if not spec.is_moe:
        return 0
    per_expert = (3 if spec.mlp_gated else 2) * spec.hidden_size * spec.moe_intermediate_size
    return spec.num_moe_layers * spec.num_experts * per_expert


def vllm_mxfp4_marlin(inputs: PlanInputs) -> bool:
    """vLLM runs MXFP4 MoE experts with its Marlin kernels on GPUs before Hopper (compute capability
    < 9), and on Hopper when the triton_kernels package is missing, as with the 0.10 and 0.11 wheels
    (v0.11.0 quantization/mxfp4.py `get_mxfp4_backend`; the 0.10.1 gpt-oss-120b H100 log loads the
    Marlin-sized 65.97 GiB). Later Hopper releases: the 256-padded layout of the other backends."""
    if inputs.gpu is None:
        return False
    major = int(inputs.gpu.compute_capability.split(".")[0])
    version = release(inputs.engine_version)
    return major < 9 or (major == 9 and version is not None and version < (0, 12, 0))


def _mxfp4_expert_bytes(spec: ModelSpec, tp: int, marlin: bool) -> int:
    """MXFP4 expert weights as vLLM allocates them (fused_moe/oracle/mxfp4.py
    `mxfp4_round_up_hidden_size_and_intermediate_size`): Marlin pads the per-GPU intermediate size to
    a multiple of 128 and the hidden size to 256; the other CUDA backends the intermediate size to
    256 (gpt-oss: 2880 -> 3072 x 2944 under Marlin, 2880 x 3072 otherwise). All GPUs together."""
    inter = -(-(spec.moe_intermediate_size // tp) // (128 if marlin else 256)) * (128 if marlin else 256)
    hidden = -(-spec.hidden_size // 256) * 256 if marlin else spec.hidden_size
    per_expert = (3 if spec.mlp_gated else 2) * hidden * inter
    return math.ceil(tp * spec.num_moe_layers * spec.num_experts * per_expert * LINEAR_BITS["mxfp4"] / 8)


def weights_bytes_total(
    spec: ModelSpec, quantization: str, dtype_bytes: int, tp: int = 1, mxfp4_marlin: bool = False
) -> int:
    """The whole checkpoint as loaded (all GPUs together)."""
    p = spec.params
    if (quantization == "gguf" or spec.source == "gguf") and spec.weights_bytes_on_disk:
        return spec.weights_bytes_on_disk
    bits = LINEAR_BITS.get(quantization)
    rest = p.total - p.linear
    if bits is None and spec.torch_dtype == "mxfp4":  # gpt-oss ships MoE experts in MXFP4
        experts = expert_matrix_params(spec)
        return _mxfp4_expert_bytes(spec, tp, mxfp4_marlin) + (p.total - experts) * dtype_bytes
    if bits is None and spec.torch_dtype.startswith("float8"):  # DeepSeek-V3 ships fp8 blocks
        bits = LINEAR_BITS["fp8"]
    if bits is None:
        return p.total * dtype_bytes
    return math.ceil(p.linear * bits / 8) + rest * dtype_bytes


def weights_bytes_per_gpu(inputs: PlanInputs, mxfp4_marlin: bool = False) -> int:
    """Tensor parallelism shards every matrix and the (vocab-parallel) embedding and head; pipeline
    parallelism splits the layers, and the heaviest stage (embedding or head on it) counts. A draft
    model for speculative decoding is loaded next to the target (same TP). `mxfp4_marlin`: MXFP4
    experts in the Marlin layout (`vllm_mxfp4_marlin`)."""
    draft = 0
    if inputs.draft is not None:
        draft = math.ceil(inputs.draft.num_params * inputs.model_dtype_bytes / inputs.tensor_parallel_size)
    return draft + _target_weights_per_gpu(inputs, mxfp4_marlin)


def _target_weights_per_gpu(inputs: PlanInputs, mxfp4_marlin: bool) -> int:
    spec, tp, pp = inputs.spec, inputs.tensor_parallel_size, inputs.pipeline_parallel_size
    total = weights_bytes_total(
        spec, inputs.effective_quantization, inputs.model_dtype_bytes, tp, mxfp4_marlin
    )
    if pp == 1 or spec.num_layers == 0:
        return math.ceil(total / tp)
    p = spec.params
    ends_bytes = (p.embedding + p.head) * inputs.model_dtype_bytes
    stage_ends = max(p.embedding, p.head) * inputs.model_dtype_bytes
    layer_share = math.ceil(spec.num_layers / pp) / spec.num_layers
    return math.ceil((stage_ends + (total - ends_bytes) * layer_share) / tp)


# PyTorch's CUDA caching allocator (default, non-expandable segments): a request of 10 MiB or more
# gets a segment of its own, rounded up to 2 MiB, and a remainder of at most 1 MiB is not split off,
# so it counts as allocated. vLLM's "model loading took" is torch's allocated bytes, so a weight
# matrix of 35 MiB reports 36 MiB (Qwen2.5-32B at TP 2: three such matrices per layer, +0.19 GiB).
MIB = 2**20
ALLOC_ROUND_BYTES = 2 * MIB
ALLOC_OWN_SEGMENT_BYTES = 10 * MIB
ALLOC_SPLIT_MIN_BYTES = MIB


# vLLM loads the weights under `max_split_size_mb:20` (v1/worker/gpu_worker.py `load_model` ->
# `_scoped_allocator_max_split`, read in the 0.21.0, 0.22.0, 0.24.0, 0.27.1, 0.28.0 and 0.32.0
# wheels; not in 0.20.0's): the allocator never splits a block for a request of max_split_size or more, so a
# weight of 20 MiB or more books its whole 2 MiB-rounded segment (Qwen2.5-7B's 24.5 MiB o_proj: 26 MiB,
# +1.5 MiB a layer, the 0.04 GiB the 0.28 field report's "model loading took" shows over the old rule).
LOAD_MAX_SPLIT_BYTES = 20 * MIB
LOAD_MAX_SPLIT_SINCE = (0, 21, 0)


def allocated_bytes(nbytes: int, max_split_bytes: int | None = None) -> int:
    """What torch's caching allocator books for one fresh request of `nbytes` (`max_split_bytes`:
    the allocator's max_split_size, under which requests at or above it are never split)."""
    nbytes = -(-nbytes // 512) * 512
    if nbytes < ALLOC_OWN_SEGMENT_BYTES:
        return nbytes  # carved from a shared 2 / 20 MiB buffer, remainder split off
    segment = -(-nbytes // ALLOC_ROUND_BYTES) * ALLOC_ROUND_BYTES
    if max_split_bytes is not None and nbytes >= max_split_bytes:
        return segment
    return segment if segment - nbytes <= ALLOC_SPLIT_MIN_BYTES else nbytes


def _matrix_shapes_per_gpu(inputs: PlanInputs) -> list[tuple[int, int]]:
    """(count, bytes) of the 16-bit weight matrices vLLM allocates on one GPU (merged QKV and
    gate/up projections, vocab-parallel embedding and head padded to 64 rows)."""
    spec, tp, dt = inputs.spec, inputs.tensor_parallel_size, inputs.model_dtype_bytes
    h, hd = spec.hidden_size, spec.head_dim
    layers = math.ceil(spec.num_layers / inputs.pipeline_parallel_size)
    q = spec.num_attention_heads * hd // tp
    kv = max(1, spec.num_kv_heads // tp) * hd
    out = [(layers, (q + 2 * kv) * h * dt), (layers, q * h * dt)]
    up = 2 if spec.mlp_gated else 1
    moe_layers = math.ceil(spec.num_moe_layers / inputs.pipeline_parallel_size)
    dense_layers = layers - moe_layers
    if dense_layers:
        inter = spec.intermediate_size // tp
        out += [(dense_layers, up * inter * h * dt), (dense_layers, inter * h * dt)]
    if spec.is_moe:
        inter = spec.moe_intermediate_size // tp
        out += [
            (moe_layers, spec.num_experts * up * inter * h * dt),
            (moe_layers, spec.num_experts * inter * h * dt),
        ]
    vocab = -(-spec.vocab_size // 64) * 64 // tp
    out.append((1 if spec.tie_word_embeddings else 2, vocab * h * dt))
    return out


def rotary_cache_positions(spec: ModelSpec) -> list[int]:
    """Positions of each distinct cos/sin cache vLLM builds (model_executor/layers/rotary_embedding,
    one cache per distinct rope, shared by all layers): YaRN caches original positions x factor,
    linear scaling max positions x factor, LongRoPE its short and long caches back to back (original
    + max positions), the others max positions; Gemma 3 adds its local (sliding-layer) rope."""
    rs = dict(spec.rope_scaling or {})
    kind = str(rs.get("rope_type") or rs.get("type") or "default")
    base = spec.max_position_embeddings
    factor = float(rs.get("factor") or 1.0)
    original = int(rs.get("original_max_position_embeddings") or base)
    if kind in ("yarn", "deepseek_yarn") and "original_max_position_embeddings" in rs:
        positions = int(original * factor)
    elif kind == "linear":
        positions = int(base * factor)
    elif kind == "longrope":
        positions = original + base
    else:
        positions = base
    caches = [positions]
    if spec.architecture.startswith("Gemma3"):
        caches.append(base)  # rope_local_base_freq, unscaled
    return caches


def vllm_load_overhead_bytes(inputs: PlanInputs) -> int:
    """What vLLM's "model loading took" counts beyond the parameters, per GPU: the rotary cos/sin
    cache (positions x rotary dim in the model dtype, `rotary_cache_positions`: 32 MiB for Llama-3.1's
    131,072 positions) and the allocator's rounding of 16-bit weight matrices (`allocated_bytes`; not
    modelled for quantized, MLA or GGUF checkpoints, whose tensor layouts differ)."""
    spec = inputs.spec
    rotary = spec.qk_rope_head_dim if spec.is_mla else int(spec.head_dim * spec.partial_rotary_factor)
    rope = sum(rotary_cache_positions(spec)) * rotary * inputs.model_dtype_bytes
    plain = (
        inputs.device == "cuda"  # the rounding is the CUDA caching allocator's
        and inputs.effective_quantization == "none"
        and not spec.is_mla
        and spec.source != "gguf"
        and spec.torch_dtype in ("bfloat16", "float16", "float32")
    )
    version = release(inputs.engine_version)
    scoped = version is None or version >= LOAD_MAX_SPLIT_SINCE
    split = LOAD_MAX_SPLIT_BYTES if scoped else None
    shapes = _matrix_shapes_per_gpu(inputs)
    rounding = sum(n * (allocated_bytes(b, split) - b) for n, b in shapes) if plain else 0
    return rope + rounding


def moe_workspace_bytes(inputs: PlanInputs, num_batched_tokens: int) -> int:
    """The persistent fused-MoE workspace of vLLM >= 0.14 for an unquantized MoE model (0 otherwise),
    from TritonExperts.workspace_shapes and FusedMoEModularKernel._allocate_buffers: with M tokens
    per chunk, N = the merged gate/up width per GPU, K = hidden size, two buffers of M x top-k x
    max(N/2, K) (intermediate caches 2, shared with the M_full x K output) and M x top-k x max(N, K)
    (caches 1 and 3), each rounded to 256 bytes."""
    spec = inputs.spec
    version = release(inputs.engine_version)
    if (
        inputs.device != "cuda"
        or not spec.is_moe
        or inputs.effective_quantization != "none"
        or spec.torch_dtype == "mxfp4"  # gpt-oss' experts take the MXFP4 kernels instead
        or (version is not None and version < MOE_WORKSPACE_SINCE)
    ):
        return 0
    n = (2 if spec.mlp_gated else 1) * spec.moe_intermediate_size // inputs.tensor_parallel_size
    k, topk, act = spec.hidden_size, spec.num_experts_per_tok, inputs.model_dtype_bytes
    unchunked = version is None or version >= MOE_UNCHUNKED_SINCE
    m = num_batched_tokens if unchunked else min(num_batched_tokens, MOE_CHUNK_TOKENS)
    cache2 = m * topk * max(n // 2 if spec.mlp_gated else n, k)
    out = num_batched_tokens * k
    if unchunked:
        buffers = [max(cache2, out), m * topk * max(n, k)]
    elif m == num_batched_tokens and cache2 >= out:  # one chunk: the output reuses the cache-2 buffer
        buffers = [cache2, m * topk * max(n, k)]
    else:
        buffers = [cache2, m * topk * max(n, k), out]
    return sum(-(-b * act // WORKSPACE_ALIGN_BYTES) * WORKSPACE_ALIGN_BYTES for b in buffers)


def activation_bytes(
    inputs: PlanInputs,
    num_batched_tokens: int,
    num_seqs: int,
    sampler_stage: bool = True,
    *,
    moe_workspace: bool = False,
    v1_sampler: bool = False,
) -> int:
    """Peak of the profiling pass: the widest per-token tensors of one layer for `num_batched_tokens`
    tokens, or the sampler warm-up on `num_seqs` rows of logits (`sampler_peak` for vLLM V1, per
    release, with `v1_sampler`), whichever is larger (`sampler_stage` False: a pipeline stage before
    the last, where vLLM's profile_run skips the sampler warm-up); plus, with `moe_workspace`, vLLM's
    persistent fused-MoE workspace where it has one (`moe_workspace_bytes`: the MoE intermediates
    live there, and it stays through the sampler run)."""
    spec, tp = inputs.spec, inputs.tensor_parallel_size
    act = inputs.model_dtype_bytes
    h = spec.hidden_size
    workspace = moe_workspace_bytes(inputs, num_batched_tokens) if moe_workspace else 0
    if workspace:
        mlp = 3 * spec.intermediate_size // tp if spec.num_moe_layers < spec.num_layers else 0
        if spec.shared_expert_intermediate_size:
            mlp = max(mlp, 3 * spec.shared_expert_intermediate_size // tp)
    elif spec.is_moe:
        mlp = spec.num_experts_per_tok * (3 * spec.moe_intermediate_size // tp + h)
        mlp = max(mlp, 3 * spec.intermediate_size // tp) if spec.num_moe_layers < spec.num_layers else mlp
    else:
        mlp = 3 * spec.intermediate_size // tp
    q = spec.num_attention_heads * spec.head_dim // tp
    attention = 2 * q + 2 * max(1, spec.num_kv_heads // tp) * spec.head_dim
    forward = num_batched_tokens * (2 * h + max(mlp, attention)) * act * ACTIVATION_FACTOR
    if not sampler_stage:
        return int(forward) + workspace
    version = release(inputs.engine_version)
    if v1_sampler and (version is None or version >= V1_SAMPLER_SINCE):
        logits = sampler_peak.sampler_peak_bytes(
            version, num_seqs, spec.vocab_size, act, inputs.flashinfer_sampler, num_sms=DEFAULT_NUM_SMS
        )
    else:
        logits = num_seqs * spec.vocab_size * SAMPLER_BYTES_PER_LOGIT
    # the dummy forward's hidden states of all batched tokens stay live through the sampler run
    sampler = logits + num_batched_tokens * h * act
    return int(max(forward, sampler)) + workspace


def vllm_non_torch_bytes(inputs: PlanInputs) -> int:
    """Non-torch memory inside vLLM's budget: its per-release figure (`NON_TORCH_RULES`)."""
    parallel = inputs.tensor_parallel_size * inputs.pipeline_parallel_size > 1
    rule = non_torch_rule(inputs.engine_version)
    return int((rule.multi_gpu_gib if parallel else rule.single_gpu_gib) * GIB)


def fixed_non_torch_bytes(inputs: PlanInputs) -> int:
    """Non-torch memory of an engine without its own measured figure: the single constant."""
    parallel = inputs.tensor_parallel_size * inputs.pipeline_parallel_size > 1
    extra = OTHER_ENGINE_NON_TORCH_PARALLEL_GIB if parallel else 0.0
    return int((OTHER_ENGINE_NON_TORCH_GIB + extra) * GIB)


def cuda_graph_bytes(inputs: PlanInputs, max_num_seqs: int) -> int:
    """TGI's graph pools for its captured decode batch sizes: per-layer intermediates of the largest
    captured batch, plus a fixed part per layer (vLLM's graphs: `cuda_graphs`, per release)."""
    if inputs.enforce_eager or inputs.device == "cpu":
        return 0
    spec = inputs.spec
    largest = min(max_num_seqs * 2, 512)
    per_layer = 2 * 2**20  # calibrated: graph bookkeeping and workspaces per captured layer
    widest = largest * (spec.hidden_size + 3 * spec.intermediate_size // inputs.tensor_parallel_size) * 2
    layers = math.ceil(spec.num_layers / inputs.pipeline_parallel_size)
    return int(layers * per_layer + widest + 64 * 2**20)
