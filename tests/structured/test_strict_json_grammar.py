"""JSON-schema grammars admit strict JSON only (issue 48, item 6): xgrammar 0.2.9 writes length-bounded
strings as a class that admits raw control characters; `json_schema_grammar` closes it, and leaves
quoted literals that happen to contain `[^` alone."""

from __future__ import annotations

import json

import pytest
from llmdeploy_engine.structured_output import json_schema_grammar, strict_character_classes

xgr = pytest.importorskip("xgrammar")
from xgrammar.testing import _is_grammar_accept_string as accepts  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {
        "b": {"type": "string", "maxLength": 8},
        "n": {"type": "object", "propertyNames": {"maxLength": 3}},
        "d": {"enum": ["[^x]", 'q"[^']},
    },
    "required": ["b", "d"],
}


@pytest.mark.parametrize("control", ["\x00", "\x01", "\t", "\x1f"])
def test_length_bounded_strings_refuse_raw_control_characters(control: str) -> None:
    text = '{"b": "a' + control + '", "d": "[^x]"}'  # json.dumps would escape it
    library = xgr.Grammar.from_json_schema(json.dumps(SCHEMA), any_whitespace=False, strict_mode=True)
    assert accepts(library, text)  # the library's own rule: the reason for the rewrite
    ours = xgr.Grammar.from_ebnf(json_schema_grammar(json.dumps(SCHEMA)))
    assert not accepts(ours, text)
    with pytest.raises(json.JSONDecodeError):
        json.loads(text, strict=True)


def test_strict_grammar_keeps_valid_replies_and_literals() -> None:
    ours = xgr.Grammar.from_ebnf(json_schema_grammar(json.dumps(SCHEMA)))
    for reply in ({"b": "abc", "d": "[^x]"}, {"b": "", "n": {"k": 1}, "d": 'q"[^'}):
        assert accepts(ours, json.dumps(reply))
    assert not accepts(ours, '{"b": "a", "n": {"k\x02": 1}, "d": "[^x]"}')


def test_rewrite_touches_negated_classes_only() -> None:
    ebnf = 'a ::= [^"\\\\] "[^q]" [a-z] [^\\0-\\x1f\\"]'
    assert strict_character_classes(ebnf) == 'a ::= [^\\0-\\x1f"\\\\] "[^q]" [a-z] [^\\0-\\x1f\\"]'
