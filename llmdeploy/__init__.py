"""llmdeploy: declarative LLM serving.

recipe (YAML) -> Recipe -> MemoryPlan -> Artifacts -> running endpoint -> Report. Each stage is a
function importable from here (loaded on first use, so `import llmdeploy` stays cheap):
`load_recipe`, `make_plan`, `render`, `apply`, `smoke`, `bench` (see `llmdeploy.api`).
The toolkit never imports torch; the built-in engine lives in
`llmdeploy_engine` (folder `engine/`).

`render`, `apply`, `smoke` and `bench` are also the names of subpackages. The first look-up of any
of these names loads the four subpackages and then binds the functions here, so from then on they
mean the functions (import the subpackages' contents with `from llmdeploy.render import ...`).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# The names `llmdeploy.api` exports (a test checks they match its __all__), known here without importing it.
_STAGES = ("apply", "bench", "load_recipe", "make_plan", "recipe_digest", "render", "smoke")
_TYPES = (
    "ApplyResult",
    "Artifacts",
    "BenchOptions",
    "BenchReport",
    "MemoryPlan",
    "Recipe",
    "SmokeReport",
    "UserError",
)
# Stage functions that share a name with a subpackage: importing a subpackage sets the package
# attribute of its name, so all four are imported before the functions are bound over them.
_SHADOWED = ("apply", "bench", "render", "smoke")

__all__ = ["__version__", *sorted(_STAGES + _TYPES)]


def __getattr__(name: str) -> Any:
    if name not in _STAGES + _TYPES:
        raise AttributeError(f"module 'llmdeploy' has no attribute {name!r}")
    api = importlib.import_module("llmdeploy.api")
    for sub in _SHADOWED:
        importlib.import_module(f"llmdeploy.{sub}")
    globals().update({n: getattr(api, n) for n in _STAGES + _TYPES})
    return globals()[name]


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
