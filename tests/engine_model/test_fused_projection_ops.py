"""The fused-projection ops (ops.linear / add_rms_norm_linear / silu_mul_linear) keep the contract of
the unfused sequence they replace; on the CPU they are that sequence (the GPU kernels are checked
against it in tests/engine_gpu)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from llmdeploy_engine.kernels import ops
from llmdeploy_engine.model.parallel_layers import MergedColumnParallelLinear, RowParallelLinear


def _rand(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_add_rms_norm_linear_is_norm_then_projection() -> None:
    h, res, w, b = _rand(3, 64, seed=0), _rand(3, 64, seed=1), _rand(40, 64, seed=2), _rand(40, seed=3)
    norm_w = 1 + 0.1 * _rand(64, seed=4)
    y, summed = ops.add_rms_norm_linear(h, res, norm_w, 1e-6, w, b)
    normed, want_sum = ops.add_rms_norm(h, res, norm_w, 1e-6)
    assert torch.equal(summed, want_sum) and torch.equal(summed, h + res)
    assert torch.allclose(y, F.linear(normed, w, b))
    y0, s0 = ops.add_rms_norm_linear(h, None, norm_w, 1e-6, w)  # the first layer: no residual yet
    assert s0 is h and torch.allclose(y0, F.linear(ops.rms_norm(h, norm_w, 1e-6), w))


def test_silu_mul_linear_reads_the_merged_gate_up_output() -> None:
    gate_up, w = _rand(5, 2 * 48, seed=5), _rand(32, 48, seed=6)
    y = ops.silu_mul_linear(gate_up, w)
    gate, up = gate_up[:, :48], gate_up[:, 48:]
    assert torch.allclose(y, F.linear(F.silu(gate) * up, w))


def test_linear_writes_into_a_strided_out_view() -> None:
    x, w, b = _rand(4, 32, seed=7), _rand(24, 32, seed=8), _rand(24, seed=9)
    buf = torch.full((4, 40), float("nan"))
    out = buf[:, 8:32]  # row stride 40, as a slice of a larger buffer
    got = ops.linear(x, w, b, out=out)
    assert got.data_ptr() == out.data_ptr()
    assert torch.allclose(out, F.linear(x, w, b)) and torch.isnan(buf[:, :8]).all()
    gate_up = _rand(4, 64, seed=10)
    ops.silu_mul_linear(gate_up, w, out=out)
    assert torch.allclose(out, F.linear(F.silu(gate_up[:, :32]) * gate_up[:, 32:], w))


def test_layers_route_the_norm_and_the_activation_into_their_projections() -> None:
    gate_up_proj = MergedColumnParallelLinear(16, 24, ("gate_proj", "up_proj"))
    down = RowParallelLinear(24, 16, "down_proj")
    with torch.no_grad():
        gate_up_proj.weight.copy_(_rand(48, 16, seed=11))
        down.weight.copy_(_rand(16, 24, seed=12))
    h, res, norm_w = _rand(2, 16, seed=13), _rand(2, 16, seed=14), 1 + 0.1 * _rand(16, seed=15)
    merged, summed = gate_up_proj.forward_normed(h, res, norm_w, 1e-5)
    normed, _ = ops.add_rms_norm(h, res, norm_w, 1e-5)
    gate, up = gate_up_proj(normed)  # the unfused path: split views of one GEMM
    assert torch.allclose(merged, torch.cat((gate, up), dim=-1)) and torch.equal(summed, h + res)
    assert torch.allclose(down(merged, silu_mul=True), down(ops.silu_mul(gate, up)))
