"""The local target: run the engine as a background process on this machine.

apply = prepare the model, start the engine (its own process group, output to a log file), stream
its start-up while waiting for /health, smoke-test it, and keep state so `status`, `logs` and
`down` work. Applying an unchanged recipe whose engine is up is a no-op; a changed recipe restarts
it after asking.

Two applies at once cannot both win: each holds its recipe's lock and its port's lock
(`local_lock`), a port held by anything else is refused before the engine starts, and the engine is
only "up" when the server answering is the process this apply started (`EngineIdentity`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import click

from llmdeploy.apply.command_hint import follow_up_commands
from llmdeploy.apply.local_lock import port_lock, recipe_lock
from llmdeploy.apply.local_port import check_port_free, engine_identity, healthy, is_ours, mismatch
from llmdeploy.apply.local_state import (
    LocalState,
    clear_state,
    instance_dir,
    pid_alive,
    read_state,
    write_state,
)
from llmdeploy.apply.model_source import prepare_model
from llmdeploy.apply.prompt import terminal_confirm
from llmdeploy.apply.startup_watch import wait_for_health
from llmdeploy.engines import get_engine
from llmdeploy.recipe.schema import Recipe
from llmdeploy.smoke.identity import INSTANCE_ENV, new_instance_id

STOP_DEADLINE_S = 30.0


def _echo(msg: str) -> None:
    click.echo(msg, err=True)


def apply_local(recipe: Recipe, recipe_path: Path, assume_yes: bool) -> int:
    with recipe_lock(recipe, "apply"):
        return _apply_locked(recipe, recipe_path, assume_yes)


def _apply_locked(recipe: Recipe, recipe_path: Path, assume_yes: bool) -> int:
    from llmdeploy.apply.local_command import local_engine_command
    from llmdeploy.apply.local_engine import check_flags, find_local_engine
    from llmdeploy.planner import make_plan
    from llmdeploy.recipe import recipe_digest

    digest = recipe_digest(recipe)
    confirm = terminal_confirm(assume_yes, default=True, announce_yes=True)
    state = read_state(recipe)
    if state is not None and state.process_alive():
        if state.recipe_digest == digest and is_ours(state, recipe):
            _echo(
                f"{recipe.name}: already running at {state.url} (pid {state.pid}) with this recipe; nothing to do"
            )
            return 0
        reason = "the recipe changed" if state.recipe_digest != digest else "it is not healthy"
        if not confirm(f"{recipe.name} is running (pid {state.pid}) but {reason}; restart it?"):
            _echo("left as it is")
            return 1
        _stop(state)
    elif state is not None:
        clear_state(recipe)

    plan = make_plan(recipe)
    found = find_local_engine(recipe)
    _echo(f"==> found {found.describe()}")
    prepared = prepare_model(recipe.model, confirm, _echo)
    command = local_engine_command(recipe, plan, prepared.ref, found)
    if get_engine(found.engine).local_flag_check is not None:
        _echo(f"==> checking the flags with {found.describe()}'s own parser")
        check_flags(found, list(command.argv))
    instance_id = new_instance_id()
    with port_lock(recipe):
        check_port_free(recipe)
        proc, state = _start_engine(recipe, command.argv, command.env, instance_id, digest, prepared.ref)
        identity = engine_identity(recipe, instance_id)
        log_path = Path(state.log_path)
        ok = wait_for_health(
            state.url,
            proc,
            log_path,
            budget_s=recipe.smoke.startup_timeout_s,
            echo=_echo,
            stranger=lambda: mismatch(recipe, identity, state.url),
        )
        if not ok:
            if proc.poll() is None:
                _stop(state)
            clear_state(recipe)
            _echo(f"the engine did not become healthy; its log is {log_path}")
            return 1
    _echo(f"==> {recipe.name} is up at {state.url} (pid {proc.pid})")

    from llmdeploy.smoke import smoke

    report = smoke(state.url, recipe=recipe, plan=plan, log_file=str(log_path), identity=identity)
    _echo(report.render())
    served = recipe.server.served_model_name or recipe.model.id
    _echo(
        "\nCall it:\n"
        f"  curl {state.url}/v1/chat/completions -H 'Content-Type: application/json' \\\n"
        f'    -d \'{{"model": "{served}", "messages": [{{"role": "user", "content": "Hello!"}}]}}\'\n'
        + follow_up_commands(str(recipe_path))
    )
    return 0 if report.ok else 1


def _start_engine(
    recipe: Recipe,
    argv_in: Sequence[str],
    env_in: Mapping[str, str],
    instance_id: str,
    digest: str,
    model_ref: str,
) -> tuple[subprocess.Popen[bytes], LocalState]:
    """Start the engine in its own session with its output in this recipe's log; record the state."""
    folder = instance_dir(recipe)
    folder.mkdir(parents=True, exist_ok=True)
    log_path = folder / "engine.log"
    if log_path.is_file():
        log_path.replace(folder / "engine.log.1")  # the previous run's log survives one restart
    argv = list(argv_in)
    env = {**os.environ, **env_in, "PYTHONUNBUFFERED": "1", INSTANCE_ENV: instance_id}
    _echo(f"==> starting {recipe.engine.type} engine: {' '.join(argv)}")
    _echo(f"    log: {log_path}")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
    state = LocalState(
        name=recipe.name,
        pid=proc.pid,
        host=recipe.server.host,
        port=recipe.server.port,
        log_path=str(log_path),
        recipe_digest=digest,
        argv=argv,
        model=model_ref,
        started_at=time.time(),
        instance_id=instance_id,
    )
    write_state(recipe, state)
    return proc, state


