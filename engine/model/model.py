"""Llama / Mistral / Qwen2 / Qwen3 decoder over a paged KV cache.

One module covers the four families; they differ only in a q/k/v bias (Qwen2) and a per-head
RMSNorm on q and k (Qwen3). Parameter names follow Hugging Face checkpoints, so a safetensors state
dict loads as is and transformers can load ours. Numerics follow transformers' order of operations
(RMSNorm and RoPE tables in float32, then cast) so float32 logits agree closely.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from llmdeploy_engine.config import ModelConfig, RopeScaling
from llmdeploy_engine.facts import ARCHITECTURES
from llmdeploy_engine.kernels import ops
from llmdeploy_engine.kernels.attention import AttentionMetadata, fused_rope_decode, paged_attention
from llmdeploy_engine.kernels.kv_cache import KVAmaxObserver
from llmdeploy_engine.model.cpu_decode import CpuDecodePath
from llmdeploy_engine.model.parallel_layers import (
    MergedColumnParallelLinear,
    ParallelLMHead,
    ParallelModule,
    QKVParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
)
from llmdeploy_engine.parallel.distributed import ATTENTION_SLOT, MLP_SLOT, SINGLE, ParallelState
from torch import nn

SUPPORTED_ARCHITECTURES = tuple(ARCHITECTURES.values())  # llama | mistral | qwen2 | qwen3


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.rms_norm(x, self.weight, self.eps)


def rope_inv_freq(head_dim: int, theta: float, scaling: RopeScaling) -> torch.Tensor:
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if scaling.rope_type == "default":
        return inv_freq
    if scaling.rope_type == "linear":
        return inv_freq / scaling.factor
    if scaling.rope_type == "llama3":
        # Llama 3.1: long wavelengths slowed by `factor`, short ones kept, a smooth ramp between.
        old_len = scaling.original_max_position_embeddings
        low_wavelen = old_len / scaling.low_freq_factor
        high_wavelen = old_len / scaling.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
        smooth = (old_len / wavelen - scaling.low_freq_factor) / (
            scaling.high_freq_factor - scaling.low_freq_factor
        )
        smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return torch.where(medium, smoothed, scaled)
    raise ValueError(
        f"unsupported rope_scaling type {scaling.rope_type!r}; supported: default, linear, llama3"
    )


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, parallel: ParallelState = SINGLE) -> None:
        super().__init__()
        self.config = config
        h, bias = config.hidden_size, config.attention_bias
        quant = config.quantization
        self.qkv_proj = QKVParallelLinear(
            h, config.head_dim, config.num_attention_heads, config.num_key_value_heads, bias, parallel, quant
        )
        # this rank's heads (all of them at tensor_parallel_size 1)
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.o_proj = RowParallelLinear(
            config.q_size, h, "o_proj", parallel, reduce_slot=ATTENTION_SLOT, quant=quant
        )
        if config.qk_norm:
            self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps)
        self.scale = config.head_dim**-0.5
        # per-tensor scales of an fp8 KV cache (kv_cache.py); updated in place (CUDA graphs hold them)
        self.register_buffer("k_scale", torch.ones(1), persistent=False)
        self.register_buffer("v_scale", torch.ones(1), persistent=False)
        self.kv_observer: KVAmaxObserver | None = None  # set while calibrating the scales

    def reset_kv_scales(self, device: torch.device) -> None:
        """float32 scales of 1.0 on device (after meta construction and any dtype cast of the model)."""
        self.k_scale = torch.ones(1, dtype=torch.float32, device=device)
        self.v_scale = torch.ones(1, dtype=torch.float32, device=device)

    def forward(
        self,
        h: torch.Tensor,
        residual: torch.Tensor | None,
        norm: RMSNorm,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_cache: tuple[torch.Tensor, torch.Tensor] | None,
        meta: AttentionMetadata,
        keep: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(attention output, h + residual): `norm` (the layer's input norm) applied to h + residual
        first, in the QKV projection's kernel for single-row batches. keep: only these rows (a long
        index tensor) of both come back; every row's K/V is still computed and stored, and attention
        still runs for every row, but the output projection only for the kept ones."""
        c = self.config
        n = h.shape[0]
        qkv, residual = self.qkv_proj.forward_normed(h, residual, norm.weight, norm.eps)
        q, k, v = qkv.split(self.qkv_proj.split_sizes, dim=-1)
        q = q.view(n, self.num_heads, c.head_dim)
        k = k.view(n, self.num_kv_heads, c.head_dim)
        v = v.view(n, self.num_kv_heads, c.head_dim)
        if c.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        written = kv_cache is not None and meta.slot_mapping is not None
        fused = None
        if written and self.kv_observer is None:
            # decode steps on the GPU: RoPE, the KV-cache store and attention in one kernel
            fused = fused_rope_decode(
                q, k, v, cos, sin, kv_cache, meta, self.scale, self.k_scale, self.v_scale
            )
        out = (
            fused if fused is not None else self._rope_and_attend(q, k, v, cos, sin, kv_cache, meta, written)
        )
        out = out.reshape(n, self.num_heads * c.head_dim)
        if keep is not None:
            out, residual = out[keep], residual[keep]
        return self.o_proj(out), residual

    def _rope_and_attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_cache: tuple[torch.Tensor, torch.Tensor] | None,
        meta: AttentionMetadata,
        written: bool,
    ) -> torch.Tensor:
        """RoPE, the new K/V stored (when written) and paged attention, as separate launches."""
        if written:
            assert kv_cache is not None and meta.slot_mapping is not None
            # RoPE and the KV-cache write in one step (one kernel on the GPU); attention only reads
            q, k = ops.rope_and_cache(
                q, k, v, cos, sin, kv_cache, meta.slot_mapping, self.k_scale, self.v_scale
            )
        else:
            q, k = ops.apply_rope(q, k, cos, sin)
        if self.kv_observer is not None:
            self.kv_observer.update(k, v)
        return paged_attention(
            q,
            k,
            v,
            kv_cache,
            meta,
            self.scale,
            k_scale=self.k_scale,
            v_scale=self.v_scale,
            kv_written=written,
        )


