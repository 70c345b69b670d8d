"""Tensor-parallel projection, embedding and LM-head layers (Megatron-style sharding).

- column-parallel (`QKVParallelLinear`, `MergedColumnParallelLinear`): output features split over
  ranks, each rank keeps its slice of the output (its attention heads, its MLP columns);
- row-parallel (`RowParallelLinear`): input features split, partial sums all-reduced;
- vocab-parallel (`VocabParallelEmbedding`, `ParallelLMHead`): vocabulary rows split (padded up to a
  multiple of the world size); embedding lookups outside a rank's range give zeros and are summed,
  logits are all-gathered along the vocabulary.

At world size 1 they are plain single-device layers and make no collective call; the merged QKV and
gate/up projections still save kernels per layer. Each layer knows the Hugging Face tensors it is
made of (`hf_shapes`), loads its rank's slice of a full tensor (`load_hf`) and, at world size 1,
gives the full tensors back (`hf_tensor`), so checkpoints keep Hugging Face names. With a
`QuantSpec` the projections hold a quantized weight (quant_linear.py) in place of the dense one and
load the checkpoint's quantized tensors (quant_loading.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from llmdeploy_engine.kernels import ops
from llmdeploy_engine.model.quant_config import QuantSpec
from llmdeploy_engine.model.quant_loading import PartLoader, make_weight, quant_shapes
from llmdeploy_engine.parallel.distributed import EMBED_SLOT, SINGLE, ParallelState, all_gather, all_reduce
from torch import nn


def divide(n: int, world_size: int, what: str) -> int:
    if n % world_size:
        raise ValueError(
            f"tensor_parallel_size {world_size} does not divide {what} ({n}); "
            "pick a tensor_parallel_size that divides it"
        )
    return n // world_size


class ParallelModule(nn.Module):
    """A layer whose parameters are built from Hugging Face tensors, possibly sharded."""

    def hf_shapes(self) -> dict[str, tuple[int, ...]]:
        """Full Hugging Face tensor shapes, keyed by name relative to the parent module."""
        raise NotImplementedError

    def load_hf(self, name: str, full: torch.Tensor) -> None:
        raise NotImplementedError

    def hf_tensor(self, name: str) -> torch.Tensor:
        raise NotImplementedError


def _check_single(parallel: ParallelState) -> None:
    if parallel.is_parallel:
        raise ValueError("full Hugging Face tensors are only available at tensor_parallel_size 1")


class _MergedColumn(ParallelModule):
    """Several column-parallel projections stacked in one weight; each part loads its own rows."""

    def __init__(
        self,
        in_features: int,
        parts: dict[str, tuple[int, int, int]],  # HF module name -> (full rows, local rows, first full row)
        bias: bool,
        parallel: ParallelState,
        quant: QuantSpec | None = None,
    ) -> None:
        super().__init__()
        self.parallel = parallel
        self.in_features = in_features
        self.parts = parts
        self.offsets: dict[str, int] = {}
        total = 0
        for name, (_, local, _) in parts.items():
            self.offsets[name] = total
            total += local
        self.quant = quant
        self.weight: nn.Parameter | nn.Module
        if quant is None:
            self.weight = nn.Parameter(torch.empty(total, in_features))
        else:
            self.weight = make_weight(quant, total, in_features)
            self._loader = PartLoader(quant, self.weight)
        self.bias = nn.Parameter(torch.empty(total)) if bias else None
        self.split_sizes = [local for _, local, _ in parts.values()]

    def hf_shapes(self) -> dict[str, tuple[int, ...]]:
        shapes: dict[str, tuple[int, ...]] = {}
        for name, (full, _, _) in self.parts.items():
            if self.quant is None:
                shapes[f"{name}.weight"] = (full, self.in_features)
            else:
                shapes.update(quant_shapes(self.quant, name, full, self.in_features))
            if self.bias is not None:
                shapes[f"{name}.bias"] = (full,)
        return shapes

    def _target(self, name: str) -> tuple[nn.Parameter, str]:
        part, _, kind = name.rpartition(".")
        param = self.weight if kind == "weight" else self.bias
        if not isinstance(param, nn.Parameter) and param is not None:
            raise ValueError(f"{name}: quantized weights have no dense Hugging Face tensor")
        if part not in self.parts or param is None:
            raise KeyError(name)
        return param, part

    def load_hf(self, name: str, full: torch.Tensor) -> None:
        if self.quant is not None and not name.endswith(".bias"):
            part, _, kind = name.rpartition(".")
            _, local, first = self.parts[part]
            expected = len(quant_shapes(self.quant, part, 8, 8))
            self._loader.add(part, kind, full, expected, rows=(first, local, self.offsets[part]))
            return
        param, part = self._target(name)
        _, local, first = self.parts[part]
        with torch.no_grad():
            param.narrow(0, self.offsets[part], local).copy_(full.narrow(0, first, local))

    def hf_tensor(self, name: str) -> torch.Tensor:
        _check_single(self.parallel)
        param, part = self._target(name)
        return param.detach().narrow(0, self.offsets[part], self.parts[part][1])

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(ops.linear(x, self.weight, self.bias).split(self.split_sizes, dim=-1))

    def forward_normed(
        self, h: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(this projection of rms_norm(h + residual), h + residual): the preceding residual add and
        RMSNorm in the same kernel for single-row batches (ops.add_rms_norm_linear). The product is the
        merged output; split it with `split_sizes`."""
        return ops.add_rms_norm_linear(h, residual, norm_weight, eps, self.weight, self.bias)


