"""GPU prices per hour for ranking `plan --fit` options: the shipped table, or the user's own file."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from functools import cache
from importlib import resources
from pathlib import Path

import yaml

from llmdeploy.catalog.gpus import resolve_gpu
from llmdeploy.errors import Problem, UserError

_FIX = "write a mapping of GPU name to US dollars per GPU-hour, e.g. `H100-SXM: 2.5`"


@cache
def shipped_prices() -> dict[str, float]:
    raw = json.loads(resources.files("llmdeploy.catalog").joinpath("gpu_prices.json").read_text())
    return {str(k): float(v) for k, v in raw["usd_per_gpu_hour"].items()}


def load_prices(path: Path | None) -> dict[str, float]:
    """The shipped table, with the entries of `path` (YAML or JSON) replacing or adding to it."""
    prices = dict(shipped_prices())
    if path is None:
        return prices
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise UserError.one(
            f"cannot read the price file ({type(e).__name__})", file=str(path), fix=_FIX
        ) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        raise UserError.one(
            "the price file is not valid YAML/JSON", file=str(path), line=line, fix=_FIX
        ) from None
    if isinstance(raw, dict) and isinstance(raw.get("usd_per_gpu_hour"), dict):
        raw = raw["usd_per_gpu_hour"]  # the shipped file's own layout
    if not isinstance(raw, dict):
        raise UserError.one("the price file must be a mapping", file=str(path), fix=_FIX)
    problems: list[Problem] = []
    for name, value in raw.items():
        if str(name).startswith("_"):
            continue
        try:
            gpu = resolve_gpu(str(name))
        except UserError as e:
            problems.extend(replace(p, file=str(path)) for p in e.problems)
            continue
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or value < 0
        ):
            problems.append(
                Problem(
                    f"the price of {name} must be a non-negative number",
                    file=str(path),
                    path=str(name),
                    fix=_FIX,
                )
            )
            continue
        prices[gpu.name] = float(value)
    if problems:
        raise UserError(problems)
    return prices
