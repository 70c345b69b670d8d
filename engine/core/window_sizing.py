"""How long the next asynchronous decode window is when `num_scheduler_steps` is auto.

Window length auto (`num_scheduler_steps` None, the default; with asynchronous windows on a CUDA
device): every window starts at one step; `WindowSizer` lengthens the windows (up to 8 steps) while
the host waits ~nothing for each window's ids, i.e. while the device idles between windows because
the host's work a window is over half the device's, and shortens them when the device has more than
four times the host's work. So a model whose steps are long on the device runs one-step windows, and
a small model at a large batch runs windows long enough to hide the host (new requests then wait up
to two windows, streams arrive in chunks). While requests arrive (one was added while sequences
decoded in the last ARRIVAL_HOLD_S) and a max_num_seqs slot is free, auto windows are at most
ARRIVAL_WINDOW_STEPS steps: an unsaturated engine's throughput follows the arrivals, not the windows,
and its streams arrive in smaller chunks. Elsewhere auto is one step.

Plain Python: part of the batching core (no torch, no numpy).
"""

from __future__ import annotations

# num_scheduler_steps auto: the longest window the engine chooses by itself
AUTO_MAX_WINDOW_STEPS = 8
# window length auto while requests arrive: a request added while sequences decode waits for the
# window in flight and its follow-on, so for ARRIVAL_HOLD_S after such an arrival (and while a
# max_num_seqs slot is free for the next one) windows are at most ARRIVAL_WINDOW_STEPS steps. The
# 0.5B at 30 requests/s ran 8-step windows there, which bought no throughput (the arrivals set it)
# and streamed tokens in chunks: with the cap the median gap between a stream's tokens went from
# 9.1-12.8 to 2.3-2.5 ms at the same tok/s (H200), the median time to first token unchanged
ARRIVAL_WINDOW_STEPS = 2
ARRIVAL_HOLD_S = 1.0


class WindowSizer:
    """The length of the next asynchronous decode window when `num_scheduler_steps` is auto.

    With asynchronous windows the host launches window k + 1, then waits for window k's ids, then
    processes them. The share of the time between windows that the host spends waiting is the
    device's lead: ~0 when the host's work per window (processing, scheduling, packing, launching)
    is longer than the device's, so the device idles between windows; near 1 when the device's is
    much longer. A longer window does the same per-window host work (and the device's own per-window
    copies) for more decode steps. So, per `span` windows, from the median window's share (one host
    stall, a collection or a descheduled thread, moves a sum but not the median): below `grow_below`
    (the host's work is over half the device's, where the host's jitter already idles the device)
    the length doubles, up to `max_steps`; above `shrink_above` (the host's work is under a quarter
    of the device's) it halves, down to 1, which shortens the wait of new requests and the chunks of
    streamed tokens. With host work a + b L and device work d L for L steps, a share above s at L is
    above 2 s - 1 at L / 2: with s = 0.75 that is 0.5, so a halving is never undone by the next
    decision. Measured on an H200: the 8B at 256 sequences (~13 ms of device work against
    ~2-3 ms of host work a step) runs one-step windows; the 0.5B (~2 ms against ~3 ms) 2-8 steps."""

    def __init__(
        self,
        max_steps: int = AUTO_MAX_WINDOW_STEPS,
        span: int = 8,
        grow_below: float = 0.5,
        shrink_above: float = 0.75,
    ) -> None:
        assert max_steps >= 1 and span >= 1 and 0.0 <= grow_below < shrink_above <= 1.0
        self.steps = 1
        self.max_steps = max_steps
        self.span = span
        self.grow_below = grow_below
        self.shrink_above = shrink_above
        self._shares: list[float] = []

    def observe(self, waited: float, between: float) -> int:
        """One window: seconds the host waited for its ids, and seconds since the window before it
        was done (its whole cycle). Returns the length of the next window."""
        shares = self._shares
        shares.append(waited / between if between > 0.0 else 1.0)
        if len(shares) >= self.span:
            shares.sort()
            mid = len(shares) // 2
            share = shares[mid] if len(shares) % 2 else (shares[mid - 1] + shares[mid]) / 2
            if share < self.grow_below:
                self.steps = min(2 * self.steps, self.max_steps)
            elif share > self.shrink_above:
                self.steps = max(self.steps // 2, 1)
            shares.clear()
        return self.steps
