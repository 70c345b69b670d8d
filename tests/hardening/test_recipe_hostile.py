"""Hostile recipe files: alias bombs, deep nesting, huge values, `extends` tricks.

Every case ends in a `UserError` (or a valid Recipe) within a time bound; never a traceback or a hang.
Policy for `extends:` (see SECURITY.md): a base may live anywhere the user can read (`../base.yaml`
is normal), but it must be a regular `.yaml`/`.yml` file of at most `MAX_RECIPE_BYTES`; devices,
pipes and other files (so no system file's content is echoed in an error) are refused.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hardening.figures import record
from llmdeploy.errors import UserError
from llmdeploy.recipe import load_recipe
from llmdeploy.recipe.loader import MAX_RECIPE_BYTES

TIME_BOUND_S = 5.0
pytestmark = pytest.mark.timeout(120)
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _load(path: Path) -> UserError | None:
    """Load within the time bound; a UserError is returned (with a message on every problem)."""
    start = time.monotonic()
    try:
        load_recipe(path, env={"A": "a"})
        error = None
    except UserError as e:
        assert e.problems and all(p.message for p in e.problems)
        assert "Traceback" not in str(e)
        error = e
    elapsed_s = time.monotonic() - start
    assert elapsed_s < TIME_BOUND_S, f"{path.name} took {elapsed_s:.1f} s"
    record("recipe cases tried", 1)
    record("recipe cases refused with UserError" if error else "recipe cases accepted", 1)
    return error


def _bomb(levels: int, width: int, kind: str) -> str:
    lines = ['x-l0: &l0 ["lol"]']
    for level in range(1, levels):
        refs = ", ".join([f"*l{level - 1}"] * width)
        if kind == "list":
            lines.append(f"x-l{level}: &l{level} [{refs}]")
        else:  # merge keys: each mapping merges the previous one `width` times
            keys = ", ".join(f"k{i}: *l{level - 1}" for i in range(width))
            lines.append(
                f"x-l{level}: &l{level} {{{keys}, <<: [{refs}]}}"
                if level > 1
                else f"x-l{level}: &l{level} {{{keys}}}"
            )
    return "\n".join(lines) + "\nmodel: {id: x}\n"


@pytest.mark.parametrize("kind", ["list", "merge"])
def test_alias_bomb_is_refused_quickly(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(_bomb(levels=10, width=9, kind=kind))
    error = _load(path)
    assert error is not None and ("expands to more than" in str(error) or "merges" in str(error))


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(levels=st.integers(1, 10), width=st.integers(1, 10), kind=st.sampled_from(["list", "merge"]))
@pytest.mark.slow
def test_alias_trees_of_any_shape(tmp_path: Path, levels: int, width: int, kind: str) -> None:
    path = tmp_path / "tree.yaml"
    path.write_text(_bomb(levels, width, kind))
    error = _load(path)
    if kind == "list" and width**levels <= 10_000:  # small trees are plain YAML and load
        assert error is None


def test_self_merging_mapping(tmp_path: Path) -> None:
    path = tmp_path / "self.yaml"
    path.write_text("x-a: &a {k: 1, <<: *a}\nmodel: {id: x}\n")
    assert _load(path) is not None


@pytest.mark.parametrize("depth", [65, 500, 5000, 50_000])
@pytest.mark.parametrize("opener", ["[", "{a: ", "- "])
@pytest.mark.slow
def test_deep_nesting(tmp_path: Path, depth: int, opener: str) -> None:
    if opener == "- ":
        text = "model: {id: x}\nx-d:\n" + "".join("  " * i + "- \n" for i in range(min(depth, 2000)))
    else:
        closer = "]" if opener == "[" else "}"
        text = "model: {id: x}\nx-d: " + opener * depth + "1" + closer * depth + "\n"
    path = tmp_path / "deep.yaml"
    path.write_text(text)
    _load(path)


@FUZZ
@given(
    field=st.sampled_from(
        [
            "limits.max_model_len",
            "limits.max_num_seqs",
            "hardware.num_gpus",
            "server.port",
            "limits.gpu_memory_utilization",
            "model.id",
            "name",
            "engine.type",
        ]
    ),
    value=st.one_of(
        st.integers(min_value=-(10**40), max_value=10**40),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=30),
        st.booleans(),
        st.none(),
        st.just("1e999"),
        st.just(".nan"),
        st.just("0x7fffffff"),
        st.lists(st.integers(), max_size=3),
        st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    ),
)
def test_wrong_types_and_huge_numbers(tmp_path: Path, field: str, value: object) -> None:
    import yaml

    section, key = field.split(".") if "." in field else (field, None)
    data: dict[str, object] = {"model": {"id": "HuggingFaceTB/SmolLM2-135M-Instruct"}}
    if key is None:
        data[section] = value
    else:
        part = data.setdefault(section, {})
        assert isinstance(part, dict)
        part[key] = value
    path = tmp_path / "typed.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True))
    _load(path)


def test_extends_cycle_of_three(tmp_path: Path) -> None:
    for name, base in [("a", "b"), ("b", "c"), ("c", "a")]:
        (tmp_path / f"{name}.yaml").write_text(f"extends: {base}.yaml\nmodel: {{id: x}}\n")
    error = _load(tmp_path / "a.yaml")
    assert error is not None and "extends cycle" in str(error)


def test_extends_outside_the_folder_is_allowed(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "base.yaml").write_text("model: {id: HuggingFaceTB/SmolLM2-135M-Instruct}\n")
    (tmp_path / "team").mkdir()
    leaf = tmp_path / "team" / "leaf.yaml"
    leaf.write_text("extends: ../shared/base.yaml\n")
    assert _load(leaf) is None
    assert load_recipe(leaf, env={}).model.id == "HuggingFaceTB/SmolLM2-135M-Instruct"


@pytest.mark.parametrize(
    "target",
    [
        "/dev/zero",
        "/dev/urandom",
        "/proc/self/fd/0",
        "/proc/self/environ",
        "/",
        "/nonexistent/x.yaml",
        "../../../../../../etc/shadow",
        "/etc/passwd",
        "\u202e.yaml",
        "a\nb.yaml",
        "x" * 5000 + ".yaml",
        "/dev/zero/.yaml",
        ".yaml",
    ],
)
def test_extends_to_hostile_paths(tmp_path: Path, target: str) -> None:
    import json

    path = tmp_path / "leaf.yaml"
    path.write_text(f"extends: {json.dumps(target)}\nmodel: {{id: x}}\n")
    error = _load(path)
    assert error is not None and "extends" in str(error)
    assert "root:" not in str(error) and "PATH=" not in str(error)  # no content of system files echoed


def test_fifo_base_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.yaml"  # the suffix passes; the file type does not
    os.mkfifo(fifo)
    path = tmp_path / "leaf.yaml"
    path.write_text("extends: pipe.yaml\nmodel: {id: x}\n")
    error = _load(path)
    assert error is not None and "not a regular file" in str(error)


@pytest.mark.parametrize("size", [MAX_RECIPE_BYTES + 1, 8 * MAX_RECIPE_BYTES])
def test_oversized_recipe(tmp_path: Path, size: int) -> None:
    path = tmp_path / "big.yaml"
    path.write_text("model: {id: x}\n# " + "x" * size + "\n")
    error = _load(path)
    assert error is not None and "larger than" in str(error)


@pytest.mark.parametrize(
    "data",
    [
        b"\xff\xfe\x00m\x00o",
        b"model: {id: \xc3\x28}\n",
        b"\x00\x00\x00",
        "model: {id: \u0000}\n".encode(),
        b"\xef\xbb\xbfmodel: {id: x}\n",
    ],
)
def test_binary_and_bad_encodings(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "bin.yaml"
    path.write_bytes(data)
    _load(path)


@FUZZ
@given(data=st.binary(max_size=300))
def test_arbitrary_bytes(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "bytes.yaml"
    path.write_bytes(data)
    _load(path)


@pytest.mark.parametrize(
    "tag",
    [
        "!!python/object/apply:os.system ['touch PWNED']",
        "!!python/name:os.system",
        "!!binary aGVsbG8=",
        "!!set {a, b}",
        "!!timestamp 2001-12-14",
        "!custom x",
    ],
)
def test_yaml_tags_never_build_objects(tmp_path: Path, tag: str, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "tag.yaml"
    path.write_text(f"model: {{id: x}}\nname: {tag}\n")
    # a "touch PWNED" that ran would land here; monkeypatch restores the directory for later tests
    monkeypatch.chdir(tmp_path)
    _load(path)
    assert not (tmp_path / "PWNED").exists()
