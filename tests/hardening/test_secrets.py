"""Secrets travel only as environment variables or Secret references, never into files or output.

Planted values sit in the environment under every name a recipe or engine reads a key or hub token
from; every shipped recipe is rendered for every target and every written file and all CLI output
is searched for them. (The engine server's log is searched by the `engine_server` fixture, which runs
the server with a planted API key.) Rendered pods are checked for a locked-down security context.
"""

from __future__ import annotations

import io
import os
import secrets
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import yaml
from default_model import default_model_gguf

from hardening.figures import record

REPO = Path(__file__).resolve().parents[2]
RECIPES = sorted((REPO / "recipes").glob("*.yaml"))
SECRET_NAMES = (
    "VLLM_API_KEY",
    "AGENT_API_KEY",
    "LLMDEPLOY_API_KEY",
    "OPENAI_API_KEY",
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "API_KEY",
)
PLANTED = {name: f"planted-{name.lower()}-{secrets.token_hex(8)}" for name in SECRET_NAMES}
TARGETS = ("as shipped", "local", "docker", "kubernetes")


def _cli(*args: str) -> CliResult:
    """`llmdeploy ARGS` in-process with the planted values in the environment; stdout and stderr kept."""
    from llmdeploy.cli.main import main

    out = io.StringIO()
    code = 0
    with mock.patch.dict(os.environ, PLANTED), redirect_stdout(out), redirect_stderr(out):
        try:
            main(list(args))
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
    return CliResult(" ".join(args), code, out.getvalue())


@dataclass(frozen=True)
class CliResult:
    args: str
    returncode: int
    output: str


def _hits(text: str) -> list[str]:
    return [name for name, value in PLANTED.items() if value in text]


@pytest.mark.slow
@pytest.mark.parametrize("recipe", RECIPES, ids=[p.stem for p in RECIPES])
def test_no_planted_secret_in_rendered_files_or_output(tmp_path: Path, recipe: Path) -> None:
    rendered = 0
    for target in TARGETS:
        sets = [] if target == "as shipped" else ["--set", f"target.type={target}"]
        out = tmp_path / target.replace(" ", "-")
        outputs = [_cli("render", str(recipe), "-o", str(out), *sets)]
        outputs.append(_cli("plan", str(recipe), *sets))
        outputs.append(_cli("validate", str(recipe), *sets))
        for result in outputs:
            assert "Traceback" not in result.output, result.output[-2000:]
            hits = _hits(result.output)
            record("secrets: planted values found in CLI output", len(hits))
            assert hits == [], result.args
            record("secrets: CLI outputs searched", 1)
        if outputs[0].returncode != 0:
            continue  # e.g. a key from an env var on Kubernetes is refused (it must be a Secret)
        for file in out.rglob("*"):
            if file.is_file():
                hits = _hits(file.read_text(errors="replace"))
                record("secrets: planted values found in rendered files", len(hits))
                assert hits == [], file
                rendered += 1
    record("secrets: rendered files searched", rendered)
    assert rendered > 0


def test_serve_dry_run_never_prints_the_key() -> None:
    gguf = default_model_gguf()
    result = _cli("serve", "--model", str(gguf), "--dry-run")
    record("secrets: CLI outputs searched", 1)
    assert result.returncode == 0, result.output
    assert _hits(result.output) == []


def _containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod.get("initContainers", []), *pod["containers"]]


def _pod_specs(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec = doc.get("spec", {})
    if "template" in spec:
        return [spec["template"]["spec"]]
    lws = spec.get("leaderWorkerTemplate")
    if lws:
        return [t["spec"] for t in (lws.get("leaderTemplate"), lws.get("workerTemplate")) if t]
    return []


@pytest.mark.parametrize("recipe", RECIPES, ids=[p.stem for p in RECIPES])
def test_pods_are_locked_down(recipe: Path) -> None:
    from llmdeploy.errors import UserError
    from llmdeploy.recipe import load_recipe
    from llmdeploy.targets import render

    env = {name: "x" for name in SECRET_NAMES}
    loaded = load_recipe(recipe, env=env)
    if loaded.target.type != "kubernetes":
        try:  # the same recipe moved to Kubernetes, where that fits
            loaded = load_recipe(recipe, ["target.type=kubernetes"], env=env)
            documents = render(loaded, None).documents
        except UserError:
            pytest.skip(f"{recipe.stem} does not render for Kubernetes once its target is switched")
    else:
        documents = render(loaded, None).documents
    pods = [pod for doc in documents for pod in _pod_specs(doc)]
    assert pods
    for pod in pods:
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] != 0
        assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC")
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for container in _containers(pod):
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False
            assert context.get("privileged", False) is False
            assert context["capabilities"]["drop"] == ["ALL"]
            assert not context["capabilities"].get("add")
            assert context["readOnlyRootFilesystem"] is True
            assert context.get("runAsUser", 1) != 0
            mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
            assert "/tmp" in mounts, "a read-only root needs a writable /tmp"
            for path, name in mounts.items():
                assert "hostPath" not in volumes[name], f"{path} is a host path"
            env_values = [e.get("value", "") for e in container.get("env", [])]
            assert not any(v == "x" for v in env_values), "a secret value was inlined into the pod"
            record("security: containers checked", 1)
    # every secret the recipe names reaches the pod as a secretKeyRef, never a literal value
    text = yaml.safe_dump_all(documents)
    assert "kind: Secret\n" not in text, (
        "the toolkit never writes a Secret object (its value would be in the file)"
    )
