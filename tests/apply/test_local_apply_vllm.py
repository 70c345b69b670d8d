"""End to end: `llmdeploy apply` of a vLLM recipe on the local target. The real vLLM CPU build
(tests/vllm/setup.sh, run by bin/test) serves the default model; apply converts the GGUF once,
waits for health and smoke-tests it; then down."""

from __future__ import annotations

import os

import pytest
from local_apply_helpers import free_port, run_llmdeploy

from llmdeploy.render.vllm_venv import vllm_python

pytestmark = [pytest.mark.slow, pytest.mark.vllm]


@pytest.fixture(scope="module")
def vllm_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    if vllm_python() is None:
        pytest.skip("the vLLM CPU venv is missing: run tests/vllm/setup.sh (bin/test does)")
    state = tmp_path_factory.mktemp("state-vllm")
    return {**os.environ, "LLMDEPLOY_STATE_DIR": str(state)}


def test_apply_vllm_recipe_and_smoke(vllm_env: dict[str, str]) -> None:
    port = free_port()
    sets = ["--set", f"server.port={port}"]
    recipe = "recipes/quickstart-vllm.yaml"
    try:
        applied = run_llmdeploy("apply", recipe, "--yes", *sets, env=vllm_env)
        out = applied.stdout + applied.stderr
        assert applied.returncode == 0, out[-4000:]
        assert "result: PASS" in out
        assert "Traceback" not in out.split("==> starting")[0]  # our side never prints one
        status = run_llmdeploy("status", recipe, *sets, env=vllm_env)
        assert status.returncode == 0, status.stdout + status.stderr
    finally:
        down = run_llmdeploy("down", recipe, *sets, env=vllm_env)
    assert down.returncode == 0, down.stderr
