"""A live progress bar on stderr: redrawn in place on a terminal, a few plain lines otherwise."""

from __future__ import annotations

import sys
import time
from typing import TextIO

_WIDTH = 30


class ProgressBar:
    def __init__(self, total: int, label: str, stream: TextIO | None = None, enabled: bool = True) -> None:
        self.total = total
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.tty = enabled and self.stream.isatty()
        self.done = 0
        self.failed = 0
        self.started_at = time.perf_counter()
        self._next_line_at = 0.25  # non-TTY: one line per quarter
        if self.enabled:
            self._draw()

    def advance(self, failed: bool = False) -> None:
        self.done += 1
        self.failed += int(failed)
        if not self.enabled:
            return
        if self.tty:
            self._draw()
        elif self.done >= self.total * self._next_line_at:
            self._draw()
            while self.done >= self.total * self._next_line_at:
                self._next_line_at += 0.25

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()

    def _draw(self) -> None:
        filled = int(_WIDTH * self.done / self.total) if self.total else _WIDTH
        bar = "#" * filled + "-" * (_WIDTH - filled)
        elapsed = time.perf_counter() - self.started_at
        text = f"{self.label} [{bar}] {self.done}/{self.total}, {self.failed} failed, {elapsed:.1f} s"
        if self.tty:
            self.stream.write("\r\033[2K" + text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()
