"""`read_gguf_header(path)`: a GGUF file's metadata and tensor table, without loading tensor data.

`gguf.GGUFReader` builds Python objects for every array (a 49k-entry tokenizer takes seconds);
planning needs only scalars and the tensor table, so arrays are skipped. Type codes and block sizes
come from the `gguf` package's constants. The header is outside input: every count and length is
held to what the file's size allows before anything is read or allocated for it.
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from llmdeploy.errors import UserError

# GGUF metadata value types -> struct format (8 = string, 9 = array)
_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9
# arrays of arrays: GGUF writers nest one level at most
_MAX_ARRAY_NESTING = 4
# llama.cpp's own limit on a tensor's dimensions (GGML_MAX_DIMS)
_MAX_DIMS = 4


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    shape: tuple[int, ...]
    type_name: str
    n_elements: int
    n_bytes: int


@dataclass(frozen=True)
class GGUFHeader:
    fields: dict[str, Any]  # scalars and strings; arrays as their length
    tensors: tuple[GGUFTensor, ...]


def _read(fh: BinaryIO, fmt: str) -> Any:
    size = struct.calcsize(fmt)
    data = fh.read(size)
    if len(data) != size:
        raise EOFError("truncated GGUF header")
    return struct.unpack(fmt, data)[0]


def _length(fh: BinaryIO, size: int, unit: int, what: str) -> int:
    """A count read from the file, refused when that many `unit`-byte items cannot fit in it."""
    n = _read(fh, "<Q")
    if n * unit > size:
        raise ValueError(f"{what} of {n:,} is more than the {size:,}-byte file can hold (corrupt header)")
    return int(n)


def _string(fh: BinaryIO, size: int) -> str:
    n = _length(fh, size, 1, "a string length")
    return bytes(fh.read(n)).decode("utf-8", errors="replace")


def _value(fh: BinaryIO, vtype: int, size: int, nesting: int = 0) -> Any:
    if vtype in _SCALARS:
        return _read(fh, _SCALARS[vtype])
    if vtype == _STRING:
        return _string(fh, size)
    if vtype == _ARRAY:
        if nesting >= _MAX_ARRAY_NESTING:
            raise ValueError(f"arrays nested more than {_MAX_ARRAY_NESTING} deep (corrupt header)")
        item_type = _read(fh, "<I")
        if item_type in _SCALARS:
            count = _length(fh, size, struct.calcsize(_SCALARS[item_type]), "an array length")
            fh.seek(count * struct.calcsize(_SCALARS[item_type]), 1)
        elif item_type == _STRING:
            count = _length(fh, size, 8, "an array length")
            for _ in range(count):  # a tokenizer's vocabulary: skipped, never decoded
                fh.seek(_length(fh, size, 1, "a string length"), 1)
        else:
            count = _length(fh, size, 1, "an array length")
            for _ in range(count):
                _value(fh, item_type, size, nesting + 1)
        if fh.tell() > size:
            raise EOFError("truncated GGUF header")
        return count
    raise ValueError(f"unknown GGUF value type {vtype}")


def read_gguf_header(path: Path) -> GGUFHeader:
    try:
        stat = path.stat()
    except OSError as e:
        raise UserError.one(f"cannot read GGUF file {path}: {e.strerror}", fix="check the path") from e
    # validate, plan and render each read the same file; the key changes when the file does
    return _cached_header(path.resolve(), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _cached_header(path: Path, size: int, mtime_ns: int) -> GGUFHeader:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        with path.open("rb") as fh:
            if fh.read(4) != b"GGUF":
                raise ValueError("not a GGUF file (bad magic)")
            version = _read(fh, "<I")
            if version < 2:
                raise ValueError(f"GGUF version {version} is not supported")
            # each field and tensor takes at least 8 bytes of the file
            n_tensors, n_fields = (
                _length(fh, size, 8, "a tensor count"),
                _length(fh, size, 8, "a field count"),
            )
            fields = {}
            for _ in range(n_fields):
                key = _string(fh, size)
                fields[key] = _value(fh, _read(fh, "<I"), size)
            tensors = []
            for _ in range(n_tensors):
                name = _string(fh, size)
                n_dims = _read(fh, "<I")
                if n_dims > _MAX_DIMS:
                    raise ValueError(f"tensor {name!r} has {n_dims} dimensions; GGUF allows {_MAX_DIMS}")
                dims = tuple(_read(fh, "<Q") for _ in range(n_dims))
                qtype = GGMLQuantizationType(_read(fh, "<I"))
                _read(fh, "<Q")  # data offset
                n = 1
                for d in dims:
                    n *= d
                block, type_size = GGML_QUANT_SIZES[qtype]
                tensors.append(GGUFTensor(name, dims, qtype.name, n, n // block * type_size))
    except (OSError, ValueError, EOFError, KeyError) as e:
        raise UserError.one(
            f"cannot read GGUF file {path}: {e}", fix="check the file is a complete GGUF model"
        ) from e
    return GGUFHeader(fields, tuple(tensors))
