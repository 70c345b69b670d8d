"""triton_pdl's switch: programmatic dependent launch only for CUDA tensors on sm_90+, never under the
Triton interpreter, off with LLMDEPLOY_PDL=0 (the GPU race test is tests/engine_gpu/test_pdl_gpu.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

pytest.importorskip("triton")
from llmdeploy_engine import triton_pdl


@pytest.fixture(autouse=True)
def _fresh_switch() -> Iterator[None]:
    triton_pdl._switched_on.cache_clear()
    yield
    triton_pdl._switched_on.cache_clear()


def test_cpu_tensors_never_use_pdl(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LLMDEPLOY_PDL", raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert triton_pdl._switched_on()
    x = torch.zeros(2)
    assert not triton_pdl.enabled(x)
    assert triton_pdl.launch_args(x) == {"USE_PDL": False}


@pytest.mark.parametrize("env", [{"LLMDEPLOY_PDL": "0"}, {"TRITON_INTERPRET": "1"}])
def test_switched_off(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    monkeypatch.delenv("LLMDEPLOY_PDL", raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
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


def test_gemv_l2_prefetch_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GEMV's L2 prefetch (only under PDL): the leading whole 128-byte lines of every weight row
    within the byte budget, as a power of two of lines for the kernel; none when it is off, without
    PDL, or when the budget does not reach one line a row."""
    from llmdeploy_engine import triton_gemv

    monkeypatch.setattr(triton_gemv, "L2_PREFETCH_BYTES", 24 * 2**20)
    # Llama-3.1-8B o_proj (4096 x 4096, bf16): 24 MiB / 4096 rows = 6 KiB = 3072 columns = 48 lines
    assert triton_gemv._l2_prefetch(4096, 4096, 2, True) == (3072, 64, 64)
    # a small matrix is prefetched whole: K = 896 is 14 lines
    assert triton_gemv._l2_prefetch(896, 896, 2, True) == (896, 16, 64)
    # the 8B LM head: 24 MiB over 128256 rows is 196 bytes a row: one line
    assert triton_gemv._l2_prefetch(128256, 4096, 2, True) == (64, 1, 64)
    # float32 weights: 32 elements a line
    assert triton_gemv._l2_prefetch(64, 100, 4, True) == (96, 4, 32)
    assert triton_gemv._l2_prefetch(4096, 4096, 2, False)[1] == 0
    monkeypatch.setattr(triton_gemv, "L2_PREFETCH_BYTES", 2**20)
    assert triton_gemv._l2_prefetch(128256, 4096, 2, True)[1] == 0  # 8 bytes a row: no whole line
    monkeypatch.setattr(triton_gemv, "L2_PREFETCH_BYTES", 0)
    assert triton_gemv._l2_prefetch(4096, 4096, 2, True)[1] == 0
