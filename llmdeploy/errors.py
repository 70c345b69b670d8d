"""The one error type for user mistakes.

Our own invariants use `assert`; anything a user can get wrong raises `UserError` carrying every
problem found, each naming where (file:line), what (field path and bad value) and the fix.
The CLI prints them all and exits 2 without a traceback.

A problem never shows a secret: its value is redacted (`'<redacted, 23 chars>'`) when its field is
secret-bearing (`server.api_key`, `server.hf_token`, an `engine.env` entry named like a credential).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# fields whose values are credentials, or names and references a careless user fills with one
SECRET_FIELDS = ("server.api_key", "server.hf_token")
# environment variable names that hold credentials: *_API_KEY, HF_TOKEN, DB_PASSWORD, AWS_SECRET_ACCESS_KEY,
# GH_PAT (a personal access token), SENTRY_DSN, ...
_CREDENTIAL_NAME = re.compile(
    r"(?i)(^|[^a-z])(key|token|secret|passw(or)?d|pwd|credentials?|auth|bearer|cookie|pat|dsn)([^a-z]|$)"
    r"|apikey|accesskey|privatekey|secretkey"
)
# values that are credentials whatever their variable is called: a URL with a password in it
# (DATABASE_URL=postgres://user:pw@host) and the shapes of well-known tokens
_CREDENTIAL_VALUE = re.compile(
    r"^[a-z][a-z0-9+.-]*://[^/@\s:]*:[^/@\s]+@"
    r"|^(ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{20,}|^github_pat_|^glpat-|^hf_[A-Za-z0-9]{20,}"
    r"|^sk-[A-Za-z0-9_-]{16,}|^xox[abprs]-|^AKIA[0-9A-Z]{16}$|^eyJ[A-Za-z0-9_-]+\.eyJ[A-Za-z0-9_-]+\.",
    re.IGNORECASE,
)


def is_credential_name(name: str) -> bool:
    """Whether an environment variable (or key) of this name looks like it holds a credential."""
    return bool(_CREDENTIAL_NAME.search(name))


def looks_like_credential(value: str) -> bool:
    """Whether a value has the shape of a credential (a URL carrying a password, a known token format)."""
    return bool(_CREDENTIAL_VALUE.search(value.strip()))


def is_secret_path(dotted: str | None) -> bool:
    """Whether a dotted field path is (under) a secret-bearing field."""
    if not dotted:
        return False
    if any(dotted == f or dotted.startswith(f + ".") for f in SECRET_FIELDS):
        return True
    parts = dotted.split(".")
    return len(parts) >= 3 and parts[:2] == ["engine", "env"] and is_credential_name(parts[2])


class Redacted(str):
    """Stands in for a secret value: `'<redacted, 23 chars>'`, the length being the only thing shown."""

    def __new__(cls, value: object) -> Redacted:
        return super().__new__(cls, f"<redacted, {len(str(value))} chars>")


def redact(value: object) -> object:
    """A secret-bearing value as shown: strings (and other scalars) redacted, nothing else kept."""
    if value is None or isinstance(value, bool | Redacted):
        return value
    if isinstance(value, str | int | float):
        return Redacted(value)
    return Redacted(repr(value))


@dataclass(frozen=True)
class Problem:
    message: str
    file: str | None = None
    line: int | None = None
    path: str | None = None  # dotted field path, e.g. "limits.max_model_len"
    value: object = None
    fix: str | None = None
    has_value: bool = False

    def __post_init__(self) -> None:
        if self.has_value and is_secret_path(self.path):
            object.__setattr__(self, "value", redact(self.value))

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
