"""Numbers past any sensible bound, non-finite floats, odd `extends` paths and values that would
render into something the engine, a shell or Kubernetes misreads: each is a located `UserError`
from `validate`, `plan` and `render` alike (exit 2), never a traceback."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hardening.cli_run import CliResult, run_cli

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
QUICKSTART = RECIPES / "quickstart.yaml"
PRODUCTION = RECIPES / "production.yaml"  # a Kubernetes target with autoscaling
DOCKER = RECIPES / "long-context-agent.yaml"
BIG = "1" + "0" * 400  # 10^400


def _all_refuse(recipe: Path, tmp_path: Path, *sets: str) -> list[CliResult]:
    overrides = [a for s in sets for a in ("--set", s)]
    env = {"AGENT_API_KEY": "x"}
    results = [
        run_cli("validate", str(recipe), *overrides, env=env),
        run_cli("plan", str(recipe), *overrides, env=env),
        run_cli("render", str(recipe), "-o", str(tmp_path / "out"), *overrides, env=env),
    ]
    for result in results:
        assert "Traceback" not in result.output, result.output
        assert result.returncode == 2, f"{result.args}: {result.output}"
    return results


@pytest.mark.parametrize(
    ("recipe", "item", "field"),
    [
        (QUICKSTART, "limits.kv_cache_memory_gib=.inf", "limits.kv_cache_memory_gib"),
        (QUICKSTART, "limits.kv_cache_memory_gib=.nan", "limits.kv_cache_memory_gib"),
        (QUICKSTART, "hardware.gpu_memory_gib=1e300", "hardware.gpu_memory_gib"),
        (QUICKSTART, "limits.max_num_seqs=1e400", "limits.max_num_seqs"),
        (QUICKSTART, "limits.max_num_seqs=1.0e+400", "limits.max_num_seqs"),
        (QUICKSTART, f"parallelism.pipeline={BIG}", "parallelism.pipeline"),
        (QUICKSTART, f"limits.max_model_len={BIG}", "limits.max_model_len"),
        (QUICKSTART, f"bench.input_len={BIG}", "bench.input_len"),
        (PRODUCTION, "target.autoscaling.target=.inf", "target.autoscaling.target"),
        (PRODUCTION, "target.model_cache.size_gib=.inf", "target.model_cache.size_gib"),
        (PRODUCTION, f"target.probes.startup_budget_s={BIG}", "target.probes.startup_budget_s"),
        (PRODUCTION, f"parallelism.replicas={BIG}", "parallelism.replicas"),
        (QUICKSTART, "engine.version=" + "v" * 300, "engine.version"),
        (QUICKSTART, "engine.version=../../../etc/x", "engine.version"),
        # found by the recipe fuzzer: a name longer than the file system takes (ENAMETOOLONG)
        (PRODUCTION, "model.id=" + "x" * 300, "model.id"),
        (PRODUCTION, "model.path=/" + "x" * 300, "model.path"),
    ],
)
def test_out_of_range_numbers_are_located_errors(tmp_path: Path, recipe: Path, item: str, field: str) -> None:
    results = _all_refuse(recipe, tmp_path, item)
    assert f"{field}:" in results[0].output


def test_extends_with_a_nul_is_an_error(tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text('extends: "a\\0.yaml"\nmodel: {id: x}\n')
    results = _all_refuse(recipe, tmp_path)
    assert "extends: contains a NUL character" in results[0].output


def test_extends_through_a_symlink_loop_is_an_error(tmp_path: Path) -> None:
    os.symlink(tmp_path / "b.yaml", tmp_path / "a.yaml")
    os.symlink(tmp_path / "a.yaml", tmp_path / "b.yaml")
    recipe = tmp_path / "r.yaml"
    recipe.write_text("extends: a.yaml\nmodel: {id: x}\n")
    results = _all_refuse(recipe, tmp_path)
    # the link check names the loop before anything tries to resolve or read it
    assert "extends:" in results[0].output and "a loop of links" in results[0].output
    assert "Traceback" not in results[0].output


@pytest.mark.parametrize(
    ("recipe", "items", "field"),
    [
        (PRODUCTION, ["target.probes.period_s=2147483648"], "target.probes.period_s"),
        (PRODUCTION, ["target.termination_grace_period_s=2147483648"], "target.termination_grace_period_s"),
        (PRODUCTION, ["target.autoscaling.max_replicas=2147483648"], "target.autoscaling.max_replicas"),
        (PRODUCTION, ["target.labels={'bad key!': x}"], "target.labels.bad key!"),
        (PRODUCTION, ["target.labels={team: 'not a value'}"], "target.labels.team"),
        (
            PRODUCTION,
            ["target.labels={app.kubernetes.io/instance: other}"],
            "target.labels.app.kubernetes.io/instance",
        ),
        (PRODUCTION, ["target.node_selector={-x: y}"], "target.node_selector.-x"),
        (PRODUCTION, ["engine.env={A-B: x}"], "engine.env.A-B"),
        (DOCKER, ["engine.env={'1BAD': x}"], "engine.env.1BAD"),
        (DOCKER, ["target.shm_size_gib=-1"], "target.shm_size_gib"),
        (DOCKER, ["target.shm_size_gib=.nan"], "target.shm_size_gib"),
        (QUICKSTART, ["server.host=--port"], "server.host"),
        (QUICKSTART, ["bench.concurrency=[]"], "bench.concurrency"),
        (QUICKSTART, ["bench.concurrency=[0]"], "bench.concurrency.0"),
        (QUICKSTART, ["bench.input_len=-5"], "bench.input_len"),
        (PRODUCTION, ["target.autoscaling.metric=kv_usage"], "target.autoscaling"),
        (PRODUCTION, ["target.kubernetes_version=latest"], "target.kubernetes_version"),
    ],
)
def test_values_that_would_render_wrong_are_refused(
    tmp_path: Path, recipe: Path, items: list[str], field: str
) -> None:
    results = _all_refuse(recipe, tmp_path, *items)
    assert f"{field}:" in results[0].output, results[0].output


def test_a_flag_value_that_reads_as_a_flag_is_refused(tmp_path: Path) -> None:
    # `plan` needs no engine command; validate and render refuse what the engine would misread
    item = ("--set", "server.served_model_name=--port")
    for args in (("validate", str(QUICKSTART)), ("render", str(QUICKSTART), "-o", str(tmp_path))):
        result = run_cli(*args, *item)
        assert result.returncode == 2, result.output
        assert (
            "server.served_model_name: --served-model-name would get a value starting with '-'"
            in result.output
        )
