"""Which CPU storage a GGUF weight kept compact takes (gguf_compact.py), from its tensor types and
shapes alone: torch-free, so the planner's byte count of the same weights can follow the same rule.
"""

from __future__ import annotations

from collections.abc import Iterable

INT4_TYPES = ("Q4_0", "Q4_1", "Q4_K")
DENSE_TYPES = ("F32", "F16", "BF16")


def projection_storage(parts: Iterable[tuple[str, int, int]]) -> str:
    """ "dense" (the compute dtype), "int4pack" or "fp16" for one merged projection stacked from parts
    (GGUF type, in_features, out_features): int4pack needs every part a 4-bit type with inputs a
    multiple of 32 (the kernel's group) and the stacked outputs a multiple of 16 (its tile)."""
    parts = list(parts)
    kinds = {kind for kind, _, _ in parts}
    if kinds <= set(DENSE_TYPES):
        return "dense"
    if (
        kinds <= set(INT4_TYPES)
        and all(in_features % 32 == 0 for _, in_features, _ in parts)
        and sum(out_features for _, _, out_features in parts) % 16 == 0
    ):
        return "int4pack"
    return "fp16"
