"""A seeded mutation fuzzer over the shipped recipes (`recipe_mutations.py` makes the cases).

Every case runs `validate` and `render` in this process, with planted secrets in the environment
under credential-named variables, and must hold:
- no traceback: anything but the project's `UserError` is a failure;
- no hang: each case within 5 s (a timer interrupts a case that runs longer);
- no planted secret in any output: validate's text and JSON, render's errors and every rendered file;
- validate and render agree: whatever render refuses, validate refuses (validate may refuse more:
  the memory fit and cross-field rules are its own).

    LLMDEPLOY_FUZZ_SEED=7 LLMDEPLOY_FUZZ_CASES=2000 pytest tests/hardening/test_recipe_fuzz.py

YAML parsing of an unchanged file is memoized for the run (most cases are `--set` items on a shipped
recipe); parsing itself is fuzzed by test_recipe_hostile.py and tests/recipe/test_loader_fuzz.py.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import time
import traceback
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from unittest import mock

import pytest

from hardening.figures import record
from hardening.recipe_mutations import (
    CREDENTIAL_VARIABLES,
    RECIPES_DIR,
    Case,
    cases,
    planted_environment,
)
from llmdeploy.errors import UserError
from llmdeploy.recipe.yaml_source import ParsedYaml

SEED = int(os.environ.get("LLMDEPLOY_FUZZ_SEED", "29"))
NUM_CASES = int(os.environ.get("LLMDEPLOY_FUZZ_CASES", "10000"))
TIME_BOUND_S = 5.0


class _Hang(Exception):
    pass


@contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise _Hang

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextmanager
def _memoized_yaml() -> Iterator[None]:
    import llmdeploy.recipe.loader as loader

    parse = functools.lru_cache(maxsize=64)(loader.parse_yaml)

    def parse_copy(text: str, file: str) -> ParsedYaml:
        parsed = parse(text, file)  # callers get their own data, as from a fresh parse
        return ParsedYaml(_copy(parsed.data), dict(parsed.marks), parsed.problems)

    with mock.patch.object(loader, "parse_yaml", parse_copy):
        yield


def _copy(value: object) -> object:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def _validate(path: Path, overrides: tuple[str, ...]) -> tuple[bool, str]:
    """`llmdeploy validate` (text and --output json) without the process around it."""
    from llmdeploy.cli.recipe_cmds import _validate_one

    result = _validate_one(path, overrides, schema_only=False)
    text = [result.line(), *(p.render() for p in result.problems), *result.notes]
    text.append(json.dumps({"ok": not result.problems, "files": [result.to_json()]}, indent=2))
    return not result.problems, "\n".join(text)


def _render(path: Path, overrides: tuple[str, ...]) -> tuple[bool, str]:
    """`llmdeploy render` up to the files it would write."""
    from llmdeploy.planner import make_plan
    from llmdeploy.recipe import load_recipe
    from llmdeploy.targets import render

    try:
        recipe = load_recipe(path, overrides)
        artifacts = render(recipe, make_plan(recipe))
    except UserError as e:
        return False, str(e)
    return True, "\n".join([*artifacts.files, *artifacts.files.values()])


def _run(case: Case, folder: Path, planted: list[str], counts: Counter[str]) -> str | None:
    """One case; the failure it shows, or None."""
    for name, text in case.files.items():
        (folder / name).write_text(text, encoding="utf-8")
    path = folder / "leaf.yaml" if case.files else RECIPES_DIR / f"{case.recipe}.yaml"
    overrides = tuple(case.overrides)
    start = time.monotonic()
    try:
        with _deadline(TIME_BOUND_S):
            validate_ok, validate_out = _validate(path, overrides)
            render_ok, render_out = _render(path, overrides)
    except _Hang:
        counts["hangs"] += 1
        return f"took over {TIME_BOUND_S:.0f} s"
    except Exception:
        counts["tracebacks"] += 1
        return traceback.format_exc(limit=-6)
    counts["slowest case (ms)"] = max(counts["slowest case (ms)"], round((time.monotonic() - start) * 1000))
    counts["validated" if validate_ok else "refused by validate"] += 1
    counts["rendered" if render_ok else "refused by render"] += 1
    leaked = [s for s in [*planted, *case.planted] if s in validate_out or s in render_out]
    if leaked:
        counts["planted secrets shown"] += len(leaked)
        where = "validate" if leaked[0] in validate_out else "render"
        return f"a planted secret in {where}'s output:\n" + (
            validate_out if where == "validate" else render_out
        )
    if validate_ok and not render_ok:
        counts["validate passed what render refused"] += 1
        return "validate passed, render refused:\n" + render_out
    if render_ok and not validate_ok:
        counts["validate stricter than render (fit and cross-field rules)"] += 1
    return None


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_mutated_shipped_recipes(tmp_path: Path) -> None:
    env = planted_environment()
    planted = [env[name] for name in CREDENTIAL_VARIABLES]
    counts: Counter[str] = Counter()
    failures: list[str] = []
    start = time.monotonic()
    with mock.patch.dict(os.environ, env), _memoized_yaml():
        for case in cases(SEED, NUM_CASES):
            counts["cases"] += 1
            counts["written as files"] += bool(case.files)
            failure = _run(case, tmp_path, planted, counts)
            if failure is not None:
                failures.append(f"{case.describe()}\n  overrides: {case.overrides}\n{failure}")
    elapsed_s = time.monotonic() - start
    for name, value in counts.items():
        record(f"recipe fuzz: {name}", value)
    record("recipe fuzz: failures", len(failures))
    print(f"recipe fuzz: seed {SEED}, {counts['cases']} cases in {elapsed_s:.0f} s, {dict(counts)}")
    assert not failures, (
        f"{len(failures)} of {counts['cases']} cases failed (seed {SEED}):\n\n" + "\n\n".join(failures[:8])
    )
