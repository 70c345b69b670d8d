"""The target registry: every recipe `target.type` has exactly one target, which owns its section."""

from __future__ import annotations

import typing

import pytest

from llmdeploy.errors import UserError
from llmdeploy.recipe.json_schema import recipe_json_schema_text
from llmdeploy.recipe.target_schema import Target as TargetSection
from llmdeploy.targets import TARGETS, get_target


def _union_members() -> dict[str, type]:
    union = typing.get_args(TargetSection)[0]
    members = {}
    for section in typing.get_args(union):
        (literal,) = typing.get_args(section.model_fields["type"].annotation)
        members[literal] = section
    return members


def test_every_section_of_the_union_has_its_target() -> None:
    members = _union_members()
    assert set(members) == set(TARGETS), "a target.type without a target, or a target without a section"
    for name, section in members.items():
        assert get_target(name).section is section, name
        assert get_target(name).name == name


def test_every_section_forbids_unknown_fields() -> None:
    for target in TARGETS.values():
        assert target.section.model_config.get("extra") == "forbid", target.name
        assert target.section.model_config.get("frozen") is True, target.name


def test_the_published_schema_lists_every_target() -> None:
    text = recipe_json_schema_text()
    for name in TARGETS:
        assert f'"{name}"' in text, name


def test_an_unknown_target_names_the_known_ones() -> None:
    with pytest.raises(UserError) as info:
        get_target("nomad")
    problem = info.value.problems[0]
    assert problem.path == "target.type"
    assert problem.fix is not None and all(name in problem.fix for name in TARGETS)


def test_facts_are_consistent() -> None:
    for target in TARGETS.values():
        assert target.secrets_from in ("env", "secret")
        if target.kubernetes_backed:
            assert target.in_container and target.secrets_from == "secret", target.name
