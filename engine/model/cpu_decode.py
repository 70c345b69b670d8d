"""The CPU decode step without per-layer modules, for models whose projections are all compact CPU
weights (cpu_quant.CpuWeight: GGUF weights kept compact, `--cpu-weights`).

Why a second path: on a 2-core CPU a decode step of the default model (30 layers) spent more time in
torch dispatch and Python than in its matrix products: ~1,700 aten ops, ~150 module calls and ~900
module attribute lookups a step at a few microseconds each. This path runs the same layer math from
tensors taken out of the modules once (`CpuDecodePath.build`), in a few ops a layer:

- each projection is one `fused_linear` with the step around it: the RMSNorm before qkv and
  gate_up, the SwiGLU before down and the residual add after o and down. The cpu_dot weights
  (cpu_native.py) do all of it inside their kernel, in place on the float32 residual; torch's
  weights apply RMSNorm's row scale to the product's output (one op fewer than the reference);
- with the cpu_dot library, RoPE, the K/V store and the paged attention as one call a layer
  (cpu_native.DecodeAttention), reading the cache blocks in place;
- without it, RoPE of q and k as one batched product with a rotation matrix built once a step (the
  reference takes ~10 elementwise ops a layer; the sums differ from it by fused multiply-add rounding
  only) and decode attention through SDPA over the gathered blocks, unmasked for a single sequence
  (its keys are cut to the context length instead).

model.py's module path stays the reference and serves everything else (prefill, any other weight,
tensor parallelism, Qwen3's q/k norm, an fp8 or 16-bit cache); tests compare the two paths' logits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from llmdeploy_engine.kernels import cpu_native
from llmdeploy_engine.kernels.attention import AttentionMetadata
from llmdeploy_engine.model.cpu_quant import CpuWeight

if TYPE_CHECKING:
    from llmdeploy_engine.model.model import CausalLM


@dataclass(frozen=True)
class _Layer:
    """One decoder layer's tensors, out of its modules (attribute lookups on modules cost ~1 us each)."""

    norm1: torch.Tensor  # input_layernorm.weight
    qkv: CpuWeight
    qkv_bias: torch.Tensor | None
    o: CpuWeight
    norm2: torch.Tensor  # post_attention_layernorm.weight
    gate_up: CpuWeight
    down: CpuWeight


def _cpu_weight(weight: object) -> CpuWeight | None:
    if not isinstance(weight, CpuWeight) or weight.activation_dtype != torch.float32:
        return None
    return weight


