"""varlen_attention's BLOCK_M classes and the start-up warm-up's prompt lengths (pure functions)."""

from __future__ import annotations

import pytest
from llmdeploy_engine.kernels.attention import (
    LARGEST_BLOCK_M,
    default_block_m,
    varlen_launch,
    warm_query_lens,
)


def test_block_m_classes() -> None:
    assert [default_block_m(r) for r in (1, 16, 17, 32, 33, 255, 256, 4096)] == [
        16,
        16,
        32,
        32,
        64,
        64,
        64,
        64,
    ]


@pytest.mark.parametrize(
    "group,want",
    [(4, [2, 5, 9]), (7, [2, 3, 5]), (1, [2, 17, 33]), (16, [2, 3]), (32, [2])],
)
def test_warm_query_lens_cover_each_class_once(group: int, want: list[int]) -> None:
    lens = warm_query_lens(group, 8192)
    assert lens == want
    classes = [default_block_m(q * group) for q in lens]
    assert len(set(classes)) == len(classes)
    # every prefill length a step can have (>= 2 tokens) falls in a class the warm-up ran
    assert {default_block_m(q * group) for q in range(2, 8193)} == set(classes)


def test_varlen_launch_configurations() -> None:
    """The v16 sweep's configurations for 64 rows (bf16 and fp8 caches); 16-32 and an explicit 128
    keep the earlier ones."""
    assert varlen_launch(64, fp8=False) == (32, 4, 3)
    assert varlen_launch(64, fp8=True) == (64, 4, 2)
    assert varlen_launch(16, fp8=False) == varlen_launch(32, fp8=True) == (64, 4, 2)
    assert varlen_launch(128, fp8=False) == (64, 8, 2)
    assert {default_block_m(r) for r in range(1, 10_000)} == {16, 32, LARGEST_BLOCK_M}


def test_warm_query_lens_stop_at_the_limit() -> None:
    assert warm_query_lens(4, 8) == [2, 5]
    assert warm_query_lens(4, 1) == []
