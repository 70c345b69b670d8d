"""cpu_dot.c's integer dot-product kernels and decode attention, compiled on first use and called
through ctypes.

Why our own kernel: torch's CPU kernels for 4-bit weights (`_weight_int4pack_mm_for_cpu`) convert
every weight to float for every activation row; on a 2-core AVX2 VM a 3072x576 product took 237 us
for one row, several times what integer dot products of GGUF's blocks take. Torch's int8 kernels do
not take GGUF's blocks exactly (fbgemm's dynamic int8 GEMM wants one scale per output feature), and
ggml, which has such kernels, offers them only inside its own graph executor. So cpu_dot.c does it:
activations quantized per 32 to 15-bit codes, each split into two int8 halves, multiplied with the
weight's 4-bit (GGUF Q4_0 / Q4_1 / Q4_K) or 8-bit (Q8_0) codes in integer lanes. The weights are
multiplied exactly as stored, and the activations' rounding (1/32512 of a block's largest value) is
far below bfloat16's. 8-bit activations, as llama.cpp quantizes them, did half the integer work but
moved the default model's logits by 3-4 % and turned its quickstart answer ("The capital of France
is Paris.") into another one.

The decode attention (`DecodeAttention`) is there for the same machine: one decode step's RoPE, K/V
store and paged softmax attention took ~8 torch ops a layer (gathers, SDPA, index_copy), ~3.7 ms of
a 135M model's step on the 2-core VM; in one C call a layer, reading the blocks where they lie, the
whole step fell from ~17.7 to ~14.2 ms.

The library is built once per source, compiler and instruction set into the cache folder
(LLMDEPLOY_CACHE_DIR, else $XDG_CACHE_HOME/llmdeploy or ~/.cache/llmdeploy) with the C compiler named
by CC (else cc, gcc or clang; about a second) and needs x86-64 with AVX2 and FMA; where the CPU has
VNNI the build uses it (LLMDEPLOY_CPU_DOT=avx2 keeps to the plain AVX2 build). It links OpenMP, which
resolves to the runtime torch already loaded, so its threads are torch's. Where any of that is
missing, or LLMDEPLOY_CPU_DOT=0 is set, `library()` is None (`unavailable_reason()` says why) and
the engine uses torch's kernels.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch
from llmdeploy_engine.facts import cache_root

logger = logging.getLogger("llmdeploy_engine")

SOURCE = Path(__file__).with_name("cpu_dot.c")
FLAGS = ("-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp", "-shared", "-fPIC", "-lm")
# the products' VNNI instruction (one vpdpbusd for vpmaddubsw + vpmaddwd), by the CPU flag that has it
VNNI_FLAGS = {"avx_vnni": ("-mavxvnni",), "avx512_vnni": ("-mavx512vnni", "-mavx512vl")}
BUILD_TIMEOUT_S = 120
BLOCK = 32  # inputs per activation / weight scale

_reason: list[str] = []


def _compiler() -> str | None:
    named = os.environ.get("CC")
    if named:
        return shutil.which(named)
    for candidate in ("cc", "gcc", "clang"):
        found = shutil.which(candidate)
        if found:
            return found
    return None


def _cpu_flags() -> set[str]:
    """The CPU's feature flags as Linux lists them (empty elsewhere: the plain AVX2 build then)."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _isa_flags() -> list[tuple[str, ...]]:
    """Extra compiler flags to try in turn: VNNI's where the CPU has it (an older compiler that does
    not know them falls back to the plain build), then none; only none with LLMDEPLOY_CPU_DOT=avx2."""
    if os.environ.get("LLMDEPLOY_CPU_DOT") == "avx2":
        return [()]
    cpu = _cpu_flags()
    tries = [
        extra
        for flag, extra in VNNI_FLAGS.items()
        if flag in cpu and (flag != "avx512_vnni" or "avx512vl" in cpu)
    ]
    return [*tries[:1], ()]


def _build(compiler: str) -> tuple[Path, tuple[str, ...]]:
    """The shared library for this source, compiler and CPU (compiled unless the cache holds it) and
    the instruction-set flags it was built with beyond FLAGS."""
    errors = []
    for extra in _isa_flags():
        try:
            return _build_with(compiler, FLAGS + extra), extra
        except (RuntimeError, subprocess.SubprocessError) as exc:
            errors.append(exc)
    raise errors[-1]


