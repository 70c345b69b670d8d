"""The problems an engine's `validate` rules report, written as rows of one check."""

from __future__ import annotations

from collections.abc import Iterator

from llmdeploy.errors import Problem


def knob_problems(*rows: tuple[bool, str, object, str, str]) -> Iterator[Problem]:
    """For each (refused, path, value, message, fix) row refused: a Problem naming the knob, its value
    and the fix, in the order of the rows."""
    for refused, path, value, message, fix in rows:
        if refused:
            yield Problem(message, path=path, value=value, has_value=True, fix=fix)
