"""How fast one replica can decode and prefill, from bytes moved and FLOPs done (a roofline model).

A decode step reads the weights on each GPU once (for a MoE model, the experts the batch routes to)
plus every running sequence's KV cache, and does two FLOPs per active parameter per sequence plus the
attention products. Its time is the larger of bytes over memory bandwidth and FLOPs over the matrix
rate. The rates are the catalog's datasheet figures times the fraction a plain device-to-device copy
and a large bf16 matrix product reach on the card (`ACHIEVABLE_*`, measured on an H200), so the model
is a ceiling that real engines approach; `docs/planner.md` states how close the built-in engine gets.
Tensor-parallel communication and kernel launch gaps are not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmdeploy.catalog.gpus import GPUSpec
from llmdeploy.memory.footprint import expert_matrix_params, weights_bytes_per_gpu
from llmdeploy.memory.kv_layout import kv_layout
from llmdeploy.memory.plan_inputs import PlanInputs

# A 4 GiB device-to-device copy moves 4.20-4.30 TB/s (read + written) on an H200 rated 4.8 TB/s, and
# an 8192^3 bf16 product runs at 769-798 TFLOP/s on random data against the rated 989.
ACHIEVABLE_BANDWIDTH_FRACTION = 0.885
ACHIEVABLE_MATMUL_FRACTION = 0.80


@dataclass(frozen=True)
class StepCost:
    """One forward step on one GPU of a replica: what it moves and computes, and the time that bounds it."""

    bytes_read: float
    flops: float
    memory_s: float
    compute_s: float

    @property
    def seconds(self) -> float:
        return max(self.memory_s, self.compute_s)

    @property
    def bound(self) -> str:
        return "memory" if self.memory_s >= self.compute_s else "compute"


def _rates(gpu: GPUSpec) -> tuple[float, float]:
    bandwidth = gpu.bandwidth_gb_s * 1e9 * ACHIEVABLE_BANDWIDTH_FRACTION
    flops = gpu.bf16_tflops * 1e12 * ACHIEVABLE_MATMUL_FRACTION
    return bandwidth, flops


def _weights_read_per_gpu(inputs: PlanInputs, batch: int) -> float:
    """Weight bytes one step reads on one GPU, in the checkpoint's layout (no engine's padding): all
    of them for a dense model; for a MoE model the non-expert part plus the share of experts that
    `batch` tokens route to (uniform routing)."""
    total = float(weights_bytes_per_gpu(inputs))
    spec = inputs.spec
    if not spec.is_moe or spec.num_experts_per_tok <= 0:
        return total
    expert_params = expert_matrix_params(spec)
    share = expert_params / max(1, spec.params.total)
    expert_bytes = total * share
    untouched = (1.0 - spec.num_experts_per_tok / spec.num_experts) ** batch
    return total - expert_bytes * untouched


def _matmul_params(inputs: PlanInputs) -> float:
    """Parameters one token multiplies through on one GPU (routed experts only; lm_head always)."""
    spec = inputs.spec
    p = spec.params
    layers = p.active_layers if spec.is_moe and p.active_layers else p.layers
    head = spec.vocab_size * spec.hidden_size
    return (layers + head) / inputs.tensor_parallel_size


def _attended_tokens(inputs: PlanInputs, context: int) -> float:
    """Tokens of KV each attention layer reads for one sequence at `context`, averaged over the
    layers that hold KV (a sliding-window layer reads at most its window, a chunked layer at most
    its chunk; linear layers read a fixed state and no KV)."""
    kinds = [k for k in inputs.spec.kinds if k != "linear"] or ["full"]
    window = inputs.spec.sliding_window or context
    chunk = inputs.spec.attention_chunk_size or context
    limit = {"sliding": window, "chunked": chunk}
    return sum(min(context, limit.get(k, context)) for k in kinds) / len(kinds)


def decode_step(inputs: PlanInputs, gpu: GPUSpec, batch: int, context: int) -> StepCost:
    """One decode step of `batch` sequences, each with `context` tokens in its KV cache."""
    assert batch >= 1 and context >= 1
    layout = kv_layout(inputs)
    attended = _attended_tokens(inputs, context)
    kv_read = batch * attended * layout.layer_bytes_per_token * layout.num_layers
    bytes_read = _weights_read_per_gpu(inputs, batch) + kv_read
    spec = inputs.spec
    heads_per_gpu = max(1, spec.num_attention_heads // inputs.tensor_parallel_size)
    attention_flops = 4 * batch * attended * heads_per_gpu * spec.head_dim * spec.num_layers
    flops = 2 * _matmul_params(inputs) * batch + attention_flops
    bandwidth, rate = _rates(gpu)
    return StepCost(bytes_read, flops, bytes_read / bandwidth, flops / rate)


def prefill_step(inputs: PlanInputs, gpu: GPUSpec, prompt_tokens: int) -> StepCost:
    """One request's prompt in one step (causal attention over the prompt)."""
    assert prompt_tokens >= 1
    spec = inputs.spec
    heads_per_gpu = max(1, spec.num_attention_heads // inputs.tensor_parallel_size)
    attention_flops = 2 * prompt_tokens * prompt_tokens * heads_per_gpu * spec.head_dim * spec.num_layers
    flops = 2 * _matmul_params(inputs) * prompt_tokens + attention_flops
    bytes_read = _weights_read_per_gpu(inputs, prompt_tokens)
    bandwidth, rate = _rates(gpu)
    return StepCost(bytes_read, flops, bytes_read / bandwidth, flops / rate)


def decode_tok_s(inputs: PlanInputs, gpu: GPUSpec, batch: int, context: int) -> float:
    """Output tokens per second of one replica decoding `batch` sequences at `context`."""
    return batch / decode_step(inputs, gpu, batch, context).seconds
