"""WindowExecutor: what the eager and the graph decode-window executors share (multi_step.py describes
a window). `launch` checks the window's batch and, with `follow`, its followed rows, then runs the
executor's own steps (`_steps`); `run` waits for the ids. `window_outputs` and `device_window` give
both executors the same sampled-ids tensor, device sampler and DecodeWindow handle."""

from __future__ import annotations

from typing import Any

import torch
from llmdeploy_engine.core.forward_batch import ForwardBatch
from llmdeploy_engine.model.sampler import WindowSampler
from llmdeploy_engine.runner.multi_step import DecodeWindow, check_decode_window, check_follow_rows
from llmdeploy_engine.sampling_params import SamplingParams

# (per-sequence params, seed) of a window that samples on the device; (followed window, its rows)
Sampling = tuple[list[SamplingParams] | None, int | None]
Following = tuple[DecodeWindow | None, list[int] | None]


class WindowExecutor:
    """Runs decode windows for one runner (an abstract base: each executor keeps its own state)."""

    block_size: int

    def max_position(self) -> int:
        """The runner's max_model_len - 1: a sequence at the longest context repeats its last step."""
        raise NotImplementedError

    @torch.inference_mode()
    def run(
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
        return self.launch(batch, num_steps, params, seed).result()

    @torch.inference_mode()
    def launch(
        self,
        batch: ForwardBatch,
        num_steps: int,
        params: list[SamplingParams] | None = None,
        seed: int | None = None,
        follow: DecodeWindow | None = None,
        follow_rows: list[int] | None = None,
    ) -> DecodeWindow:
        """`run` without waiting for the ids (multi_step.py, asynchronous windows). With `follow` (a
        window launched before, not yet read), row i's step-0 input is row follow_rows[i] of its last
        step's ids, on the device; batch.input_ids are not read."""
        cap = self.max_position()
        check_decode_window(batch, num_steps, self.block_size, cap)
        check_follow_rows(follow, follow_rows, batch.num_seqs)
        return self._steps(batch, num_steps, cap, (params, seed), (follow, follow_rows))

    def _steps(
        self, batch: ForwardBatch, num_steps: int, cap: int, sampling: Sampling, following: Following
    ) -> DecodeWindow:
        """The window's steps, launched: `sampling` is (params, seed), `following` (follow, follow_rows)."""
        raise NotImplementedError


def window_outputs(
    num_steps: int, num_seqs: int, params: Any, vocab_size: int, device: Any, seed: int | None
) -> tuple[torch.Tensor, WindowSampler]:
    """The window's sampled ids [num_steps, num_seqs] on the device, and the sampler that fills them."""
    sampled = torch.empty(num_steps, num_seqs, dtype=torch.long, device=device)
    return sampled, WindowSampler(params, vocab_size, device, seed)


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
