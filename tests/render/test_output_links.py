"""`render -o DIR` never follows a symbolic link that is already inside DIR (issue 29, item 11).

A link planted where a rendered file goes (or a folder on the way to one, or the manifest) would make
a write land outside DIR and `chmod +x` a file the user never rendered; every such link is refused
before anything is written, and the file it points to is left byte for byte and mode for mode.
"""

from __future__ import annotations

import dataclasses
import os
import stat
from pathlib import Path

import pytest

from llmdeploy.errors import UserError
from llmdeploy.render.output_dir import MANIFEST, write_artifacts
from llmdeploy.targets import render
from render.recipe_factory import make_recipe

LOCAL = make_recipe("vllm", target={"type": "local"})
KUBE = make_recipe("vllm", target={"type": "kubernetes", "autoscaling": {"kind": "hpa"}})


def _victim(tmp_path: Path) -> Path:
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "precious.txt"
    victim.write_text("not llmdeploy's\n")
    victim.chmod(0o600)
    return victim


def _untouched(victim: Path) -> None:
    assert victim.read_text() == "not llmdeploy's\n"
    assert stat.S_IMODE(victim.stat().st_mode) == 0o600


@pytest.mark.parametrize("name", ["launch.sh", "engine.env", MANIFEST])
def test_a_link_in_place_of_a_rendered_file_is_refused(tmp_path: Path, name: str) -> None:
    victim = _victim(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / name).symlink_to(victim)
    with pytest.raises(UserError) as caught:
        write_artifacts(render(LOCAL, None), out)
    message = str(caught.value)
    assert "symbolic link" in message and str(out / name) in message and "rm " in message
    _untouched(victim)
    assert (out / name).is_symlink()  # left for the user to decide
    assert not (out / "launch.sh").exists() or name == "launch.sh"  # nothing written first


def test_a_linked_folder_on_the_way_is_refused(tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    nested = {"deep/launch.sh": "#!/bin/sh\n"}
    artifacts = render(LOCAL, None)
    artifacts = dataclasses.replace(artifacts, files={**artifacts.files, **nested})
    (out / "deep").symlink_to(victim.parent, target_is_directory=True)
    with pytest.raises(UserError, match="symbolic link is in the way of a rendered folder"):
        write_artifacts(artifacts, out)
    assert sorted(os.listdir(victim.parent)) == ["precious.txt"]
    _untouched(victim)


def test_stale_manifest_entries_never_delete_through_a_link(tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    out = tmp_path / "out"
    write_artifacts(render(KUBE, None), out)
    stale = out / "horizontalpodautoscaler.yaml"
    stale.unlink()
    stale.symlink_to(victim)  # a file the previous render wrote is now a link to someone else's file
    result = write_artifacts(render(make_recipe("vllm", target={"type": "kubernetes"}), None), out)
    assert result.removed == ()
    _untouched(victim)


def test_a_replaced_file_keeps_its_mode_and_launch_sh_runs(tmp_path: Path) -> None:
    out = tmp_path / "out"
    write_artifacts(render(LOCAL, None), out)
    (out / "engine.env").chmod(0o600)
    (out / "engine.env").write_text("edited by hand\n")
    result = write_artifacts(render(LOCAL, None), out)
    assert result.written == ("engine.env",)
    assert stat.S_IMODE((out / "engine.env").stat().st_mode) == 0o600
    assert os.access(out / "launch.sh", os.X_OK)
    assert not [p for p in os.listdir(out) if "llmdeploy-tmp" in p]
