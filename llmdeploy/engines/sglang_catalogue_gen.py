"""Generate SGLang's flag catalogue (JSON) from the source of its `server_args.py`, without importing it.

SGLang cannot be installed here (it needs CUDA builds of its kernels), so its parser cannot be run
the way `catalogue_gen.py` runs vLLM's. Its CLI is declared data-like instead: every `ServerArgs`
field annotated `A[T, "help"]` or `A[T, Arg(...)]` becomes an option through
`add_cli_args_from_dataclass` (arg_groups/arg_utils.py), and `ServerArgs.add_cli_args` registers
the rest by hand. This script reads both with `ast` and applies the same derivation: the name is
`--` + the field name with dashes (or `cli_name`) plus `aliases`; `bool` is `store_true`; `List[X]`
takes `nargs="+"`; `Literal[...]` gives the choices; `choices=NAME` resolves NAME from the module's
literal constants (choices built at run time from a registry are left open, null).

    python3 llmdeploy/engines/sglang_catalogue_gen.py PATH/TO/server_args.py 0.5.15 \\
        > llmdeploy/engines/catalogues/sglang-0.5.15.json
"""

from __future__ import annotations

import ast
import json
import sys
from typing import Any

ENTRYPOINT = ["python3", "-m", "sglang.launch_server"]
# argparse actions SGLang defines (arg_groups/argparse_actions.py) that take no value
_NO_VALUE_ACTIONS = {"store_true", "store_false", "DeprecatedAction", "DeprecatedStoreTrueAction"}
_NO_VALUE_ACTIONS |= {"DeprecatedStoreConstAction"}


def _constants(module: ast.Module) -> dict[str, Any]:
    """Module-level NAME = <literal> assignments (the *_CHOICES lists)."""
    found: dict[str, Any] = {}
    for node in module.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                found[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                if isinstance(node.value, ast.Name) and node.value.id in found:
                    found[node.targets[0].id] = found[node.value.id]  # an alias of another constant
    return found


def _choices(node: ast.expr | None, constants: dict[str, Any]) -> list[str] | None:
    if node is None:
        return None
    if isinstance(node, ast.Name):
        value = constants.get(node.id)
    else:
        try:
            value = ast.literal_eval(node)
        except ValueError:
            value = None  # built at run time (a registry's keys): left open
    return sorted(str(choice) for choice in value) if value else None


def _keywords(call: ast.Call) -> dict[str, ast.expr]:
    return {k.arg: k.value for k in call.keywords if k.arg is not None}


def _literal(node: ast.expr | None) -> Any:
    return ast.literal_eval(node) if node is not None else None


def _type_shape(node: ast.expr) -> tuple[str, list[str] | None]:
    """('bool' | 'list' | 'scalar', Literal choices) of an annotation, Optional[...] unwrapped."""
    if isinstance(node, ast.Subscript) and ast.unparse(node.value) in ("Optional", "Union"):
        inner = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        real = [n for n in inner if ast.unparse(n) != "None"]
        if len(real) == 1:
            return _type_shape(real[0])
        return "scalar", None
    if isinstance(node, ast.Name) and node.id == "bool":
        return "bool", None
    if isinstance(node, ast.Subscript) and ast.unparse(node.value) in ("List", "list"):
        return "list", None
    if isinstance(node, ast.Subscript) and ast.unparse(node.value) == "Literal":
        values = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        return "scalar", [str(ast.literal_eval(v)) for v in values]
    return "scalar", None


def _row(
    names: list[str], dest: str, kind: str, nargs: int | str | None, choices: list[str] | None
) -> dict[str, Any]:
    return {
        "flag": sorted(n for n in names if n.startswith("--"))[0],
        "option_strings": sorted(names),
        "dest": dest,
        "kind": kind,
        "nargs": nargs,
        "choices": sorted(choices) if choices else None,
    }


def _field_row(field: ast.AnnAssign, constants: dict[str, Any]) -> dict[str, Any] | None:
    ann = field.annotation
    if not (isinstance(ann, ast.Subscript) and ast.unparse(ann.value) == "A"):
        return None  # not annotated for the CLI: add_cli_args_from_dataclass skips it
    assert isinstance(field.target, ast.Name) and isinstance(ann.slice, ast.Tuple)
    name, (type_node, meta) = field.target.id, ann.slice.elts[:2]
    kw = _keywords(meta) if isinstance(meta, ast.Call) else {}
    if _literal(kw.get("no_cli")):
        return None
    cli = _literal(kw.get("cli_name")) or "--" + name.replace("_", "-")
    names = [cli, *(_literal(kw.get("aliases")) or [])]
    shape, literal_choices = _type_shape(type_node)
    choices = _choices(kw.get("choices"), constants) or literal_choices
    if "action" in kw:
        action = ast.unparse(kw["action"])
        if action == "argparse.BooleanOptionalAction":
            names += ["--no-" + n[2:] for n in names]
            return _row(names, name, "bool_optional", 0, None)
        return _row(names, name, "value", "*", choices)  # LoRAPathAction: a list of paths
    if shape == "bool":
        return _row(names, name, "flag", 0, None)
    if shape == "list" and "type_parser" not in kw:
        return _row(names, name, "value", _literal(kw.get("nargs")) or "+", choices)
    return _row(names, name, "value", _literal(kw.get("nargs")), choices)


def _manual_row(call: ast.Call, constants: dict[str, Any]) -> dict[str, Any]:
    names = [_literal(a) for a in call.args]
    kw = _keywords(call)
    dest = _literal(kw.get("dest")) or names[0].lstrip("-").replace("-", "_")
    action = ast.unparse(kw["action"]).strip("'\"") if "action" in kw else None
    if action in _NO_VALUE_ACTIONS:
        return _row(names, dest, "flag", 0, None)
    choices = _choices(kw.get("choices"), constants)
    if "choices" in kw and isinstance(kw["choices"], ast.BinOp):
        choices = None  # ["auto"] + a registry's keys: open
    return _row(names, dest, "value", _literal(kw.get("nargs")), choices)


def catalogue(source: str, version: str, origin: str) -> dict[str, Any]:
    module = ast.parse(source)
    constants = _constants(module)
    server_args = next(n for n in module.body if isinstance(n, ast.ClassDef) and n.name == "ServerArgs")
    rows: dict[str, dict[str, Any]] = {}
    for field in server_args.body:
        if isinstance(field, ast.AnnAssign):
            row = _field_row(field, constants)
            if row is not None:
                rows[row["flag"]] = row
    add_cli_args = next(
        n for n in server_args.body if isinstance(n, ast.FunctionDef) and n.name == "add_cli_args"
    )
    for node in ast.walk(add_cli_args):
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "parser.add_argument":
            row = _manual_row(node, constants)
            rows[row["flag"]] = row
    return {
        "engine": "sglang",
        "version": version,
        "source": origin,
        "entrypoint": ENTRYPOINT,
        "flags": [rows[flag] for flag in sorted(rows)],
    }


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print("usage: sglang_catalogue_gen.py SERVER_ARGS_PY VERSION [SOURCE-DESCRIPTION]", file=sys.stderr)
        return 2
    path, version = argv[0], argv[1]
    origin = argv[2] if len(argv) == 3 else f"python/sglang/srt/server_args.py of SGLang {version}"
    with open(path, encoding="utf-8") as handle:
        data = catalogue(handle.read(), version, origin)
    sys.stdout.write(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
