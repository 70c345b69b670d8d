"""`extends:` naming a symbolic link to something that is not a recipe (issue 29, item 11).

The link's own name ends in .yaml, so it passes the suffix rule; what it points at is named in the
error, with its type, and never read: no line of the file reaches the message.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from llmdeploy.errors import UserError
from llmdeploy.recipe import load_recipe

SECRET_LINE = "db_password: hunter2-not-for-your-eyes"


def _error(leaf: Path) -> str:
    with pytest.raises(UserError) as caught:
        load_recipe(leaf, env={})
    return str(caught.value)


@pytest.mark.parametrize("target_name", ["notes.txt", "settings.conf", "passwd"])
def test_link_to_a_non_recipe_file_names_path_and_type_only(tmp_path: Path, target_name: str) -> None:
    target = tmp_path / "private" / target_name
    target.parent.mkdir()
    target.write_text(f"{SECRET_LINE}\nroot:x:0:0:root:/root:/bin/bash\n")
    (tmp_path / "base.yaml").symlink_to(target)
    leaf = tmp_path / "leaf.yaml"
    leaf.write_text("extends: base.yaml\nmodel: {id: x}\n")
    message = _error(leaf)
    assert str(target) in message and "a regular file" in message and "symbolic link" in message
    assert "hunter2" not in message and "db_password" not in message and "root:x" not in message


def test_link_to_system_file_content_is_not_echoed(tmp_path: Path) -> None:
    (tmp_path / "base.yaml").symlink_to("/etc/passwd")
    leaf = tmp_path / "leaf.yaml"
    leaf.write_text("extends: base.yaml\nmodel: {id: x}\n")
    message = _error(leaf)
    assert "/etc/passwd" in message and "root:" not in message


def test_a_scalar_recipe_is_described_not_echoed(tmp_path: Path) -> None:
    base = tmp_path / "base.yaml"
    base.write_text("sk-live-this-is-a-planted-value\n")
    leaf = tmp_path / "leaf.yaml"
    leaf.write_text("extends: base.yaml\nmodel: {id: x}\n")
    message = _error(leaf)
    assert "a single value (a string)" in message and "sk-live" not in message


def test_a_link_to_a_yaml_recipe_still_works(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "base.yaml").write_text("model: {id: HuggingFaceTB/SmolLM2-135M-Instruct}\n")
    (tmp_path / "base.yaml").symlink_to(shared / "base.yaml")
    leaf = tmp_path / "leaf.yaml"
    leaf.write_text("extends: base.yaml\n")
    assert load_recipe(leaf, env={}).model.id == "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_a_loop_of_links_is_a_user_error(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").symlink_to(tmp_path / "b.yaml")
    (tmp_path / "b.yaml").symlink_to(tmp_path / "a.yaml")
    leaf = tmp_path / "leaf.yaml"
    leaf.write_text("extends: a.yaml\nmodel: {id: x}\n")
    assert "symbolic link" in _error(leaf)
