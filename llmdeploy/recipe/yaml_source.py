"""YAML text -> plain data plus the file:line of every key, with readable errors.

PyYAML's composer gives us nodes that carry marks; we build the data ourselves from them so that
each field path can be traced back to its line, duplicate keys are caught (PyYAML silently keeps
the last one) and merge keys (`<<: *anchor`) still work. Scalars are typed by PyYAML's safe
constructor, so nothing beyond plain YAML types is ever built.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from llmdeploy.errors import Problem

FieldPath = tuple[str | int, ...]

_MAP_TAG = "tag:yaml.org,2002:map"
_SEQ_TAG = "tag:yaml.org,2002:seq"
_MERGE_TAG = "tag:yaml.org,2002:merge"
MAX_DEPTH = 64
# aliases are expanded while building; a budget of built values stops alias bombs (billion laughs)
_MAX_VALUES = 20_000
# each merge copies the marks seen so far; recipes use a handful, so a small cap keeps this linear
_MAX_MERGES = 200
# PyYAML's scanner is quadratic in the nesting of flow collections (`[[[[...`: 14 s at 5,000
# levels), so brackets nested this deep are refused before it runs; far past MAX_DEPTH on purpose,
# as the count is rough (a bracket inside a plain scalar counts too)
_MAX_FLOW_BRACKETS = 4 * MAX_DEPTH
# a recipe (or one `--set` value) is a short text; past this it is a mistake or an attack
MAX_YAML_BYTES = 1024 * 1024


@dataclass(frozen=True)
class Mark:
    """Where a value came from: a file and 1-based line, or an override such as `--set a.b=1`."""

    file: str
    line: int | None


@dataclass(frozen=True)
class ParsedYaml:
    data: Any
    marks: dict[FieldPath, Mark]
    problems: tuple[Problem, ...]
    # the text is not YAML at all (bad syntax, tabs, control characters), as opposed to YAML past a
    # limit or with a value its tag cannot hold: `--set` then takes the text as a plain string
    unreadable: bool = False


def parse_yaml(text: str, file: str) -> ParsedYaml:
    """Parse one YAML document; `problems` is non-empty when it could not be read cleanly."""
    if _flow_depth(text) > _MAX_FLOW_BRACKETS:
        return ParsedYaml(None, {}, (_too_deep(file),))
    tab_problems = _leading_tabs(text, file)
    if tab_problems:
        return ParsedYaml(None, {}, tuple(tab_problems), unreadable=True)
    try:
        loader = yaml.SafeLoader(text)
    except yaml.reader.ReaderError as e:
        line = text[: e.position].count("\n") + 1
        return ParsedYaml(
            None,
            {},
            (
                Problem(
                    f"not valid YAML: control character #x{e.character:04x} is not allowed",
                    file=file,
                    line=line,
                    fix="delete the invisible character (or write it as an escape in a double-quoted string)",
                ),
            ),
            unreadable=True,
        )
    try:
        node = loader.get_single_node()
    except yaml.MarkedYAMLError as e:
        return ParsedYaml(None, {}, (_syntax_problem(e, file),), unreadable=True)
    except yaml.YAMLError as e:
        return ParsedYaml(None, {}, (Problem(f"not valid YAML: {e}", file=file),), unreadable=True)
    except RecursionError:
        return ParsedYaml(None, {}, (_too_deep(file),))
    finally:
        loader.dispose()
    if node is None:
        return ParsedYaml(None, {}, ())
    if _expanded_size(node, _MAX_VALUES) > _MAX_VALUES:
        line = node.start_mark.line + 1
        return ParsedYaml(None, {}, (Problem(_TOO_MANY_VALUES, file=file, line=line, fix=_TOO_MANY_FIX),))
    builder = _Builder(loader, file)
    try:
        data = builder.build(node, (), 0)
    except RecursionError:
        return ParsedYaml(None, {}, (_too_deep(file),))
    if builder.exhausted:
        return ParsedYaml(None, {}, tuple(builder.problems))
    builder.marks[()] = Mark(file, None)
    return ParsedYaml(data, builder.marks, tuple(builder.problems))


_TOO_MANY_VALUES = f"the YAML expands to more than {_MAX_VALUES} values (aliases nested in aliases?)"
_TOO_MANY_FIX = "write the values out instead of repeating anchors inside anchors"


def _expanded_size(root: Node, limit: int) -> int:
    """How many values `root` holds once its aliases are expanded (more than `limit`: stops counting).
    Counted over the composed graph, each node once, so an alias bomb is refused in microseconds
    instead of after building `limit` values; nesting past MAX_DEPTH and recursive aliases count once
    here (building reports them)."""
    sizes: dict[int, int] = {}

    def size(node: Node, depth: int) -> int:
        if id(node) in sizes or depth > MAX_DEPTH:
            return sizes.get(id(node), 1)
        sizes[id(node)] = 1
        if isinstance(node, SequenceNode):
            children = list(node.value)
        elif isinstance(node, MappingNode):
            children = [value for _, value in node.value]
        else:
            children = []
        total = 1
        for child in children:
            total += size(child, depth + 1)
            if total > limit:
                break
        sizes[id(node)] = total
        return total

    return size(root, 0)


def _too_deep(file: str) -> Problem:
    return Problem(
        f"not valid YAML for a recipe: nested more than {MAX_DEPTH} levels deep",
        file=file,
        fix="a recipe is a few levels of sections and fields; flatten the nesting",
    )


def _flow_depth(text: str) -> int:
    """The deepest nesting of `[`/`{` outside quotes and comments (a rough count; see its limit)."""
    depth = deepest = 0
    quote = ""
    for index, char in enumerate(text):
        if quote:
            if char == quote or (char == "\n" and quote == "#"):
                quote = ""
        elif char in "\"'#" and (index == 0 or text[index - 1] in " \t\n[{,:"):
            quote = char  # a quote or comment starts only there (`don't` is a plain scalar)
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}" and depth:
            depth -= 1
    return deepest


def _leading_tabs(text: str, file: str) -> list[Problem]:
    problems = []
    for number, line in enumerate(text.splitlines(), start=1):
        indent = line[: len(line) - len(line.lstrip(" \t"))]
        if "\t" in indent and line.strip():
            problems.append(
                Problem(
                    "tab character in indentation; YAML indents with spaces only",
                    file=file,
                    line=number,
                    fix="replace the tab(s) at the start of this line with spaces",
                )
            )
    return problems


def _syntax_problem(e: yaml.MarkedYAMLError, file: str) -> Problem:
    mark = e.problem_mark or e.context_mark
    line = mark.line + 1 if mark is not None else None
    what = " ".join(part for part in (e.context, e.problem) if part)
    fix = "check the indentation and quoting on this line and the one above"
    if "expected a single document" in what:
        what = "the file holds more than one YAML document"
        fix = "keep one recipe per file (remove the '---' separator)"
    elif e.problem and "found duplicate anchor" in e.problem:
        fix = "give each anchor (&name) a unique name"
    elif e.problem and "found undefined alias" in e.problem:
        fix = "define the anchor (&name) before using the alias (*name)"
    elif e.problem and "mapping values are not allowed" in e.problem:
        fix = "put a space after each ':' and quote values that contain ': '"
    return Problem(f"not valid YAML: {what}", file=file, line=line, fix=fix)


class _Builder:
    def __init__(self, loader: yaml.SafeLoader, file: str) -> None:
        self.loader = loader
        self.file = file
        self.marks: dict[FieldPath, Mark] = {}
        self.problems: list[Problem] = []
        self._active: set[int] = set()
        self._num_values = 0
        self._num_merges = 0
        self.exhausted = False

    def _problem(self, node: Node, path: FieldPath, message: str, fix: str | None = None) -> None:
        dotted = ".".join(str(p) for p in path) or None
        self.problems.append(
            Problem(message, file=self.file, line=node.start_mark.line + 1, path=dotted, fix=fix)
        )

    def _past_limit(
        self, count: int, limit: int, node: Node, path: FieldPath, message: str, fix: str
    ) -> bool:
        """Report `message` the first time a count passes its limit; True once any limit was passed."""
        if count > limit and not self.exhausted:
            self.exhausted = True
            self._problem(node, path, message, fix)
        return self.exhausted

    def _over_budget(self, node: Node, path: FieldPath) -> bool:
        self._num_values += 1
        return self._past_limit(
            self._num_values,
            _MAX_VALUES,
            node,
            path,
            _TOO_MANY_VALUES,
            _TOO_MANY_FIX,
        )

    def build(self, node: Node, path: FieldPath, depth: int) -> Any:
        if self._over_budget(node, path):
            return None
        if depth > MAX_DEPTH:
            self.exhausted = True
            self.problems.append(_too_deep(self.file))
            return None
        if id(node) in self._active:
            self._problem(
                node, path, "recursive alias: a value refers to itself", "remove the self-reference"
            )
            return None
        self._active.add(id(node))
        try:
            if isinstance(node, MappingNode):
                return self._mapping(node, path, depth)
            if isinstance(node, SequenceNode):
                if node.tag != _SEQ_TAG:
                    self._problem(node, path, f"unsupported YAML tag {node.tag!r}", "remove the tag")
                items = []
                for index, item in enumerate(node.value):
                    self.marks[(*path, index)] = Mark(self.file, item.start_mark.line + 1)
                    items.append(self.build(item, (*path, index), depth + 1))
                return items
            assert isinstance(node, ScalarNode)
            return self._scalar(node, path)
        finally:
            self._active.discard(id(node))

    def _scalar(self, node: ScalarNode, path: FieldPath) -> Any:
        try:
            return self.loader.construct_object(node)
        except yaml.constructor.ConstructorError as e:
            self._problem(
                node, path, f"unsupported YAML value: {e.problem}", "write a plain string, number or bool"
            )
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError):
            # PyYAML's own constructors fail this way on a core tag with a value it cannot hold
            # (`!!int x`, `!!bool maybe`, `!!timestamp notadate`) or an integer past Python's digit limit
            tag = node.tag.removeprefix("tag:yaml.org,2002:")
            self._problem(
                node,
                path,
                f"a value its YAML type ({tag}) cannot hold (or a number too long to read)",
                "remove the `!!` tag, or write a value of that type",
            )
        return None

    def _mapping(self, node: MappingNode, path: FieldPath, depth: int) -> dict[str, Any]:
        if node.tag != _MAP_TAG:
            self._problem(node, path, f"unsupported YAML tag {node.tag!r}", "remove the tag")
        result: dict[str, Any] = {}
        first_line: dict[str, int] = {}
        merges: list[Node] = []
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                merges.append(value_node)
                continue
            if not isinstance(key_node, ScalarNode):
                self._problem(key_node, path, "a key must be a plain name, not a list or mapping")
                continue
            key = self._scalar(key_node, path)
            if not isinstance(key, str):
                self._problem(
                    key_node,
                    path,
                    f"key {key_node.value!r} is read as {type(key).__name__}, not a name",
                    f"quote it: '{key_node.value}'",
                )
                continue
            line = key_node.start_mark.line + 1
            if key in first_line:
                self._problem(
                    key_node,
                    (*path, key),
                    f"duplicate key {key!r} (first given on line {first_line[key]})",
                    "keep only one of them; YAML would silently use the last",
                )
                continue
            first_line[key] = line
            self.marks[(*path, key)] = Mark(self.file, line)
            result[key] = self.build(value_node, (*path, key), depth + 1)
        for merge_node in merges:
            self._merge_into(result, merge_node, path, depth)
        return result

    def _merge_into(self, result: dict[str, Any], node: Node, path: FieldPath, depth: int) -> None:
        # `<<: *base` or `<<: [*a, *b]`: keys written in this mapping win, earlier merges beat later ones.
        sources = node.value if isinstance(node, SequenceNode) else [node]
        for source in sources:
            self._num_merges += 1
            self._past_limit(
                self._num_merges,
                _MAX_MERGES,
                source,
                path,
                f"more than {_MAX_MERGES} '<<' merges (merges nested in merges?)",
                "write the values out instead of merging anchors inside anchors",
            )
            if self._over_budget(source, path):
                return
            if depth > MAX_DEPTH:
                self._problem(source, path, "recursive merge: a mapping merges itself", "remove the '<<'")
                return
            if not isinstance(source, MappingNode):
                self._problem(source, path, "'<<' merge needs a mapping or a list of mappings")
                continue
            saved = dict(self.marks)
            merged = self._mapping(source, path, depth + 1)
            kept = {key for key in merged if key in result}
            for key, value in merged.items():
                if key not in kept:
                    result[key] = value
            if kept:
                # the marks of keys written here (not the merged ones) stay; one pass over all marks
                self.marks = {k: v for k, v in self.marks.items() if not _under_any(k, path, kept)}
                self.marks.update({k: v for k, v in saved.items() if _under_any(k, path, kept)})


def _under_any(path: FieldPath, prefix: FieldPath, keys: set[str]) -> bool:
    n = len(prefix)
    return len(path) > n and path[n] in keys and path[:n] == prefix