class MLP(nn.Module):
    def __init__(self, config: ModelConfig, parallel: ParallelState = SINGLE) -> None:
        super().__init__()
        h, inter = config.hidden_size, config.intermediate_size
        quant = config.quantization
        self.gate_up_proj = MergedColumnParallelLinear(h, inter, ("gate_proj", "up_proj"), parallel, quant)
        self.down_proj = RowParallelLinear(inter, h, "down_proj", parallel, reduce_slot=MLP_SLOT, quant=quant)

    def forward(
        self, h: torch.Tensor, residual: torch.Tensor | None, norm: RMSNorm
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(MLP output, h + residual): `norm` (the post-attention norm) applied to h + residual first,
        in the gate_up projection's kernel for single-row batches; SiLU(gate) * up is read from the
        merged output by the down projection (its kernel, or a separate one for larger batches)."""
        gate_up, residual = self.gate_up_proj.forward_normed(h, residual, norm.weight, norm.eps)
        return self.down_proj(gate_up, silu_mul=True), residual


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, parallel: ParallelState = SINGLE) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, parallel)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config, parallel)

    def forward(
        self,
        h: torch.Tensor,
        residual: torch.Tensor | None,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_cache: tuple[torch.Tensor, torch.Tensor] | None,
        meta: AttentionMetadata,
        keep: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(this layer's MLP output, the residual stream before it); the next layer adds them. keep:
        from the output projection on, only these rows (Attention.forward)."""
        h, residual = self.self_attn(h, residual, self.input_layernorm, cos, sin, kv_cache, meta, keep)
        return self.mlp(h, residual, self.post_attention_layernorm)


class Backbone(nn.Module):
    def __init__(self, config: ModelConfig, parallel: ParallelState = SINGLE) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, parallel=parallel)
        self.layers = nn.ModuleList(DecoderLayer(config, parallel) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class CausalLM(nn.Module):
    """`model.*` + `lm_head`, as in Hugging Face checkpoints.

    q/k/v and gate/up projections are merged (`qkv_proj`, `gate_up_proj`) and, with a `parallel`
    state of world size > 1, every projection, the embedding and the LM head hold this rank's shard;
    `load_weights` takes Hugging Face names and full tensors and slices them.
    """

    def __init__(self, config: ModelConfig, parallel: ParallelState = SINGLE) -> None:
        super().__init__()
        if config.architecture not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"architecture {config.architecture!r} is not supported by the built-in engine; "
                f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        self.config = config
        self.parallel = parallel
        self.model = Backbone(config, parallel)
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, parallel=parallel)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        # computed on the CPU, then moved: under a meta-device default (model_runner builds the model
        # so) a division runs torch's reference ops, whose first use imports torch._dynamo (1-3 s)
        with torch.device("cpu"):
            inv_freq = self._inv_freq()
        self.register_buffer("inv_freq", inv_freq.to(self.model.norm.weight.device), persistent=False)
        # cpu_decode.py's path, built at the first CPU decode step (None there: it does not apply)
        self._cpu_decode: CpuDecodePath | None = None
        self._cpu_decode_built = False

    def _inv_freq(self) -> torch.Tensor:
        c = self.config
        inv_freq = rope_inv_freq(c.head_dim, c.rope_theta, c.rope_scaling)
        if c.rope_freq_factors is not None:
            inv_freq = inv_freq / torch.tensor(c.rope_freq_factors, dtype=torch.float32)
        return inv_freq

    def reset_rope(self) -> None:
        """Recompute the float32 RoPE frequencies on the model's device (after meta construction)."""
        self.inv_freq = self._inv_freq().to(self.model.norm.weight.device)

    def rope_tables(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        return ops.rope_tables(positions, self.inv_freq, dtype)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]] | None,
        keep_rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Hidden states after the final norm, [num_tokens, hidden_size]; with keep_rows (a long index
        tensor) only those rows, in that order. Nothing reads the other rows' last-layer output, so
        the last layer computes and stores every row's K/V and attention, then runs its output
        projection, MLP and the final norm on the kept rows only (for the 8B, 88 % of that layer's
        GEMM FLOPs skipped for a prompt token that needs no logits). CPU decode-only steps of int4pack
        weights take cpu_decode.py's path instead (the same math in fewer ops)."""
        if input_ids.device.type == "cpu" and CpuDecodePath.applies(input_ids, meta, kv_caches, keep_rows):
            if not self._cpu_decode_built:
                self._cpu_decode = CpuDecodePath.build(self)  # from the loaded weights, once
                self._cpu_decode_built = True
            if self._cpu_decode is not None:
                assert kv_caches is not None
                return self._cpu_decode.forward(input_ids, positions, meta, kv_caches)
        return self.module_forward(input_ids, positions, meta, kv_caches, keep_rows)

    def module_forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]] | None,
        keep_rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """`forward` through the layer modules: the reference, and every step cpu_decode.py does not take."""
        h = self.model.embed_tokens(input_ids)
        cos, sin = self.rope_tables(positions, h.dtype)
        residual: torch.Tensor | None = None
        last = len(self.model.layers) - 1
        for i, layer in enumerate(self.model.layers):
            kv = None if kv_caches is None else kv_caches[i]
            h, residual = layer(h, residual, cos, sin, kv, meta, keep_rows if i == last else None)
        norm = self.model.norm
        normed, _ = ops.add_rms_norm(h, residual, norm.weight, norm.eps)
        return normed

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()

    def _hf_slots(self) -> dict[str, tuple[ParallelModule | None, str, nn.Parameter | None]]:
        """Hugging Face name -> (parallel layer and its relative name) or (None, name, plain parameter)."""
        slots: dict[str, tuple[ParallelModule | None, str, nn.Parameter | None]] = {}
        owned: set[int] = set()
        for mod_name, mod in self.named_modules():
            if not isinstance(mod, ParallelModule):
                continue
            owned.update(id(p) for p in mod.parameters())
            if mod is self.lm_head and self.config.tie_word_embeddings:
                continue
            parent = mod_name.rpartition(".")[0]
            for rel in mod.hf_shapes():
                slots[f"{parent}.{rel}" if parent else rel] = (mod, rel, None)
        for name, p in self.named_parameters():
            if id(p) not in owned:
                slots[name] = (None, name, p)
        return slots

    def hf_shapes(self) -> dict[str, tuple[int, ...]]:
        """Full Hugging Face tensor shapes of this model (every tensor a checkpoint must hold)."""
        shapes: dict[str, tuple[int, ...]] = {}
        for name, (mod, rel, p) in self._hf_slots().items():
            shapes[name] = mod.hf_shapes()[rel] if mod is not None else tuple(p.shape)  # type: ignore[union-attr]
        return shapes

    def load_hf_tensors(self, tensors: Iterable[tuple[str, torch.Tensor]], retie: bool = True) -> None:
        """Copy this rank's slice of each full Hugging Face tensor in (names from `hf_shapes`). retie:
        first share the embedding with a tied LM head again (False where they were replaced apart)."""
        self._cpu_decode_built = False  # rebuilt from the new weights at the next CPU decode step
        if retie and self.config.tie_word_embeddings:  # `to_empty` unties shared parameters
            self.lm_head.weight = self.model.embed_tokens.weight
        slots = self._hf_slots()
        for name, full in tensors:
            mod, rel, p = slots[name]
            if mod is not None:
                mod.load_hf(rel, full)
            else:
                with torch.no_grad():
                    p.copy_(full)  # type: ignore[union-attr]

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """Hugging Face-named full tensors (tensor_parallel_size 1 only), e.g. to build a transformers model."""
        state: dict[str, torch.Tensor] = {}
        for name, (mod, rel, p) in self._hf_slots().items():
            state[name] = mod.hf_tensor(rel) if mod is not None else p.detach()  # type: ignore[union-attr]
        if self.config.tie_word_embeddings:
            state["lm_head.weight"] = state["model.embed_tokens.weight"]
        return state

    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Copy a Hugging Face-named state dict in (full tensors; each rank takes its slice); every
        tensor must be present exactly once."""
        slots = self._hf_slots()
        shapes = self.hf_shapes()
        if self.config.tie_word_embeddings:
            weights = {k: v for k, v in weights.items() if k != "lm_head.weight"}
        missing = sorted(set(slots) - set(weights))
        unexpected = sorted(k for k in set(weights) - set(slots) if not k.endswith("rotary_emb.inv_freq"))
        if missing or unexpected:
            raise ValueError(
                f"checkpoint does not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}"
            )
        for name in slots:
            w = weights[name]
            if tuple(w.shape) != shapes[name]:
                raise ValueError(f"{name}: checkpoint shape {tuple(w.shape)} != model shape {shapes[name]}")
        self.load_hf_tensors((name, weights[name]) for name in slots)
