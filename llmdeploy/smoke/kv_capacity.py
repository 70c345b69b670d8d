"""The KV cache size an engine actually allocated, from Prometheus metrics or its start-up log.

- built-in engine: gauge `llmdeploy:kv_cache_tokens`
- vLLM: `vllm:cache_config_info` label `kv_cache_size_tokens`, else `num_gpu_blocks` x `block_size`; its start-up
  log says "GPU KV cache size: 123,456 tokens"
"""

from __future__ import annotations

import re
from pathlib import Path

from llmdeploy.smoke.report import KVCapacity

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
_LOG_LINE = re.compile(r"(?:GPU|CPU) KV cache size:\s*([\d,]+)\s*tokens")


def parse_metrics(text: str) -> list[tuple[str, dict[str, str], float]]:
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


def _int_label(labels: dict[str, str], key: str) -> int | None:
    value = labels.get(key, "")
    return int(value) if value.isdigit() else None


def capacity_from_metrics(text: str) -> KVCapacity | None:
    samples = parse_metrics(text)
    for name, _, value in samples:
        if name == "llmdeploy:kv_cache_tokens" and value > 0:
            return KVCapacity(int(value), "/metrics llmdeploy:kv_cache_tokens")
    for name, labels, _ in samples:
        if name == "vllm:cache_config_info":
            tokens = _int_label(labels, "kv_cache_size_tokens")  # recent vLLM releases state it outright
            if tokens:
                return KVCapacity(tokens, "/metrics vllm:cache_config_info kv_cache_size_tokens")
            blocks, block_size = _int_label(labels, "num_gpu_blocks"), _int_label(labels, "block_size")
            if blocks and block_size:
                return KVCapacity(
                    blocks * block_size, "/metrics vllm:cache_config_info num_gpu_blocks x block_size"
                )
    return None


def capacity_from_log(path: str | Path) -> KVCapacity | None:
    """The last "GPU (or CPU) KV cache size: N tokens" line of a vLLM or built-in engine start-up log."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    found = _LOG_LINE.findall(text)
    if not found:
        return None
    return KVCapacity(int(found[-1].replace(",", "")), f"log {path}")
