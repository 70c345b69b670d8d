"""A seeded mutation fuzzer over model files (`model_mutations.py` makes the cases).

Each case (a checkpoint folder or a GGUF file, damaged) goes through `llmdeploy models show`,
`validate` and `plan` (a recipe naming it in `model.path`), and through the built-in engine's
loader (`load_model_config`, what `llmdeploy-engine serve` reads before any weight), and must hold:
- no traceback: the toolkit answers with a `UserError` (exit 2), the engine with a ValueError
  naming the model (its serve command prints those and exits 2);
- no hang: each case within 5 s (a timer interrupts a case that runs longer).

    LLMDEPLOY_MODEL_FUZZ_SEED=7 LLMDEPLOY_MODEL_FUZZ_CASES=2000 pytest -s tests/hardening/test_model_files_fuzz.py
"""

from __future__ import annotations

import os
import signal
import time
import traceback
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

import pytest

from hardening.cli_run import run_cli
from hardening.figures import record
from hardening.model_mutations import ModelCase, cases

SEED = int(os.environ.get("LLMDEPLOY_MODEL_FUZZ_SEED", "48"))
NUM_CASES = int(os.environ.get("LLMDEPLOY_MODEL_FUZZ_CASES", "150"))
TIME_BOUND_S = 5.0
RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "quickstart.yaml"


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


def _toolkit(path: Path, case: ModelCase) -> str | None:
    """models show, validate and plan on the case; what went wrong, or None."""
    quantization = "gguf" if case.kind == "gguf" else "none"
    model = [f"--set=model.path={path}", "--set=model.pypi=null", f"--set=model.quantization={quantization}"]
    for args in (
        ("models", "show", str(path)),
        ("models", "show", str(path), "--output", "json"),
        ("validate", str(RECIPE), *model),
        ("plan", str(RECIPE), *model),
    ):
        result = run_cli(*args)
        if result.returncode not in (0, 2):
            return f"{result.args}: exit {result.returncode}\n{result.output[-2000:]}"
        if "Traceback" in result.output:
            return f"{result.args}: a traceback\n{result.output[-2000:]}"
    return None


def _engine(path: Path) -> str | None:
    from llmdeploy_engine.runner.setup import load_model_config

    try:
        load_model_config(str(path))
    except ValueError as e:
        if str(path) not in str(e):
            return f"the engine's error does not name the model: {e}"
    return None


def _warm_up() -> None:
    """Import what the first case would (transformers' config classes, torch): not a case's time."""
    from llmdeploy_engine.runner import setup

    from llmdeploy.catalog.config_defaults import transformers_view

    transformers_view({"model_type": "llama"})
    assert setup.load_model_config
    assert run_cli("validate", str(RECIPE)).returncode == 0


def _run(case: ModelCase, folder: Path, counts: Counter[str]) -> str | None:
    path = case.write(folder)
    start = time.monotonic()
    try:
        with _deadline(TIME_BOUND_S):
            failure = _toolkit(path, case) or _engine(path)
    except _Hang:
        counts["hangs"] += 1
        return f"took over {TIME_BOUND_S:.0f} s"
    except Exception:
        counts["tracebacks"] += 1
        return traceback.format_exc(limit=-6)
    counts["slowest case (ms)"] = max(counts["slowest case (ms)"], round((time.monotonic() - start) * 1000))
    if failure is not None:
        counts["tracebacks"] += 1
    return failure


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_mutated_model_files(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    _warm_up()
    counts: Counter[str] = Counter()
    failures: list[str] = []
    start = time.monotonic()
    for case in cases(SEED, NUM_CASES):
        counts["cases"] += 1
        counts[case.kind] += 1
        folder = tmp_path / str(case.index)
        folder.mkdir()
        failure = _run(case, folder, counts)
        if failure is not None:
            failures.append(f"{case.describe()}\n{failure}")
    elapsed_s = time.monotonic() - start
    for name, value in counts.items():
        record(f"model-file fuzz: {name}", value)
    record("model-file fuzz: failures", len(failures))
    print(f"model-file fuzz: seed {SEED}, {counts['cases']} cases in {elapsed_s:.0f} s, {dict(counts)}")
    kinds = Counter(f.splitlines()[1][:100] for f in failures)
    assert not failures, (
        f"{len(failures)} of {counts['cases']} cases failed (seed {SEED}); by first line:\n"
        + "\n".join(f"  {n} x {kind}" for kind, n in kinds.most_common(20))
        + "\n\n"
        + "\n\n".join(failures[:8])
    )
