"""Seeded mutations of the shipped recipes, for the recipe fuzzer (`test_recipe_fuzz.py`).

Each `Case` is one shipped recipe changed by one to three operators: a field (any path of the schema,
or one the recipe writes) set to a hostile value, a section replaced or deleted, an unknown key, a
target / engine / device switch, a secret planted inline in a secret-bearing field or interpolated
from a credential-named variable into any field, the recipe split into an `extends:` base and
overlay, a `--set` item whose text is hostile YAML (a core tag with a value it cannot hold, nesting
5,000 deep, an alias bomb). Most changes travel as `--set` items on the shipped file (its YAML is parsed once); the
rest are written out as recipe files and parsed like any other. The same seed gives the same cases.
"""

from __future__ import annotations

import copy
import random
import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from llmdeploy.recipe.schema import Recipe
from llmdeploy.recipe.schema_paths import all_field_paths

RECIPES_DIR = Path(__file__).resolve().parents[2] / "recipes"
# credential-named variables in the environment of every case; their values must appear nowhere
CREDENTIAL_VARIABLES = (
    "VLLM_API_KEY",
    "AGENT_API_KEY",
    "HF_TOKEN",
    "FUZZ_API_KEY",
    "DB_PASSWORD",
    "MY_SECRET",
)
# ordinary variables: their values may show up anywhere
PLAIN_VARIABLES = {"FUZZ_NAME": "fuzz-name", "FUZZ_PORT": "8080", "FUZZ_BIG": "1e400", "FUZZ_DASH": "--port"}
SCHEMA_PATHS = [".".join(p) for p in all_field_paths(Recipe, ())]
SECTIONS = [name for name in Recipe.model_fields]
BIG = 10**400

VALUES: list[Any] = [
    0, -1, 1, 2, 7, 4096, 2**31 - 1, 2**31, 2**63, BIG, -BIG, 1e300, -1e300, float("inf"), float("-inf"),
    float("nan"), -0.0, 0.5, 1e-300, True, False, None, "", " ", "-x", "--port", "a b", "0.0.0.0", "::",
    "Bad_Name", "x" * 300, "é☃", "\U0001f600", "a\x00b", "line\nbreak", "${FUZZ_NAME}", "${FUZZ_BIG}",
    "${FUZZ_DASH}", "${UNSET_FUZZ_VAR}", "${UNSET_FUZZ_VAR:-7}", "$${x}", "${", "${1x}", "1e400", ".inf",
    "10^400", "../../../etc/passwd", "/dev/zero", "a.yaml", "$(id)", "`id`", "{{ x }}", "'", '"', [], [1],
    [0], [-1], ["a"], [{}], [BIG], {}, {"env": "K"}, {"env": "1BAD"}, {"secret": {"name": "s"}},
    {"secret": {"name": "Bad_Secret", "key": "k/y"}}, {"env": "K", "secret": {"name": "s"}},
    {"type": "kubernetes"}, {"type": "docker"}, {"type": "local"}, {"type": "nope"}, {"min": 5, "max": 1},
    {"min": 1, "max": BIG}, {"a": 1}, {"bad key!": "v"}, {"team": "not a value"},
]  # fmt: skip
# `--set` values written as YAML text, not dumped from a Python value
RAW_YAML = [
    "!!int x", "!!float abc", "!!bool maybe", "!!timestamp notadate", "!!binary zz!", "!!int [1]",
    "!!python/object:os.system x", "!!set {a: 1}", "!!omap [1]", "*undefined", "&a [*a]",
    "[" * 5000 + "]" * 5000, "{a: " * 5000 + "1" + "}" * 5000, "[" * 200 + "]" * 200, "9" * 5000,
    '[&a ["x","x","x","x","x","x","x","x","x"],&b [*a,*a,*a,*a,*a,*a,*a,*a,*a],'
    "&c [*b,*b,*b,*b,*b,*b,*b,*b,*b],&d [*c,*c,*c,*c,*c,*c,*c,*c,*c],&e [*d,*d,*d,*d,*d,*d,*d,*d,*d],"
    "&f [*e,*e,*e,*e,*e,*e,*e,*e,*e],&g [*f,*f,*f,*f,*f,*f,*f,*f,*f]]",
    "{<<: [{a: 1}], b: 2}", "a: b: c", "\t- x", "- [unclosed",
]  # fmt: skip
TYPE_SWITCHES = {
    "target.type": ["local", "docker", "kubernetes"],
    "engine.type": ["vllm", "tgi", "builtin"],
    "hardware.device": ["cuda", "cpu"],
    "kv_cache.dtype": ["auto", "fp8", "fp16"],
    "model.quantization": ["none", "fp8", "awq", "gguf"],
    "target.autoscaling.kind": ["hpa", "keda"],
    "target.autoscaling.metric": ["queue_depth", "kv_usage"],
}


