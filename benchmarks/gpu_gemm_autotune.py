"""Does any GEMM this GPU's software stack can build beat cuBLAS at the 8B's decode row counts? (issue 6, v17)

The 8B's 256-request run spends ~183 us a layer in its decode projections at 256 rows, where reading
the weights takes ~104 us and the FLOPs ~113 us at the top clock (v10, v16). gpu_batch_diag.py's
hand-written Triton GEMM sweep was slower than cuBLAS from 128 rows on. This script asks torch
inductor's max-autotune instead: for each projection and row count it compiles `x @ w.T` with every
GEMM family inductor has for this GPU (cuBLAS through ATen, its Triton mm templates, and the
persistent TMA template where the build has it), lets inductor's autotuner pick, and then times the
pick the way gpu_batch_diag.py times cuBLAS: a CUDA graph of back-to-back calls cycling through
copies of the weight (>= 256 MB, so L2 never holds the previous call's weight), median of 7
replays. Inductor's own autotune table (printed to stderr by inductor) times each candidate with
the weight hot in L2; the figures this script prints do not.

Every compiled result is checked against F.linear before it is timed. The last lines are a table:
projection, rows, cuBLAS us, inductor's pick us, ratio.

    PYTHONPATH=<dir holding llmdeploy_engine> python3 benchmarks/gpu_gemm_autotune.py [--rows 160,208,256]
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch
import torch.nn.functional as F
from gpu_batch_diag import EVICT_BYTES, SHAPES, cublas_call, time_graph  # also imports the engine

START = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - START:6.1f}s] {msg}", flush=True)


def configure_inductor() -> list[str]:
    """max-autotune over ATen (cuBLAS) and Triton templates; the persistent TMA template where the
    build has the switch. Returns the switches set, for the log."""
    import torch._dynamo
    import torch._inductor.config as ic

    torch._dynamo.config.cache_size_limit = 256
    ic.max_autotune = True
    ic.max_autotune_gemm = True
    ic.max_autotune_gemm_backends = "ATEN,TRITON"
    set_ = ["max_autotune_gemm_backends=ATEN,TRITON"]
    if hasattr(ic.triton, "enable_persistent_tma_matmul"):
        ic.triton.enable_persistent_tma_matmul = True
        set_.append("triton.enable_persistent_tma_matmul=True")
    return set_


def mm_t(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.mm(a, b.t())


def compiled_call(fn: Any, x: torch.Tensor, ws: list[torch.Tensor], i: int) -> None:
    fn(x, ws[i % len(ws)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="qkv,o_proj,gate_up,down")
    parser.add_argument("--rows", default="160,208,256")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    dev = torch.device("cuda")
    import triton

    log(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}")
    log("inductor: " + ", ".join(configure_inductor()))
    rows = [int(r) for r in args.rows.split(",")]
    results: list[dict[str, Any]] = []
    for name in args.shapes.split(","):
        n, k = SHAPES[name]
        copies = max(2, math.ceil(EVICT_BYTES / (n * k * 2)))
        ws = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
        calls = max(copies, 8)
        for m in rows:
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            out = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
            ref = F.linear(x, ws[0]).float()
            cublas_us = time_graph(functools.partial(cublas_call, x, ws, out), calls, dev)
            t0 = time.perf_counter()
            fn = torch.compile(mm_t, dynamic=False)
            got = fn(x, ws[0]).float()
            compile_s = time.perf_counter() - t0
            err = ((got - ref).abs().max() / ref.abs().max()).item()
            if err > 2e-2:
                log(
                    f"  {name} m={m}: inductor's pick differs from F.linear (max rel err {err:.2e}); not timed"
                )
                continue
            ind_us = time_graph(functools.partial(compiled_call, fn, x, ws), calls, dev)
            flops, wbytes = 2 * m * n * k, n * k * 2
            cell = {"shape": name, "m": m, "n": n, "k": k, "cublas_us": cublas_us, "inductor_us": ind_us,
                    "compile_s": compile_s, "max_rel_err": err}  # fmt: skip
            results.append(cell)
            log(
                f"  {name:8s} m={m:4d}: cuBLAS {cublas_us:7.1f} us ({flops / cublas_us / 1e6:4.0f} TF/s,"
                f" {wbytes / cublas_us / 1e6:4.2f} TB/s) | inductor's pick {ind_us:7.1f} us"
                f" ({flops / ind_us / 1e6:4.0f} TF/s) | cuBLAS/pick {cublas_us / ind_us:4.2f}x"
                f" | compiled in {compile_s:.0f} s"
            )
        del ws
        torch.cuda.empty_cache()
    print("\n| projection | rows | cuBLAS us | inductor's pick us | cuBLAS / pick |")
    print("|---|---|---|---|---|")
    for c in results:
        print(f"| {c['shape']} | {c['m']} | {c['cublas_us']:.1f} | {c['inductor_us']:.1f} |"
              f" {c['cublas_us'] / c['inductor_us']:.2f}x |")  # fmt: skip
    by_rows: dict[int, list[float]] = {}
    for c in results:
        by_rows.setdefault(c["m"], [0.0, 0.0])
        by_rows[c["m"]][0] += c["cublas_us"]
        by_rows[c["m"]][1] += c["inductor_us"]
    for m, (cb, ind) in sorted(by_rows.items()):
        print(f"| all four, one layer | {m} | {cb:.1f} | {ind:.1f} | {cb / ind:.2f}x |")
    if args.out:
        Path(args.out, "gpu_gemm_autotune.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