class QKVParallelLinear(_MergedColumn):
    """q, k and v projections in one matmul; attention heads split over ranks.

    With fewer KV heads than ranks each KV head is replicated on world_size / num_kv_heads ranks
    (rank r holds KV head r * num_kv_heads // world_size), so every rank has one KV head.
    """

    def __init__(
        self,
        hidden_size: int,
        head_dim: int,
        num_heads: int,
        num_kv_heads: int,
        bias: bool,
        parallel: ParallelState = SINGLE,
        quant: QuantSpec | None = None,
    ) -> None:
        tp, rank = parallel.world_size, parallel.rank
        self.num_heads = divide(num_heads, tp, "the number of attention heads")
        if num_kv_heads >= tp:
            self.num_kv_heads = divide(num_kv_heads, tp, "the number of KV heads")
            first_kv = rank * self.num_kv_heads
        else:
            if tp % num_kv_heads:
                raise ValueError(
                    f"tensor_parallel_size {tp} exceeds the number of KV heads ({num_kv_heads}) and is not "
                    "a multiple of it; KV heads cannot be replicated evenly"
                )
            self.num_kv_heads = 1
            first_kv = rank * num_kv_heads // tp
        self.q_size, self.kv_size = self.num_heads * head_dim, self.num_kv_heads * head_dim
        kv_full, kv_first = num_kv_heads * head_dim, first_kv * head_dim
        super().__init__(
            hidden_size,
            {
                "q_proj": (num_heads * head_dim, self.q_size, rank * self.q_size),
                "k_proj": (kv_full, self.kv_size, kv_first),
                "v_proj": (kv_full, self.kv_size, kv_first),
            },
            bias,
            parallel,
            quant,
        )


