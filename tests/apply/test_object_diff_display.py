"""`diff` shows a changed command or argument list argument by argument, and nothing cut off."""

from __future__ import annotations

from typing import Any

from llmdeploy.apply.object_diff import diff_objects


def _deployment(command: list[str], containers: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    engine = {"name": "engine", "image": "vllm:1", "command": command}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "d"},
        "spec": {"template": {"spec": {"containers": [engine, *(containers or [])]}}},
    }


ARGV = ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "m", "--max-num-seqs", "128",
        "--max-model-len", "32768", "--enable-prefix-caching"]  # fmt: skip
PATH = "spec.template.spec.containers[name=engine].command"


def _rendered(live: dict[str, Any], planned: dict[str, Any]) -> list[str]:
    return [c.render() for c in diff_objects(live, planned)]


def test_a_changed_value_names_its_flag() -> None:
    after = [*ARGV]
    after[6] = "64"
    assert _rendered(_deployment(ARGV), _deployment(after)) == [
        f'~ {PATH}[6]: "128" -> "64"  (after --max-num-seqs)'
    ]


def test_added_and_removed_arguments_are_listed_one_by_one() -> None:
    after = [a for a in ARGV if a not in ("--max-model-len", "32768")] + ["--enforce-eager", "--seed", "7"]
    assert _rendered(_deployment(ARGV), _deployment(after)) == [
        f'- {PATH}[7]: "--max-model-len"',
        f'- {PATH}[8]: "32768"  (after --max-model-len)',
        f'+ {PATH}[8]: "--enforce-eager"',
        f'+ {PATH}[9]: "--seed"',
        f'+ {PATH}[10]: "7"  (after --seed)',
    ]


def test_long_values_are_shown_whole() -> None:
    long_arg = "--chat-template=" + "x" * 400
    lines = _rendered(_deployment(ARGV), _deployment([*ARGV, long_arg]))
    assert lines == [f'+ {PATH}[10]: "{long_arg}"']


def test_an_added_container_is_shown_in_full_as_yaml() -> None:
    sidecar = {"name": "log-shipper", "image": "shipper:1", "args": ["--input", "/tmp/" + "y" * 200]}
    (line,) = _rendered(_deployment(ARGV), _deployment(ARGV, [sidecar]))
    assert line.splitlines() == [
        "+ spec.template.spec.containers[name=log-shipper]:",
        "      name: log-shipper",
        "      image: shipper:1",
        "      args:",
        "      - --input",
        "      - /tmp/" + "y" * 200,
    ]
