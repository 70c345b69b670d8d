"""What the accuracy check finds per log (`LogCheck`), its groups, and how an error is printed.

Shared by the check (`accuracy`) and its Markdown table (`accuracy_table`), which sit side by side.
"""

from __future__ import annotations

from dataclasses import dataclass

TARGET, LEGACY, HYBRID = "vllm>=0.7", "vllm<0.7", "hybrid"


@dataclass(frozen=True)
class LogCheck:
    log_id: str
    source: str
    hybrid: bool
    logged_tokens: int | None
    bpt_tokens: int | None  # from the logged KV memory and our bytes/token
    bpt_error: float | None
    full_tokens: int | None  # from our whole estimate
    full_reference: int | None
    full_reference_derived: bool
    full_error: float | None
    weights_error_gib: float | None
    activation_error_gib: float | None
    kv_error_gib: float | None = None  # predicted minus logged KV memory (before clamping at 0)
    group: str = TARGET
    model: str = ""
    gpu: str = ""
    version: str = ""
    weights_gib: float | None = None  # logged
    heldout_tokens: int | None = None  # full prediction with non-torch re-fitted without this thread
    heldout_error: float | None = None
    in_sample: str = ""  # which planner figure this log was used to set ("" = none)
    start_failed: bool = False  # the logged start failed for lack of memory
    predicted_fits: bool | None = None  # the plan's verdict (with its fixes) for the log's settings
    fix_that_works: str | None = None  # a suggested fix the log shows would have started


def percent(x: float | None) -> str:
    """A signed error as a percentage with two decimals ("-" when there is none)."""
    return "-" if x is None else f"{x * 100:+.2f}%"
