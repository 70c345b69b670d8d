"""Block-style YAML for the rendered files: what a reviewer reads in a pull request.

PyYAML's safe dumper with every collection in block style, multi-line text as literal blocks
(`|`), no line folding, keys in the order the renderer built them, and ASCII-only output (other
characters written as escapes, which every YAML reader decodes) so the bytes never depend on the
locale a file is written in. Same value, same bytes.
"""

from __future__ import annotations

from typing import Any

import yaml


class _BlockDumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        # a value placed twice (the labels of every object) is written out twice, never as &id/*id
        return True


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    # PyYAML falls back to a quoted scalar where a literal block cannot hold the text exactly
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_BlockDumper.add_representer(str, _text)


def to_block_yaml(value: Any) -> str:
    """`value` as block-style YAML, without a trailing newline (templates place it on its own lines)."""
    text = yaml.dump(
        value,
        Dumper=_BlockDumper,
        default_flow_style=False,
        sort_keys=False,
        allow_unicode=False,
        width=float("inf"),
        indent=2,
    )
    return text.removesuffix("\n").removesuffix("\n...")
