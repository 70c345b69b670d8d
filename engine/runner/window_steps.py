"""Decode windows on ModelRunner (multi_step.py): steps back to back on the device, each fed the
tokens the step before chose, with one host sync at the end."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from llmdeploy_engine.core.forward_batch import ForwardBatch
from llmdeploy_engine.kernels.attention import build_attention_metadata
from llmdeploy_engine.model.sampler import WindowSampler
from llmdeploy_engine.runner.multi_step import (
    DecodeWindow,
    check_decode_window,
    check_follow_rows,
    step_batch,
)
from llmdeploy_engine.sampling_params import SamplingParams


class WindowSteps:
    """ModelRunner's window methods (a mixin: they share its model, KV caches and device)."""

    if TYPE_CHECKING:
        model: Any
        kv_caches: Any
        device: torch.device
        block_size: int
        max_model_len: int
        model_config: Any

    @torch.inference_mode()
    def execute_multi_step(
        self,
        batch: ForwardBatch,
        num_steps: int,
        params: list[SamplingParams] | None = None,
        seed: int | None = None,
    ) -> list[list[int]]:
        """A decode window (multi_step.py): `num_steps` steps back to back, each fed the tokens the
        previous step chose on the device (argmax, or with `params` per sequence and a `seed`,
        `WindowSampler`'s draws); returns the ids [num_steps][num_seqs] after one sync. Each step
        computes what `execute` computes for it, so greedy tokens are those of single steps."""
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
        """`execute_multi_step` without waiting for the ids (multi_step.py, asynchronous windows).
        With `follow` (a window launched before, not yet read), row i's step-0 input is row
        follow_rows[i] of its last step's ids, on the device; batch.input_ids are not read."""
        cap = self.max_model_len - 1  # a sequence at the longest context repeats its last step
        check_decode_window(batch, num_steps, self.block_size, cap)
        check_follow_rows(follow, follow_rows, batch.num_seqs)
        if follow is None:
            ids = torch.tensor(batch.input_ids, dtype=torch.long).to(self.device, non_blocking=True)
        else:
            rows = torch.tensor(follow_rows, dtype=torch.long).to(self.device, non_blocking=True)
            ids = torch.index_select(follow.last_ids, 0, rows)
        sampled = torch.empty(num_steps, batch.num_seqs, dtype=torch.long, device=self.device)
        sampler = WindowSampler(params, self.model_config.vocab_size, self.device, seed)
        for k in range(num_steps):
            step = step_batch(batch, k, self.block_size, cap)
            positions = torch.tensor(step.positions, dtype=torch.long).to(self.device, non_blocking=True)
            meta = build_attention_metadata(step, self.block_size, self.device)
            hidden = self.model(ids, positions, meta, self.kv_caches)
            sampler.sample(self.model.compute_logits(hidden), sampled[k])
            ids = sampled[k]
        return device_window(sampled)


def device_window(sampled: torch.Tensor) -> DecodeWindow:
    """A DecodeWindow for ids just queued on their device: on CUDA with a pinned copy queued now and
    an event after it (`result()` then waits for this window only); elsewhere the tensor itself."""
    if not sampled.is_cuda:
        return DecodeWindow(sampled)
    host = torch.empty(sampled.shape, dtype=sampled.dtype, pin_memory=True)
    host.copy_(sampled, non_blocking=True)
    ready = torch.cuda.Event()
    ready.record()
    return DecodeWindow(sampled, host, ready)
