"""Asking before a step that installs, replaces or deletes something (`--yes` answers for the user)."""

from __future__ import annotations

import sys
from collections.abc import Callable

import click


def terminal_confirm(assume_yes: bool, *, default: bool, announce_yes: bool = False) -> Callable[[str], bool]:
    """`confirm(question)`: True without asking under --yes (saying so on stderr when `announce_yes`),
    False when standard input is not a terminal to ask on, else the user's answer (`default` on enter)."""

    def ask(question: str) -> bool:
        if assume_yes:
            if announce_yes:
                click.echo(f"{question} yes (--yes)", err=True)
            return True
        if not sys.stdin.isatty():
            click.echo(f"{question} no: standard input is not a terminal (pass --yes to agree)", err=True)
            return False
        return click.confirm(question, default=default, err=True)

    return ask
