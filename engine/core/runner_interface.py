"""What LLMEngine calls on its runner: the one interface ModelRunner, CudaGraphRunner and
TensorParallelDriver implement (and test fakes subclass).

`execute` is required. A runner that runs decode windows (multi_step.py) overrides
`execute_multi_step` and, for asynchronous windows, `launch_multi_step` (ModelRunner and
CudaGraphRunner, as `WindowRunner`s, hand them to the window executor they hold:
runner/window_executor.py); a runner around another one (CudaGraphRunner, TensorParallelDriver)
takes the values below from it with `take_values`; `runs_windows` and
`launches_windows` say whether it did, so the engine asks the interface instead of probing attributes.
Torch-free: the engine's batching core and its fakes use it without a device.
"""

from __future__ import annotations

from typing import Any


class Runner:
    num_kv_blocks: int
    block_size: int
    max_model_len: int
    device: Any = "cpu"  # a torch.device, or "cpu" for runners without one
    # the most tokens a step may hold (the runner profiled its activation memory for them); None: any
    max_num_batched_tokens: int | None = None
    # execute_multi_step / launch_multi_step take per-sequence params and a seed (sampling on the
    # device), not only argmax
    multi_step_sampling: bool = False
    model_config: Any = None  # the model's ModelConfig, when the runner has a model
    startup_report: Any = None

    def execute(self, batch: Any) -> Any:
        """Float32 logits [len(batch.logit_rows()), vocab]; writes the new K/V to batch.slot_mapping."""
        raise NotImplementedError

    def execute_multi_step(
        self, batch: Any, num_steps: int, params: Any = None, seed: int | None = None
    ) -> list[list[int]]:
        """A decode window: the ids [num_steps][num_seqs] after one host sync (multi_step.py)."""
        raise NotImplementedError(f"{type(self).__name__} runs no decode windows")

    def launch_multi_step(
        self,
        batch: Any,
        num_steps: int,
        params: Any = None,
        seed: int | None = None,
        follow: Any = None,
        follow_rows: list[int] | None = None,
    ) -> Any:
        """`execute_multi_step` without waiting: a DecodeWindow whose `result()` gives the ids."""
        raise NotImplementedError(f"{type(self).__name__} launches no decode windows")

    def take_values(self, runner: Runner) -> None:
        """A runner around another one (CudaGraphRunner, TensorParallelDriver) takes its values."""
        self.block_size = runner.block_size
        self.device = runner.device
        self.num_kv_blocks = runner.num_kv_blocks
        self.max_model_len = runner.max_model_len
        self.max_num_batched_tokens = runner.max_num_batched_tokens
        self.model_config = runner.model_config

    @property
    def runs_windows(self) -> bool:
        return type(self).execute_multi_step is not Runner.execute_multi_step

    @property
    def launches_windows(self) -> bool:
        return type(self).launch_multi_step is not Runner.launch_multi_step

    def close(self) -> None:
        """Release what the runner holds (tensor-parallel workers, graphs); unusable after."""


class WindowRunner(Runner):
    """A runner that hands its decode windows to the window executor it holds as `windows`
    (runner/window_executor.py: EagerWindows in ModelRunner, GraphWindows in CudaGraphRunner)."""

    windows: Any

    def execute_multi_step(
        self, batch: Any, num_steps: int, params: Any = None, seed: int | None = None
    ) -> list[list[int]]:
        result: list[list[int]] = self.windows.run(batch, num_steps, params, seed)
        return result

    def launch_multi_step(
        self,
        batch: Any,
        num_steps: int,
        params: Any = None,
        seed: int | None = None,
        follow: Any = None,
        follow_rows: list[int] | None = None,
    ) -> Any:
        return self.windows.launch(batch, num_steps, params, seed, follow, follow_rows)
