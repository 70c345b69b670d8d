"""CPU kernels for quantized weights: the `QuantWeight`s (quant_linear.py) that a GGUF file's tensors
become on `--device cpu` when they are kept compact (`--cpu-weights`, gguf_compact.py).

- `Int4PackWeight`: 4-bit codes q in groups along the input features with a float scale s and zero
  z per (output feature, group), w = (q - 8) * s + z, multiplied through torch's
  `_weight_int4pack_mm_for_cpu`. Its vectorized (AVX2 / AVX-512) kernel takes bfloat16 activations,
  scales and zeros, so the activations are rounded to bfloat16 on the way in (the product is
  accumulated in float32). GGUF Q4_0 (w = d * (q - 8)), Q4_1 (w = d * q + m: z = m + 8d) and Q4_K
  (sub-blocks of 32 with 6-bit scales and mins: s = d * sc, z = 8 * d * sc - dmin * mn) map to it
  with groups of 32 and nothing but the bfloat16 rounding of s and z.
- `Fp16PackWeight`: a float16 copy multiplied through fbgemm's fp16 GEMM
  (`quantized::linear_dynamic_fp16`, float32 activations): for quantized types no torch CPU kernel
  takes exactly (Q8_0 and Q6_K have one scale per 32 or 16 weights, `_weight_int8pack_mm` one per
  output feature), at half the bytes of float32 and within float16 rounding of the GGUF weight.
- `Int4DotWeight` / `Int8DotWeight`: GGUF's 4-bit (Q4_0 / Q4_1 / Q4_K) and Q8_0 codes as stored, with
  float16 scales (and offsets) per 32, multiplied by cpu_dot.c's integer kernels (cpu_native.py)
  where they build: the activations rounded to 15-bit codes per 32, well inside float32's answers.
  The loader prefers them to the two above.
- `RowTable`: an embedding table kept compact (Q8_0: int8 codes and one float16 scale per 32;
  others float16) from which the looked-up rows are dequantized.

Batches of `CPU_DEQUANT_ROWS` rows or more (prefill) dequantize the weight once and use a dense
GEMM: the int4 kernel dequantizes per tile and is compute-bound there. The GEMM runs in bfloat16
where this CPU's bfloat16 GEMM (oneDNN on AVX512-BF16 or AMX) is clearly faster than float32, timed
once per process (`prefill_gemm_dtype`): on a 2-core AVX512-BF16 VM a 512-token prompt's projections
took 125 ms instead of 568 ms. The activations and the weight are rounded to bfloat16 there (8
mantissa bits against the 4-bit codes' step).
"""

from __future__ import annotations

import functools
import time

import torch
import torch.nn.functional as F
from llmdeploy_engine.kernels import cpu_native
from llmdeploy_engine.kernels.quant_linear import QuantWeight

# from this many rows on, one dequantization plus a dense GEMM beats the int4 kernel
CPU_DEQUANT_ROWS = 32
INT4PACK_GROUPS = (32, 64, 128, 256)
# bfloat16 prefill GEMMs only where they beat float32 by this much (oneDNN emulates them elsewhere)
BF16_GEMM_MIN_SPEEDUP = 1.5


@functools.lru_cache(maxsize=1)
def prefill_gemm_dtype() -> torch.dtype:
    """bfloat16 when this CPU's bfloat16 GEMM beats float32 by BF16_GEMM_MIN_SPEEDUP on a prefill-sized
    product (timed once, ~20-40 ms), else float32."""
    x, w = torch.randn(256, 1536), torch.randn(576, 1536)
    best = {}
    for dtype in (torch.float32, torch.bfloat16):
        a, b = x.to(dtype), w.to(dtype)
        F.linear(a, b)  # the first call initializes oneDNN's kernels
        times = []
        for _ in range(3):
            start = time.perf_counter()
            F.linear(a, b)
            times.append(time.perf_counter() - start)
        best[dtype] = min(times)
    fast = best[torch.float32] >= BF16_GEMM_MIN_SPEEDUP * best[torch.bfloat16]
    return torch.bfloat16 if fast else torch.float32


def _dense_linear(x: torch.Tensor, weight: QuantWeight) -> torch.Tensor:
    """A prefill batch through the dense weight (prefill_gemm_dtype), the result in x's dtype."""
    dtype = prefill_gemm_dtype() if x.device.type == "cpu" else x.dtype
    return F.linear(x.to(torch.bfloat16).to(dtype), weight.dequantize(dtype)).to(x.dtype)


def int4pack_available() -> bool:
    """Whether torch has the int4 CPU kernel with a vectorized path on this CPU."""
    vectorized = torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")
    return vectorized and hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu")


def fp16pack_available() -> bool:
    return "fbgemm" in torch.backends.quantized.supported_engines


