"""llmdeploy: declarative LLM serving.

recipe (YAML) -> Recipe -> MemoryPlan -> Artifacts -> running endpoint -> Report. Each stage is a
function importable from here (loaded on first use, so `import llmdeploy` stays cheap):
`load_recipe`, `make_plan`, `render`, `apply`, `smoke`, `bench` (see `llmdeploy.api`).
The toolkit never imports torch; the built-in engine lives in `llmdeploy_engine` (folder `engine/`).

`render`, `apply`, `smoke` and `bench` are also the names of subpackages; on this package they
always mean the functions (import the subpackages' contents with `from llmdeploy.render import ...`).
"""

from __future__ import annotations

import sys
import types
from typing import Any

__version__ = "0.1.0"

_API = {
    "Artifacts",
    "BenchOptions",
    "BenchReport",
    "MemoryPlan",
    "Recipe",
    "SmokeReport",
    "UserError",
    "apply",
    "bench",
    "load_recipe",
    "make_plan",
    "recipe_digest",
    "render",
    "smoke",
}
# Stage functions that share a name with a subpackage: importing the subpackage sets a module
# attribute of the same name, so these are looked up before ordinary attributes.
_SHADOWED = {"apply", "bench", "render", "smoke"}

__all__ = ["__version__", *sorted(_API)]


def _api_attr(name: str) -> Any:
    from llmdeploy import api

    return getattr(api, name)


class _Toolkit(types.ModuleType):
    def __getattribute__(self, name: str) -> Any:
        if name in _SHADOWED:
            return _api_attr(name)
        return super().__getattribute__(name)

    def __getattr__(self, name: str) -> Any:
        if name in _API:
            return _api_attr(name)
        raise AttributeError(f"module 'llmdeploy' has no attribute {name!r}")


sys.modules[__name__].__class__ = _Toolkit