class MergedColumnParallelLinear(_MergedColumn):
    """Equal-width column-parallel projections in one matmul (gate_proj and up_proj of a gated MLP)."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        names: tuple[str, ...],
        parallel: ParallelState = SINGLE,
        quant: QuantSpec | None = None,
    ) -> None:
        local = divide(out_features, parallel.world_size, f"{'/'.join(names)} width")
        super().__init__(
            in_features,
            {name: (out_features, local, parallel.rank * local) for name in names},
            False,
            parallel,
            quant,
        )


class RowParallelLinear(ParallelModule):
    """Input features split over ranks; each rank's partial product is all-reduced (summed)."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        name: str,
        parallel: ParallelState = SINGLE,
        reduce_slot: int = 0,
        quant: QuantSpec | None = None,
    ) -> None:
        super().__init__()
        self.parallel, self.name = parallel, name
        self.reduce_slot = reduce_slot  # the symmetric buffer's slot (distributed.REDUCE_SLOTS)
        self.in_features, self.out_features = in_features, out_features
        self.local_in = divide(in_features, parallel.world_size, f"{name} input width")
        self.quant = quant
        self.weight: nn.Parameter | nn.Module
        if quant is None:
            self.weight = nn.Parameter(torch.empty(out_features, self.local_in))
        else:
            self.weight = make_weight(quant, out_features, self.local_in)
            self._loader = PartLoader(quant, self.weight)

    def hf_shapes(self) -> dict[str, tuple[int, ...]]:
        if self.quant is not None:
            return quant_shapes(self.quant, self.name, self.out_features, self.in_features)
        return {f"{self.name}.weight": (self.out_features, self.in_features)}

    def load_hf(self, name: str, full: torch.Tensor) -> None:
        if self.quant is not None:
            kind = name.rpartition(".")[2]
            shapes = self.hf_shapes()
            if name not in shapes:
                raise KeyError(name)
            cols = (self.parallel.rank * self.local_in, self.local_in)
            self._loader.add(self.name, kind, full, len(shapes), cols=cols)
            return
        if name != f"{self.name}.weight":
            raise KeyError(name)
        with torch.no_grad():
            self.weight.copy_(full.narrow(1, self.parallel.rank * self.local_in, self.local_in))

    def hf_tensor(self, name: str) -> torch.Tensor:
        _check_single(self.parallel)
        if name != f"{self.name}.weight" or not isinstance(self.weight, nn.Parameter):
            raise KeyError(name)
        return self.weight.detach()

    def forward(self, x: torch.Tensor, silu_mul: bool = False) -> torch.Tensor:
        """x @ weight.T summed over ranks; with `silu_mul`, x is a merged [rows, 2 * in] gate_up output
        and the product is of SiLU(gate) * up (computed in the same kernel for single-row batches)."""
        fast = self.parallel.fast_all_reduce
        if fast is not None and x.dim() == 2 and x.is_cuda:
            # the product written straight into the shared buffer
            reduced = fast.linear(x, self.weight, silu_mul=silu_mul, slot=self.reduce_slot)
            if reduced is not None:
                return reduced
        product = ops.silu_mul_linear(x, self.weight) if silu_mul else ops.linear(x, self.weight)
        return all_reduce(product, self.parallel, self.reduce_slot)


class _VocabParallel(ParallelModule):
    """Vocabulary rows split over ranks, padded with zero rows up to a multiple of the world size."""

    DEFAULT_NAME: str  # the Hugging Face module name of each subclass

    def __init__(
        self, vocab_size: int, hidden_size: int, name: str | None = None, parallel: ParallelState = SINGLE
    ) -> None:
        super().__init__()
        self.parallel, self.name = parallel, self.DEFAULT_NAME if name is None else name
        self.vocab_size, self.hidden_size = vocab_size, hidden_size
        self.local_vocab = -(-vocab_size // parallel.world_size)
        self.vocab_start = parallel.rank * self.local_vocab
        self.weight = nn.Parameter(torch.empty(self.local_vocab, hidden_size))

    def hf_shapes(self) -> dict[str, tuple[int, ...]]:
        return {f"{self.name}.weight": (self.vocab_size, self.hidden_size)}

    def load_hf(self, name: str, full: torch.Tensor) -> None:
        if name != f"{self.name}.weight":
            raise KeyError(name)
        rows = max(0, min(self.local_vocab, self.vocab_size - self.vocab_start))
        with torch.no_grad():
            self.weight[rows:].zero_()
            self.weight[:rows].copy_(full.narrow(0, self.vocab_start, rows))

    def hf_tensor(self, name: str) -> torch.Tensor:
        _check_single(self.parallel)
        if name != f"{self.name}.weight":
            raise KeyError(name)
        return self.weight.detach()


class VocabParallelEmbedding(_VocabParallel):
    DEFAULT_NAME = "embed_tokens"

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if not self.parallel.is_parallel:
            return F.embedding(ids, self.weight)
        # fixed shapes (CUDA-graph safe): ids outside this rank's rows look up row 0 and are zeroed
        local = ids - self.vocab_start
        mine = (local >= 0) & (local < self.local_vocab)
        out = F.embedding(torch.where(mine, local, 0), self.weight)
        out = out * mine.unsqueeze(-1).to(out.dtype)
        return all_reduce(out, self.parallel, EMBED_SLOT)


class ParallelLMHead(_VocabParallel):
    """hidden -> logits over the whole vocabulary on every rank (local logits all-gathered)."""

    DEFAULT_NAME = "lm_head"

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if not self.parallel.is_parallel:
            return ops.linear(hidden, self.weight)  # single-row decode: the fused GEMV (faster on the H200)
        logits = F.linear(hidden, self.weight)
        return all_gather(logits, self.parallel, dim=-1)[..., : self.vocab_size]
