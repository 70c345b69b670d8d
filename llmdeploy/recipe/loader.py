"""Recipe file -> `Recipe`: `extends:` chains, `${ENV}` interpolation, `--set` overrides, validation.

Every problem found in any layer is collected and raised together as one `UserError`; each names
the file and line that wrote the value (or the `--set` item), the dotted field path and a fix.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from llmdeploy.errors import Problem, UserError
from llmdeploy.recipe.diagnostics import problems_from_validation
from llmdeploy.recipe.interpolation import interpolate
from llmdeploy.recipe.overlay import Layer, apply_overrides, merge
from llmdeploy.recipe.schema import Recipe
from llmdeploy.recipe.yaml_source import MAX_YAML_BYTES, FieldPath, Mark, parse_yaml

# fields holding file paths, resolved against the folder of the recipe file that wrote them
_RELATIVE_PATH_FIELDS: tuple[FieldPath, ...] = (("model", "path"), ("bench", "dataset"))
# a recipe is a short text; reading stops here (a mistyped path to a model file, /dev/zero, ...)
MAX_RECIPE_BYTES = MAX_YAML_BYTES


@dataclass(frozen=True)
class LoadedRecipe:
    """A validated recipe and where each of its fields was written (for locating later problems)."""

    recipe: Recipe
    marks: Mapping[FieldPath, Mark]

    def mark_for(self, dotted: str | None) -> Mark | None:
        """The file:line of a dotted field path, or of its nearest written parent."""
        parts: FieldPath = tuple(int(p) if p.isdigit() else p for p in dotted.split(".")) if dotted else ()
        for end in range(len(parts), 0, -1):
            if parts[:end] in self.marks:
                return self.marks[parts[:end]]
        return self.marks.get(())


def load_recipe(
    path: str | os.PathLike[str], overrides: Sequence[str] = (), env: Mapping[str, str] | None = None
) -> Recipe:
    """Load, layer and validate a recipe; raise `UserError` listing every problem found."""
    return load_layered(path, overrides, env).recipe


def load_layered(
    path: str | os.PathLike[str], overrides: Sequence[str] = (), env: Mapping[str, str] | None = None
) -> LoadedRecipe:
    """`load_recipe`, keeping the file:line of every field."""
    env = os.environ if env is None else env
    file = Path(path)
    problems: list[Problem] = []
    layer = _load_layer(file, env, (), problems)
    if layer is None:
        raise UserError(_sorted(problems))
    layer, override_problems = apply_overrides(layer, overrides)
    problems += override_problems
    # top-level `x-...` keys are free space for YAML anchors, as in Docker Compose files
    data = {k: v for k, v in layer.data.items() if not k.startswith("x-")}
    if data.get("name") is None:
        data["name"] = default_name(file)
    problems += _nul_problems(data, (), layer.marks)
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as e:
        reported = {_path_tuple(p.path) for p in problems if p.path}
        problems += problems_from_validation(e, data, layer.marks, reported)
        raise UserError(_sorted(problems)) from None
    if problems:
        raise UserError(_sorted(problems))
    return LoadedRecipe(recipe, layer.marks)


def recipe_digest(recipe: Recipe) -> str:
    """sha256 of the recipe's canonical JSON (sorted keys, no whitespace): equal recipes, equal digests."""
    canonical = json.dumps(recipe.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def default_name(file: Path) -> str:
    """The file stem made into a DNS label: `Long_Context.yaml` -> `long-context`."""
    name = re.sub(r"[^a-z0-9-]+", "-", file.stem.lower()).strip("-")
    return name[:52].rstrip("-") or "recipe"


_SCALAR_KIND = {"str": "a string", "int": "a number", "float": "a number", "bool": "true or false"}


def _load_layer(
    file: Path, env: Mapping[str, str], chain: tuple[tuple[Path, str], ...], problems: list[Problem]
) -> Layer | None:
    shown = _display(file)
    if chain and _is_special(file):
        # a base named by `extends:` is read without asking; devices and pipes could block forever
        problems.append(Problem("not a regular file", file=shown, fix="extend a .yaml recipe file"))
        return None
    try:
        with file.open("rb") as stream:
            raw = stream.read(MAX_RECIPE_BYTES + 1)
        if len(raw) > MAX_RECIPE_BYTES:
            problems.append(
                Problem(
                    f"larger than {MAX_RECIPE_BYTES // 1024} KiB; not a recipe",
                    file=shown,
                    fix="check the path (a recipe is a short YAML file)",
                )
            )
            return None
        text = raw.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")  # as read_text does
    except FileNotFoundError:
        problems.append(Problem("recipe file not found", file=shown, fix="check the path"))
        return None
    except IsADirectoryError:
        problems.append(Problem("is a folder, not a recipe file", file=shown, fix="give a .yaml file"))
        return None
    except UnicodeDecodeError as e:
        problems.append(Problem(f"not UTF-8 text ({e.reason})", file=shown, fix="save the file as UTF-8"))
        return None
    except OSError as e:
        problems.append(Problem(f"cannot read the file: {e.strerror}", file=shown))
        return None
    parsed = parse_yaml(text, shown)
    problems += parsed.problems
    if parsed.problems and parsed.data is None:
        return None  # unreadable YAML; key-level problems (duplicates, odd keys) let validation go on
    if parsed.data is None:
        problems.append(
            Problem(
                "the recipe is empty",
                file=shown,
                fix="start from recipes/quickstart.yaml (at least `model: {id: ...}`)",
            )
        )
        return None
    if not isinstance(parsed.data, dict):
        # its type only: the file may be anything a link or a typo pointed at, and is not echoed
        scalar = _SCALAR_KIND.get(type(parsed.data).__name__, "a scalar")
        kind = "a list" if isinstance(parsed.data, list) else f"a single value ({scalar})"
        problems.append(
            Problem(
                f"a recipe must be a YAML mapping of sections (model:, hardware:, ...), but this file is {kind}",
                file=shown,
                line=1,
                fix="start from recipes/quickstart.yaml",
            )
        )
        return None
    data, found = interpolate(parsed.data, parsed.marks, env)
    problems += found
    data = _resolve_relative_paths(data, file.parent)
    layer = Layer(data, parsed.marks)
    if "extends" not in data:
        return layer
    return _extend(layer, file, env, chain, problems)


def _extend(
    layer: Layer,
    file: Path,
    env: Mapping[str, str],
    chain: tuple[tuple[Path, str], ...],
    problems: list[Problem],
) -> Layer | None:
    data = dict(layer.data)
    target = data.pop("extends")
    marks = {k: m for k, m in layer.marks.items() if k[:1] != ("extends",)}
    mark = layer.marks.get(("extends",), Mark(_display(file), None))
    own = Layer(data, marks)

    def problem(message: str, fix: str) -> Problem:
        return Problem(
            message, file=mark.file, line=mark.line, path="extends", value=target, has_value=True, fix=fix
        )

    example = "e.g. extends: production.yaml (relative to this file)"
    if not isinstance(target, str) or not target.strip():
        problems.append(problem("must be the path of another recipe file", example))
        return own
    if "\x00" in target:
        problems.append(problem("contains a NUL character (\\0), which no file path can hold", example))
        return own
    base_file = file.parent / target
    if base_file.suffix.lower() not in (".yaml", ".yml"):
        # refusing other files keeps e.g. /etc/shadow or /proc/self/environ out of error messages
        problems.append(problem("must name a recipe file ending in .yaml or .yml", example))
        return own
    link_problem = _link_problem(base_file)
    if link_problem is not None:
        # the link's name passes the suffix rule; what it points at must too, and is named, never read
        problems.append(problem(link_problem, "point extends: at the recipe file itself"))
        return own
    try:
        here, base_resolved = file.resolve(), base_file.resolve()
    except (RuntimeError, OSError) as e:  # RuntimeError: a symlink loop (pathlib's strict=False resolve)
        reason = "a loop of symbolic links" if isinstance(e, RuntimeError) else (e.strerror or "unreadable")
        problems.append(problem(f"cannot follow the path: {reason}", "point extends at a regular .yaml file"))
        return own
    seen = (*chain, (here, _display(file)))
    resolved = [p for p, _ in seen]
    if base_resolved in resolved:
        cycle = [shown for _, shown in seen[resolved.index(base_resolved) :]] + [_display(base_file)]
        problems.append(
            problem(
                "extends cycle: " + " -> ".join(cycle),
                "remove one `extends:` so the chain ends in a recipe that extends nothing",
            )
        )
        return own
    before = len(problems)
    base = _load_layer(base_file, env, seen, problems)
    if base is None:
        problems.insert(
            before,
            problem(
                f"cannot use the extended recipe {_display(base_file)} (problems below)",
                "fix the extended file, or the path (relative to this recipe's folder)",
            ),
        )
        return own
    # the instance name belongs to the leaf recipe: a derived recipe never inherits its base's name
    base_data = {k: v for k, v in base.data.items() if k != "name"}
    base_marks = {k: m for k, m in base.marks.items() if k[:1] != ("name",)}
    return merge(Layer(base_data, base_marks), own)


def _resolve_relative_paths(data: dict[str, Any], folder: Path) -> dict[str, Any]:
    out = dict(data)
    for section, key in _RELATIVE_PATH_FIELDS:
        assert isinstance(section, str) and isinstance(key, str)
        part = out.get(section)
        if isinstance(part, dict) and isinstance(part.get(key), str) and part[key]:
            value = os.path.expanduser(part[key])
            if not os.path.isabs(value):
                value = os.path.normpath(os.path.join(folder.resolve(), value))
            out[section] = {**part, key: value}
    return out


def _nul_problems(value: Any, path: FieldPath, marks: Mapping[FieldPath, Mark]) -> list[Problem]:
    # a NUL cannot reach a process (argv and environment strings end at it), so no recipe value holds one
    if isinstance(value, str):
        if "\x00" not in value:
            return []
        mark = next((marks[path[:end]] for end in range(len(path), 0, -1) if path[:end] in marks), None)
        return [
            Problem(
                "contains a NUL character (\\0), which no command line or environment can carry",
                file=mark.file if mark else None,
                line=mark.line if mark else None,
                path=".".join(str(p) for p in path),
                fix="remove the \\0 escape",
            )
        ]
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    return [p for key, item in items for p in _nul_problems(item, (*path, key), marks)]


def _is_special(file: Path) -> bool:
    try:
        mode = file.stat().st_mode
    except OSError:
        return False  # reading it reports the reason
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def _link_problem(path: Path) -> str | None:
    """Why a symbolic link named by `extends:` is not a recipe (its target and type only), or None."""
    try:
        if not path.is_symlink():
            return None
    except OSError:
        return None  # an unusable path (too long, ...) is reported where the file is read
    try:
        target = path.resolve(strict=True)
    except (OSError, RuntimeError):
        return "is a symbolic link that does not lead to a file (missing target or a loop of links)"
    if target.suffix.lower() in (".yaml", ".yml"):
        return None
    kind = "a folder" if target.is_dir() else "a regular file" if target.is_file() else "a special file"
    return f"is a symbolic link to {target} ({kind} not ending in .yaml or .yml), not a recipe file"


def _display(file: Path) -> str:
    # the path as the user wrote it (bases: joined onto it), so messages match what they typed
    return os.path.normpath(file)


def _path_tuple(dotted: str) -> FieldPath:
    return tuple(dotted.split("."))


def _sorted(problems: list[Problem]) -> list[Problem]:
    # stable: problems of one file stay in line order, other sources (--set) keep their order
    order = {p.file: i for i, p in reversed(list(enumerate(problems)))}
    return sorted(problems, key=lambda p: (order.get(p.file, 0), p.line or 0))
