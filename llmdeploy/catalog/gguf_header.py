"""`read_gguf_header(path)`: a GGUF file's metadata and tensor table, without loading tensor data.

`gguf.GGUFReader` builds Python objects for every array (a 49k-entry tokenizer takes seconds);
planning needs only scalars and the tensor table, so arrays are skipped. Type codes and block sizes
come from the `gguf` package's constants.
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


def _string(fh: BinaryIO) -> str:
    n = _read(fh, "<Q")
    return bytes(fh.read(n)).decode("utf-8", errors="replace")


def _value(fh: BinaryIO, vtype: int) -> Any:
    if vtype in _SCALARS:
        return _read(fh, _SCALARS[vtype])
    if vtype == _STRING:
        return _string(fh)
    if vtype == _ARRAY:
        item_type, count = _read(fh, "<I"), _read(fh, "<Q")
        if item_type in _SCALARS:
            fh.seek(count * struct.calcsize(_SCALARS[item_type]), 1)
        elif item_type == _STRING:
            for _ in range(count):  # a tokenizer's vocabulary: skipped, never decoded
                fh.seek(_read(fh, "<Q"), 1)
        else:
            for _ in range(count):
                _value(fh, item_type)
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
            n_tensors, n_fields = _read(fh, "<Q"), _read(fh, "<Q")
            fields = {}
            for _ in range(n_fields):
                key = _string(fh)
                fields[key] = _value(fh, _read(fh, "<I"))
            tensors = []
            for _ in range(n_tensors):
                name = _string(fh)
                dims = tuple(_read(fh, "<Q") for _ in range(_read(fh, "<I")))
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
