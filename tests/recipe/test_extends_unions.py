"""`extends:` and unions: an overlay mapping that selects another variant (`api_key: {env: K}` over a
base's `{secret: ...}`, `target: {type: kubernetes}` over a local target) replaces the base's
variant; a mapping of the same variant still merges key by key."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmdeploy.errors import UserError
from llmdeploy.recipe import load_recipe
from llmdeploy.recipe.schema import ApiKeyFromEnv, ApiKeyFromSecret, KubernetesTarget, LocalTarget


def _write(tmp_path: Path, base: str, overlay: str) -> Path:
    (tmp_path / "base.yaml").write_text("model: {id: HuggingFaceTB/SmolLM2-135M-Instruct}\n" + base)
    leaf = tmp_path / "leaf.yaml"
    leaf.write_text("extends: base.yaml\n" + overlay)
    return leaf


def test_env_key_over_a_secret_key_replaces_it(tmp_path: Path) -> None:
    leaf = _write(
        tmp_path, "server:\n  api_key: {secret: {name: s, key: k}}\n", "server:\n  api_key: {env: K}\n"
    )
    assert load_recipe(leaf).server.api_key == ApiKeyFromEnv(env="K")


def test_secret_key_over_an_env_key_replaces_it(tmp_path: Path) -> None:
    leaf = _write(
        tmp_path, "server:\n  hf_token: {env: HF_TOKEN}\n", "server:\n  hf_token: {secret: {name: t}}\n"
    )
    token = load_recipe(leaf).server.hf_token
    assert isinstance(token, ApiKeyFromSecret) and token.secret.name == "t"


def test_the_same_variant_still_merges(tmp_path: Path) -> None:
    leaf = _write(
        tmp_path,
        "server:\n  api_key: {secret: {name: s, key: k}}\n",
        "server:\n  api_key: {secret: {name: t}}\n",
    )
    key = load_recipe(leaf).server.api_key
    assert isinstance(key, ApiKeyFromSecret) and (key.secret.name, key.secret.key) == ("t", "k")


def test_another_target_type_replaces_the_base_target(tmp_path: Path) -> None:
    leaf = _write(
        tmp_path,
        "target: {type: local, state_dir: /tmp/x}\n",
        "target: {type: kubernetes, namespace: llm}\n",
    )
    target = load_recipe(leaf).target
    assert isinstance(target, KubernetesTarget) and target.namespace == "llm"


def test_a_target_without_type_merges_into_the_base_target(tmp_path: Path) -> None:
    leaf = _write(tmp_path, "target: {type: kubernetes, namespace: llm}\n", "target: {labels: {team: a}}\n")
    target = load_recipe(leaf).target
    assert isinstance(target, KubernetesTarget) and (target.namespace, target.labels) == (
        "llm",
        {"team": "a"},
    )
    leaf = _write(tmp_path, "target: {type: local}\n", "target: {state_dir: /tmp/y}\n")
    assert load_recipe(leaf).target == LocalTarget(type="local", state_dir="/tmp/y")


def test_an_error_in_the_replacing_variant_points_at_the_overlay(tmp_path: Path) -> None:
    leaf = _write(
        tmp_path, "server:\n  api_key: {secret: {name: s}}\n", "server:\n  api_key: {env: '1BAD'}\n"
    )
    with pytest.raises(UserError) as info:
        load_recipe(leaf)
    assert "leaf.yaml:3: server.api_key.env: not an environment variable name" in str(info.value)
