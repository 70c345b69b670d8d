"""Whatever the text, the loader returns a Recipe or raises UserError; never another exception."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmdeploy.errors import UserError
from llmdeploy.recipe import load_recipe

TOKENS = [
    "model", "id", "limits", "max_model_len", "extends", "name", "target", "type", "kubernetes",
    "bench", "input_len", "min", "max", "server", "api_key", "env", "smoke", "prompts", "x-a",
    ":", ": ", "- ", "  ", "\n", "\t", "{", "}", "[", "]", ",", "&a", "*a", "<<", "!!str", "!x",
    "'", '"', "${A}", "${B:-3}", "$${", "${", "#", "---", "1", "-1", "0.5", "true", "null", "~", "?",
]  # fmt: skip


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    parts=st.lists(st.sampled_from(TOKENS), max_size=40), sets=st.lists(st.sampled_from(TOKENS), max_size=3)
)
def test_loader_never_raises_anything_but_user_error(
    tmp_path: Path, parts: list[str], sets: list[str]
) -> None:
    path = tmp_path / "fuzz.yaml"
    path.write_text("".join(parts))
    overrides = ["".join(sets)] if sets else []
    try:
        load_recipe(path, overrides=overrides, env={"A": "a"})
    except UserError as e:
        assert e.problems and all(p.message for p in e.problems)


KEYS = ["model", "id", "path", "limits", "max_model_len", "target", "type", "bench", "input_len", "min", "server",
        "api_key", "secret", "name", "smoke", "prompts", "engine", "extra_args", "speculative", "method", "extends"]  # fmt: skip
VALUES = [
    "",
    "x",
    "1",
    "0",
    "-3",
    "1.5",
    "true",
    "null",
    "[1, 2]",
    "{a: 1}",
    "kubernetes",
    "${A}",
    "'q'",
    "&a x",
    "*a",
]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lines=st.lists(
        st.tuples(st.integers(0, 3), st.sampled_from(KEYS), st.sampled_from(VALUES), st.booleans()),
        max_size=25,
    )
)
@pytest.mark.slow
def test_loader_on_nested_mappings(tmp_path: Path, lines: list[tuple[int, str, str, bool]]) -> None:
    text = "model:\n  id: x\n" + "".join(
        "  " * depth + ("- " if dash else "") + f"{key}: {value}\n" for depth, key, value, dash in lines
    )
    path = tmp_path / "nested.yaml"
    path.write_text(text)
    try:
        load_recipe(path, env={})
    except UserError as e:
        assert e.problems and all(p.message for p in e.problems)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=120))
def test_loader_on_arbitrary_unicode(tmp_path: Path, text: str) -> None:
    path = tmp_path / "any.yaml"
    path.write_text("model: {id: x}\n" + text, encoding="utf-8", errors="surrogatepass")
    try:
        load_recipe(path, env={})
    except UserError as e:
        assert e.problems and all(p.message for p in e.problems)
