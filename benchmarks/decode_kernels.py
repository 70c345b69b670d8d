"""Micro-benchmarks of the engine's decode-step kernels at the reference models' shapes.

(Not named `kernels.py`: a script's folder leads sys.path, and transformers imports the PyPI
`kernels` package whenever one is found, so the suite's other scripts failed to build a config.)

Each case is timed with `triton.testing.do_bench` (CUDA events, median; on the CPU, `--quick`, a
host timer) and reported as time, bandwidth (the fewest bytes the op must move: inputs read once,
outputs written once) against the measured copy bandwidth, and TFLOP/s for the matrix products.
Weights are rotated over copies larger than the L2 cache together, so a single-row product reads
its weight from HBM as in a decode step.

Cases per model: RMSNorm, residual add + RMSNorm, SiLU(gate) * up at one row and at 256 rows; the
QKV, gate_up and down projections at one row (the engine's fused GEMV for 16-bit CUDA rows) and at
256 rows (cuBLAS), all through the engine's `ops` module.

    python benchmarks/decode_kernels.py                     # both reference models on the GPU
    python benchmarks/decode_kernels.py --models llama-3.1-8b --rows 1,64,256
    python benchmarks/decode_kernels.py --quick             # CPU, tiny, seconds
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import common

COLUMNS = common.columns("model kernel shape us gb_s copy_pct tflop_s")
L2_BYTES = 256 * 2**20  # rotate over at least this much, several times an H200's 50 MiB L2


def timer(device: str) -> Callable[[Callable[[], Any]], float]:
    """Seconds per call: triton's do_bench on CUDA, a host median on the CPU."""
    if device == "cuda":
        from triton.testing import do_bench

        return lambda fn: float(do_bench(fn, warmup=25, rep=100, return_mode="median")) / 1e3
    return lambda fn: common.median_time(fn, device, reps=5, warmup=1)