class CpuDecodePath:
    """A decode-only CPU step of a CausalLM through its int4pack weights (see the module docstring)."""

    def __init__(self, model: CausalLM, layers: list[_Layer]) -> None:
        c = model.config
        self.model = model
        self.layers = layers
        self.hidden = c.hidden_size
        self.heads, self.kv_heads, self.head_dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.q_size = self.heads * self.head_dim
        self.kv_size = self.kv_heads * self.head_dim
        self.eps = float(c.rms_norm_eps)
        self.final_norm = model.model.norm.weight
        self.final_eps = model.model.norm.eps
        self.scale = c.head_dim**-0.5
        d, half = c.head_dim, c.head_dim // 2
        # rotate_half as a signed permutation: (x @ sign)[j] = -x[j + half] (j < half), x[j - half] else
        sign = torch.zeros(d, d)
        sign[torch.arange(half) + half, torch.arange(half)] = -1.0
        sign[torch.arange(half), torch.arange(half) + half] = 1.0
        self.sign = sign
        # cpu_dot.c's decode attention where the kernels load (else torch's ops below)
        self.native_attention = cpu_native.library() is not None
        self._flat_source: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        self._flat: list[tuple[torch.Tensor, torch.Tensor]] = []

    @classmethod
    def build(cls, model: CausalLM) -> CpuDecodePath | None:
        """The path for this model, or None where it does not apply (the module path runs then)."""
        c = model.config
        if model.parallel.is_parallel or c.qk_norm or model.inv_freq.device.type != "cpu":
            return None
        if model.model.norm.weight.dtype != torch.float32:
            return None
        layers = []
        for layer in model.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            weights = [
                _cpu_weight(p.weight) for p in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
            ]
            qkv, o, gate_up, down = weights
            if qkv is None or o is None or gate_up is None or down is None:
                return None
            bias = attn.qkv_proj.bias  # the only biased projection (Qwen2); o, gate_up and down have none
            layers.append(
                _Layer(
                    norm1=layer.input_layernorm.weight.detach().contiguous(),
                    qkv=qkv,
                    qkv_bias=None if bias is None else bias.detach().float().contiguous(),
                    o=o,
                    norm2=layer.post_attention_layernorm.weight.detach().contiguous(),
                    gate_up=gate_up,
                    down=down,
                )
            )
        return cls(model, layers)

    @staticmethod
    def applies(
        input_ids: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]] | None,
        keep_rows: torch.Tensor | None,
    ) -> bool:
        """Whether a step is one this path runs: decode rows only, in order, with a float32 cache."""
        n = input_ids.shape[0]
        return (
            kv_caches is not None
            and keep_rows is None
            and meta.slot_mapping is not None
            and not meta.prefills
            and meta.decodes_in_order
            and n > 0
            and meta.num_decodes == n
            and kv_caches[0][0].dtype == torch.float32
        )

    def _flat_caches(
        self, kv_caches: list[tuple[torch.Tensor, torch.Tensor]]
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer, the K and V pools as [slots, kv_heads, head_dim] views (made once per pool list)."""
        if self._flat_source is not kv_caches:
            shape = (-1, self.kv_heads, self.head_dim)
            self._flat = [(k.view(shape), v.view(shape)) for k, v in kv_caches]
            self._flat_source = kv_caches
        return self._flat

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    ) -> torch.Tensor:
        """Hidden states after the final norm [n, hidden], as CausalLM.forward."""
        n = input_ids.shape[0]
        hidden, heads, kv_heads, d = self.hidden, self.heads, self.kv_heads, self.head_dim
        group = heads // kv_heads
        qk_heads = heads + kv_heads
        width = self.q_size + 2 * self.kv_size  # a qkv output row
        model = self.model
        h = model.model.embed_tokens(input_ids).float()
        cos, sin = model.rope_tables(positions, torch.float32)  # [n, 1, d]
        slots = meta.slot_mapping
        assert slots is not None
        blocks = meta.decode_blocks
        attended = torch.empty(n, self.q_size)
        eps = self.eps
        if self.native_attention:
            attention = cpu_native.DecodeAttention(
                heads,
                kv_heads,
                d,
                cos.view(n, d),
                sin.view(n, d),
                slots,
                blocks.view(n, -1),
                meta.decode_context_lens().to(torch.int32),
                self.scale,
                attended,
            )
            for layer, (k_pool, v_pool) in zip(self.layers, kv_caches, strict=True):
                qkv = layer.qkv.fused_linear(h, norm=layer.norm1, eps=eps, bias=layer.qkv_bias)
                attention(qkv, k_pool, v_pool)
                h = self._mlp(layer, attended, h)
            return F.rms_norm(h, (hidden,), self.final_norm, self.final_eps)
        rotation = torch.diag_embed(cos[:, 0]).add_(self.sign * sin)  # [n, d, d]
        block_size = kv_caches[0][0].shape[1]
        padded = blocks.numel() // n * block_size
        if n == 1:
            # one sequence: its keys cut to the context length, no mask
            context = int(meta.decode_context_lens()[0])
            mask = None
        else:
            context, mask = padded, meta.decode_mask
        kv_shape, kv_stride = (n, kv_heads, context, d), (padded * kv_heads * d, d, kv_heads * d, 1)
        q_shape, q_stride = (n, kv_heads, group, d), (qk_heads * d, group * d, d, 1)
        kv_row_stride = (width, d, 1)
        attended_4d = attended.view(n, kv_heads, group, d)
        scale = self.scale
        flat = self._flat_caches(kv_caches)
        for layer, (k_pool, v_pool), (k_flat, v_flat) in zip(self.layers, kv_caches, flat, strict=True):
            qkv = layer.qkv.fused_linear(h, norm=layer.norm1, eps=eps, bias=layer.qkv_bias)
            qk = torch.bmm(qkv.as_strided((n, qk_heads, d), kv_row_stride), rotation)
            k_flat.index_copy_(0, slots, qk[:, heads:])
            v_flat.index_copy_(
                0, slots, qkv.as_strided((n, kv_heads, d), kv_row_stride, self.q_size + self.kv_size)
            )
            keys = k_pool.index_select(0, blocks).as_strided(kv_shape, kv_stride)
            values = v_pool.index_select(0, blocks).as_strided(kv_shape, kv_stride)
            out = F.scaled_dot_product_attention(
                qk.as_strided(q_shape, q_stride), keys, values, attn_mask=mask, scale=scale
            )
            attended_4d.copy_(out)
            h = self._mlp(layer, attended, h)
        return F.rms_norm(h, (hidden,), self.final_norm, self.final_eps)

    def _mlp(self, layer: _Layer, attended: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """The residual after the attention output projection and the MLP (in place on h)."""
        h = layer.o.fused_linear(attended, add=h, out=h)
        gate_up = layer.gate_up.fused_linear(h, norm=layer.norm2, eps=self.eps)
        return layer.down.fused_linear(gate_up, swiglu=True, add=h, out=h)
