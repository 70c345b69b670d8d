"""Rendered Kubernetes files are block-style YAML a reviewer can read, byte-identical for identical input."""

from __future__ import annotations

import itertools

import yaml

from llmdeploy.planner import make_plan
from llmdeploy.render.block_yaml import to_block_yaml
from llmdeploy.targets import render
from render.pod_settings import pod_settings
from render.recipe_factory import make_recipe


def _flow_collections(text: str) -> list[str]:
    """Non-empty mappings or lists written in flow style ({...} / [...])."""
    found = []
    events = list(yaml.parse(text))
    for event, following in itertools.pairwise(events):
        starts = isinstance(event, yaml.MappingStartEvent | yaml.SequenceStartEvent) and event.flow_style
        if starts and not isinstance(following, yaml.MappingEndEvent | yaml.SequenceEndEvent):
            found.append(f"line {event.start_mark.line + 1}")
    return found


def _recipe() -> object:
    return make_recipe(
        "vllm",
        parallelism={"replicas": 2},
        target={
            "type": "kubernetes",
            "namespace": "llm",
            "autoscaling": {"kind": "hpa"},
            **pod_settings("t"),
        },
    )


def test_rendered_manifests_have_no_flow_collections_and_no_json() -> None:
    recipe = _recipe()
    files = render(recipe, make_plan(recipe)).files  # type: ignore[arg-type]
    assert "deployment.yaml" in files and "horizontalpodautoscaler.yaml" in files
    for name, text in files.items():
        assert not _flow_collections(text), (name, _flow_collections(text))
        assert '": ' not in text and "{\n" not in text, name
        assert "&id" not in text and "*id" not in text, f"{name}: YAML aliases"


def test_rendering_twice_gives_the_same_bytes() -> None:
    first, second = _recipe(), _recipe()
    assert render(first, make_plan(first)).files == render(second, make_plan(second)).files  # type: ignore[arg-type]


def test_block_yaml_keeps_hard_text_exact() -> None:
    values = [
        "plain",
        "two\nlines\n",
        "trailing space \nand a tab\t\n",
        "  leading spaces\nthen text",
        "yes",
        "1.30",
        "",
        "emoji \U0001f600 and accents é",
        "# not a comment",
        "a: b",
        "x" * 300,
    ]
    doc = {"values": values, "empty": {}, "none": [], "nested": [{"a": [1, 2.5, True, None]}]}
    text = to_block_yaml(doc)
    assert yaml.safe_load(text) == doc
    assert text.isascii()
    assert "\n" not in text.split("- xxx")[1].split("\n")[0][:10], "long lines are not folded"
    assert to_block_yaml(doc) == text
