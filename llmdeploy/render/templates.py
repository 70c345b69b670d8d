"""The Jinja templates of the launch files (package data under llmdeploy/templates), rendered strictly."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import jinja2

from llmdeploy.render.block_yaml import to_block_yaml

TEMPLATES_DIR = Path(__file__).resolve().parents[1] / "templates"


@cache
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR)),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
    )
    env.filters["to_yaml"] = to_block_yaml
    return env


def render_template(template: str, **values: Any) -> str:
    return environment().get_template(template).render(**values)