def _build_with(compiler: str, flags: tuple[str, ...]) -> Path:
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    key = hashlib.sha256("\0".join((SOURCE.read_text(), version, *flags)).encode()).hexdigest()[:16]
    folder = cache_root() / "kernels"
    target = folder / f"cpu_dot-{key}.so"
    if target.exists():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    fd, scratch = tempfile.mkstemp(suffix=".so", dir=folder)
    os.close(fd)
    try:
        done = subprocess.run(
            [compiler, str(SOURCE), "-o", scratch, *flags],
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
        )
        if done.returncode != 0:
            tail = done.stderr.strip().splitlines()[-5:]
            raise RuntimeError(f"{compiler} failed on {SOURCE.name}: {' / '.join(tail)}")
        os.replace(scratch, target)  # atomic: another process building at once finds a whole file
    finally:
        if os.path.exists(scratch):
            os.unlink(scratch)
    return target


def _declare(lib: ctypes.CDLL) -> None:
    p, i64, f32, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int
    # x, m, k, x_stride, norm, eps, swiglu, codes, scales, [offsets,] n, bias, add, y, threads
    lib.llmdeploy_q4_linear.argtypes = [p, i64, i64, i64, p, f32, i32, p, p, p, i64, p, p, p, i32]
    lib.llmdeploy_q8_linear.argtypes = [p, i64, i64, i64, p, f32, i32, p, p, i64, p, p, p, i32]
    lib.llmdeploy_q4_linear.restype = lib.llmdeploy_q8_linear.restype = ctypes.c_int
    # qkv, n, heads, kv_heads, d, cos, sin, k_pool, v_pool, num_blocks, block_size, slots, tables,
    # table_width, lengths, scale, out, threads
    lib.llmdeploy_decode_attention.argtypes = [
        p,
        i64,
        i64,
        i64,
        i64,
        p,
        p,
        p,
        p,
        i64,
        i64,
        p,
        p,
        i64,
        p,
        f32,
        p,
        i32,
    ]
    lib.llmdeploy_decode_attention.restype = ctypes.c_int


@functools.cache
def library() -> ctypes.CDLL | None:
    """The loaded kernels, or None where they cannot run here (logged once, with the reason)."""
    reason = None
    compiler = _compiler()
    setting = os.environ.get("LLMDEPLOY_CPU_DOT", "1")
    if setting == "0":
        reason = "LLMDEPLOY_CPU_DOT=0"
    elif setting not in ("1", "avx2"):
        reason = f"LLMDEPLOY_CPU_DOT={setting!r} is not 1, avx2 or 0"
    elif platform.machine().lower() not in ("x86_64", "amd64"):
        reason = f"this CPU is {platform.machine()}, the kernels are x86-64"
    elif torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        reason = f"this CPU has no AVX2 (torch reports {torch.backends.cpu.get_cpu_capability()})"
    elif compiler is None:
        reason = "no C compiler (set CC, or install cc, gcc or clang)"
    if reason is None:
        assert compiler is not None
        try:
            path, extra = _build(compiler)
            lib = ctypes.CDLL(str(path))
            _declare(lib)
            isa = "AVX512-VNNI" if "-mavx512vnni" in extra else "AVX-VNNI" if extra else "no VNNI"
            logger.info("CPU integer dot-product kernels: AVX2 + FMA, %s (%s)", isa, path)
            return lib
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
            reason = f"building them failed: {exc}"
    _reason.append(reason)
    # a missing compiler, a failed build or a mistyped setting is the user's to fix (about half the
    # decode speed is lost)
    fixable = reason.startswith(("no C compiler", "building")) or "is not 1, avx2 or 0" in reason
    logger.log(
        logging.WARNING if fixable else logging.INFO,
        "CPU integer dot-product kernels off (%s): torch's CPU kernels multiply GGUF weights",
        reason,
    )
    return None


def unavailable_reason() -> str | None:
    """Why library() is None, or None when it is loaded."""
    return None if library() is not None else _reason[-1]


def _checked(t: torch.Tensor | None, numel: int, what: str) -> int | None:
    """t's data pointer after the checks that keep the kernel inside its memory: float32, contiguous,
    numel values."""
    if t is None:
        return None
    if t.dtype is not torch.float32 or t.numel() != numel or not t.is_contiguous():
        raise ValueError(f"cpu_dot product: {what} must be {numel} contiguous float32 values")
    return t.data_ptr()


