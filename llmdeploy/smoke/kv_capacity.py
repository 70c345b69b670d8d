"""The KV cache size an engine actually allocated, from Prometheus metrics or its start-up log.

Each engine says where it states the figure (`Engine.kv_capacity_from_metrics`, `Engine.kv_log_line`);
smoke may not know which engine answers, so it asks each in turn: an engine that also speaks another
engine's metric names (the built-in engine exports vLLM's) first, since its own gauge is the exact one.
"""

from __future__ import annotations

import re
from pathlib import Path

from llmdeploy.engines import ENGINES, Engine
from llmdeploy.engines.base import KVCapacity, MetricSample

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> list[MetricSample]:
    """(name, labels, value) for every sample line of a Prometheus text exposition."""
    samples = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            continue
        name, labels, value = match.groups()
        try:
            number = float(value)
        except ValueError:
            continue
        samples.append((name, dict(_LABEL.findall(labels or "")), number))
    return samples


def _engines() -> list[Engine]:
    return sorted(ENGINES.values(), key=lambda engine: not engine.reexports_metrics)


def capacity_from_metrics(text: str) -> KVCapacity | None:
    samples = parse_metrics(text)
    for engine in _engines():
        found = engine.kv_capacity_from_metrics(samples)
        if found is not None:
            return found
    return None


def capacity_from_log(path: str | Path) -> KVCapacity | None:
    """The KV cache size of the last start-up log line an engine states it in (vLLM and the
    built-in engine: "GPU (or CPU) KV cache size: N tokens")."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for engine in _engines():
        found = engine.kv_log_line.findall(text) if engine.kv_log_line is not None else []
        if found:
            return KVCapacity(int(found[-1].replace(",", "")), f"log {path}")
    return None