@functools.lru_cache(maxsize=16)
def _int4pack_order(n: int, k: int) -> torch.Tensor:
    """For a packed [n, k] weight: the flat index (row * k + col) of the code each nibble holds, nibble
    2b the low and 2b + 1 the high half of byte b. The layout depends on the CPU's vector width; it
    is read off the packing op itself by packing the base-16 digits of every position."""
    index = torch.arange(n * k, dtype=torch.int64)
    source = torch.zeros(n * k, dtype=torch.int64)
    shift = 0
    while (1 << shift) < n * k:
        digit = ((index >> shift) & 0xF).to(torch.int32).reshape(n, k)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(digit, 1).reshape(-1)
        source |= _nibbles(packed).to(torch.int64) << shift
        shift += 4
    assert torch.equal(torch.sort(source).values, index), "int4pack is not a permutation of nibbles"
    return torch.argsort(source).to(torch.int32)  # natural position -> nibble position


@functools.lru_cache(maxsize=16)
def _int4pack_block_rows(n: int, k: int) -> int | None:
    """B when the packed [n, k] weight is in blocks of B output features, each column of a block B/2
    bytes whose low nibbles hold the block's rows 0..B/2-1 and high nibbles the rest (B = 64 on
    AVX-512, 32 on AVX2), so that dequantization unpacks it with strided copies instead of a gather
    (a 3072x576 weight on a 2-core AVX2 VM: 11 ms through the gather); None for another layout."""
    order = _int4pack_order(n, k).long()
    for rows in (64, 32):
        if n % rows:
            continue
        half = rows // 2
        b, c, r = torch.meshgrid(torch.arange(n // rows), torch.arange(k), torch.arange(rows), indexing="ij")
        nibble = b * (k * rows) + c * rows + 2 * (r % half) + r // half  # [block, column, row in block]
        if torch.equal(order, nibble.permute(0, 2, 1).reshape(-1)):  # natural (row, column) order
            return rows
    return None


def _nibbles(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [m] -> uint8 [2m]: low nibble, then high nibble of each byte."""
    return torch.stack((packed & 0xF, packed >> 4), dim=-1).reshape(-1)


class CpuWeight(QuantWeight):
    """A compact CPU weight; `fused_linear` is the product with the step around it that
    cpu_decode.py's path fuses (torch ops here; the cpu_dot weights do it in their kernel)."""

    activation_dtype: torch.dtype

    @property
    def dtype(self) -> torch.dtype:
        return self.activation_dtype

    def linear(
        self, x: torch.Tensor, bias: torch.Tensor | None = None, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        raise NotImplementedError

    def fused_linear(
        self,
        x: torch.Tensor,
        *,
        norm: torch.Tensor | None = None,
        eps: float = 0.0,
        swiglu: bool = False,
        bias: torch.Tensor | None = None,
        add: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """act(x) @ W.T (+ bias) (+ add), into `out` if given (which may be `add`); act is RMSNorm with
        weight `norm` (its row scale applied to the product, one op fewer), SwiGLU of x = [gate | up],
        or nothing."""
        if norm is not None:
            k = x.shape[-1]
            ms = torch.linalg.vector_norm(x, 2, -1, keepdim=True).square_().mul_(1.0 / k)
            y = self.linear(x * norm) * ms.add_(eps).rsqrt_()
            if bias is not None:
                y += bias
        else:
            if swiglu:
                gate, up = x.chunk(2, -1)
                x = F.silu(gate) * up
            y = self.linear(x, bias)
        if add is not None:
            return torch.add(y, add, out=out) if out is not None else y + add
        if out is not None:
            return out.copy_(y)
        return y


class Int4PackWeight(CpuWeight):
    """int4pack codes (uint8 [N, K/2] in the CPU kernel's layout) and bfloat16 scales and zeros
    [K/G, N, 2]; w = (q - 8) * scale + zero."""

    def __init__(self, codes: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor, dtype: torch.dtype):
        """codes uint8 [N, K] (0..15), scales and offsets float [N, K/G]: w = codes * scales + offsets."""
        super().__init__()
        n, k = codes.shape
        groups = scales.shape[1]
        group = k // groups
        if group not in INT4PACK_GROUPS or k % group or n % 16:
            raise ValueError(
                f"int4pack needs groups of {INT4PACK_GROUPS} and a multiple of 16 output features "
                f"(got [{n}, {k}] in groups of {group})"
            )
        self.out_features, self.in_features, self.group_size = n, k, group
        self.activation_dtype = dtype
        zeros = offsets.float() + 8 * scales.float()
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32).contiguous(), 1)
        self.register_buffer("packed", packed)
        self.register_buffer(
            "scale_zeros",
            torch.stack((scales.float().t(), zeros.t()), dim=-1).to(torch.bfloat16).contiguous(),
        )

    def codes(self) -> torch.Tensor:
        """uint8 [N, K] codes in natural order."""
        nibbles = _nibbles(self.packed.reshape(-1))
        order = _int4pack_order(self.out_features, self.in_features)
        return nibbles[order.long()].reshape(self.out_features, self.in_features)

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        n, k, g = self.out_features, self.in_features, self.group_size
        sz = self.scale_zeros.float()  # [G, N, 2]
        scales, zeros = sz[..., 0].t()[..., None], sz[..., 1].t()[..., None]  # [N, G, 1]
        rows = _int4pack_block_rows(n, k)
        if rows is not None:
            # the prefill path runs this once per layer and step: strided copies, in place, no gather
            half = rows // 2
            packed = self.packed.view(n // rows, k, half).transpose(1, 2)  # [block, byte, column]
            w = torch.empty(n // rows, rows, k)
            w[:, :half].copy_(packed & 0xF)
            w[:, half:].copy_(packed >> 4)
            w = w.view(n, k // g, g).sub_(8).mul_(scales).add_(zeros)
        else:
            w = (self.codes().reshape(n, k // g, g).float() - 8) * scales + zeros
        return w.reshape(n, k).to(dtype)

    def linear(
        self, x: torch.Tensor, bias: torch.Tensor | None = None, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        if x.shape[0] >= CPU_DEQUANT_ROWS or x.device.type != "cpu":
            # activations rounded as the kernel rounds them, so a row's result barely depends on the batch
            y = _dense_linear(x, self)
        else:
            xb = x.to(torch.bfloat16).contiguous()
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(xb, self.packed, self.group_size, self.scale_zeros)
            y = y.to(x.dtype)
        return self._output(y, bias, out)  # the bias added alike on both paths


class Fp16PackWeight(CpuWeight):
    """A float16 weight in fbgemm's packed layout (an opaque object, not a buffer)."""

    def __init__(self, weight: torch.Tensor, dtype: torch.dtype) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.activation_dtype = dtype
        self.pack = torch.ops.quantized.linear_prepack_fp16(weight.float().contiguous())

    def stored_bytes(self) -> int:
        return self.out_features * self.in_features * 2

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        weight: torch.Tensor = torch.ops.quantized.linear_unpack_fp16(self.pack)[0]
        return weight.to(dtype)

    def linear(
        self, x: torch.Tensor, bias: torch.Tensor | None = None, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        y: torch.Tensor = torch.ops.quantized.linear_dynamic_fp16(x.float().contiguous(), self.pack)
        return self._output(y.to(x.dtype), bias, out)


class _DotWeight(CpuWeight):
    """A weight multiplied by cpu_dot.c's kernels (cpu_native.py) below CPU_DEQUANT_ROWS rows, through
    a dense GEMM of its dequantization from there on."""

    kind: str
    _product: cpu_native.Product | None = None

    def operands(self) -> tuple[torch.Tensor, ...]:
        raise NotImplementedError

    def product(self) -> cpu_native.Product:
        """The bound kernel call, made again when the buffers were replaced (`Module.to` and the like
        replace them all; the first one is checked)."""
        bound = self._product
        if bound is None or bound.operands[0] is not next(iter(self._buffers.values())):
            bound = self._product = cpu_native.Product(self.kind, self.operands(), self.out_features)
        return bound

    def _direct(self, x: torch.Tensor) -> bool:
        return x.shape[0] < CPU_DEQUANT_ROWS and x.is_cpu

    def linear(
        self, x: torch.Tensor, bias: torch.Tensor | None = None, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(
                f"{type(self).__name__}: input rows of {x.shape[-1]} values, the weight takes {self.in_features}"
            )
        if not self._direct(x):
            return self._output(_dense_linear(x, self), bias, out)
        rows = x.reshape(-1, self.in_features).float()
        y = self.product()(rows, torch.empty(rows.shape[0], self.out_features), bias=bias)
        return self._output(y.to(x.dtype), None, out)

    def fused_linear(
        self,
        x: torch.Tensor,
        *,
        norm: torch.Tensor | None = None,
        eps: float = 0.0,
        swiglu: bool = False,
        bias: torch.Tensor | None = None,
        add: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """As CpuWeight.fused_linear, in one kernel call below CPU_DEQUANT_ROWS rows (the operands
        float32 and contiguous; cpu_native.Product checks)."""
        if not self._direct(x):
            return super().fused_linear(x, norm=norm, eps=eps, swiglu=swiglu, bias=bias, add=add, out=out)
        y = out if out is not None else torch.empty(x.shape[0], self.out_features)
        return self.product()(x, y, norm, eps, swiglu, bias, add)


class Int4DotWeight(_DotWeight):
    """4-bit codes with a float16 scale and offset per (output feature, 32 inputs), w = code * scale +
    offset, for cpu_dot.c's q4 kernel: the codes of output features 2i and 2i + 1 share bytes (low /
    high nibble), [N/2, K]. GGUF Q4_0 and Q4_1 blocks hold float16 scales, so they are exact; Q4_K's
    6-bit sub-block scales times a float16 are rounded to float16 (int4pack rounds them to bfloat16)."""

    kind = "q4"

    def __init__(self, codes: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor, dtype: torch.dtype):
        """codes uint8 [N, K] (0..15), scales and offsets float [N, K/32]."""
        super().__init__()
        n, k = codes.shape
        if k % cpu_native.BLOCK or n % 2 or scales.shape != (n, k // cpu_native.BLOCK):
            raise ValueError(
                f"the q4 kernel needs groups of 32 and an even number of outputs (got [{n}, {k}])"
            )
        self.out_features, self.in_features = n, k
        self.activation_dtype = dtype
        pairs = codes.to(torch.uint8).view(n // 2, 2, k)
        self.register_buffer("pairs", (pairs[:, 0] | (pairs[:, 1] << 4)).contiguous())
        self.register_buffer("scales", scales.to(torch.float16).contiguous())
        self.register_buffer("offsets", offsets.to(torch.float16).contiguous())

    def operands(self) -> tuple[torch.Tensor, ...]:
        return (self.pairs, self.scales, self.offsets)

    def codes(self) -> torch.Tensor:
        """uint8 [N, K] codes."""
        return torch.stack((self.pairs & 0xF, self.pairs >> 4), dim=1).reshape(
            self.out_features, self.in_features
        )

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        n, k = self.out_features, self.in_features
        w = torch.empty(n // 2, 2, k)
        w[:, 0].copy_(self.pairs & 0xF)
        w[:, 1].copy_(self.pairs >> 4)
        w = (
            w.view(n, k // cpu_native.BLOCK, cpu_native.BLOCK)
            .mul_(self.scales[..., None])
            .add_(self.offsets[..., None])
        )
        return w.view(n, k).to(dtype)


class Int8DotWeight(_DotWeight):
    """int8 codes [N, K] with a float16 scale per (output feature, 32 inputs), w = code * scale (GGUF
    Q8_0 exactly), for cpu_dot.c's q8 kernel. A tied LM head shares both with the embedding's RowTable."""

    kind = "q8"

    def __init__(self, codes: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype):
        super().__init__()
        n, k = codes.shape
        if k % cpu_native.BLOCK or codes.dtype != torch.int8 or scales.shape != (n, k // cpu_native.BLOCK):
            raise ValueError(f"the q8 kernel needs int8 codes in groups of 32 (got {codes.dtype} [{n}, {k}])")
        self.out_features, self.in_features = n, k
        self.activation_dtype = dtype
        self.register_buffer("values", codes.contiguous())
        self.register_buffer("scales", scales.to(torch.float16).contiguous())

    def operands(self) -> tuple[torch.Tensor, ...]:
        return (self.values, self.scales)

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        n, k = self.out_features, self.in_features
        w = (
            self.values.float().view(n, k // cpu_native.BLOCK, cpu_native.BLOCK)
            * self.scales.float()[..., None]
        )
        return w.view(n, k).to(dtype)


class RowTable(QuantWeight):
    """Embedding rows kept compact: int8 codes [N, K] with float16 scales [N, K/32] (GGUF Q8_0, exact),
    or float16 values [N, K] (scales empty). `forward(ids)` looks rows up (the embedding)."""

    def __init__(self, values: torch.Tensor, scales: torch.Tensor | None, dtype: torch.dtype) -> None:
        super().__init__()
        self.out_features, self.in_features = values.shape
        self.activation_dtype = dtype
        self.register_buffer("values", values.contiguous())
        self.register_buffer(
            "scales", (scales if scales is not None else torch.zeros(0)).to(torch.float16).contiguous()
        )

    @property
    def dtype(self) -> torch.dtype:
        return self.activation_dtype

    def _rows(self, values: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        if self.scales.numel() == 0:
            return values.float()
        k = self.in_features
        groups = scales.shape[-1]
        w = values.float().reshape(*values.shape[:-1], groups, k // groups) * scales.float()[..., None]
        return w.reshape(*values.shape[:-1], k)

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        return self._rows(self.values, self.scales).to(dtype)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1)
        values = self.values.index_select(0, flat)
        scales = self.scales.index_select(0, flat) if self.scales.numel() else self.scales
        rows = self._rows(values, scales).to(self.activation_dtype)
        return rows.reshape(*ids.shape, self.in_features)
