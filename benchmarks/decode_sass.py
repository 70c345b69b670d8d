"""Static view of the paged decode kernel's variants for sm_90, on any machine with Triton (no GPU).

Each variant is compiled for an H100/H200 target (`triton.compile` with GPUTarget("cuda", 90, 32);
Triton ships ptxas and cuobjdump), and the table gives registers a thread, shared memory, the K/V
buffers the software pipeline allocated, resident programs an SM (64 K registers, 228 KB shared),
the SASS instructions in the main loop's body (a thread, a tile) and per key (warp instructions),
barriers and byte-wide shared loads (LDS.U8) in the whole kernel. These numbers explained the H200
timings of benchmarks/gpu_fp8_sweep.py: Triton's `.to()` on fp8 V tiles reads V one byte at a time
(128 LDS.U8 a thread per 128-key tile); stages 5 give two K/V buffers where 3 and 4 give one.

    PYTHONPATH=<dir holding llmdeploy_engine> python benchmarks/decode_sass.py
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_path import import_engine

import_engine()

import triton  # noqa: E402
from llmdeploy_engine.kernels import triton_attention as ta  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
TYPES = {
    "q_ptr": "*bf16",
    "o_ptr": "*bf16",
    "part_o_ptr": "*fp32",
    "part_lse_ptr": "*fp32",
    "tables_ptr": "*i64",  # as the engine passes them
    "lengths_ptr": "*i64",
    "k_scale_ptr": "*fp32",
    "v_scale_ptr": "*fp32",
    "scale": "fp32",
}
# (cache, tile, warps, stages, conversion, sums at the end, splits)
VARIANTS = [
    ("bf16", 64, 4, 3, "to", False, 2),
    ("bf16", 64, 4, 3, "to", False, 1),
    ("e4m3", 128, 4, 3, "to", False, 2),
    ("e4m3", 128, 4, 5, "to", False, 1),
    ("e4m3", 128, 4, 5, "kv", False, 1),
    ("e4m3", 128, 4, 5, "v", False, 1),
    ("e4m3", 128, 4, 4, "v", False, 1),
    ("e4m3", 64, 2, 5, "v", True, 2),
    ("e4m3", 32, 1, 4, "v", True, 4),
]


def loop_body(sass: str) -> list[str]:
    """Instructions of the longest backward branch's body (the main loop)."""
    lines = [x for x in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]{4}\*/", x)]
    addrs = [int(re.match(r"\s+/\*([0-9a-f]{4})\*/", x).group(1), 16) for x in lines]  # type: ignore[union-attr]
    best: list[str] = []
    for i, line in enumerate(lines):
        target = re.search(r"BRA\s+(?:`\(\.L_x_\d+\)\s*)?0x([0-9a-f]+)", line)
        if target and int(target.group(1), 16) < addrs[i]:
            body = [x for x, a in zip(lines, addrs, strict=True) if int(target.group(1), 16) <= a <= addrs[i]]
            best = max(best, body, key=len)
    return best


def compile_variant(
    cache: str, tile: int, warps: int, stages: int, cvt: str, at_end: bool, splits: int
) -> str:
    fp8 = cache != "bf16"
    types = dict(TYPES, k_ptr="*fp8e4nv" if fp8 else "*bf16", v_ptr="*fp8e4nv" if fp8 else "*bf16")
    const = {
        "GROUP": 4, "GROUP_PAD": 16, "HEAD_DIM": 128, "BLOCK_SIZE": 16, "TILE": tile, "NUM_SPLITS": splits,
        "FP8": fp8, "F16_DOT": fp8, "CVT_K": cvt == "kv", "CVT_V": cvt in ("v", "kv"), "E5M2": False,
        "STAGES": stages, "SUM_AT_END": at_end, "ROPE": False, "MERGE": False, "FENCE": True, "USE_PDL": False,
    }  # fmt: skip
    fn = ta._paged_decode_kernel
    names = fn.arg_names
    sig = {n: "constexpr" if n in const else types.get(n, "i32") for n in names}
    attrs = {
        (names.index(n),): [["tt.divisibility", 16]]
        for n in names
        if n not in const and (n.endswith("_ptr") or n.startswith("stride"))
    }
    src = ASTSource(fn, sig, constexprs={(names.index(n),): v for n, v in const.items()}, attrs=attrs)
    opts = {"num_warps": warps, "num_stages": stages}
    if not fp8:
        opts["maxnreg"] = ta.DECODE_CONFIG[False].max_registers or 255
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
    bufs = re.findall(r"local_alloc : \(\) -> !ttg.memdesc<(\d+)x\d+x\d+x", kernel.asm["ttgir"])
    per_sm = min(65536 // (-(-regs // 8) * 8 * 32 * warps), 228 * 1024 // (smem + 1024))
    body = loop_body(sass)
    return (
        f"| {cache} {tile}/{warps}/{stages}/{cvt}{'/sums at end' if at_end else ''} splits {splits} | {regs} | "
        f"{smem // 1024} KB | {bufs[0] if bufs else '-'} | {per_sm} | {len(body)} | {len(body) * warps / tile:.1f} | "
        f"{sass.count('BAR.SYNC')} | "
        f"{sass.count('LDS.U8')} |"
    )


def main() -> None:
    print(
        "| variant | registers | shared | K/V buffers | programs an SM | loop instructions (a thread, a tile) "
        "| warp instructions a key | barriers | LDS.U8 |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for variant in VARIANTS:
        print(compile_variant(*variant), flush=True)


if __name__ == "__main__":
    main()