class Product:
    """One weight's product through the kernels: its operands' pointers bound once, so that a call
    costs a few microseconds of Python (the step makes ~120 of them)."""

    __slots__ = ("fn", "k", "n", "operands", "pointers")

    def __init__(self, kind: str, operands: tuple[torch.Tensor, ...], n: int) -> None:
        lib = library()
        assert lib is not None, "cpu_native.Product made where library() is None"
        self.fn = lib.llmdeploy_q4_linear if kind == "q4" else lib.llmdeploy_q8_linear
        self.k, self.n = operands[0].shape[1], n
        self.operands = operands  # held: the pointers are theirs
        self.pointers = tuple(ctypes.c_void_p(t.data_ptr()) for t in operands)

    def __call__(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        norm: torch.Tensor | None = None,
        eps: float = 0.0,
        swiglu: bool = False,
        bias: torch.Tensor | None = None,
        add: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """y[:] = act(x) @ w.T (+ bias) (+ add); y may be add. x: float32 rows, unit column stride."""
        k, n = self.k, self.n
        m = x.shape[0]
        width = 2 * k if swiglu else k
        if x.dim() != 2 or x.shape[1] != width or x.dtype is not torch.float32 or x.stride(1) != 1:
            raise ValueError(
                f"cpu_dot product: input must be float32 rows of {width} values (got {x.dtype} {list(x.shape)})"
            )
        status = self.fn(
            x.data_ptr(),
            m,
            k,
            x.stride(0),
            _checked(norm, k, "the norm weight"),
            eps,
            int(swiglu),
            *self.pointers,
            n,
            _checked(bias, n, "the bias"),
            _checked(add, m * n, "the residual"),
            _checked(y, m * n, "the output"),
            torch.get_num_threads(),
        )
        if status != 0:
            raise MemoryError(f"cpu_dot product of {m} rows: out of memory for the quantized activations")
        return y


def _bound(t: torch.Tensor, dtype: torch.dtype, shape: tuple[int, ...], what: str) -> int:
    if t.dtype is not dtype or tuple(t.shape) != shape or not t.is_contiguous() or not t.is_cpu:
        raise ValueError(
            f"cpu_dot decode attention: {what} must be contiguous {dtype} {list(shape)} "
            f"(got {t.dtype} {list(t.shape)})"
        )
    return t.data_ptr()


class DecodeAttention:
    """One decode step's attention through cpu_dot.c (RoPE of q and k, the new K/V stored, softmax
    attention over the paged cache): the step's tensors checked and bound once, then one call a layer
    in place of ~8 torch ops."""

    __slots__ = ("args", "d", "heads", "held", "kv_heads", "n", "out", "scale", "threads", "width")

    def __init__(
        self,
        heads: int,
        kv_heads: int,
        d: int,
        cos: torch.Tensor,
        sin: torch.Tensor,
        slots: torch.Tensor,
        tables: torch.Tensor,
        lengths: torch.Tensor,
        scale: float,
        out: torch.Tensor,
    ) -> None:
        """cos, sin [n, d] float32; slots int64 [n]; tables int64 [n, width]; lengths int32 [n] (with
        the new token); out float32 [n, heads * d], written by each call."""
        lib = library()
        assert lib is not None, "cpu_native.DecodeAttention made where library() is None"
        if d % 2 or heads % kv_heads:
            raise ValueError(
                f"cpu_dot decode attention: needs an even head size and whole groups ({heads}/{kv_heads})"
            )
        n = slots.shape[0]
        width = tables.shape[1] if tables.dim() == 2 else -1
        self.heads, self.kv_heads, self.d, self.n, self.width = heads, kv_heads, d, n, width
        self.held = (cos, sin, slots, tables, lengths, out)  # the pointers below are theirs
        self.out = out
        self.threads = torch.get_num_threads()
        self.args = (
            _bound(cos, torch.float32, (n, d), "cos"),
            _bound(sin, torch.float32, (n, d), "sin"),
            _bound(slots, torch.int64, (n,), "slots"),
            _bound(tables, torch.int64, (n, width), "the block tables"),
            _bound(lengths, torch.int32, (n,), "the context lengths"),
            _bound(out, torch.float32, (n, heads * d), "the output"),
        )
        self.scale = scale

    def __call__(self, qkv: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor) -> torch.Tensor:
        """Attends one layer: qkv [n, (heads + 2 kv_heads) d] float32 (its q and k rotated in place),
        k_pool and v_pool [blocks, block_size, kv_heads, d] float32; returns `out`."""
        heads, kv_heads, d, n = self.heads, self.kv_heads, self.d, self.n
        blocks, block_size = k_pool.shape[0], k_pool.shape[1]
        pool = (blocks, block_size, kv_heads, d)
        cos, sin, slots, tables, lengths, out = self.args
        lib = library()
        assert lib is not None
        status = lib.llmdeploy_decode_attention(
            _bound(qkv, torch.float32, (n, (heads + 2 * kv_heads) * d), "qkv"),
            n,
            heads,
            kv_heads,
            d,
            cos,
            sin,
            _bound(k_pool, torch.float32, pool, "the K pool"),
            _bound(v_pool, torch.float32, pool, "the V pool"),
            blocks,
            block_size,
            slots,
            tables,
            self.width,
            lengths,
            self.scale,
            out,
            self.threads,
        )
        if status == -2:
            raise ValueError(
                "cpu_dot decode attention: a slot, block id or context length outside the KV pools"
            )
        if status != 0:
            raise MemoryError("cpu_dot decode attention: out of memory for the scores")
        return self.out
