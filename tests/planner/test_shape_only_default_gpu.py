"""The README's shape-only `plan` example runs as written (issue 29, item 13: it needed `--gpu`).

Without a GPU the shape-only mode sizes the model on the smallest catalog GPU that holds its
weights, the flat overhead and one full-length sequence, and says so in a note.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

from click.testing import CliRunner

from llmdeploy.catalog.gpus import list_gpus
from llmdeploy.cli.plan_cmd import plan_command

README = Path(__file__).resolve().parents[2] / "README.md"


def _readme_example() -> list[str]:
    found = re.search(r"`plan (--params-b [^`]+)`", README.read_text())
    assert found, "the README shows a shape-only plan example"
    return shlex.split(found.group(1))


def _plan(args: list[str]) -> dict[str, object]:
    out = CliRunner().invoke(plan_command, [*args, "--output", "json"])
    assert out.exit_code == 0, out.output
    return dict(json.loads(out.output))


def test_the_readme_example_runs_and_names_the_gpu_it_chose() -> None:
    args = _readme_example()
    assert "--gpu" not in args
    plan = _plan(args)
    assert plan["fits"] is True
    assert any("no --gpu given: sized on" in str(n) for n in plan["notes"])  # type: ignore[attr-defined]


def test_the_chosen_gpu_is_the_smallest_that_fits() -> None:
    args = _readme_example()
    chosen = _plan(args)["gpu"]
    by_size = sorted(list_gpus(), key=lambda g: (g.marketing_gb, g.memory_gib))
    fits = {g.name: _plan([*args, "--gpu", g.name])["fits"] for g in by_size}
    assert fits[str(chosen)] is True
    smaller = [
        g.name for g in by_size if g.marketing_gb < next(x for x in by_size if x.name == chosen).marketing_gb
    ]
    assert not any(fits[name] for name in smaller)


def test_too_large_for_every_gpu_says_so() -> None:
    plan = _plan(["--params-b", "2000", "--num-layers", "80", "--num-kv-heads", "8", "--head-dim", "128"])
    assert plan["fits"] is False
    assert any("no catalog GPU holds this" in str(n) for n in plan["notes"])  # type: ignore[attr-defined]


def test_shape_only_mode_never_names_an_amd_gpu() -> None:
    # 205 GB of weights: MI300X (192 GB) is too small, MI325X (256 GB) would be the smallest that
    # holds it, but the planner's rules are the CUDA builds' and refuse ROCm, so B300 is named
    from click.testing import CliRunner

    from llmdeploy.cli.plan_cmd import plan_command

    args = ["--params-b", "400", "--num-layers", "120", "--num-kv-heads", "8", "--head-dim", "128"]
    result = CliRunner().invoke(plan_command, [*args, "--weight-bytes", "0.5"])
    assert result.exit_code == 0, result.output
    assert "sized on B300" in result.output and "MI3" not in result.output
