"""Static view of triton_skinny's kernels for sm_90, on any machine with Triton (no GPU).

Each projection of Qwen2.5-0.5B and Llama-3.1-8B is compiled with its default config (or with the
overrides given) for an H100/H200 target (`triton.compile` with GPUTarget("cuda", 90, 32); Triton
ships ptxas and cuobjdump). The table gives registers a thread, shared memory, the tiles the software
pipeline buffers (Triton buffers every load of the loop, activations included), the MMA kind
(mma.sync HMMA, or Hopper's wgmma HGMMA) and resident programs an SM. A config whose shared memory
passes 227 KB would fail to launch on the GPU; this shows it without one.

    PYTHONPATH=<dir holding llmdeploy_engine> python benchmarks/skinny_sass.py [--rows 16,32,64]
        [--set block_n=64,swap_ab=True]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_path import import_engine

import_engine()

import triton  # noqa: E402
from llmdeploy_engine import triton_skinny as ts  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
# (name, prologue, N, K, bias): prologue 0 plain, 1 add + RMSNorm (with a residual), 2 SiLU * up
SHAPES = [
    ("8b-qkv", 1, 6144, 4096, False),
    ("8b-o_proj", 0, 4096, 4096, False),
    ("8b-gate_up", 1, 28672, 4096, False),
    ("8b-down", 2, 4096, 14336, False),
    ("0.5b-qkv", 1, 1152, 896, True),
    ("0.5b-o_proj", 0, 896, 896, False),
    ("0.5b-gate_up", 1, 9728, 896, False),
    ("0.5b-down", 2, 896, 4864, False),
]


def parse_set(text: str) -> dict[str, int | bool]:
    out: dict[str, int | bool] = {}
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        out[key.strip()] = value.strip() == "True" if value.strip() in ("True", "False") else int(value)
    return out


def compile_row(
    name: str, prologue: int, n: int, k: int, bias: bool, rows: int, overrides: dict[str, int | bool]
) -> str:
    act_tiles = 1 if prologue == 0 else 2
    cfg = replace(ts.default_config(rows, n, k, act_tiles=act_tiles), **overrides)  # type: ignore[arg-type]
    block_m = ts.block_m_for(rows)
    const = {
        "PROLOGUE": prologue, "HAS_RESIDUAL": prologue == 1, "HAS_BIAS": bias, "BLOCK_M": block_m,
        "BLOCK_N": cfg.block_n, "BLOCK_K": cfg.block_k,
        "NORM_BLOCK": max(16, min(triton.next_power_of_2(k), 8192 // block_m)),
        "EVEN_K": k % cfg.block_k == 0, "SWAP_AB": cfg.swap_ab,
        "RSTD_EPILOGUE": prologue == 1 and cfg.rstd_epilogue, "PRECISION": "tf32",
    }  # fmt: skip
    fn = ts._skinny_kernel
    names = fn.arg_names
    sig = {a: "constexpr" if a in const else "*bf16" if a.endswith("_ptr") else "i32" for a in names}
    sig["eps"] = "fp32"
    # the launch's integer specialisation: pointers, strides, K and up_off divisible by 16 (K % 8 == 0
    # in elements gives 16-byte rows)
    attrs = {
        (names.index(a),): [["tt.divisibility", 16]]
        for a in names
        if a not in const and (a.endswith("_ptr") or a.startswith("stride") or a in ("K", "up_off"))
    }
    src = ASTSource(fn, sig, constexprs={(names.index(a),): v for a, v in const.items()}, attrs=attrs)
    opts = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp, "k.cubin")
        cubin.write_bytes(kernel.asm["cubin"])
        usage = subprocess.run(
            [BIN / "cuobjdump", "-res-usage", cubin], capture_output=True, text=True
        ).stdout
        sass = subprocess.run([BIN / "cuobjdump", "-sass", cubin], capture_output=True, text=True).stdout
    regs = int(re.search(r"REG:(\d+)", usage).group(1))  # type: ignore[union-attr]
    smem = int(kernel.metadata.shared)
    bufs = re.findall(r"ttg.local_alloc.*?-> !ttg.memdesc<([0-9x]+)x\w+", kernel.asm["ttgir"])
    mma = "wgmma" if sass.count("HGMMA") else "mma.sync" if sass.count("HMMA") else "?"
    per_sm = min(65536 // (-(-regs // 8) * 8 * 32 * cfg.num_warps), 228 * 1024 // (smem + 1024))
    flag = "  TOO MUCH SHARED MEMORY" if smem > 227 * 1024 else ""
    return (
        f"| {name} M={rows} | {cfg.block_n}/{cfg.block_k}/{cfg.num_warps}/{cfg.num_stages}"
        f"{'/swap' if cfg.swap_ab else ''}{'/rstd' if cfg.rstd_epilogue and prologue == 1 else ''} | {regs} | "
        f"{smem // 1024} KB | {' '.join(bufs)} | {mma} | {per_sm} |{flag}"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default="32", help="comma-separated row counts (9..64)")
    p.add_argument("--set", default="", help="config overrides, e.g. block_n=64,swap_ab=True")
    p.add_argument("--shapes", default="", help="only shapes whose name starts with this")
    args = p.parse_args()
    overrides = parse_set(args.set)
    print(
        "| shape | BLOCK_N/BLOCK_K/warps/stages | registers | shared | pipelined tiles | MMA | programs an SM |"
    )
    print("|---|---|---|---|---|---|---|")
    for rows in (int(r) for r in args.rows.split(",")):
        for name, prologue, n, k, bias in SHAPES:
            if name.startswith(args.shapes):
                print(compile_row(name, prologue, n, k, bias, rows, overrides), flush=True)


if __name__ == "__main__":
    main()
