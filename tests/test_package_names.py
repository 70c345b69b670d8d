"""`import llmdeploy` is a plain module whose stage names are `llmdeploy.api`'s, loaded on first use."""

from __future__ import annotations

import subprocess
import sys

CODE = """
import sys
import llmdeploy
assert not [m for m in sys.modules if m.startswith(("pydantic", "llmdeploy.api"))], "import llmdeploy is not cheap"
import llmdeploy.render.renderer, llmdeploy.api as api
assert sorted(llmdeploy.__all__) == sorted(["__version__", *api.__all__]), (llmdeploy.__all__, api.__all__)
assert llmdeploy.load_recipe is api.load_recipe
for name in api.__all__:
    assert getattr(llmdeploy, name) is getattr(api, name), name
import llmdeploy.apply.local, llmdeploy.smoke.report, llmdeploy.bench.load
assert llmdeploy.render is api.render and llmdeploy.apply is api.apply, "a subpackage shadowed its stage"
assert type(llmdeploy) is type(sys), type(llmdeploy)
print("ok")
"""


def test_stage_names_are_the_api_functions_after_their_subpackages_load() -> None:
    done = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
