"""What ModelRunner's decode CUDA graphs need sized at start-up: the memory set aside for them (the
planner's rule, facts.cuda_graph_bytes), the symmetric buffer and the logits all-gather region their
tensor-parallel collectives use, and the rows whose logits they compute inside the graph."""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Any

import torch


class GraphSizing:
    """ModelRunner's graph-sizing methods (a mixin: they read its config, model shape and dtypes)."""

    if TYPE_CHECKING:
        config: Any
        model_config: Any
        parallel: Any
        device: torch.device
        dtype: torch.dtype
        kv_dtype: torch.dtype
        block_size: int

    def _largest_graph(self) -> int:
        from llmdeploy_engine.facts import cuda_graph_batch_sizes

        return max(cuda_graph_batch_sizes(self.config.max_num_seqs))

    def _symm_mem_bytes(self) -> int:
        """Bytes of the largest all-reduce inside a decode CUDA graph (rows of the largest graph x
        hidden size, float32 at most): the symmetric-memory buffer must take every one of them."""
        return self._largest_graph() * self.model_config.hidden_size * 4

    def _local_vocab(self, tp: int) -> int:
        return -(-self.model_config.vocab_size // tp)  # as the vocabulary-parallel layers split it

    def _gather_bytes(self, tp: int) -> int:
        """One rank's logits (model dtype) for the decode graphs that compute them inside the graph:
        what the push path's all-gather region must take."""
        from llmdeploy_engine.facts import CUDA_GRAPH_LOGITS_MAX_BATCH

        rows = min(CUDA_GRAPH_LOGITS_MAX_BATCH, self._largest_graph())
        return rows * self._local_vocab(tp) * self.dtype.itemsize

    def graph_logits_rows(self) -> int:
        """Rows up to which decode CUDA graphs compute the logits inside the graph (CudaGraphRunner's
        logits_max_batch; the same on every rank). At tp > 1 only with an all-gather that runs inside
        a graph (the push path), as many rows as its region takes; else 0 (logits after the replay)."""
        from llmdeploy_engine.facts import CUDA_GRAPH_LOGITS_MAX_BATCH

        if not self.parallel.is_parallel:
            return CUDA_GRAPH_LOGITS_MAX_BATCH
        fast = self.parallel.fast_all_reduce
        gather_bytes = 0 if fast is None else fast.gather_bytes
        row_bytes = self._local_vocab(self.parallel.world_size) * self.dtype.itemsize
        return min(CUDA_GRAPH_LOGITS_MAX_BATCH, gather_bytes // row_bytes)

    @property
    def graphs_with_tensor_parallel(self) -> bool:
        """Whether decode steps may be captured in CUDA graphs at this tensor-parallel size: always at
        tp 1; at tp > 1 only with the symmetric-memory all-reduce (no NCCL inside a graph)."""
        return not self.parallel.is_parallel or self.parallel.fast_all_reduce is not None

    def _cuda_graph_reserve(self, model_len: int) -> int:
        """Bytes the decode CUDA graphs (captured after the KV cache, see cuda_graph_runner) will take,
        by the planner's builtin rule; 0 when none will be captured."""
        if self.device.type != "cuda" or self.config.enforce_eager:
            return 0
        from llmdeploy_engine import facts

        mc = self.model_config
        # with Triton installed, 16-bit decode attention reads the cache in place (a cache of the
        # model's dtype or fp8); otherwise the pure-torch path gathers copies of the context
        in_place = (
            importlib.util.find_spec("triton") is not None
            and self.dtype in (torch.bfloat16, torch.float16)
            and (self.kv_dtype == self.dtype or self.kv_dtype.itemsize == 1)  # fp8: read in place too
        )
        return facts.cuda_graph_bytes(
            max_num_seqs=self.config.max_num_seqs,
            max_model_len=model_len,
            block_size=self.block_size,
            hidden_size=mc.hidden_size,
            intermediate_size=mc.intermediate_size,
            q_size=mc.q_size,
            kv_size=mc.kv_size,
            vocab_size=mc.vocab_size,
            dtype_bytes=self.dtype.itemsize,
            gathered_kv=not in_place,
        )
