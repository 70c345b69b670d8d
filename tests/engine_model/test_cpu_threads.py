"""CPU step threads (runner/cpu_threads.py): decode-sized steps on their own count, prefills on all."""

from __future__ import annotations

import pytest
import torch
from llmdeploy_engine.config import EngineConfig
from llmdeploy_engine.runner.cpu_threads import PARALLEL_STEP_TOKENS, CpuThreads


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_decode_sized_steps_take_the_decode_count_and_larger_ones_all(restore_threads) -> None:
    policy = CpuThreads(all_threads=2, decode_threads=1)
    policy.apply(1)
    assert torch.get_num_threads() == 1
    policy.apply(PARALLEL_STEP_TOKENS - 1)
    assert torch.get_num_threads() == 1
    policy.apply(PARALLEL_STEP_TOKENS)
    assert torch.get_num_threads() == 2
    policy.apply(8)
    assert torch.get_num_threads() == 1
    policy.apply_all()  # the LM head of any step
    assert torch.get_num_threads() == 2


def test_a_fixed_count_holds_for_every_step_and_unset_keeps_torchs(restore_threads) -> None:
    fixed = CpuThreads.from_config(cpu_threads=1, cpu_decode_threads=None)
    assert (fixed.threads_for(1), fixed.threads_for(512)) == (1, 1)
    torch.set_num_threads(2)
    unset = CpuThreads.from_config(cpu_threads=None, cpu_decode_threads=None)
    assert (unset.threads_for(1), unset.threads_for(512)) == (2, 2)
    capped = CpuThreads.from_config(cpu_threads=None, cpu_decode_threads=8)
    assert capped.threads_for(1) == 2  # never more than the prefill count
    assert "1 for steps under" in CpuThreads(2, 1).describe()


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "2"])
def test_thread_counts_must_be_whole_and_positive(bad) -> None:
    with pytest.raises(ValueError, match="cpu_decode_threads must be a whole number"):
        EngineConfig(model="random:x", cpu_decode_threads=bad)
    with pytest.raises(ValueError, match="cpu_threads must be a whole number"):
        EngineConfig(model="random:x", cpu_threads=bad)
