"""`plan --fit --model ID` for a catalog model imports neither the recipe models (pydantic) nor the
hub client nor transformers: the answer is meant to come back in well under a second, and those
imports alone cost most of one."""

from __future__ import annotations

import json
import subprocess
import sys

CODE = """
import json, sys
from llmdeploy.cli.main import main
code = 0
try:
    main(sys.argv[1:])
except SystemExit as e:
    code = e.code
print(json.dumps({"code": code, "modules": sorted(m for m in sys.modules if m.split(".")[0] in
      ("pydantic", "huggingface_hub", "transformers", "jinja2", "httpx", "llmdeploy"))}))
"""


def test_plan_fit_for_a_catalog_model_stays_off_the_heavy_imports() -> None:
    argv = ["plan", "--fit", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--max-model-len", "32768"]
    argv += ["--target-concurrency", "64", "--output", "json"]
    proc = subprocess.run([sys.executable, "-c", CODE, *argv], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["code"] in (0, None)
    modules = result["modules"]
    heavy = [
        m
        for m in modules
        if m.split(".")[0] in ("pydantic", "huggingface_hub", "transformers", "jinja2", "httpx")
    ]
    assert not heavy, heavy
    assert not [
        m for m in modules if m.startswith(("llmdeploy.recipe", "llmdeploy.render", "llmdeploy.apply"))
    ]
