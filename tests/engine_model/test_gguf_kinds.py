"""gguf_kinds.projection_storage: the CPU storage of a merged GGUF projection from its parts' types and
shapes (in_features, out_features)."""

from __future__ import annotations

import pytest
from llmdeploy_engine.loading.gguf_kinds import projection_storage


@pytest.mark.parametrize(
    ("parts", "storage"),
    [
        ([("F32", 64, 64)], "dense"),
        ([("F16", 64, 64), ("BF16", 64, 16)], "dense"),
        ([("Q4_0", 64, 64), ("Q4_K", 64, 32)], "int4pack"),
        ([("Q4_1", 64, 8), ("Q4_1", 64, 8)], "int4pack"),  # the stacked outputs are a multiple of 16
        ([("Q4_1", 64, 8)], "fp16"),  # 8 outputs: not a whole int4pack tile
        ([("Q4_0", 48, 64)], "fp16"),  # inputs not a multiple of the 32-wide group
        ([("Q4_0", 64, 64), ("Q8_0", 64, 64)], "fp16"),  # one part of another quantized type
        ([("Q4_0", 64, 64), ("F16", 64, 64)], "fp16"),
        ([("Q6_K", 256, 256)], "fp16"),
    ],
)
def test_projection_storage(parts: list[tuple[str, int, int]], storage: str) -> None:
    assert projection_storage(parts) == storage
    assert projection_storage(iter(parts)) == storage  # any iterable, read once
