"""The progress bar redraws in place on a terminal and prints a few plain lines otherwise."""

from __future__ import annotations

import io

from llmdeploy.bench.progress import ProgressBar


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_stream_gets_quarter_lines() -> None:
    out = io.StringIO()
    bar = ProgressBar(8, "c=1", out)
    for i in range(8):
        bar.advance(failed=i == 0)
    bar.close()
    lines = out.getvalue().splitlines()
    assert [line.split("]")[1].split(",")[0].strip() for line in lines] == ["0/8", "2/8", "4/8", "6/8", "8/8"]
    assert "1 failed" in lines[-1] and "\r" not in out.getvalue()


def test_terminal_is_redrawn_in_place() -> None:
    out = FakeTerminal()
    bar = ProgressBar(3, "c=2", out)
    for _ in range(3):
        bar.advance()
    bar.close()
    text = out.getvalue()
    assert text.count("\r") == 4 and text.endswith("\n") and text.count("\n") == 1
    assert "3/3, 0 failed" in text


def test_disabled_bar_writes_nothing() -> None:
    out = FakeTerminal()
    bar = ProgressBar(3, "c=2", out, enabled=False)
    bar.advance()
    bar.close()
    assert out.getvalue() == ""
