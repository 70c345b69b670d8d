"""`KVLayout`: how one GPU's KV cache is laid out for a model, per attention kind.

vLLM V1 gives every layer a KV-cache spec (v1/kv_cache_interface.py): full attention, sliding
window, chunked local attention (Llama 4's `attention_chunk_size` layers) and, for linear-attention
layers such as Qwen3-Next's Gated DeltaNet, a `MambaSpec`: one fixed-size recurrent state per
request instead of per-token KV. Layers of one kind form groups of equal size that draw blocks from
one shared pool (v1/core/kv_cache_utils.py `_get_kv_cache_groups_uniform_page_size`), so one pool
block costs `group_size` layers' pages. MLA layers store one compressed latent per token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llmdeploy.catalog.model_spec import LayerKind, ModelSpec
from llmdeploy.memory.plan_inputs import PlanInputs

# vLLM's CUDA attention backends (FlashAttention, FlashInfer) take kernel blocks in multiples of 16
# tokens: `_align_hybrid_block_size` rounds the attention block up to one of those
KERNEL_BLOCK_ALIGNMENT = 16
# with prefix caching on (vLLM's default) a Mamba-style layer runs in mamba_cache_mode "align",
# which holds 2 state blocks per request (MambaSpec.max_memory_usage_bytes); without it, 1
LINEAR_STATE_BLOCKS_PER_REQUEST = 2


@dataclass(frozen=True)
class KVLayout:
    """How the KV cache is laid out per GPU, and what one token of 'GPU KV cache size' costs."""

    bytes_per_token: int  # per GPU, one token across every attention group (linear states excluded)
    layer_bytes_per_token: int  # one attention layer, one token, per GPU
    num_layers: int  # layers that hold KV on this GPU (pipeline stage; linear layers excluded)
    num_kv_heads_per_gpu: int
    num_groups: int  # vLLM KV cache groups (1 unless hybrid)
    sliding_window: int | None
    num_sliding_layers: int
    is_mla: bool
    group_size: int = 0  # layers per group (one block pool slot each); 0 means num_layers
    num_sliding_groups: int = 0
    pool_bytes_per_token: int = 0  # one block-pool slot (group_size layers, + draft layers), per token
    group_kinds: tuple[LayerKind, ...] = ()  # the kind of each group; empty means one "full" group
    attention_chunk_size: int | None = None
    linear_state_bytes: int = 0  # one linear layer's recurrent state (conv + temporal), per GPU

    @property
    def is_plain(self) -> bool:
        """One kind of full-attention layer: KV tokens are simply blocks x block size."""
        return self.sliding_window is None and set(self.group_kinds) <= {"full"}

    def hybrid_block_size(self, block_size: int) -> int:
        """The attention block size vLLM uses so that one attention page holds a linear layer's
        state (platforms/interface.py `_align_hybrid_block_size`; the state page is padded up)."""
        if not self.linear_state_bytes:
            return block_size
        align = max(KERNEL_BLOCK_ALIGNMENT, block_size)
        needed = align * -(-self.linear_state_bytes // (align * self.layer_bytes_per_token))
        needed = KERNEL_BLOCK_ALIGNMENT * -(-needed // KERNEL_BLOCK_ALIGNMENT)
        return max(block_size, needed)


def linear_state_bytes(spec: ModelSpec, tp: int, state_dtype_bytes: int) -> int:
    """A Gated DeltaNet layer's state per request and GPU (model_executor/layers/mamba/mamba_utils.py
    `gated_delta_net_state_shape`): conv state (2 x key heads x key dim + value heads x value dim)
    x (kernel - 1), and the temporal state value heads x value dim x key dim, both split by TP, in
    the model dtype (mamba_cache_dtype "auto")."""
    conv_dim = 2 * spec.linear_num_key_heads * spec.linear_key_head_dim
    conv_dim += spec.linear_num_value_heads * spec.linear_value_head_dim
    conv = conv_dim // tp * (spec.linear_conv_kernel_dim - 1)
    temporal = spec.linear_num_value_heads // tp * spec.linear_value_head_dim * spec.linear_key_head_dim
    return (conv + temporal) * state_dtype_bytes


def _group_size(counts: list[int]) -> int:
    """vLLM's layers per group: the smallest kind's count, or the largest when no kind has 1.5x
    the smallest's layers (fewer padding layers)."""
    smallest, largest = min(counts), max(counts)
    return largest if largest < smallest * 1.5 else smallest


def kv_layout(inputs: PlanInputs) -> KVLayout:
    spec, tp, pp = inputs.spec, inputs.tensor_parallel_size, inputs.pipeline_parallel_size
    kv_bytes = inputs.kv_dtype_bytes
    layers = math.ceil(spec.num_layers / pp)
    if spec.is_mla:
        # one compressed latent + the rope key per token, replicated on every TP rank
        per_layer = (spec.kv_lora_rank + spec.qk_rope_head_dim) * kv_bytes
        pool = per_layer * layers + _draft_kv_bytes(inputs)
        return KVLayout(pool, per_layer, layers, 1, 1, None, 0, True, layers, 0, pool, ("full",))
    heads = max(1, spec.num_kv_heads // tp)  # replicated when TP exceeds the KV heads
    per_layer = 2 * heads * spec.head_dim * kv_bytes
    kinds = spec.kinds[:layers]
    counts = {kind: kinds.count(kind) for kind in ("full", "sliding", "chunked", "linear") if kind in kinds}
    group_size = _group_size(list(counts.values())) if len(counts) > 1 else layers
    group_kinds = tuple(kind for kind, n in counts.items() for _ in range(math.ceil(n / group_size)))
    attention_groups = sum(1 for k in group_kinds if k != "linear")
    state = 0
    if "linear" in counts:
        assert spec.linear_num_value_heads and spec.linear_conv_kernel_dim, (
            "linear layers need their state shape"
        )
        state = linear_state_bytes(spec, tp, inputs.model_dtype_bytes)
    pool = per_layer * group_size + (_draft_kv_bytes(inputs) if len(group_kinds) == 1 else 0)
    return KVLayout(
        bytes_per_token=pool * attention_groups,
        layer_bytes_per_token=per_layer,
        num_layers=layers - counts.get("linear", 0),
        num_kv_heads_per_gpu=heads,
        num_groups=len(group_kinds),
        sliding_window=spec.sliding_window if "sliding" in counts else None,
        num_sliding_layers=counts.get("sliding", 0),
        is_mla=False,
        group_size=group_size,
        num_sliding_groups=group_kinds.count("sliding"),
        pool_bytes_per_token=pool,
        group_kinds=group_kinds,
        attention_chunk_size=spec.attention_chunk_size if "chunked" in counts else None,
        linear_state_bytes=state,
    )


def _draft_kv_bytes(inputs: PlanInputs) -> int:
    """A draft model's attention layers join the target's KV pool (every block spans all layers)."""
    draft = inputs.draft
    if draft is None:
        return 0
    heads = max(1, draft.num_kv_heads // inputs.tensor_parallel_size)
    return 2 * draft.num_layers * heads * draft.head_dim * inputs.kv_dtype_bytes
