"""`ModelSpec`: the architecture facts of one model, and the parameter count derived from them.

A spec is built from a flat mapping of Hugging Face `config.json`-style facts (the catalog stores
exactly that), so one parameter formula covers every family: the families differ only in which
optional pieces are present (biases, gated MLP, extra norms, MoE experts, MLA projections).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

# "chunked": attention within fixed chunks of `attention_chunk_size` tokens (Llama 4's local layers);
# "linear": a linear-attention / recurrent layer with a constant-size state and no KV cache
# (Qwen3-Next's Gated DeltaNet layers)
LayerKind = Literal["full", "sliding", "chunked", "linear"]
NormType = Literal["rms", "layernorm"]


@dataclass(frozen=True)
class ParamCount:
    """Exact parameter count, split the way weight-size estimates need it."""

    embedding: int
    layers: int
    head: int  # lm_head (0 when tied) plus the final norm
    extra: int = 0  # parts outside the decoder stack (vision tower, projector)
    linear: int = 0  # the quantizable matrices inside `layers` (attention + MLP/expert weights)
    active_layers: int = 0  # `layers` counting only the routed experts a token uses (MoE)

    @property
    def total(self) -> int:
        return self.embedding + self.layers + self.head + self.extra


@dataclass(frozen=True)
class ModelSpec:
    hf_id: str
    family: str
    architecture: str  # the transformers class name, e.g. "LlamaForCausalLM"
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool
    aliases: tuple[str, ...] = ()
    rope_theta: float | None = None
    rope_scaling: Mapping[str, Any] | None = None
    rope_local_base_freq: float | None = None  # RoPE base of the sliding-window layers (Gemma 3)
    partial_rotary_factor: float = 1.0
    rms_norm_eps: float | None = None
    norm_type: NormType = "rms"
    norms_per_layer: int = 2
    attention_bias: bool = False  # q/k/v biases
    attention_out_bias: bool = False  # o_proj bias
    attention_sinks: bool = False  # one learned sink logit per head (gpt-oss)
    qk_norm: bool = False
    attention_output_gate: bool = False  # q_proj also yields a sigmoid gate per head (Qwen3-Next)
    mlp_gated: bool = True
    mlp_bias: bool = False
    lm_head_bias: bool = False
    sliding_window: int | None = None
    layer_types: tuple[LayerKind, ...] = ()  # per layer; empty means all "full"
    attention_chunk_size: int | None = None  # tokens per chunk of the "chunked" layers
    # the recurrent state of the "linear" layers (Gated DeltaNet: conv + temporal state)
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 0
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    num_shared_experts: int = 0
    shared_expert_intermediate_size: int = 0  # Qwen-MoE style single shared expert
    shared_expert_gate: bool = False
    expert_bias: bool = False
    router_bias: bool = False
    first_k_dense_replace: int = 0  # leading dense layers in a MoE stack (DeepSeek)
    moe_layer_step: int = 1  # every k-th layer is MoE, the others dense (Llama 4 Maverick: 2)
    kv_lora_rank: int = 0  # MLA
    q_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    extra_params: int = 0
    torch_dtype: str = "bfloat16"
    source: str = "catalog"  # catalog | config | gguf
    weights_bytes_on_disk: int | None = None  # exact, when read from safetensors / GGUF headers
    file_quantization: str | None = None  # e.g. GGUF file type "Q4_1"
    # a GGUF file's tensor table (name, GGUF shape, type): how the CPU engine stores it depends on it
    gguf_tensors: tuple[tuple[str, tuple[int, ...], str], ...] = field(default=(), repr=False)
    params: ParamCount = field(default_factory=lambda: ParamCount(0, 0, 0))

    @property
    def num_params(self) -> int:
        return self.params.total

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def is_moe_layer(self, index: int) -> bool:
        """Whether layer `index` (0-based) routes to experts (transformers' `moe_layers`)."""
        return self.is_moe and index >= self.first_k_dense_replace and (index + 1) % self.moe_layer_step == 0

    @property
    def num_moe_layers(self) -> int:
        return sum(1 for i in range(self.num_layers) if self.is_moe_layer(i))

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def gqa_group_size(self) -> int:
        return self.num_attention_heads // max(1, self.num_kv_heads)

    @property
    def kinds(self) -> tuple[LayerKind, ...]:
        if self.layer_types:
            return self.layer_types
        return tuple("sliding" if self.sliding_window else "full" for _ in range(self.num_layers))

    @property
    def is_hybrid(self) -> bool:
        return len(set(self.kinds)) > 1


def _attention_params(s: ModelSpec) -> tuple[int, int]:
    """(matrix params, other params) of one attention block."""
    h = s.hidden_size
    if s.is_mla:
        qk_head = s.qk_nope_head_dim + s.qk_rope_head_dim
        if s.q_lora_rank:
            q = h * s.q_lora_rank + s.q_lora_rank * s.num_attention_heads * qk_head
            q_norm = s.q_lora_rank
        else:
            q, q_norm = h * s.num_attention_heads * qk_head, 0
        kv = h * (s.kv_lora_rank + s.qk_rope_head_dim)
        kv += s.kv_lora_rank * s.num_attention_heads * (s.qk_nope_head_dim + s.v_head_dim)
        o = s.num_attention_heads * s.v_head_dim * h
        return q + kv + o, q_norm + s.kv_lora_rank
    q_out = s.num_attention_heads * s.head_dim
    kv_out = s.num_kv_heads * s.head_dim
    gate = q_out if s.attention_output_gate else 0
    matrices = h * (q_out + gate) + 2 * h * kv_out + q_out * h
    other = (q_out + 2 * kv_out) if s.attention_bias else 0
    other += h if s.attention_out_bias else 0
    other += 2 * s.head_dim if s.qk_norm else 0
    other += s.num_attention_heads if s.attention_sinks else 0
    return matrices, other


def _linear_attention_params(s: ModelSpec) -> tuple[int, int]:
    """(matrix params, other params) of one Gated DeltaNet block (transformers' Qwen3NextGatedDeltaNet):
    fused q/k/v/z and b/a input projections, a depthwise causal conv over q/k/v, per-value-head
    A_log and dt_bias, a gated RMSNorm over the value head dim, and the output projection."""
    h = s.hidden_size
    key = s.linear_num_key_heads * s.linear_key_head_dim
    value = s.linear_num_value_heads * s.linear_value_head_dim
    matrices = h * (2 * key + 2 * value) + h * 2 * s.linear_num_value_heads + value * h
    conv = (2 * key + value) * s.linear_conv_kernel_dim
    return matrices, conv + 2 * s.linear_num_value_heads + s.linear_value_head_dim


def _mlp_params(s: ModelSpec, inter: int, bias: bool) -> tuple[int, int]:
    h = s.hidden_size
    matrices = (3 if s.mlp_gated else 2) * h * inter
    other = ((2 * inter if s.mlp_gated else inter) + h) if bias else 0
    return matrices, other


def _moe_params(s: ModelSpec) -> tuple[int, int, int]:
    """(matrix params, other params, matrix params of the experts one token uses) of one MoE block."""
    one_m, one_o = _mlp_params(s, s.moe_intermediate_size, s.expert_bias)
    matrices, other = s.num_experts * one_m, s.num_experts * one_o
    other += s.hidden_size * s.num_experts + (s.num_experts if s.router_bias else 0)
    shared_m = 0
    if s.num_shared_experts:
        shared_m += _mlp_params(s, s.moe_intermediate_size * s.num_shared_experts, False)[0]
    if s.shared_expert_intermediate_size:
        shared_m += _mlp_params(s, s.shared_expert_intermediate_size, False)[0]
    other += s.hidden_size if s.shared_expert_gate else 0
    active = s.num_experts_per_tok * one_m + shared_m
    return matrices + shared_m, other, active


def count_params(s: ModelSpec) -> ParamCount:
    norm = s.hidden_size * (2 if s.norm_type == "layernorm" else 1)
    attention = _attention_params(s)
    delta_net = _linear_attention_params(s) if "linear" in s.kinds else attention
    dense_m, dense_o = _mlp_params(s, s.intermediate_size, s.mlp_bias)
    layers = linear = active = 0
    for i, kind in enumerate(s.kinds):
        attn_m, attn_o = delta_net if kind == "linear" else attention
        if s.is_moe_layer(i):
            mlp_m, mlp_o, mlp_active = _moe_params(s)
        else:
            mlp_m, mlp_o = dense_m, dense_o
            mlp_active = mlp_m
        layer_other = attn_o + mlp_o + s.norms_per_layer * norm
        layers += attn_m + mlp_m + layer_other
        linear += attn_m + mlp_m
        active += attn_m + mlp_active + layer_other
    embedding = s.vocab_size * s.hidden_size
    head = norm + (0 if s.tie_word_embeddings else embedding) + (s.vocab_size if s.lm_head_bias else 0)
    return ParamCount(embedding, layers, head, s.extra_params, linear, active)


_INT_FIELDS = {
    "num_layers",
    "hidden_size",
    "num_attention_heads",
    "num_kv_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
    "max_position_embeddings",
}


def build_spec(facts: Mapping[str, Any]) -> ModelSpec:
    """A spec from catalog-style facts; fills head_dim and the layer pattern, then counts parameters."""
    known = {f for f in ModelSpec.__dataclass_fields__ if f != "params"}
    unknown = set(facts) - known
    assert not unknown, f"unknown model facts: {sorted(unknown)}"
    values = dict(facts)
    values.setdefault("num_kv_heads", values.get("num_attention_heads"))
    if not values.get("head_dim"):
        values["head_dim"] = values["hidden_size"] // values["num_attention_heads"]
    values["aliases"] = tuple(values.get("aliases", ()))
    values["layer_types"] = _layer_types(values)
    for name in _INT_FIELDS:
        values[name] = int(values[name])
    spec = ModelSpec(**values)
    return replace(spec, params=count_params(spec))


def _layer_types(values: Mapping[str, Any]) -> tuple[LayerKind, ...]:
    """Expand a compact pattern: a list of kinds, or {"full_every": k, "other": kind} meaning k-1
    layers of `kind` (default "sliding") then 1 full."""
    raw = values.get("layer_types") or ()
    n = int(values["num_layers"])
    if isinstance(raw, Mapping):
        period, other = int(raw["full_every"]), raw.get("other", "sliding")
        assert other in ("sliding", "chunked", "linear"), f"unknown layer kind {other!r}"
        return tuple("full" if (i + 1) % period == 0 else other for i in range(n))
    kinds = tuple(raw)
    assert not kinds or len(kinds) == n, "layer_types must list every layer"
    return kinds


def weights_bytes(spec: ModelSpec, bits_per_linear_param: float, unquantized_bytes: int = 2) -> int:
    """Weight size when the linear layers are stored at `bits_per_linear_param` and the rest
    (embeddings, lm_head, norms, routers, vision tower) stays in 16-bit, as quantized checkpoints do."""
    p = spec.params
    rest = p.total - p.linear
    return math.ceil(p.linear * bits_per_linear_param / 8) + rest * unquantized_bytes
