"""Torch threads of each CPU step: fewer for decode-sized steps while a server streams the tokens.

A decode step of a small model is a few thousand short ops, each run on one thread (they are below
torch's parallel grain) between memory-bound quantized GEMVs. When `llmdeploy-engine serve` streams
the tokens, its event loop needs a core in every step; an OpenMP team as large as the machine then
waits at each barrier for the worker the event loop displaced. On 2 cores a single stream decoded
at 52.6 tok/s on 2 threads and 75.8 on 1 (docs/performance.md), while 512-token prefills, which are
compute-bound GEMMs, want every core. So steps of `PARALLEL_STEP_TOKENS` tokens or more run on all
threads and smaller ones on `decode_threads`, but for the LM head: one GEMV over the whole vocabulary
(49,152 x 576 for the default model, 1.6 ms on one thread and 0.95 on two), a single parallel
region per step that paid for itself in every paired run (single stream and 8 streams).
"""

from __future__ import annotations

import torch

# from this many tokens a step's GEMMs are compute-bound (the CPU kernels' dequantize-once path,
# cpu_quant.CPU_DEQUANT_ROWS), so it runs on every thread
PARALLEL_STEP_TOKENS = 32


class CpuThreads:
    """Sets torch's intra-op threads before each CPU step (a no-op when the count does not change)."""

    def __init__(self, all_threads: int, decode_threads: int) -> None:
        if all_threads < 1 or decode_threads < 1:
            raise ValueError(f"CPU threads must be >= 1 (got {all_threads} and {decode_threads})")
        self.all_threads = all_threads
        self.decode_threads = min(decode_threads, all_threads)

    @classmethod
    def from_config(cls, cpu_threads: int | None, cpu_decode_threads: int | None) -> CpuThreads:
        """cpu_threads: every step's threads (None: torch's count at start, OMP_NUM_THREADS or the
        cores); cpu_decode_threads: decode-sized steps' threads when cpu_threads is unset (None: all)."""
        if cpu_threads is not None:
            return cls(cpu_threads, cpu_threads)
        total = torch.get_num_threads()
        return cls(total, total if cpu_decode_threads is None else cpu_decode_threads)

    def threads_for(self, num_tokens: int) -> int:
        return self.all_threads if num_tokens >= PARALLEL_STEP_TOKENS else self.decode_threads

    def apply(self, num_tokens: int) -> None:
        threads = self.threads_for(num_tokens)
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)

    def apply_all(self) -> None:
        if torch.get_num_threads() != self.all_threads:
            torch.set_num_threads(self.all_threads)

    def describe(self) -> str:
        if self.decode_threads == self.all_threads:
            return f"{self.all_threads} torch thread(s)"
        return (
            f"{self.all_threads} torch threads, {self.decode_threads} for steps under "
            f"{PARALLEL_STEP_TOKENS} tokens but for the LM head"
        )
