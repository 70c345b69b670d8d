"""Every target-specific refusal names the file:line that wrote the field, the field and a fix, and
the memory gate refuses a recipe that does not fit on every target (validate, plan, render, apply)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hardening.cli_run import run_cli

from llmdeploy.targets import TARGETS

# a small vLLM recipe on one GPU; each case appends its target section (and may replace lines)
BASE = """\
name: refusal
model:
  id: Qwen/Qwen2.5-0.5B-Instruct
  dtype: bfloat16
hardware:
  gpu: L4
limits:
  max_model_len: 4096
engine:
  type: vllm
server:
  host: 0.0.0.0
  port: 8000
"""


def _run(tmp_path: Path, body: str, *args: str) -> tuple[int, str, Path]:
    path = tmp_path / "recipe.yaml"
    path.write_text(body)
    result = run_cli(*args, str(path))
    return result.returncode, result.output, path


CASES = [
    # (id, text after BASE, the text on the field's line, field path, message fragment, fix fragment)
    (
        "kubernetes-autoscaling-multi-node",
        "parallelism:\n  tensor: 1\ntarget:\n  type: kubernetes\n  autoscaling:\n    kind: hpa\n",
        "autoscaling:",
        "target.autoscaling",
        "autoscaling a LeaderWorkerSet is not rendered",
        "remove target.autoscaling",
    ),
    (
        "kubernetes-hpa-to-zero",
        "target:\n  type: kubernetes\n  autoscaling:\n    kind: hpa\n    min_replicas: 0\n",
        "min_replicas: 0",
        "target.autoscaling.min_replicas",
        "cannot scale to zero",
        "kind: keda",
    ),
    (
        "kubernetes-secret-from-env",
        "target:\n  type: kubernetes\n",
        "api_key:",
        "server.api_key.env",
        "must come from a Secret",
        "create that Secret",
    ),
    (
        "local-reads-no-kubernetes-secret",
        "target:\n  type: local\n",
        "api_key:",
        "server.api_key.secret",
        "cannot be read by a local process",
        "server.api_key: {env: VARIABLE}",
    ),
    (
        "docker-runs-its-image",
        "target:\n  type: docker\n",
        "executable:",
        "engine.executable",
        "names a local install",
        "remove engine.executable",
    ),
]


def _body(case_id: str, tail: str) -> str:
    body = BASE
    if case_id == "kubernetes-autoscaling-multi-node":
        body = body.replace("  gpu: L4\n", "  gpu: L4\n  nodes: 2\n")
    if case_id == "kubernetes-secret-from-env":
        body = body.replace("  port: 8000\n", "  port: 8000\n  api_key: {env: LLM_KEY}\n")
    if case_id == "local-reads-no-kubernetes-secret":
        body = body.replace("  port: 8000\n", "  port: 8000\n  api_key: {secret: {name: k, key: v}}\n")
    if case_id == "docker-runs-its-image":
        body = body.replace("  type: vllm\n", "  type: vllm\n  executable: /opt/vllm/bin/vllm\n")
    return body + tail


def _line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


@pytest.mark.parametrize("verb", ["validate", "render"])
@pytest.mark.parametrize(
    ("case_id", "tail", "needle", "field", "message", "fix"), CASES, ids=[c[0] for c in CASES]
)
def test_the_refusal_is_located_and_gives_the_fix(
    tmp_path: Path, verb: str, case_id: str, tail: str, needle: str, field: str, message: str, fix: str
) -> None:
    body = _body(case_id, tail)
    args = [verb, "-o", str(tmp_path / "out")] if verb == "render" else [verb]
    code, output, path = _run(tmp_path, body, *args)
    assert code == 2, output
    where = f"{path}:{_line_of(body, needle)}: {field}: "
    located = [line for line in output.splitlines() if line.strip().startswith(where)]
    assert located and message in located[0], output
    fix_line = next(line for line in output.split(where, 1)[1].splitlines() if "fix:" in line)
    assert fix in fix_line, output


TOO_BIG = BASE.replace("Qwen/Qwen2.5-0.5B-Instruct", "meta-llama/Llama-3.1-70B-Instruct")


@pytest.mark.parametrize("target", list(TARGETS))
@pytest.mark.parametrize("verb", ["validate", "plan", "render", "apply"])
def test_the_memory_gate_refuses_on_every_target(tmp_path: Path, target: str, verb: str) -> None:
    tail = f"target:\n  type: {target}\n"
    args = [verb, "-o", str(tmp_path / "out")] if verb == "render" else [verb]
    path = tmp_path / "recipe.yaml"
    path.write_text(TOO_BIG + tail)
    result = run_cli(*args, str(path))
    assert result.returncode == 2, result.output
    assert "does not fit" in result.output and "fix:" in result.output, result.output
    assert not (tmp_path / "out").exists(), "render wrote files for a recipe that does not fit"


@pytest.mark.parametrize("target", [name for name, t in TARGETS.items() if not t.kubernetes_backed])
def test_diff_and_dry_run_need_kubernetes_objects(tmp_path: Path, target: str) -> None:
    body = BASE + f"target:\n  type: {target}\n"
    for args in (["diff"], ["apply", "--dry-run"]):
        code, output, _ = _run(tmp_path, body, *args)
        assert code == 2, output
        assert "target.type" in output and "fix: see" in output and "render" in output, output
