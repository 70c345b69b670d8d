"""One module per serving engine (vLLM, TGI, the built-in engine) behind the `Engine` protocol.

Each engine owns its recipe rules, flag mapping and flag catalogue, memory rule, container image,
metric names and how smoke reads its actual KV capacity; the stages look it up with
`get_engine(recipe.engine.type)` and never branch on an engine's name.

Layer: errors < catalog < recipe (its schema) < memory < engines < planner < render, apply, smoke,
bench, cli. `engines` imports `llmdeploy` (the version), `errors`, `catalog`, `recipe.schema` and
`memory` only, never a stage above it; `memory` holds the engine-neutral building blocks of the
memory rules, so `planner` asks an engine for its plan without a cycle.
"""

from llmdeploy.engines.base import Engine, KVCapacity, PlanFigures
from llmdeploy.engines.registry import ENGINES, get_engine

__all__ = ["ENGINES", "Engine", "KVCapacity", "PlanFigures", "get_engine"]
