"""Make the checkout's engine/ importable as `llmdeploy_engine` for the benchmark scripts.

The GPU machine runs the scripts from a plain copy of the repository (no pip install), so each
script calls `import_engine()` before importing the engine.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def import_engine() -> None:
    """Use the checkout's engine/ as `llmdeploy_engine` when the package is not installed."""
    sys.path.insert(0, str(ROOT))
    if importlib.util.find_spec("llmdeploy_engine") is None:
        spec = importlib.util.spec_from_file_location(
            "llmdeploy_engine",
            ROOT / "engine" / "__init__.py",
            submodule_search_locations=[str(ROOT / "engine")],
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["llmdeploy_engine"] = module
        spec.loader.exec_module(module)
