"""The docker target: the rendered Compose file, run by the `docker compose` on this machine.

apply writes the recipe's docker-compose.yaml into its state folder and runs
`docker compose --project-name NAME --file FILE up --detach --wait` (Compose itself waits for the
engine's healthcheck), then smoke-tests the published port; status, logs and down run `ps`, `logs`
and `down` on the same project. llmdeploy drives the Docker CLI rather than the Engine API because
Compose files are the CLI's format (no library reads them); the model-cache volume survives `down`.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import httpx

from llmdeploy.apply.command_hint import follow_up_commands, llmdeploy_command
from llmdeploy.apply.local_state import instance_dir
from llmdeploy.errors import UserError
from llmdeploy.memory.memory_plan import MemoryPlan
from llmdeploy.recipe.schema import Recipe

COMPOSE_FILE = "docker-compose.yaml"
ENGINE_SERVICE = "engine"
_SECRET_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*):\?")


def project_name(recipe: Recipe) -> str:
    """Compose project names are lowercase letters, digits, dashes and underscores."""
    name = re.sub(r"[^a-z0-9_-]", "-", recipe.name.lower()).strip("-_")
    return f"llmdeploy-{name or 'recipe'}"


def compose_file(recipe: Recipe) -> Path:
    return instance_dir(recipe) / COMPOSE_FILE


def _docker() -> str:
    found = shutil.which("docker")
    if found is None:
        raise UserError.one(
            "`docker` is not on PATH, so the docker target cannot be applied here",
            path="target.type",
            value="docker",
            fix=(
                "install Docker Engine with the Compose plugin (`docker compose version` must work), "
                "or `llmdeploy render RECIPE -o DIR` and run `docker compose up -d --wait` where Docker is"
            ),
        )
    return found


def _compose(recipe: Recipe) -> list[str]:
    return [_docker(), "compose", "--project-name", project_name(recipe), "--file", str(compose_file(recipe))]


def _url(recipe: Recipe) -> str:
    host = recipe.server.host
    return f"http://{'127.0.0.1' if host in ('0.0.0.0', '::', '') else host}:{recipe.server.port}"


def _missing_variables(text: str) -> list[str]:
    """Variables the Compose file requires (`${VAR:?...}`, the secrets) that this environment lacks."""
    return sorted({name for name in _SECRET_REF.findall(text) if not os.environ.get(name)})


def apply_docker(
    recipe: Recipe, recipe_path: Path, text: str, plan: MemoryPlan, wait: bool, echo: Callable[[str], None]
) -> int:
    """Run the rendered Compose file `text` (the recipe's docker-compose.yaml) and smoke-test it."""
    missing = _missing_variables(text)
    if missing:
        raise UserError.one(
            f"environment variable {missing[0]} is not set; Compose passes it to the engine",
            path="server",
            value=missing[0],
            fix=f"export {missing[0]}=... before applying",
        )
    base = _compose(recipe)
    path = compose_file(recipe)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    argv = [*base, "up", "--detach"]
    if wait:
        argv += ["--wait"]
    echo(f"==> {' '.join(argv)}")
    if wait:
        echo("    (Compose waits for the engine's healthcheck: pulling the image and loading the model)")
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, check=False)
    if done.returncode != 0:
        echo(f"docker compose up failed (exit {done.returncode}); see `llmdeploy logs {recipe_path}`")
        return 1
    url = _url(recipe)
    if not wait:
        echo(f"==> started; it answers at {url} once healthy (`{llmdeploy_command()} status {recipe_path}`)")
        return 0
    echo(f"==> {recipe.name} is up at {url}")
    from llmdeploy.smoke import smoke

    report = smoke(url, recipe=recipe, plan=plan)
    echo(report.render())
    echo(follow_up_commands(str(recipe_path), " (the model-cache volume is kept)"))
    return 0 if report.ok else 1


def _require_applied(recipe: Recipe, out: Callable[[str], None]) -> bool:
    if compose_file(recipe).is_file():
        return True
    out(f"{recipe.name}: not applied here (no {compose_file(recipe)})")
    return False


def status_docker(recipe: Recipe, out: Callable[[str], None]) -> int:
    if not _require_applied(recipe, out):
        return 3
    done = subprocess.run([*_compose(recipe), "ps", "--all"], stdin=subprocess.DEVNULL, check=False)
    if done.returncode != 0:
        return 1
    url = _url(recipe)
    try:
        healthy = httpx.get(url + "/health", timeout=2.0).status_code == 200
    except httpx.HTTPError:
        healthy = False
    out(f"{recipe.name}: {'healthy' if healthy else 'not healthy'} at {url}")
    return 0 if healthy else 1


def logs_docker(recipe: Recipe, follow: bool, lines: int, out: Callable[[str], None]) -> int:
    if not _require_applied(recipe, out):
        return 1
    argv = [*_compose(recipe), "logs", "--tail", str(lines) if lines > 0 else "all"]
    if follow:
        argv.append("--follow")
    return subprocess.run([*argv, ENGINE_SERVICE], stdin=subprocess.DEVNULL, check=False).returncode


def down_docker(recipe: Recipe, out: Callable[[str], None]) -> int:
    if not compose_file(recipe).is_file():
        out(f"{recipe.name}: not applied here; nothing to stop")
        return 0
    done = subprocess.run([*_compose(recipe), "down"], stdin=subprocess.DEVNULL, check=False)
    if done.returncode != 0:
        return 1
    compose_file(recipe).unlink()
    out(f"{recipe.name}: stopped (the model-cache volume is kept; `docker volume ls` lists it)")
    return 0
