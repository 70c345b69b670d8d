"""Reading a figure of the memory plan (an attribute, or a key of its `to_json()`), for flags and probes."""

from __future__ import annotations

import json


def plan_number(plan: object, key: str) -> float | None:
    """`key` of the plan as a number, or None when there is no plan or no such figure."""
    if plan is None:
        return None
    value = getattr(plan, key, None)
    if value is None and hasattr(plan, "to_json"):
        data = plan.to_json()
        data = json.loads(data) if isinstance(data, str) else data
        value = data.get(key) if isinstance(data, dict) else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
