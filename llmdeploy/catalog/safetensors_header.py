"""Parameter count and bytes of a checkpoint folder, summed over its `*.safetensors` headers.

A header is outside input: its claimed length is held to the file's size (and to the 100 MB the
safetensors library itself allows) before it is read, and a header of the wrong shape is a
`UserError` naming the file.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from llmdeploy.errors import UserError

_MAX_HEADER_BYTES = 100_000_000


def safetensors_totals(folder: Path) -> tuple[int, int] | None:
    """(parameter count, bytes) summed over the `*.safetensors` headers in a folder, or None."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    count = size = 0
    for f in files:
        try:
            file_count, file_size = _safetensors_header_totals(f)
        except (
            OSError,
            UnicodeDecodeError,
            struct.error,
            TypeError,
            ValueError,
            KeyError,
            IndexError,
            AttributeError,
            OverflowError,
        ) as e:
            raise UserError.one(
                f"cannot read the safetensors header of {f}: {type(e).__name__}: {e}",
                fix="the file is cut short or damaged: download it again",
            ) from None
        count, size = count + file_count, size + file_size
    return count, size


def _safetensors_header_totals(file: Path) -> tuple[int, int]:
    with file.open("rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        if n > min(_MAX_HEADER_BYTES, file.stat().st_size - 8):
            raise ValueError(f"the header claims {n:,} bytes, more than the file or the format allows")
        header = json.loads(fh.read(n))
    count = size = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        numel = 1
        for d in info["shape"]:
            if isinstance(d, bool) or not isinstance(d, int) or d < 0:
                raise ValueError(f"tensor {name!r} has a dimension that is not a count: {d!r}")
            numel *= d
        count += numel
        start, end = info["data_offsets"]
        size += int(end) - int(start)
    return count, size
