"""What a local apply leaves behind so `status`, `logs`, `down` and a second `apply` can find it.

One folder per recipe instance holding `state.json` (pid, port, log path, recipe digest, argv) and
the engine's log. A state whose process is gone is stale and treated as absent.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from llmdeploy.recipe.schema import Recipe


def state_root() -> Path:
    base = os.environ.get("LLMDEPLOY_STATE_DIR") or os.path.join(
        os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state"), "llmdeploy"
    )
    return Path(base)


def instance_dir(recipe: Recipe) -> Path:
    # a target section may name the folder itself (the local target's state_dir)
    state_dir = getattr(recipe.target, "state_dir", None)
    if state_dir:
        return Path(state_dir).expanduser()
    return state_root() / recipe.name


@dataclass(frozen=True)
class LocalState:
    name: str
    pid: int
    host: str
    port: int
    log_path: str
    recipe_digest: str
    argv: list[str]
    model: str
    started_at: float
    instance_id: str = ""  # what the engine was started with (see llmdeploy.smoke.identity)

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        return f"http://{host}:{self.port}"

    def process_alive(self) -> bool:
        return pid_alive(self.pid)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours still answers kill(0); look at its state where /proc exists.
    stat = Path(f"/proc/{pid}/stat")
    if stat.exists():
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            return fields[0] != "Z"
        except (OSError, IndexError):
            return True
    return True


def read_state(recipe: Recipe) -> LocalState | None:
    path = instance_dir(recipe) / "state.json"
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        return LocalState(**data)
    except (ValueError, TypeError):
        return None


def write_state(recipe: Recipe, state: LocalState) -> Path:
    folder = instance_dir(recipe)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "state.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(state), indent=2) + "\n")
    tmp.replace(path)
    return path


def live_states_on_port(port: int) -> list[LocalState]:
    """The running engines that llmdeploy started on `port` (recipes in the default state folder)."""
    found = []
    root = state_root()
    for path in sorted(root.glob("*/state.json")) if root.is_dir() else []:
        try:
            state = LocalState(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            continue
        if state.port == port and state.process_alive():
            found.append(state)
    return found


def clear_state(recipe: Recipe) -> None:
    path = instance_dir(recipe) / "state.json"
    path.unlink(missing_ok=True)
