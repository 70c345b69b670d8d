"""EagerWindows: ModelRunner's decode-window executor (multi_step.py): steps back to back on the
device, each run eagerly and fed the tokens the step before chose, with one host sync at the end."""

from __future__ import annotations

import weakref
from typing import Any

import torch
from llmdeploy_engine.core.forward_batch import ForwardBatch
from llmdeploy_engine.kernels.attention import build_attention_metadata
from llmdeploy_engine.runner.multi_step import step_batch
from llmdeploy_engine.runner.window_executor import (
    Following,
    Sampling,
    WindowExecutor,
    device_window,
    window_outputs,
)


class EagerWindows(WindowExecutor):
    """Runs windows on `runner` (a ModelRunner: its model, KV caches and device)."""

    def __init__(self, runner: Any) -> None:
        # a proxy: the runner holds this executor, and a cycle would keep a dropped engine's KV cache
        # until the cyclic collector runs
        self.runner = weakref.proxy(runner)
        self.block_size: int = runner.block_size

    def max_position(self) -> int:
        return int(self.runner.max_model_len) - 1

    def _steps(self, batch: ForwardBatch, n: int, cap: int, sampling: Sampling, following: Following) -> Any:
        num_steps, (params, seed), (follow, follow_rows) = n, sampling, following
        runner = self.runner
        device, bs = runner.device, self.block_size
        if follow is None:
            ids = torch.tensor(batch.input_ids, dtype=torch.long).to(device, non_blocking=True)
        else:
            rows = torch.tensor(follow_rows, dtype=torch.long).to(device, non_blocking=True)
            ids = torch.index_select(follow.last_ids, 0, rows)
        sampled, sampler = window_outputs(
            num_steps, batch.num_seqs, params, runner.model_config.vocab_size, device, seed
        )
        model, kv_caches = runner.model, runner.kv_caches
        for k in range(num_steps):
            step = step_batch(batch, k, bs, cap)
            positions = torch.tensor(step.positions, dtype=torch.long).to(device, non_blocking=True)
            meta = build_attention_metadata(step, bs, device)
            hidden = model(ids, positions, meta, kv_caches)
            sampler.sample(model.compute_logits(hidden), sampled[k])
            ids = sampled[k]
        return device_window(sampled)
