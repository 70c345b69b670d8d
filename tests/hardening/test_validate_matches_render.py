"""`validate` runs every check `render` (and so `apply`) makes for the recipe's target: whatever
`render` refuses, `validate` refuses too, naming the same problems, so a CI gate on `validate` is exact."""

from __future__ import annotations

from pathlib import Path

import pytest

from hardening.cli_run import run_cli

RECIPES = Path(__file__).resolve().parents[2] / "recipes"

CASES = [
    # (recipe, --set items, a fragment both must name)
    ("production", ["server.api_key={env: K}"], "server.api_key.env: on Kubernetes"),
    ("production", ["server.hf_token={env: HF_TOKEN}"], "server.hf_token.env: on Kubernetes"),
    ("quickstart", ["server.api_key={secret: {name: k}}"], "server.api_key.secret: a Kubernetes Secret"),
    ("long-context-agent", ["server.api_key={secret: {name: k}}"], "read by Docker Compose"),
    ("production", ["target.autoscaling.min_replicas=0"], "cannot scale to zero"),
    (
        "tgi",
        ["target.type=kubernetes", "target.autoscaling={metric: kv_usage, target: 0.8}"],
        "exports no metric",
    ),
    ("production", ["hardware.nodes=2", "parallelism.tensor=1"], "autoscaling a LeaderWorkerSet"),
    ("quickstart-vllm", ["target.type=docker"], "containers get no conversion step"),
    ("quickstart", ["target.type=kubernetes", "target.namespace=Bad_NS"], "target.namespace"),
    ("production", ["engine.env={'1X': y}"], "engine.env.1X"),
]


@pytest.mark.parametrize(("name", "items", "fragment"), CASES, ids=[f"{c[0]}:{c[1][0]}" for c in CASES])
def test_what_render_refuses_validate_refuses(
    tmp_path: Path, name: str, items: list[str], fragment: str
) -> None:
    recipe = str(RECIPES / f"{name}.yaml")
    sets = [a for item in items for a in ("--set", item)]
    env = {"AGENT_API_KEY": "x", "K": "x"}
    rendered = run_cli("render", recipe, "-o", str(tmp_path / "out"), *sets, env=env)
    validated = run_cli("validate", recipe, *sets, env=env)
    assert rendered.returncode == 2, rendered.output
    assert validated.returncode == 2, f"validate passed what render refuses:\n{rendered.output}"
    assert fragment in rendered.output and fragment in validated.output, (rendered.output, validated.output)


def test_render_reports_every_target_problem_at_once(tmp_path: Path) -> None:
    recipe = str(RECIPES / "production.yaml")
    sets = ["--set", "server.api_key={env: K}", "--set", "target.autoscaling.min_replicas=0"]
    result = run_cli("render", recipe, "-o", str(tmp_path), *sets)
    assert "error: 2 problems found" in result.output, result.output
