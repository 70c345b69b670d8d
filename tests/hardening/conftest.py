from __future__ import annotations

import pytest

from hardening.figures import FIGURES, save, table


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if FIGURES:
        save()
        terminalreporter.write_sep("=", "hardening figures")
        terminalreporter.write_line(table(dict(FIGURES)))
