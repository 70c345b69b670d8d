"""The engine command for the local target, made runnable on this machine.

`engine_command` is pure; starting the engine locally needs three things more: the entry point of
the install found on this machine (apply/local_engine.py), a checkpoint folder converted from a GGUF
file for vLLM (0.32 reads no GGUF), and secrets from this process's environment.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

from llmdeploy_engine.facts import cache_root

from llmdeploy.apply.local_engine import LocalEngine
from llmdeploy.engines import get_engine
from llmdeploy.engines.flags import is_gguf
from llmdeploy.errors import UserError
from llmdeploy.planner import MemoryPlan
from llmdeploy.recipe.schema import Recipe
from llmdeploy.render.engine_command import EngineCommand, engine_command
from llmdeploy.render.model_location import VLLM_CHECKPOINTS_DIR, vllm_checkpoint_name
from llmdeploy.render.renderer import local_secret_variable

# the converter is a script run in vLLM's interpreter, kept beside the model locations it fills
_CONVERTER = Path(__file__).parents[1] / "render" / "gguf_to_hf.py"


def local_engine_command(
    recipe: Recipe,
    plan: MemoryPlan | None,
    model_ref: str,
    found: LocalEngine,
    environ: Mapping[str, str] | None = None,
) -> EngineCommand:
    """`engine_command` for a model prepared at `model_ref`, started by the install `found`, with the
    converted checkpoint (GGUF on vLLM) and secret values filled in from `environ` (default: os.environ)."""
    environ = os.environ if environ is None else environ
    engine = get_engine(recipe.engine.type)
    if engine.gguf_as_checkpoint and is_gguf(recipe.model):
        assert found.python is not None
        model_ref = str(
            checkpoint_from_gguf(
                Path(model_ref), cache_root(), found.python, vllm_checkpoint_name(recipe.model)
            )
        )
    command = engine_command(recipe, plan, model_ref=model_ref)
    argv = found.argv(list(command.argv))
    env = dict(command.env)
    if Path(model_ref).exists():
        for name, setting in engine.local_folder_env:
            env.setdefault(name, setting)  # a local folder needs no hub; never wait on one
    for secret in command.secrets:
        knob, variable = local_secret_variable(secret)
        value = environ.get(variable)
        if not value:
            raise UserError.one(
                f"environment variable {variable} is not set",
                path=f"{knob}.env",
                value=variable,
                fix=f"export {variable}=... before applying",
            )
        env[secret.name] = value
    return EngineCommand(argv=argv, env=env, secrets=(), engine=command.engine, version=command.version)


def checkpoint_from_gguf(gguf_path: Path, cache_dir: Path, python: Path, name: str | None = None) -> Path:
    """The checkpoint folder cache_dir/vllm-checkpoints/NAME made from `gguf_path` by `python` (the
    interpreter that has vLLM, hence transformers and gguf), converted once. NAME defaults to the
    file's stem plus a digest of its path."""
    if name is None:
        digest = hashlib.sha256(str(gguf_path.resolve()).encode()).hexdigest()[:16]
        name = f"{gguf_path.stem}-{digest}"
    out = cache_dir / VLLM_CHECKPOINTS_DIR / name
    if (out / "config.json").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [str(python), str(_CONVERTER), str(gguf_path), str(out)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        raise UserError.one(
            f"converting {gguf_path} for vLLM failed:\n{tail}",
            path="model",
            fix="check that the GGUF file is a transformers-supported architecture",
        )
    return out
