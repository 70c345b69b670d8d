"""Byte-identical renders, per-target file sets, headers, and the output folder's stale-file handling."""

from __future__ import annotations

from pathlib import Path

from llmdeploy.recipe import load_recipe, recipe_digest
from llmdeploy.render.output_dir import MANIFEST, write_artifacts
from llmdeploy.targets import render
from render.recipe_factory import RECIPES, make_recipe, shipped


def test_rendering_twice_gives_identical_bytes() -> None:
    for path in RECIPES:
        recipe, plan = shipped(path)
        assert render(recipe, plan).files == render(load_recipe(path), plan).files


def test_every_file_starts_with_the_recipe_header() -> None:
    for path in RECIPES:
        recipe, plan = shipped(path)
        for name, text in render(recipe, plan).files.items():
            lines = text.splitlines()
            head = lines[1] if lines[0].startswith("#!") else lines[0]
            assert head.startswith("# Rendered by llmdeploy") and recipe_digest(recipe) in head, name


def test_only_the_targets_files() -> None:
    local = render(make_recipe("vllm", target={"type": "local"}), None).files
    docker = render(make_recipe("vllm", target={"type": "docker"}), None).files
    kube = render(make_recipe("vllm", target={"type": "kubernetes"}), None).files
    assert sorted(local) == ["engine.env", "launch.sh"]
    assert sorted(docker) == ["docker-compose.yaml"]
    assert "kustomization.yaml" in kube and "deployment.yaml" in kube and "launch.sh" not in kube


def test_output_folder_removes_stale_files_only(tmp_path: Path) -> None:
    kube = make_recipe("vllm", target={"type": "kubernetes", "autoscaling": {"kind": "hpa"}})
    first = write_artifacts(render(kube, None), tmp_path)
    assert "horizontalpodautoscaler.yaml" in first.written
    (tmp_path / "mine.txt").write_text("not llmdeploy's")
    again = write_artifacts(render(kube, None), tmp_path)
    assert not again.written and again.unchanged
    without = make_recipe("vllm", target={"type": "kubernetes"})
    result = write_artifacts(render(without, None), tmp_path)
    assert result.removed == ("horizontalpodautoscaler.yaml",)
    assert (tmp_path / "mine.txt").is_file() and (tmp_path / MANIFEST).is_file()
    assert not (tmp_path / "horizontalpodautoscaler.yaml").exists()


def test_secret_sources_must_suit_the_target() -> None:
    import pytest

    from llmdeploy.errors import UserError

    with pytest.raises(UserError, match="Secret"):
        render(make_recipe("vllm", server={"api_key": {"env": "KEY"}}, target={"type": "kubernetes"}), None)
    with pytest.raises(UserError, match="Secret"):
        render(
            make_recipe("vllm", server={"api_key": {"secret": {"name": "s"}}}, target={"type": "local"}), None
        )
    launch = render(make_recipe("vllm", server={"api_key": {"env": "KEY"}}, target={"type": "local"}), None)
    assert 'export VLLM_API_KEY="${KEY:?' in launch.files["launch.sh"]