def rotating(make: Callable[[], Any], nbytes: int, quick: bool) -> Callable[[], Any]:
    """Next of enough copies of make()'s tensors to overflow the L2 cache, on each call."""
    copies = 1 if quick else max(1, -(-L2_BYTES // max(1, nbytes)))
    pool = [make() for _ in range(copies)]
    return itertools.cycle(pool).__next__


def cases(
    spec: Any, rows: list[int], device: str, quick: bool
) -> list[tuple[str, str, Callable[[], Any], int, int]]:
    """(kernel, shape, fn, bytes, flops) of each case."""
    import torch
    from llmdeploy_engine.kernels import ops  # the engine's kernel entry points (see benchmarks/README.md)

    dtype = common.torch_dtype(device)
    size = dtype.itemsize
    h, inter = spec.hidden_size, spec.intermediate_size
    qkv = (spec.num_attention_heads + 2 * spec.num_kv_heads) * spec.head_dim
    eps = 1e-6
    out: list[tuple[str, str, Callable[[], Any], int, int]] = []

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=device, dtype=dtype)

    for m in rows:
        x, res, w = randn(m, h), randn(m, h), randn(h)
        gu = randn(m, 2 * inter)
        out.append(("rms_norm", f"{m}x{h}", lambda x=x, w=w: ops.rms_norm(x, w, eps), 2 * m * h * size, 0))
        out.append(
            (
                "add_rms_norm",
                f"{m}x{h}",
                lambda x=x, r=res, w=w: ops.add_rms_norm(x, r, w, eps),
                4 * m * h * size,
                0,
            )
        )
        gate, up = gu[:, :inter], gu[:, inter:]
        out.append(
            ("silu_mul", f"{m}x{inter}", lambda g=gate, u=up: ops.silu_mul(g, u), 3 * m * inter * size, 0)
        )
        for name, n, k in (("qkv_proj", qkv, h), ("gate_up_proj", 2 * inter, h), ("down_proj", h, inter)):
            weights = rotating(lambda n=n, k=k: randn(n, k), n * k * size, quick)
            a = randn(m, k)
            nbytes = (n * k + m * k + m * n) * size
            fn = lambda a=a, weights=weights: ops.linear(a, weights())  # noqa: E731
            out.append((f"linear {name}", f"{m}x{k} @ {k}x{n}", fn, nbytes, 2 * m * n * k))
    return out


def quantized_cases(
    spec: Any, rows: list[int], device: str, quick: bool, formats: list[str]
) -> list[tuple[str, str, Callable[[], Any], int, int]]:
    """The projections with int4 (group 128) and fp8 weights through the engine's QuantWeight.linear
    (its choice of kernel at each row count), and on CUDA each int4 kernel on its own (tinygemm,
    dequantize + cuBLAS) and fp8's _scaled_mm, to place the crossovers. Bytes: the stored weight,
    the input and the output."""
    import torch
    from llmdeploy_engine.kernels.quant_linear import Fp8Weight, Int4Weight

    dtype = common.torch_dtype(device)
    size = dtype.itemsize
    h, inter = spec.hidden_size, spec.intermediate_size
    qkv = (spec.num_attention_heads + 2 * spec.num_kv_heads) * spec.head_dim
    out: list[tuple[str, str, Callable[[], Any], int, int]] = []

    def int4(n: int, k: int) -> Int4Weight:
        group = next(g for g in (128, 64, 32) if k % g == 0)  # 128 at the reference models' shapes
        w = Int4Weight(n, k, group).to(device=device)
        g = k // group
        codes = torch.randint(0, 16, (n, k), dtype=torch.uint8, device=device)
        scales = (torch.rand(n, g, device=device) * 0.01 + 0.001).to(dtype)
        zeros = torch.randint(0, 16, (n, g), dtype=torch.uint8, device=device)
        w.scales = w.scales.to(dtype)
        w.write_rows(0, codes, scales, zeros, torch.arange(k) // group)
        w.repack_tinygemm()
        return w

    def fp8(n: int, k: int) -> Fp8Weight:
        w = Fp8Weight(n, k).to(device=device)
        w.like = w.like.to(dtype)
        w.write_rows(0, torch.randn(n, k, device=device) * 0.05, torch.rand(n, device=device) * 0.01 + 0.001)
        return w

    projections = (("qkv_proj", qkv, h), ("gate_up_proj", 2 * inter, h), ("down_proj", h, inter))
    pools = {}  # built once per projection and format: the rows reuse them
    for fmt in formats:
        make = int4 if fmt == "int4" else fp8
        for name, n, k in projections:
            stored = make(n, k).stored_bytes()
            pools[fmt, name] = (rotating(lambda n=n, k=k, make=make: make(n, k), stored, quick), stored)
    for m in rows:
        for name, n, k in projections:
            a = torch.randn(m, k, device=device, dtype=dtype)
            shape = f"{m}x{k} @ {k}x{n}"
            flops = 2 * m * n * k
            for fmt in formats:
                weights, stored = pools[fmt, name]
                nbytes = stored + (m * k + m * n) * size
                out.append(
                    (f"{fmt} linear {name}", shape, lambda a=a, w=weights: w().linear(a), nbytes, flops)
                )
                if device != "cuda":
                    continue
                from llmdeploy_engine.kernels import triton_tinygemm

                if fmt == "int4":
                    tiny = lambda a=a, w=weights: torch.ops.aten._weight_int4pack_mm(  # noqa: E731
                        a, (q := w()).tg_weight, q.group_size, q.tg_scale_zero
                    )
                    dense = lambda a=a, w=weights: torch.mm(a, w().dequantize(a.dtype).t())  # noqa: E731
                    out.append((f"int4 tinygemm {name}", shape, tiny, nbytes, flops))
                    tiled = lambda a=a, w=weights: triton_tinygemm.gemm(  # noqa: E731
                        a, (q := w()).tg_weight, q.tg_scale_zero, q.group_size
                    )
                    out.append((f"int4 dequant+cublas {name}", shape, dense, nbytes, flops))
                    out.append((f"int4 triton gemm {name}", shape, tiled, nbytes, flops))
                else:
                    scaled = lambda a=a, w=weights: w()._batched(None, a, None, None)  # noqa: E731
                    out.append((f"fp8 scaled_mm {name}", shape, scaled, nbytes, flops))
    return out


def main() -> None:
    p = common.parser(__doc__.split("\n")[0])
    p.add_argument(
        "--models", default=common.DEFAULT_MODELS, help="comma-separated short names or catalog ids"
    )
    p.add_argument("--rows", default="1,256", help="comma-separated batch rows (tokens of a step)")
    p.add_argument(
        "--weights",
        default="bf16",
        help="comma-separated: bf16 (the dense kernels), int4, fp8 (quantized projections)",
    )
    args = p.parse_args()
    device = common.resolve_device(args)
    rows_of = [int(r) for r in ("1,4" if args.quick else args.rows).split(",")]
    if args.quick and args.weights == "bf16":
        args.weights = "bf16,int4,fp8"  # the CPU check runs every path
    head = common.header(device)
    bandwidth = common.copy_bandwidth(device, 2**22 if args.quick else 2**32)
    head["copy_bandwidth_gb_s"] = round(bandwidth / 1e9, 1)
    time_of = timer(device)
    rows = []
    for hf_id in common.model_ids(args.models, args.quick):
        spec = common.model_spec(hf_id)
        formats = args.weights.split(",")
        todo = cases(spec, rows_of, device, args.quick) if "bf16" in formats else []
        todo += quantized_cases(spec, rows_of, device, args.quick, [f for f in formats if f != "bf16"])
        for kernel, shape, fn, nbytes, flops in todo:
            try:
                seconds = time_of(fn)
            except (RuntimeError, ValueError) as exc:  # a kernel that refuses a shape: say so, go on
                common.log(f"  {kernel} {shape}: {str(exc).splitlines()[0]}")
                continue
            rows.append(
                {
                    "model": hf_id,
                    "kernel": kernel,
                    "shape": shape,
                    "us": seconds * 1e6,
                    "gb_s": nbytes / seconds / 1e9,
                    "copy_pct": 100 * nbytes / seconds / bandwidth,
                    "tflop_s": flops / seconds / 1e12 if flops else None,
                }
            )
    common.report("decode_kernels", head, rows, COLUMNS, args)


if __name__ == "__main__":
    main()
