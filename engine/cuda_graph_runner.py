"""CUDA graphs for decode steps: capture the model's forward once per (batch size, context bucket) at
start-up, then replay it for pure-decode batches; everything else runs eagerly through ModelRunner.
LLMEngine wraps its CUDA runner in this unless `enforce_eager` is set.

Why: an eager decode step launches about 50 kernels per layer from Python, and on the H200 the host
takes ~15-30 us per launch while each kernel runs ~2 us (docs/gpu-notes.md), so single-stream decode
is bound by the host. A replay launches the whole step at once.

Shapes are fixed per graph: the batch is padded up to the next captured batch size and decode
contexts to the bucket's number of KV blocks (masked, as the eager path pads to the longest context).
Padding rows repeat row 0 (same token, position, slot and block table): they recompute and rewrite
row 0's K/V into row 0's own slot, so no other sequence's cache is touched; their outputs are dropped.
Logits are computed eagerly from the graph's hidden states (one matmul), so graphs hold no
vocabulary-sized buffers.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import torch
from llmdeploy_engine.attention import AttentionMetadata
from llmdeploy_engine.forward_batch import ForwardBatch

DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
logger = logging.getLogger("llmdeploy_engine")


@dataclass(frozen=True)
class CaptureReport:
    num_graphs: int
    capture_time_s: float
    memory_bytes: int  # device memory reserved by the graphs' pool (and capture) beyond what was there

    def log_line(self) -> str:
        return (
            f"Captured {self.num_graphs} CUDA graphs for decode in {self.capture_time_s:.2f} s, "
            f"{self.memory_bytes / 2**30:.2f} GiB"
        )


class _DecodeGraph:
    """Static inputs (one packed int64 buffer, so a step needs one host-to-device copy) and the graph."""

    def __init__(self, batch_size: int, num_blocks: int, block_size: int, device: torch.device) -> None:
        self.batch_size, self.num_blocks = batch_size, num_blocks
        b = batch_size
        self.packed = torch.zeros(b * (4 + num_blocks), dtype=torch.long, device=device)
        self.ids, self.positions = self.packed[:b], self.packed[b : 2 * b]
        self.slots, self.lengths = self.packed[2 * b : 3 * b], self.packed[3 * b : 4 * b]
        self.blocks = self.packed[4 * b :]
        self.token_index = torch.arange(b, device=device)
        self.key_pos = torch.arange(num_blocks * block_size, device=device)
        self.lengths.fill_(1)
        self.graph = torch.cuda.CUDAGraph()
        self.hidden: torch.Tensor | None = None

    def meta(self) -> AttentionMetadata:
        mask = self.key_pos[None, :] < self.lengths[:, None]
        return AttentionMetadata(
            slot_mapping=self.slots,
            decode_token_index=self.token_index,
            decode_blocks=self.blocks,
            decode_mask=mask[:, None, None, :],
            prefills=(),
        )


class CudaGraphRunner:
    """Wraps a CUDA ModelRunner; `execute` has the runner's contract. Other attributes pass through."""

    def __init__(
        self,
        runner: Any,
        batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES,
        max_blocks: int | None = None,
    ) -> None:
        if runner.device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device")
        self.runner = runner
        self.block_size: int = runner.block_size
        top = max_blocks or -(-runner.max_model_len // self.block_size)
        buckets = [8]
        while buckets[-1] < top:
            buckets.append(buckets[-1] * 2)
        buckets[-1] = top if top > 8 else buckets[-1]
        self.block_buckets = tuple(buckets)
        self.batch_sizes = tuple(b for b in batch_sizes if b <= runner.config.max_num_seqs)
        self.graphs: dict[tuple[int, int], _DecodeGraph] = {}
        self.num_replays = 0
        self.report = self._capture_all()
        logger.info(self.report.log_line())

    def __getattr__(self, name: str) -> Any:
        return getattr(self.runner, name)

    @torch.inference_mode()
    def _capture_all(self) -> CaptureReport:
        device = self.runner.device
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_reserved(device)
        start = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        # largest first, so smaller graphs reuse the pool's blocks
        for b in sorted(self.batch_sizes, reverse=True):
            for nb in sorted(self.block_buckets, reverse=True):
                g = _DecodeGraph(b, nb, self.block_size, device)
                side = torch.cuda.Stream(device)
                side.wait_stream(torch.cuda.current_stream(device))
                with torch.cuda.stream(side):  # warm-up outside the capture (library handles, workspaces)
                    self._forward(g)
                torch.cuda.current_stream(device).wait_stream(side)
                with torch.cuda.graph(g.graph, pool=pool):
                    g.hidden = self._forward(g)
                self.graphs[(b, nb)] = g
        torch.cuda.synchronize(device)
        return CaptureReport(
            len(self.graphs), time.perf_counter() - start, torch.cuda.memory_reserved(device) - before
        )

    def _forward(self, g: _DecodeGraph) -> torch.Tensor:
        out: torch.Tensor = self.runner.model(g.ids, g.positions, g.meta(), self.runner.kv_caches)
        return out

    def _pick(self, batch: ForwardBatch) -> _DecodeGraph | None:
        n = batch.num_seqs
        if n == 0 or any(q != 1 for q in batch.query_len) or any(c <= 1 for c in batch.context_len):
            return None
        if batch.sample_indices != list(range(n)) or batch.num_logits is not None:
            return None
        need = -(-max(batch.context_len) // self.block_size)
        b = next((s for s in self.batch_sizes if s >= n), None)
        nb = next((s for s in self.block_buckets if s >= need), None)
        return None if b is None or nb is None else self.graphs[(b, nb)]

    @torch.inference_mode()
    def execute(self, batch: ForwardBatch) -> torch.Tensor:
        """float32 logits [len(batch.sample_indices), vocab], as ModelRunner.execute."""
        g = self._pick(batch)
        if g is None:
            result: torch.Tensor = self.runner.execute(batch)
            return result
        n, b, nb = batch.num_seqs, g.batch_size, g.num_blocks
        pad = b - n
        tables = []
        for table in batch.block_tables + [batch.block_tables[0]] * pad:
            row = table[:nb]
            tables += row + [0] * (nb - len(row))
        packed = (
            batch.input_ids + [batch.input_ids[0]] * pad
            + batch.positions + [batch.positions[0]] * pad
            + batch.slot_mapping + [batch.slot_mapping[0]] * pad
            + batch.context_len + [batch.context_len[0]] * pad
            + tables
        )  # fmt: skip
        g.packed.copy_(torch.tensor(packed, dtype=torch.long), non_blocking=True)
        g.graph.replay()
        self.num_replays += 1
        assert g.hidden is not None
        logits: torch.Tensor = self.runner.model.compute_logits(g.hidden[:n])
        return logits
