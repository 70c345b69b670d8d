"""Prometheus `/metrics` with vLLM's metric names, written in the text exposition format.

Request-level figures (tokens, latencies, finish reasons) are observed by the server as outputs
stream out; engine-level figures (running / waiting requests, KV usage, the start-up report) are
read from `engine.stats()` at scrape time.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

# vLLM's bucket edges, so dashboards built for vLLM read the same.
TTFT_BUCKETS_S = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS_S = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
E2E_BUCKETS_S = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
FINISHED_REASONS = ("stop", "length", "abort")
# start-up report field -> gauge name
STARTUP_GAUGES = {
    "weights_gib": ("llmdeploy:weights_gib", "Model weights loaded (GiB)."),
    "available_kv_gib": ("llmdeploy:available_kv_cache_gib", "Memory given to the KV cache (GiB)."),
    "kv_cache_tokens": ("llmdeploy:kv_cache_tokens", "KV cache size in tokens."),
    "num_kv_blocks": ("llmdeploy:num_kv_blocks", "KV cache blocks allocated."),
    "max_concurrency": (
        "llmdeploy:max_concurrency",
        "Requests of max_model_len tokens that fit in the KV cache.",
    ),
    "cuda_graph_gib": ("llmdeploy:cuda_graph_gib", "Memory the decode CUDA graphs took at capture (GiB)."),
    "num_cuda_graphs": ("llmdeploy:num_cuda_graphs", "Decode CUDA graphs captured at start-up."),
}


def read(obj: Any, name: str, default: Any = None) -> Any:
    """A field of an engine stats value, whether it is an object or a mapping."""
    if obj is None:
        return default
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default)


def first(obj: Any, *names: str) -> Any:
    """The first of several field names present (LLMEngine's EngineStats names, then the short ones)."""
    for holder in (obj, read(obj, "counters", None)):
        for name in names:
            value = read(holder, name, None)
            if value is not None:
                return value
    return None


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels.items()) + "}"


def _num(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if isinstance(value, int) or float(value).is_integer():
        return str(int(value)) if abs(value) < 1e15 else repr(float(value))
    return repr(float(value))


@dataclass
class Histogram:
    buckets_s: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.buckets_s)

    def observe(self, value_s: float) -> None:
        self.total += value_s
        self.count += 1
        for i, edge in enumerate(self.buckets_s):
            if value_s <= edge:
                self.counts[i] += 1

    def lines(self, name: str, labels: dict[str, str]) -> list[str]:
        out = []
        for edge, n in zip(self.buckets_s, self.counts, strict=True):
            out.append(f"{name}_bucket{_labels({**labels, 'le': _num(edge)})} {n}")
        out.append(f"{name}_bucket{_labels({**labels, 'le': '+Inf'})} {self.count}")
        out.append(f"{name}_sum{_labels(labels)} {_num(self.total)}")
        out.append(f"{name}_count{_labels(labels)} {self.count}")
        return out


