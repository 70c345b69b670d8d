"""The offline flag check against catalogues generated from the engines' own parsers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmdeploy.engines.catalogue import PINNED_VERSIONS, catalogue_path
from llmdeploy.engines.catalogue_gen import builtin_catalogue
from llmdeploy.errors import UserError
from llmdeploy.recipe import load_recipe
from llmdeploy.render import check_flags
from llmdeploy.render.engine_command import engine_command


def test_renamed_flag_is_a_problem_with_a_suggestion() -> None:
    problems = check_flags("vllm", ["--max-model-length", "4096"])
    assert len(problems) == 1 and "--max-model-len" in (problems[0].fix or "")


def test_extra_args_problems_name_their_entry() -> None:
    quickstart = Path(__file__).resolve().parents[2] / "recipes" / "quickstart.yaml"
    recipe = load_recipe(quickstart, ['engine.extra_args=["--max-num-seqs", "4", "--bogus-flag"]'])
    with pytest.raises(UserError) as caught:
        engine_command(recipe, None)
    assert [p.path for p in caught.value.problems] == ["engine.extra_args.2"]
    # a rendered flag outside the recipe's extra_args is the engine's (its mapping's) problem
    assert check_flags("vllm", ["--bogus", "--model", "m"], extra_args_from=1)[0].path == "engine"


def test_value_outside_choices_is_a_problem() -> None:
    assert check_flags("vllm", ["--kv-cache-dtype", "fp4"])
    assert check_flags("tgi", ["--kv-cache-dtype", "fp8"])
    assert not check_flags("tgi", ["--kv-cache-dtype", "fp8_e4m3fn"])


def test_known_flags_pass() -> None:
    argv = [
        "python3",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "m",
        "--served-model-name",
        "a",
        "b",
        "--no-enable-prefix-caching",
        "--tensor-parallel-size=2",
    ]
    assert check_flags("vllm", argv) == []
    assert check_flags("builtin", ["llmdeploy-engine", "serve", "--model", "m", "--device", "cpu"]) == []


def test_unknown_version_has_no_catalogue() -> None:
    problems = check_flags("vllm", ["--model", "m"], version="0.0.1")
    assert problems and problems[0].path == "engine.version"


def test_builtin_catalogue_matches_the_engine_parser() -> None:
    """A renamed built-in engine flag must come with a regenerated catalogue."""
    committed = json.loads(catalogue_path("builtin", PINNED_VERSIONS["builtin"]).read_text())
    assert committed["flags"] == builtin_catalogue()["flags"], (
        "regenerate: python llmdeploy/engines/catalogue_gen.py builtin > llmdeploy/engines/catalogues/builtin-0.1.0.json"
    )
