"""Multi-step decoding with tensor parallelism on CPU (gloo, 2 processes): rank 0 sends each window
to the worker, which runs the same window; greedy tokens match tp=1 with one step per call."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from llmdeploy_engine.llm import LLM
from llmdeploy_engine.llm_engine import LLMEngine
from llmdeploy_engine.sampling_params import SamplingParams
from test_tensor_parallel import engine_config, save_model

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    return save_model(tmp_path_factory.mktemp("tp-multi"), "qwen2-kv2")


def test_tp2_windows_match_tp1_single_steps(checkpoint: Path) -> None:
    """Synchronous and asynchronous windows, one-step asynchronous windows too (the worker follows
    its own last window on its device)."""
    params = SamplingParams(temperature=0, max_tokens=19, ignore_eos=True)
    prompts = ["Hello, my name is", "The capital of France is", "tensor parallel"]

    def run(tp: int, steps: int, asynchronous: bool = True) -> tuple[list[list[int]], list[int]]:
        engine = LLMEngine(
            engine_config(checkpoint, tp, num_scheduler_steps=steps, async_scheduling=asynchronous)
        )
        windows: list[int] = []
        if steps > 1 or asynchronous:
            name = "launch_multi_step" if asynchronous else "execute_multi_step"
            inner = getattr(engine.runner, name)

            def counting(batch, n, *args):  # type: ignore[no-untyped-def]
                windows.append(n)
                return inner(batch, n, *args)

            setattr(engine.runner, name, counting)
        try:
            outs = LLM.from_engine(engine).generate(prompts, params, use_tqdm=False)
        finally:
            engine.close()
        return [list(o.outputs[0].token_ids) for o in outs], windows

    ref, _ = run(1, 1, False)
    for steps, asynchronous in ((4, False), (4, True), (1, True)):  # (1, True): one-step windows
        got, windows = run(2, steps, asynchronous)
        assert windows and max(windows) == steps
        assert got == ref


def test_tp2_sampled_windows_match_tp1(checkpoint: Path) -> None:
    """Rank 1 draws with the window's seed too: a sampled request's tokens are those of tp=1 windows
    with the same seeds (float32, so the logits agree far below the draws' resolution)."""
    prompts = ["Hello, my name is", "tensor parallel"]
    params = [
        SamplingParams(temperature=0.9, top_k=50, max_tokens=17, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=17, ignore_eos=True),
    ]

    def run(tp: int) -> list[list[int]]:
        engine = LLMEngine(engine_config(checkpoint, tp, num_scheduler_steps=4))
        try:
            torch.manual_seed(5)
            outs = LLM.from_engine(engine).generate(prompts, params, use_tqdm=False)
        finally:
            engine.close()
        return [list(o.outputs[0].token_ids) for o in outs]

    assert run(2) == run(1)
