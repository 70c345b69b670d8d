"""Engine flag catalogues (JSON generated from the real CLIs, see catalogue_gen.py) and the offline check.

A renamed or removed flag, or a value outside a flag's choices, becomes a Problem at `validate` /
`render` time instead of a pod that crash-loops.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from llmdeploy.engines.registry import ENGINES, get_engine
from llmdeploy.errors import Problem

FLAGS_DIR = Path(__file__).with_name("catalogues")
# the engine releases llmdeploy renders for by default (a catalogue exists for each)
PINNED_VERSIONS: dict[str, str] = {name: engine.pinned_version for name, engine in ENGINES.items()}


@dataclass(frozen=True)
class FlagSpec:
    flag: str
    option_strings: tuple[str, ...]
    kind: str  # "value" | "flag" | "bool_optional"
    nargs: int | str | None
    choices: tuple[str, ...] | None


@dataclass(frozen=True)
class FlagCatalogue:
    engine: str
    version: str
    source: str
    entrypoint: tuple[str, ...]
    by_option: dict[str, FlagSpec]

    def lookup(self, option: str) -> FlagSpec | None:
        return self.by_option.get(option)


def catalogue_path(engine: str, version: str) -> Path:
    return FLAGS_DIR / get_engine(engine).catalogue_file(version)


def available_versions(engine: str) -> list[str]:
    return sorted(p.stem.split("-", 1)[1] for p in FLAGS_DIR.glob(f"{engine}-*.json"))


@cache
def load_catalogue(engine: str, version: str) -> FlagCatalogue | None:
    path = catalogue_path(engine, version)
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    by_option: dict[str, FlagSpec] = {}
    for row in data["flags"]:
        spec = FlagSpec(
            flag=row["flag"],
            option_strings=tuple(row["option_strings"]),
            kind=row["kind"],
            nargs=row["nargs"],
            choices=tuple(row["choices"]) if row["choices"] else None,
        )
        for option in spec.option_strings:
            by_option[option] = spec
    return FlagCatalogue(
        engine=data["engine"],
        version=data["version"],
        source=data["source"],
        entrypoint=tuple(data["entrypoint"]),
        by_option=by_option,
    )


def _takes_values(spec: FlagSpec) -> int | None:
    """How many following tokens the flag consumes: an int, or None for 'one or more'."""
    if spec.kind != "value":
        return 0
    if spec.nargs in (None, 1):
        return 1
    if isinstance(spec.nargs, int):
        return spec.nargs
    return None if spec.nargs in ("+", "*") else 1


def check_flags(
    engine: str, argv: list[str], version: str | None = None, extra_args_from: int | None = None
) -> list[Problem]:
    """Every option in `argv` (entry point included or not) checked against the engine's catalogue.
    `extra_args_from`: the index in `argv` where the recipe's `engine.extra_args` begin, so their
    problems name the entry (`engine.extra_args.N`) rather than the engine."""
    version = version or get_engine(engine).pinned_version
    catalogue = load_catalogue(engine, version)
    if catalogue is None:
        known = ", ".join(available_versions(engine)) or "none"
        return [
            Problem(
                f"no flag catalogue for {engine} {version}",
                path="engine.version",
                value=version,
                has_value=True,
                fix=f"use a version with a catalogue ({known}), or generate one with "
                "llmdeploy/engines/catalogue_gen.py",
            )
        ]
    args = list(argv)
    skipped = 0
    if tuple(args[: len(catalogue.entrypoint)]) == catalogue.entrypoint:
        skipped = len(catalogue.entrypoint)
        args = args[skipped:]
    first_extra = None if extra_args_from is None else extra_args_from - skipped

    def field(at: int) -> str:
        if first_extra is None or at < first_extra:
            return "engine"
        return f"engine.extra_args.{at - first_extra}"

    problems: list[Problem] = []
    i = 0
    while i < len(args):
        token = args[i]
        at = i
        i += 1
        if not token.startswith("-"):
            problems.append(
                Problem(
                    f"{engine} {version}: unexpected positional argument",
                    path=field(at) if first_extra is not None else "engine.extra_args",
                    value=token,
                    has_value=True,
                    fix="pass every value after its flag",
                )
            )
            continue
        option, _, inline = token.partition("=")
        spec = catalogue.lookup(option)
        if spec is None:
            close = difflib.get_close_matches(option, list(catalogue.by_option), n=1)
            hint = f"did you mean {close[0]}?" if close else f"see {catalogue_path(engine, version).name}"
            problems.append(
                Problem(
                    f"{engine} {version} has no flag {option}",
                    path=field(at),
                    value=option,
                    has_value=True,
                    fix=f"{hint} (catalogue from {catalogue.source})",
                )
            )
            while i < len(args) and not args[i].startswith("-"):
                i += 1  # the unknown flag's values
            continue
        count = _takes_values(spec)
        values: list[str] = []
        if inline:
            values = [inline]
        elif count is None:
            while i < len(args) and not args[i].startswith("--"):
                values.append(args[i])
                i += 1
        else:
            values = args[i : i + count]
            i += len(values)
        if count and len(values) < count:
            problems.append(
                Problem(
                    f"{engine} {version}: {option} needs a value",
                    path=field(at),
                    value=option,
                    has_value=True,
                    fix=f"give {option} VALUE",
                )
            )
        if spec.choices:
            for value in values:
                if value not in spec.choices:
                    problems.append(
                        Problem(
                            f"{engine} {version}: {option} does not accept this value",
                            path=field(at),
                            value=value,
                            has_value=True,
                            fix=f"one of: {', '.join(spec.choices)}",
                        )
                    )
    return problems
