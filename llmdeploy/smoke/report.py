"""What a smoke run found: one line per check, warnings, and the predicted-versus-actual KV capacity."""

from __future__ import annotations

from dataclasses import dataclass

from llmdeploy.engines.base import KVCapacity


@dataclass(frozen=True)
class CheckResult:
    name: str
    ok: bool
    detail: str = ""  # on failure: the one-line reason
    duration_s: float = 0.0

    def line(self) -> str:
        status = "ok  " if self.ok else "FAIL"
        detail = ": " + " ".join(self.detail.split()) if self.detail else ""  # one line per check
        return f"{status}  {self.name} ({self.duration_s:.2f} s){detail}"


@dataclass(frozen=True)
class KVComparison:
    predicted_tokens: int | None
    actual: KVCapacity | None
    tolerance: float

    @property
    def gap_fraction(self) -> float | None:
        if self.predicted_tokens is None or self.actual is None or self.predicted_tokens <= 0:
            return None
        return (self.actual.tokens - self.predicted_tokens) / self.predicted_tokens

    @property
    def within_tolerance(self) -> bool:
        gap = self.gap_fraction
        return gap is None or abs(gap) <= self.tolerance

    def describe(self) -> str:
        if self.actual is None and self.predicted_tokens is None:
            return "KV cache: the engine reports no capacity and there is no plan to compare with"
        if self.actual is None:
            return f"KV cache: plan predicts {self.predicted_tokens:,} tokens; the engine reports no capacity"
        actual = f"engine reports {self.actual.tokens:,} tokens ({self.actual.source})"
        if self.predicted_tokens is None:
            return f"KV cache: {actual}; no plan to compare with"
        gap = self.gap_fraction or 0.0
        return (
            f"KV cache: {actual}, plan predicted {self.predicted_tokens:,} "
            f"({gap:+.1%}, tolerance {self.tolerance:.0%})"
        )


@dataclass(frozen=True)
class SmokeReport:
    url: str
    model: str | None
    checks: tuple[CheckResult, ...]
    warnings: tuple[str, ...]
    kv: KVComparison | None

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def failures(self) -> tuple[CheckResult, ...]:
        return tuple(c for c in self.checks if not c.ok)

    def render(self) -> str:
        lines = [f"smoke test of {self.model or '(no model)'} at {self.url}"]
        lines += [c.line() for c in self.checks]
        if self.kv is not None:
            lines.append(("info  " if self.kv.within_tolerance else "warn  ") + self.kv.describe())
        lines += [f"warn  {w}" for w in self.warnings]
        n = len(self.failures)
        lines.append("result: PASS" if self.ok else f"result: FAIL ({n} check{'s' if n != 1 else ''} failed)")
        return "\n".join(lines)

    def to_json(self) -> dict[str, object]:
        kv = None
        if self.kv is not None:
            kv = {
                "predicted_tokens": self.kv.predicted_tokens,
                "actual_tokens": None if self.kv.actual is None else self.kv.actual.tokens,
                "source": None if self.kv.actual is None else self.kv.actual.source,
                "gap_fraction": self.kv.gap_fraction,
                "tolerance": self.kv.tolerance,
                "within_tolerance": self.kv.within_tolerance,
            }
        return {
            "url": self.url,
            "model": self.model,
            "ok": self.ok,
            "checks": [
                {"name": c.name, "ok": c.ok, "detail": c.detail, "duration_s": c.duration_s}
                for c in self.checks
            ],
            "warnings": list(self.warnings),
            "kv": kv,
        }
