"""The cyclic garbage collector's young-generation threshold for the engine's process.

Python runs a young-generation pass every 700 new container objects by default; the engine's step
loop creates that many in well under a millisecond, and the passes (with the older-generation passes
they trigger) took a third of the host time of a decode window (`git show c2170a2:benchmarks/host_overhead.py`: 2.0 ->
1.4 us a token at 256 x (560 + 560) with 8-step windows). So the engine raises the threshold to
`EngineConfig.gc_gen0_threshold` (`--gc-gen0-threshold`) for the process, never lowering it; 0 leaves
Python's setting alone.
"""

from __future__ import annotations

import gc

GC_GEN0_THRESHOLD = 50_000


def raise_gc_threshold(wanted: int = GC_GEN0_THRESHOLD) -> int:
    """Raise the collector's young-generation threshold to `wanted` (never lower it); returns it after."""
    if wanted < 0:
        raise ValueError(f"gc_gen0_threshold={wanted}: give a whole number of objects (0: Python's default)")
    gen0, gen1, gen2 = gc.get_threshold()
    if wanted > gen0:
        gc.set_threshold(wanted, gen1, gen2)
    return gc.get_threshold()[0]
