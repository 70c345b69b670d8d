"""`target.llm_d_router` on the local and docker targets: `llmdeploy render` also writes llm-d's
no-Kubernetes endpoints file and the endpoint-picker config reading it, pointing at the recipe's
server.host:server.port; off by default; byte-identical on re-render; a host the router cannot
reach by IPv4 address is refused with file:line and a fix."""

from __future__ import annotations

import ipaddress
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from llmdeploy.planner import make_plan
from llmdeploy.recipe import Recipe, load_recipe
from llmdeploy.targets import render
from llmdeploy.targets.llm_d_objects import ENGINE_TYPE_LABEL
from llmdeploy.targets.llm_d_router import router_problems

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "recipes" / "quickstart.yaml"
ROUTER_FILES = ("llm-d/endpoints.yaml", "llm-d/epp-config.yaml")


def _recipe(tmp_path: Path, target: str, host: str, port: int, router: bool = True) -> Path:
    data = yaml.safe_load(QUICKSTART.read_text())
    data["target"] = {"type": target, **({"llm_d_router": True} if router else {})}
    data["server"] = {**data["server"], "host": host, "port": port}
    path = tmp_path / f"{target}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _render(recipe: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llmdeploy.cli.main", "render", str(recipe), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=False,
    )


@pytest.mark.parametrize(
    ("target", "host", "address"),
    [
        ("local", "127.0.0.1", "127.0.0.1"),
        ("docker", "0.0.0.0", "127.0.0.1"),
        ("local", "10.1.2.3", "10.1.2.3"),
    ],
)
def test_render_writes_the_router_files_for_the_engine(
    tmp_path: Path, target: str, host: str, address: str
) -> None:
    recipe = _recipe(tmp_path, target, host, 8137)
    out = tmp_path / "out"
    done = _render(recipe, out)
    assert done.returncode == 0, done.stderr
    main_file = "launch.sh" if target == "local" else "docker-compose.yaml"
    assert (out / main_file).is_file()
    endpoints = yaml.safe_load((out / "llm-d" / "endpoints.yaml").read_text())["endpoints"]
    assert len(endpoints) == 1
    (entry,) = endpoints
    assert (entry["address"], entry["port"]) == (address, "8137")
    ipaddress.IPv4Address(entry["address"])
    assert entry["labels"] == {"model": "smollm2-135m-instruct", ENGINE_TYPE_LABEL: "vllm"}
    config = yaml.safe_load((out / "llm-d" / "epp-config.yaml").read_text())
    assert config["kind"] == "EndpointPickerConfig"
    discovery = next(p for p in config["plugins"] if p.get("type") == "file-discovery")
    assert discovery["parameters"]["path"] == "/etc/epp/endpoints.yaml"
    assert config["dataLayer"]["discovery"] == {"pluginRef": "file-discovery"}

    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    again = _render(recipe, out)
    assert again.returncode == 0, again.stderr
    assert "written" not in again.stdout
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize("target", ["local", "docker"])
def test_off_by_default(tmp_path: Path, target: str) -> None:
    recipe = load_recipe(_recipe(tmp_path, target, "127.0.0.1", 8000, router=False))
    assert recipe.target.model_dump()["llm_d_router"] is False
    files = render(recipe, make_plan(recipe)).files
    assert not set(ROUTER_FILES) & set(files)


@pytest.mark.parametrize(
    ("target", "host", "field", "fix"),
    [
        ("local", "engine.example", "server.host", "set server.host to an IPv4 address"),
        ("docker", "::1", "server.host", "set server.host to an IPv4 address"),
    ],
)
def test_a_host_the_router_cannot_reach_is_refused(
    tmp_path: Path, target: str, host: str, field: str, fix: str
) -> None:
    recipe = _recipe(tmp_path, target, host, 8000)
    done = _render(recipe, tmp_path / "out")
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"{recipe}:" in done.stderr and f"{field}:" in done.stderr
    assert fix in done.stderr
    assert not (tmp_path / "out" / "llm-d").exists()


def test_tgi_is_refused_behind_the_router() -> None:
    data = load_recipe(QUICKSTART).model_dump(mode="json", exclude_none=True)
    data["target"] = {"type": "local", "llm_d_router": True}
    data["engine"] = {"type": "tgi"}
    problems = router_problems(Recipe.model_validate(data), True)
    assert [(p.path, p.fix) for p in problems] == [
        ("engine.type", "use engine.type: vllm, sglang or builtin, or remove target.llm_d_router")
    ]
