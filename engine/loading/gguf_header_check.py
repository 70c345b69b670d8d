"""A GGUF header's counts and lengths checked against the file's size before gguf-py reads it.

gguf-py's reader trusts the header: an array claiming a billion items in a 600-byte file makes it
build a billion-entry index (minutes, gigabytes) before it notices the file is short. This walk
reads only the counts, lengths and type codes (no values), refuses any that the file cannot hold,
and costs one pass over the metadata.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import BinaryIO

# metadata value type -> size in bytes (8: string, 9: array)
_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9
_MAX_ARRAY_NESTING = 4
_MAX_DIMS = 4  # llama.cpp's GGML_MAX_DIMS


def check_gguf_header(path: str | Path) -> None:
    """Raise ValueError (naming the file) when the header's counts do not fit in the file."""
    size = Path(path).stat().st_size
    try:
        with open(path, "rb") as fh:
            if fh.read(4) != b"GGUF":
                raise ValueError("not a GGUF file (bad magic)")
            _read(fh, "<I")  # version
            n_tensors, n_fields = _count(fh, size, 8), _count(fh, size, 8)
            for _ in range(n_fields):
                _skip(fh, _count(fh, size, 1))  # key
                _skip_value(fh, _read(fh, "<I"), size, 0)
            for _ in range(n_tensors):
                _skip(fh, _count(fh, size, 1))  # name
                n_dims = _read(fh, "<I")
                if n_dims > _MAX_DIMS:
                    raise ValueError(f"a tensor has {n_dims} dimensions; GGUF allows {_MAX_DIMS}")
                _skip(fh, 8 * n_dims + 4 + 8)  # dims, type, offset
                if fh.tell() > size:
                    raise EOFError
    except (EOFError, struct.error):
        raise ValueError(f"GGUF file {path} is cut short: download it again") from None
    except ValueError as e:
        raise ValueError(f"GGUF file {path}: {e} (a damaged header): download it again") from None


def _read(fh: BinaryIO, fmt: str) -> int:
    data = fh.read(struct.calcsize(fmt))
    return int(struct.unpack(fmt, data)[0])


def _count(fh: BinaryIO, size: int, unit: int) -> int:
    n = _read(fh, "<Q")
    if n * unit > size:
        raise ValueError(f"a count or length of {n:,} is more than the {size:,}-byte file can hold")
    return n


def _skip(fh: BinaryIO, n: int) -> None:
    fh.seek(n, 1)


def _skip_value(fh: BinaryIO, vtype: int, size: int, nesting: int) -> None:
    if vtype in _SCALAR_SIZES:
        _skip(fh, _SCALAR_SIZES[vtype])
    elif vtype == _STRING:
        _skip(fh, _count(fh, size, 1))
    elif vtype == _ARRAY:
        if nesting >= _MAX_ARRAY_NESTING:
            raise ValueError(f"arrays nested more than {_MAX_ARRAY_NESTING} deep")
        item_type = _read(fh, "<I")
        if item_type in _SCALAR_SIZES:
            _skip(fh, _count(fh, size, _SCALAR_SIZES[item_type]) * _SCALAR_SIZES[item_type])
        else:
            for _ in range(_count(fh, size, 8 if item_type == _STRING else 1)):
                _skip_value(fh, item_type, size, nesting + 1)
    else:
        raise ValueError(f"unknown metadata value type {vtype}")
    if fh.tell() > size:
        raise EOFError
