"""One captured CUDA graph of CudaGraphRunner (its static inputs and outputs), and the report of
capturing them all."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from llmdeploy_engine.kernels.attention import AttentionMetadata


@dataclass(frozen=True)
class CaptureReport:
    num_graphs: int
    capture_time_s: float
    memory_bytes: int  # device memory reserved by the graphs' pool (and capture) beyond what was there
    num_prefill_graphs: int = 0  # of num_graphs: the multi-token-row graphs for short prefills

    def log_line(self) -> str:
        prefill = f" (+{self.num_prefill_graphs} for short prefills)" if self.num_prefill_graphs else ""
        return (
            f"Captured {self.num_graphs - self.num_prefill_graphs} CUDA graphs for decode{prefill} in "
            f"{self.capture_time_s:.2f} s, {self.memory_bytes / 2**30:.2f} GiB"
        )


class _DecodeGraph:
    """Static inputs (one packed int64 buffer, so a step needs one host-to-device copy) and the graph."""

    def __init__(
        self, batch_size: int, num_blocks: int, block_size: int, device: torch.device, one_token_per_seq: bool
    ) -> None:
        self.batch_size, self.num_blocks = batch_size, num_blocks
        self.one_token_per_seq = one_token_per_seq
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
        self.logits: torch.Tensor | None = None  # view of the shared logits buffer, if computed inside

    def meta(self) -> AttentionMetadata:
        mask = self.key_pos[None, :] < self.lengths[:, None]
        return AttentionMetadata(
            slot_mapping=self.slots,
            decode_token_index=self.token_index,
            decode_blocks=self.blocks,
            decode_mask=mask[:, None, None, :],
            prefills=(),
            decode_lengths=self.lengths.to(torch.int32),  # inside the capture: once per replay
            decodes_in_order=True,  # token_index is arange(batch_size)
            decode_one_token_per_seq=self.one_token_per_seq,
        )
