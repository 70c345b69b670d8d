"""The engines llmdeploy renders for, by the name a recipe's `engine.type` gives."""

from __future__ import annotations

from llmdeploy.engines.base import Engine
from llmdeploy.engines.builtin import BUILTIN
from llmdeploy.engines.sglang import SGLANG
from llmdeploy.engines.tgi import TGI
from llmdeploy.engines.vllm import VLLM
from llmdeploy.errors import UserError

# the order `--engine` choices and messages list them in
ENGINES: dict[str, Engine] = {engine.name: engine for engine in (VLLM, TGI, BUILTIN, SGLANG)}


def get_engine(name: str) -> Engine:
    """The engine named `name` (a recipe's engine.type)."""
    engine = ENGINES.get(name)
    if engine is None:
        raise UserError.one(
            f"no engine named {name!r}",
            path="engine.type",
            value=name,
            fix=f"use one of: {', '.join(ENGINES)}",
        )
    return engine
