"""The platform targets on a real kube-apiserver 1.20: the platforms' pinned CRDs installed
(tests/targets/crds), every object rendered for the shipped kserve, llm-d and kubeai recipes (and
SGLang on kserve and llm-d) taken by server-side apply with no field pruned, and the CLI's apply /
diff / status / down against it, a fake controller setting the status a real one would;
`smoke`'s URL comes from the platform's status, and `smoke` passes against a built-in engine the
test starts at the URL the fake KServe controller reports."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from engine_server import start as start_engine
from fake_platform_controller import FakePlatformController, kserve_url
from targets.platform_schemas import CRD_FILES, installable_crds

from llmdeploy.apply.discovery import Discovery
from llmdeploy.apply.kube_api import KubeClient
from llmdeploy.apply.kube_connect import connect
from llmdeploy.planner import make_plan
from llmdeploy.recipe import Recipe, load_recipe
from llmdeploy.targets import Cluster, get_target, render

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
CRD_KIND = ("apiextensions.k8s.io/v1", "CustomResourceDefinition")


def _wait(predicate: Any, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout_s:.0f} s waiting for {what}"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def platform_crds(kubeconfig: Path) -> Iterator[None]:
    """The platforms' CRDs, with the keys apiserver 1.20 does not know stripped at install time
    (tests/targets/platform_schemas.py: CEL rules), removed after this module."""
    crds = installable_crds()
    with connect(kubeconfig) as client:
        rt = Discovery(client).resolve(*CRD_KIND)
        assert rt is not None
        for crd in crds:
            client.apply(rt, crd)

        def served() -> bool:
            discovery = Discovery(client)
            return all(discovery.resolve(*key) is not None for key in CRD_FILES)

        _wait(served, "the platform CRDs to be served")
        try:
            yield
        finally:
            for crd in crds:
                client.delete(rt, crd["metadata"]["name"])


def _subset(rendered: Any, live: Any, path: str = "") -> list[str]:
    """Where `rendered` has something `live` lacks: a field the server pruned or changed."""
    if isinstance(rendered, dict):
        if not isinstance(live, dict):
            return [path]
        return [m for k, v in rendered.items() for m in _subset(v, live.get(k), f"{path}.{k}")]
    if isinstance(rendered, list):
        if not isinstance(live, list) or len(live) != len(rendered):
            return [path]
        return [
            m
            for i, (a, b) in enumerate(zip(rendered, live, strict=True))
            for m in _subset(a, b, f"{path}[{i}]")
        ]
    return [] if rendered == live or str(rendered) == str(live) else [path]


def _in_namespace(path: Path, namespace: str, **server: Any) -> Recipe:
    recipe = load_recipe(path)
    data = recipe.model_dump(mode="json", exclude_none=True)
    data["target"]["namespace"] = namespace
    data["server"] = {**data["server"], **server}
    return Recipe.model_validate(data)


def _sglang_on(target: str, namespace: str) -> Recipe:
    data = load_recipe(ROOT / "recipes" / "sglang.yaml").model_dump(mode="json", exclude_none=True)
    data["target"] = {"type": target, "namespace": namespace}
    data["server"]["port"] = 8000
    return Recipe.model_validate(data)


CASES = {
    "kserve": lambda ns: _in_namespace(ROOT / "recipes" / "kserve.yaml", ns),
    "llm-d": lambda ns: _in_namespace(ROOT / "recipes" / "llm-d.yaml", ns),
    "kubeai": lambda ns: _in_namespace(ROOT / "recipes" / "kubeai.yaml", ns),
    "kserve-sglang": lambda ns: _sglang_on("kserve", ns),
    "llm-d-sglang": lambda ns: _sglang_on("llm-d", ns),
}


@pytest.mark.parametrize("case", list(CASES))
def test_every_rendered_object_is_taken_by_server_side_apply(
    case: str, platform_crds: None, client: KubeClient, namespace: str
) -> None:
    recipe = CASES[case](namespace)
    discovery = Discovery(client)
    for doc in render(recipe, make_plan(recipe)).documents:
        rt = discovery.resolve(doc["apiVersion"], doc["kind"])
        assert rt is not None, f"{doc['kind']} is not served"
        applied = client.apply(rt, doc)
        lost = _subset({k: v for k, v in doc.items() if k != "metadata"}, applied)
        assert lost == [], f"{doc['kind']} {doc['metadata']['name']}: the server dropped {lost}"


def _llmdeploy(*args: str, kubeconfig: Path, namespace: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "llmdeploy.cli.main", *args, "--kubeconfig", str(kubeconfig)]
    argv += ["--set", f"target.namespace={namespace}"]
    return subprocess.run(
        argv, capture_output=True, text=True, cwd=ROOT, timeout=300, stdin=subprocess.DEVNULL
    )


@pytest.mark.parametrize("name", ["kserve", "llm-d", "kubeai"])
def test_apply_diff_status_down_through_the_cli(
    name: str, platform_crds: None, kubeconfig: Path, namespace: str
) -> None:
    recipe = str(ROOT / "recipes" / f"{name}.yaml")
    with FakePlatformController(kubeconfig, namespace):
        applied = _llmdeploy(
            "apply", recipe, "--yes", "--timeout", "120", kubeconfig=kubeconfig, namespace=namespace
        )
        assert applied.returncode == 0, applied.stdout + applied.stderr

        same = _llmdeploy("diff", recipe, kubeconfig=kubeconfig, namespace=namespace)
        assert same.returncode == 0, same.stdout + same.stderr
        assert "no changes" in same.stdout

        changed = _llmdeploy(
            "diff", recipe, "--set", "limits.max_num_seqs=16", kubeconfig=kubeconfig, namespace=namespace
        )
        assert changed.returncode == 1, changed.stdout + changed.stderr

        status = _llmdeploy("status", recipe, kubeconfig=kubeconfig, namespace=namespace)
        assert status.returncode == 0, status.stdout + status.stderr

        if name == "kserve":
            recipe_obj = _in_namespace(Path(recipe), namespace)
            url = get_target("kserve").endpoint_url(recipe_obj, Cluster(kubeconfig=kubeconfig))
            assert url == kserve_url("kserve", namespace)

    down = _llmdeploy("down", recipe, "--yes", kubeconfig=kubeconfig, namespace=namespace)
    assert down.returncode == 0, down.stdout + down.stderr
    gone = _llmdeploy("status", recipe, kubeconfig=kubeconfig, namespace=namespace)
    assert gone.returncode != 0 and "not deployed" in gone.stdout, gone.stdout + gone.stderr


SMOKE_MODEL_NAME = "smollm2-135m-instruct"


def _kserve_smollm2(namespace: str) -> dict[str, Any]:
    """The quickstart's model and smoke prompt as KServe would serve it: vLLM, weights from the hub
    (KServe takes no PyPI package), KServe's port; the served name is what KServe's
    `spec.model.name` and the engine's --served-model-name both carry."""
    data = yaml.safe_load((ROOT / "recipes" / "quickstart.yaml").read_text())
    data["name"] = "smoke-kserve"
    data["model"] = {"id": "HuggingFaceTB/SmolLM2-135M-Instruct", "dtype": "float32"}
    data["engine"] = {"type": "vllm"}
    data["kv_cache"] = {"block_size": 128}
    data["server"] = {"host": "0.0.0.0", "port": 8000, "served_model_name": SMOKE_MODEL_NAME}
    data["target"] = {"type": "kserve", "namespace": namespace}
    return data


