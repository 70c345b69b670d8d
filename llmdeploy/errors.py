"""The one error type for user mistakes.

Our own invariants use `assert`; anything a user can get wrong raises `UserError` carrying every
problem found, each naming where (file:line), what (field path and bad value) and the fix.
The CLI prints them all and exits 2 without a traceback.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Problem:
    message: str
    file: str | None = None
    line: int | None = None
    path: str | None = None  # dotted field path, e.g. "limits.max_model_len"
    value: object = None
    fix: str | None = None
    has_value: bool = False

    def render(self) -> str:
        where = ""
        if self.file:
            where = self.file + (f":{self.line}" if self.line else "") + ": "
        field_part = f"{self.path}: " if self.path else ""
        text = f"{where}{field_part}{self.message}"
        if self.has_value:
            text += f" (got {self.value!r})"
        if self.fix:
            text += f"\n    fix: {self.fix}"
        return text


@dataclass
class UserError(Exception):
    problems: list[Problem] = field(default_factory=list)

    @classmethod
    def one(cls, message: str, **kw: object) -> UserError:
        if "value" in kw:
            kw["has_value"] = True
        return cls([Problem(message, **kw)])  # type: ignore[arg-type]

    def __str__(self) -> str:
        return "\n".join(p.render() for p in self.problems)
