"""Decode windows replayed from CUDA graphs (CudaGraphRunner's multi-step half; cuda_graph_runner.py's
docstring describes them)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from llmdeploy_engine.core.forward_batch import ForwardBatch
from llmdeploy_engine.model.sampler import WindowSampler
from llmdeploy_engine.runner.graph_inputs import (
    PackedTables,
    pack_decode_window,
    packed_tables,
    window_size,
)
from llmdeploy_engine.runner.multi_step import (
    DecodeWindow,
    check_decode_window,
    check_follow_rows,
    last_step_batch,
)
from llmdeploy_engine.runner.window_steps import device_window
from llmdeploy_engine.sampling_params import SamplingParams


class GraphWindows:
    """CudaGraphRunner's window methods (a mixin: they share its graphs, buffers and wrapped runner)."""

    if TYPE_CHECKING:
        runner: Any
        block_size: int
        padding_block: int | None
        num_replays: int
        _packed: PackedTables | None
        _window_host: torch.Tensor
        _window_dev: torch.Tensor | None
        _window_copied: Any

        def _pick(self, batch: ForwardBatch) -> Any: ...

    @torch.inference_mode()
    def execute_multi_step(
        self,
        batch: ForwardBatch,
        num_steps: int,
        params: list[SamplingParams] | None = None,
        seed: int | None = None,
    ) -> list[list[int]]:
        """A decode window (multi_step.py): num_steps steps replayed from one graph, each fed the
        tokens the previous step chose on the device (as ModelRunner.execute_multi_step: argmax, or
        `WindowSampler` draws after the replay); the ids [num_steps][num_seqs] after one sync.
        Batches no graph serves run the wrapped runner's eager window."""
        return self.launch_multi_step(batch, num_steps, params, seed).result()

    @torch.inference_mode()
    def launch_multi_step(
        self,
        batch: ForwardBatch,
        num_steps: int,
        params: list[SamplingParams] | None = None,
        seed: int | None = None,
        follow: DecodeWindow | None = None,
        follow_rows: list[int] | None = None,
    ) -> DecodeWindow:
        """`execute_multi_step` without waiting for the ids (as ModelRunner.launch_multi_step). With
        `follow`, step 0's ids are gathered from its last step's ids on the device (padding rows take
        row 0's source row, so they keep repeating row 0)."""
        cap = self.runner.max_model_len - 1  # a sequence at the longest context repeats its last step
        check_decode_window(batch, num_steps, self.block_size, cap)
        check_follow_rows(follow, follow_rows, batch.num_seqs)
        g = self._pick(last_step_batch(batch, num_steps, cap))
        if g is None:
            window: DecodeWindow = self.runner.launch_multi_step(
                batch, num_steps, params, seed, follow, follow_rows
            )
            return window
        n, b, nb = batch.num_seqs, g.batch_size, g.num_blocks
        step0 = b * (4 + nb)
        size = window_size(b, nb, num_steps)
        total = size + (b if follow is not None else 0)
        host = self._window_buffer(total)
        prev = self._packed if follow is not None and self._packed is not None else None
        following = (prev, follow_rows) if prev is not None and prev.window is follow else None
        pack_decode_window(host, batch, num_steps, b, nb, self.block_size, cap, self.padding_block, following)
        if follow_rows is not None:
            host[size : size + n] = follow_rows
            host[size + n : total] = follow_rows[0]
        if self._window_dev is None or self._window_dev.numel() < total:
            self._window_dev = torch.empty(
                self._window_host.numel(), dtype=torch.long, device=g.packed.device
            )
        dev = self._window_dev[:total]
        dev.copy_(self._window_host[:total], non_blocking=True)
        self._window_copied.record()
        gather = dev[step0 : step0 + b]
        later_dev = dev[step0 + b : size].view(max(num_steps - 1, 0), 3 * b)
        sampled = torch.empty(num_steps, n, dtype=torch.long, device=g.packed.device)
        sampler = WindowSampler(params, self.runner.model_config.vocab_size, g.packed.device, seed)
        g.packed.copy_(dev[:step0])
        if follow is not None:
            torch.index_select(follow.last_ids, 0, dev[size:total], out=g.ids)
        for k in range(num_steps):
            if k:
                g.packed[b : 4 * b].copy_(later_dev[k - 1])
                torch.index_select(sampled[k - 1], 0, gather, out=g.ids)
            g.graph.replay()
            if g.logits is not None:
                logits = g.logits[:n]
            else:
                assert g.hidden is not None
                logits = self.runner.model.compute_logits(g.hidden[:n])
            sampler.sample(logits, sampled[k])
        self.num_replays += num_steps
        window = device_window(sampled)
        self._packed = packed_tables(window, host[4 * b : 4 * b + n * nb].reshape(n, nb), batch)
        return window

    def _window_buffer(self, size: int) -> np.ndarray:
        """The window's pinned host buffer as numpy, at least `size` long, once the previous window's
        copy has left it."""
        self._window_copied.synchronize()
        if self._window_host.numel() < size:
            self._window_host = torch.zeros(size, dtype=torch.long, pin_memory=True)
        return self._window_host.numpy()