def planted_environment() -> dict[str, str]:
    """The variables of every case: credential-named ones hold fresh planted secrets."""
    env = {name: _secret() for name in CREDENTIAL_VARIABLES}
    return {**env, **PLAIN_VARIABLES}


def _secret() -> str:
    # upper case and '-' make it neither a DNS name nor a variable name, so no check takes it as one
    return "sk-Fz" + secrets.token_hex(10)


@dataclass
class Case:
    index: int
    recipe: str  # stem of the shipped recipe
    files: dict[str, str] = field(default_factory=dict)  # name -> YAML text; none: the shipped file
    overrides: list[str] = field(default_factory=list)
    planted: list[str] = field(default_factory=list)  # inline secrets this case adds
    steps: list[str] = field(default_factory=list)  # what was done, for the failure report

    def describe(self) -> str:
        return f"case {self.index} ({self.recipe}): " + "; ".join(self.steps)


def shipped_recipes() -> dict[str, dict[str, Any]]:
    out = {}
    for path in sorted(RECIPES_DIR.glob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        if isinstance(data.get("extends"), str):
            data["extends"] = str(RECIPES_DIR / data["extends"])
        out[path.stem] = data
    return out


def cases(seed: int, n: int) -> Iterator[Case]:
    rng = random.Random(seed)
    recipes = shipped_recipes()
    names = sorted(recipes)
    for index in range(n):
        name = rng.choice(names)
        case = Case(index, name)
        data = copy.deepcopy(recipes[name])
        ops = rng.choices(list(_WEIGHTS), weights=list(_WEIGHTS.values()), k=rng.choice((1, 1, 2, 3)))
        # `--set` values are not interpolated and cannot delete: interpolation goes into a small
        # overlay recipe extending the shipped one, a deletion into a whole rewritten recipe
        if "delete" in ops or rng.random() < 0.05:
            for op in ops:
                _mutate(rng, case, data, data, op)
            if rng.random() < 0.3:
                _split_extends(rng, case, data)
            else:
                case.files["leaf.yaml"] = _dump(data)
        elif "plant_interpolated" in ops:
            overlay: dict[str, Any] = {}
            for op in ops:
                _mutate(rng, case, data, overlay, op)
            overlay["extends"] = str(RECIPES_DIR / f"{name}.yaml")
            case.files["leaf.yaml"] = _dump(overlay)
        else:
            for op in ops:
                _mutate(rng, case, data, None, op)
        yield case


_WEIGHTS = {
    "perturb": 30,
    "set": 30,
    "switch": 12,
    "plant_inline": 10,
    "plant_interpolated": 7,
    "section": 8,
    "delete": 5,
    "unknown": 8,
    "raw_yaml": 5,
}


def _mutate(
    rng: random.Random, case: Case, data: dict[str, Any], sink: dict[str, Any] | None, op: str
) -> None:
    """Apply one operator: paths are chosen from `data` (the recipe), values go into `sink` (a
    recipe or overlay being written) or, without one, into `--set` items."""
    if op == "perturb":
        # a plausible value near the recipe's own: most of these still render
        leaves = [(path, value) for path, value in _leaf_items(data) if isinstance(value, int | float | str)]
        if leaves:
            path, value = rng.choice(leaves)
            _put(case, sink, path, _near(rng, value))
    elif op == "set":
        path = rng.choice(SCHEMA_PATHS + _leaf_paths(data))
        _put(case, sink, path, rng.choice(VALUES))
    elif op == "switch":
        path = rng.choice(sorted(TYPE_SWITCHES))
        _put(case, sink, path, rng.choice(TYPE_SWITCHES[path]))
    elif op == "plant_inline":
        planted = _secret()
        case.planted.append(planted)
        path, value = rng.choice(
            [
                ("server.api_key", planted),
                ("server.api_key", {"env": planted}),
                ("server.api_key.env", planted),
                ("server.hf_token", {"secret": {"name": planted, "key": planted}}),
                ("server.hf_token", {"env": planted}),
                ("engine.env", {"MY_API_KEY": planted}),
                ("engine.env", {"HF_TOKEN": planted, "OK_VAR": "1"}),
                ("server", {"api_key": planted}),
            ]
        )
        _put(case, sink, path, value)
    elif op == "plant_interpolated":
        variable = rng.choice(CREDENTIAL_VARIABLES)
        reference = rng.choice([f"${{{variable}}}", f"x-${{{variable}}}", f"${{{variable}:-d}}"])
        path = rng.choice(SCHEMA_PATHS + _leaf_paths(data))
        value: Any = rng.choice([reference, [reference], {"env": reference}, {"K": reference}])
        _put(case, sink, path, value)
    elif op == "raw_yaml":
        path = rng.choice(SCHEMA_PATHS + _leaf_paths(data))
        text = rng.choice(RAW_YAML)
        case.overrides.append(f"{path}={text}")  # on top of a written recipe file too
        case.steps.append(f"--set {path}=(raw) {_short(text)}")
    elif op == "section":
        _put(case, sink, rng.choice(SECTIONS), rng.choice(VALUES))
    elif op == "delete":
        paths = _leaf_paths(data) + [k for k in data if isinstance(k, str)]
        if paths:
            path = rng.choice(paths)
            _delete(sink if sink is not None else data, path.split("."))
            case.steps.append(f"delete {path}")
    else:
        key = rng.choice(["unknown", "tensr", "x-anchor", "apikey", "type", "Name"])
        section = rng.choice(["", *SECTIONS])
        _put(case, sink, f"{section}.{key}" if section else key, rng.choice(VALUES))


def _put(case: Case, sink: dict[str, Any] | None, path: str, value: Any) -> None:
    if sink is not None:
        _assign(sink, path.split("."), value)
        case.steps.append(f"{path}: {_short(value)}")
        return
    item = f"{path}={_flow(value)}"
    case.overrides.append(item)
    case.steps.append(f"--set {_short(item)}")


def _assign(data: dict[str, Any], parts: list[str], value: Any) -> None:
    node = data
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[parts[-1]] = copy.deepcopy(value)


def _delete(data: dict[str, Any], parts: list[str]) -> None:
    node: Any = data
    for part in parts[:-1]:
        node = node.get(part) if isinstance(node, dict) else None
    if isinstance(node, dict):
        node.pop(parts[-1], None)


def _near(rng: random.Random, value: int | float | str) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return rng.choice([value * 2, value + 1, max(0, value - 1), value // 2, value * 1000, 2**31 - 1])
    if isinstance(value, float):
        return rng.choice([value * 2, value / 2, round(value * 1.1, 3), value * 1e6])
    return rng.choice(
        [value.upper(), value + "-2", value.replace("-", "_"), value[: len(value) // 2], value * 2]
    )


def _leaf_items(data: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if not isinstance(data, dict):
        return []
    out: list[tuple[str, Any]] = []
    for key, value in data.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        out.append((path, value))
        out += _leaf_items(value, path)
    return out


def _leaf_paths(data: Any, prefix: str = "") -> list[str]:
    if not isinstance(data, dict):
        return []
    out = []
    for key, value in data.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        out.append(path)
        out += _leaf_paths(value, path)
    return out


def _split_extends(rng: random.Random, case: Case, data: dict[str, Any]) -> None:
    """Some sections to a base file, the rest (and the name) in the leaf that extends it."""
    base = {k: v for k, v in data.items() if k != "name" and rng.random() < 0.5}
    leaf = {k: v for k, v in data.items() if k not in base}
    if "extends" in base:
        leaf.pop("extends", None)
    # an overlay that selects the other variant of a union than the base's
    if rng.random() < 0.5:
        leaf["server"] = {
            **(leaf.get("server") if isinstance(leaf.get("server"), dict) else {}),
            "api_key": rng.choice([{"env": "VLLM_API_KEY"}, {"secret": {"name": "k"}}]),
        }
        base["server"] = {"api_key": rng.choice([{"env": "K"}, {"secret": {"name": "s", "key": "k"}}])}
        case.steps.append("api_key variant over a base's")
    leaf["extends"] = "base.yaml"
    case.files["base.yaml"] = _dump(base)
    case.files["leaf.yaml"] = _dump(leaf)
    case.steps.append(f"split: base has {sorted(base)}")


def _dump(data: dict[str, Any]) -> str:
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


def _flow(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=10**9, allow_unicode=True)
    return text.removesuffix("\n...\n").rstrip("\n")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 90 else text[:87] + "..."
