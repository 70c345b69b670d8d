"""GraphWindows: CudaGraphRunner's decode-window executor, replaying one CUDA graph per step
(cuda_graph_runner.py's docstring describes them). Batches no graph serves run the wrapped runner's
eager window."""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np
import torch
from llmdeploy_engine.core.forward_batch import ForwardBatch
from llmdeploy_engine.runner.graph_inputs import (
    PackedTables,
    pack_decode_window,
    packed_tables,
    window_size,
)
from llmdeploy_engine.runner.multi_step import DecodeWindow, last_step_batch
from llmdeploy_engine.runner.window_executor import (
    Following,
    Sampling,
    WindowExecutor,
    device_window,
    window_outputs,
)


class GraphWindows(WindowExecutor):
    """Runs windows on the graphs of `graphs` (a CudaGraphRunner: its `_pick`, padding block and
    replay count); owns the windows' pinned host buffer, its device copy and event, and the last
    window's packed block tables."""

    def __init__(self, graphs: Any) -> None:
        # a proxy: the graph runner holds this executor, and a cycle would keep a dropped engine's
        # graphs and KV cache until the cyclic collector runs
        self.graphs = weakref.proxy(graphs)
        self.block_size: int = graphs.block_size
        # their own pinned buffer (grown on demand), event and device copy
        self._window_host = torch.zeros(0, dtype=torch.long)
        self._window_dev: torch.Tensor | None = None
        self._window_copied = torch.cuda.Event()
        self._packed: PackedTables | None = None  # the last window's block tables

    def max_position(self) -> int:
        return int(self.graphs.runner.max_model_len) - 1

    def _steps(
        self, batch: ForwardBatch, num_steps: int, cap: int, sampling: Sampling, following: Following
    ) -> DecodeWindow:
        """num_steps steps replayed from one graph, picked for the window's last step. With `follow`,
        step 0's ids are gathered from its last step's ids on the device (padding rows take row 0's
        source row, so they keep repeating row 0)."""
        (params, seed), (follow, follow_rows) = sampling, following
        graphs = self.graphs
        g = graphs._pick(last_step_batch(batch, num_steps, cap))
        if g is None:
            window: DecodeWindow = graphs.runner.launch_multi_step(
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
        pack_decode_window(
            host, batch, num_steps, b, nb, self.block_size, cap, graphs.padding_block, following
        )
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
        vocab = graphs.runner.model_config.vocab_size
        sampled, sampler = window_outputs(num_steps, n, params, vocab, g.packed.device, seed)
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
                logits = graphs.runner.model.compute_logits(g.hidden[:n])
            sampler.sample(logits, sampled[k])
        graphs.num_replays += num_steps
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