def test_smoke_reaches_the_engine_at_the_url_kserve_reports(
    platform_crds: None, kubeconfig: Path, namespace: str, tmp_path: Path
) -> None:
    """`llmdeploy smoke RECIPE` on a kserve recipe asks the cluster for the LLMInferenceService's
    status.url and runs its checks there: the fake controller reports the URL of a built-in engine
    this test started on loopback, so every check passing means smoke found that URL and talked to
    a real engine."""
    recipe = tmp_path / "smoke-kserve.yaml"
    recipe.write_text(yaml.safe_dump(_kserve_smollm2(namespace), sort_keys=False))
    engine = start_engine(
        tmp_path,
        *("--kv-cache-memory-bytes", str(512 * 2**20), "--max-model-len", "2048", "--max-num-seqs", "32"),
        served_model_name=SMOKE_MODEL_NAME,
    )
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    try:
        with FakePlatformController(kubeconfig, namespace, urls={"smoke-kserve": engine.url}):
            applied = _llmdeploy(
                "apply", str(recipe), "--yes", "--timeout", "120", kubeconfig=kubeconfig, namespace=namespace
            )
            assert applied.returncode == 0, applied.stdout + applied.stderr
            # smoke has no --kubeconfig: it reads the cluster the way kubectl does, from $KUBECONFIG
            smoked = subprocess.run(
                [sys.executable, "-m", "llmdeploy.cli.main", "smoke", str(recipe), "--startup-timeout", "60",
                 "--log-file", str(engine.log_path)],
                capture_output=True,
                text=True,
                cwd=ROOT,
                env=env,
                timeout=600,
                stdin=subprocess.DEVNULL,
            )  # fmt: skip
        assert smoked.returncode == 0, smoked.stdout + smoked.stderr
        assert f"smoke test of {SMOKE_MODEL_NAME} at {engine.url}" in smoked.stdout, smoked.stdout
        for check in (
            "health",
            "list models",
            "chat completion",
            "streamed chat completion",
            "recipe prompt 1",
        ):
            assert f"ok    {check}" in smoked.stdout, smoked.stdout
        # the engine itself answered: its access log shows the chat requests smoke sent
        assert "/v1/chat/completions" in engine.log(), engine.log()[-2000:]
    finally:
        engine.stop(timeout_s=20)
        _llmdeploy("down", str(recipe), "--yes", kubeconfig=kubeconfig, namespace=namespace)