def _stop(state: LocalState) -> None:
    try:
        os.killpg(state.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + STOP_DEADLINE_S
    while time.monotonic() < deadline and pid_alive(state.pid):
        time.sleep(0.2)
    if pid_alive(state.pid):
        _echo(f"pid {state.pid} did not stop within {STOP_DEADLINE_S:.0f} s; killing it")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(state.pid, signal.SIGKILL)


def status_local(recipe: Recipe) -> int:
    state = read_state(recipe)
    if state is None:
        click.echo(f"{recipe.name}: not running (no local state)")
        return 3
    alive = state.process_alive()
    serving = alive and is_ours(state, recipe)
    uptime = time.time() - state.started_at
    click.echo(
        f"{recipe.name}: {'running' if alive else 'exited'}, {'healthy' if serving else 'not healthy'}"
    )
    click.echo(f"  url:    {state.url}\n  pid:    {state.pid}\n  model:  {state.model}")
    click.echo(f"  log:    {state.log_path}\n  uptime: {uptime:.0f} s")
    return 0 if serving else 1


def logs_local(recipe: Recipe, follow: bool, lines: int) -> int:
    state = read_state(recipe)
    log_path = Path(state.log_path) if state else instance_dir(recipe) / "engine.log"
    if not log_path.is_file():
        click.echo(f"{recipe.name}: no log at {log_path}", err=True)
        return 1
    with open(log_path, errors="replace") as f:
        for line in f.readlines()[-lines:] if lines > 0 else f.readlines():
            click.echo(line.rstrip("\n"))
        while follow:
            line = f.readline()
            if line:
                click.echo(line.rstrip("\n"))
                continue
            if state is None or not state.process_alive():
                break
            time.sleep(0.5)
    return 0


def down_local(recipe: Recipe) -> int:
    with recipe_lock(recipe, "down"):
        state = read_state(recipe)
        if state is None:
            click.echo(f"{recipe.name}: not running; nothing to stop")
            return 0
        if state.process_alive():
            click.echo(f"stopping {recipe.name} (pid {state.pid})")
            _stop(state)
        clear_state(recipe)
        click.echo(f"{recipe.name}: stopped")
        if healthy(state.url):
            click.echo(f"note: {state.url} still answers: a server this recipe did not start holds the port")
        return 0
