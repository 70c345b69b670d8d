"""`${VAR}` and `${VAR:-default}` in recipe strings; `$${` writes a literal `${`.

A variable named like a credential (`*_API_KEY`, `HF_TOKEN`, `*_PASSWORD`, `GH_PAT`, ...), or one
whose value has a credential's shape whatever its name (`DATABASE_URL=postgres://u:pw@db`, a
GitHub or Hugging Face token), is never substituted: its value would land in rendered files in
plain text and in any error about the field. The recipe names such a variable instead
(`server.api_key: {env: VAR}`, a Kubernetes Secret), and the value is read at start-up; the
refusal names the variable, never its value.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from llmdeploy.errors import Problem, Redacted, is_credential_name, looks_like_credential
from llmdeploy.recipe.yaml_source import FieldPath, Mark

_TOKEN = re.compile(r"\$\$\{|\$\{([^}]*)\}?")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def interpolate(
    data: Any, marks: Mapping[FieldPath, Mark], env: Mapping[str, str], path: FieldPath = ()
) -> tuple[Any, list[Problem]]:
    """Return `data` with every string value interpolated, and the problems found (keys are left alone)."""
    problems: list[Problem] = []
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for key, value in data.items():
            out[key], found = interpolate(value, marks, env, (*path, key))
            problems += found
        return out, problems
    if isinstance(data, list):
        items = []
        for index, value in enumerate(data):
            item, found = interpolate(value, marks, env, (*path, index))
            items.append(item)
            problems += found
        return items, problems
    if isinstance(data, str) and "$" in data:
        return _substitute(data, marks, env, path)
    return data, problems


def _substitute(
    text: str, marks: Mapping[FieldPath, Mark], env: Mapping[str, str], path: FieldPath
) -> tuple[str, list[Problem]]:
    problems: list[Problem] = []
    mark = marks.get(path)

    def problem(message: str, fix: str, with_value: bool = True) -> None:
        problems.append(
            Problem(
                message,
                file=mark.file if mark else None,
                line=mark.line if mark else None,
                path=".".join(str(p) for p in path) or None,
                value=text if with_value else None,
                has_value=with_value,
                fix=fix,
            )
        )

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$${":
            return "${"
        body = match.group(1)
        if not match.group(0).endswith("}"):
            problem("unclosed '${' in value", "close it with '}'")
            return match.group(0)
        name, sep, default = body.partition(":-")
        if not _NAME.fullmatch(name):
            problem(
                f"'${{{body}}}' is not a variable reference",
                "write ${NAME} or ${NAME:-default}; write $${ for a literal '${'",
            )
            return match.group(0)
        if is_credential_name(name):
            problem(
                f"${{{name}}} looks like a credential; its value would be written into rendered files "
                "and messages",
                f"name the variable instead, e.g. server.api_key: {{env: {name}}} (or server.hf_token); "
                "the engine reads it at start-up",
                False,
            )
            # what reaches validation (and any message about this field) is a stand-in, never the value
            return str(Redacted(env.get(name, default)))
        if name in env and looks_like_credential(env[name]):
            problem(
                f"${{{name}}} holds what looks like a credential (a URL with a password, or a token); "
                "interpolated, it would be written into rendered files in plain text",
                "on Kubernetes give it through a Secret (target.env: [{name: ..., valueFrom: "
                "{secretKeyRef: {name: ..., key: ...}}}]); locally export it where the engine starts; "
                "a value that is no secret: write it into the recipe itself",
                False,
            )
            return str(Redacted(env[name]))
        if name in env:
            return env[name]
        if sep:
            return default
        problem(
            f"environment variable {name} is not set",
            f"export {name}=..., or give a default: ${{{name}:-value}}",
            False,
        )
        return ""

    return _TOKEN.sub(replace, text), problems