@dataclass
class ServerMetrics:
    model_name: str
    prompt_tokens: int = 0
    generation_tokens: int = 0
    request_success: Counter[str] = field(default_factory=Counter)
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS_S))
    itl: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS_S))
    tpot: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS_S))
    e2e: Histogram = field(default_factory=lambda: Histogram(E2E_BUCKETS_S))

    def observe_first_token(self, ttft_s: float) -> None:
        self.ttft.observe(ttft_s)

    def observe_token_gap(self, gap_s: float) -> None:
        self.itl.observe(gap_s)

    def observe_finished(
        self,
        *,
        reason: str,
        num_prompt_tokens: int,
        num_generated_tokens: int,
        e2e_s: float,
        decode_s: float | None,
    ) -> None:
        self.prompt_tokens += num_prompt_tokens
        self.generation_tokens += num_generated_tokens
        self.request_success[reason] += 1
        self.e2e.observe(e2e_s)
        if decode_s is not None and num_generated_tokens > 1:
            self.tpot.observe(decode_s / (num_generated_tokens - 1))

    def render(self, stats: Any, block_size: int) -> str:
        lab = {"model_name": self.model_name}
        out: list[str] = []

        def metric(name: str, kind: str, help_text: str, samples: list[str]) -> None:
            base = name[: -len("_total")] if kind == "counter" and name.endswith("_total") else name
            out.append(f"# HELP {base} {help_text}")
            out.append(f"# TYPE {base} {kind}")
            out.extend(samples)

        def gauge(name: str, help_text: str, value: float) -> None:
            metric(name, "gauge", help_text, [f"{name}{_labels(lab)} {_num(value)}"])

        kv_usage = float(first(stats, "kv_cache_usage", "kv_usage") or 0.0)
        running = first(stats, "num_requests_running", "num_running") or 0
        waiting = first(stats, "num_requests_waiting", "num_waiting") or 0
        gauge("vllm:num_requests_running", "Requests in the running batch.", running)
        gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.", waiting)
        gauge("vllm:kv_cache_usage_perc", "KV cache usage (1 means 100 percent).", kv_usage)
        gauge("vllm:gpu_cache_usage_perc", "KV cache usage (1 means 100 percent); older name.", kv_usage)
        for keys, name, help_text in (
            (("num_preemptions",), "vllm:num_preemptions_total", "Preemptions (recompute) so far."),
            (
                ("prefix_cache_queries_tokens", "prefix_cache_queries"),
                "vllm:prefix_cache_queries_total",
                "Prompt tokens looked up in the prefix cache.",
            ),
            (
                ("prefix_cache_hits_tokens", "prefix_cache_hits"),
                "vllm:prefix_cache_hits_total",
                "Prompt tokens found in the prefix cache.",
            ),
        ):
            value = first(stats, *keys)
            if value is not None:
                metric(name, "counter", help_text, [f"{name}{_labels(lab)} {_num(value)}"])
        if read(stats, "spec_decode_num_drafts", None):
            for key, help_text in (
                ("num_drafts", "Speculative drafts verified (sequence-steps with proposed tokens)."),
                ("num_draft_tokens", "Speculative tokens proposed."),
                ("num_accepted_tokens", "Speculative tokens accepted."),
            ):
                name = f"vllm:spec_decode_{key}_total"
                value = read(stats, f"spec_decode_{key}", 0)
                metric(name, "counter", help_text, [f"{name}{_labels(lab)} {_num(value)}"])
            name = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
            per_pos = read(stats, "spec_decode_num_accepted_tokens_per_pos", ()) or ()
            samples = [f"{name}{_labels({**lab, 'position': str(i)})} {n}" for i, n in enumerate(per_pos)]
            metric(name, "counter", "Speculative tokens accepted, by draft position.", samples)
        metric(
            "vllm:prompt_tokens_total",
            "counter",
            "Prompt tokens processed.",
            [f"vllm:prompt_tokens_total{_labels(lab)} {self.prompt_tokens}"],
        )
        metric(
            "vllm:generation_tokens_total",
            "counter",
            "Tokens generated.",
            [f"vllm:generation_tokens_total{_labels(lab)} {self.generation_tokens}"],
        )
        metric(
            "vllm:request_success_total",
            "counter",
            "Finished requests by finish reason.",
            [
                f"vllm:request_success_total{_labels({**lab, 'finished_reason': r})} {self.request_success[r]}"
                for r in sorted(set(FINISHED_REASONS) | set(self.request_success))
            ],
        )
        for name, help_text, hist in (
            ("vllm:time_to_first_token_seconds", "Time to first token.", self.ttft),
            ("vllm:inter_token_latency_seconds", "Time between consecutive output tokens.", self.itl),
            (
                "vllm:time_per_output_token_seconds",
                "Mean time per output token after the first, per request.",
                self.tpot,
            ),
            ("vllm:e2e_request_latency_seconds", "End-to-end request latency.", self.e2e),
        ):
            metric(name, "histogram", help_text, hist.lines(name, lab))
        report = read(stats, "startup_report", None)
        num_blocks = read(report, "num_kv_blocks", None)
        block_size = read(report, "block_size", None) or block_size
        info = {
            "block_size": str(block_size),
            "num_gpu_blocks": str(num_blocks if num_blocks is not None else ""),
        }
        metric(
            "vllm:cache_config_info",
            "gauge",
            "KV cache configuration.",
            [f"vllm:cache_config_info{_labels({**info, 'model_name': self.model_name})} 1"],
        )
        for key, (name, help_text) in STARTUP_GAUGES.items():
            value = read(report, key, None)
            if value is not None:
                gauge(name, help_text, float(value))
        return "\n".join(out) + "\n"
