"""triton_pdl's switch: programmatic dependent launch only for CUDA tensors on sm_90+, never under the
Triton interpreter (the GPU race test is tests/engine_gpu/test_pdl_gpu.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

pytest.importorskip("triton")
from llmdeploy_engine.kernels import triton_pdl


@pytest.fixture(autouse=True)
def _fresh_switch() -> Iterator[None]:
    triton_pdl._switched_on.cache_clear()
    yield
    triton_pdl._switched_on.cache_clear()


def test_cpu_tensors_never_use_pdl(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert triton_pdl._switched_on()
    x = torch.zeros(2)
    assert not triton_pdl.enabled(x)
    assert triton_pdl.launch_args(x) == {"USE_PDL": False}


def test_switched_off_under_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not triton_pdl._switched_on()


def test_launch_args_on_a_capable_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the switch on and an sm_90 device the launch carries Triton's launch_pdl option."""
    monkeypatch.setattr(triton_pdl, "_switched_on", lambda: True)
    monkeypatch.setattr(triton_pdl, "_capable", lambda index: index == 0)

    class FakeCuda:
        device = torch.device("cuda", 0)

    assert triton_pdl.launch_args(FakeCuda()) == {"USE_PDL": True, "launch_pdl": True}  # type: ignore[arg-type]
    FakeCuda.device = torch.device("cuda", 1)
    assert triton_pdl.launch_args(FakeCuda()) == {"USE_PDL": False}  # type: ignore[arg-type]
