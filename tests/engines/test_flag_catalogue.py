"""The offline flag check against catalogues generated from the engines' own parsers."""

from __future__ import annotations

import json

from llmdeploy.engines.catalogue import PINNED_VERSIONS, catalogue_path
from llmdeploy.engines.catalogue_gen import builtin_catalogue
from llmdeploy.render import check_flags


def test_renamed_flag_is_a_problem_with_a_suggestion() -> None:
    problems = check_flags("vllm", ["--max-model-length", "4096"])
    assert len(problems) == 1 and "--max-model-len" in (problems[0].fix or "")


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
