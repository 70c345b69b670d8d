"""Prometheus `/metrics` with vLLM's metric names and types, exposed through `prometheus_client`.

Request-level figures (tokens, latencies, finish reasons) are observed by the server as outputs
stream out; engine-level figures (running / waiting requests, KV usage, the start-up report) are
read from `engine.stats()` at scrape time by a collector.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

# vLLM exposes no `_created` series either; one switch for the whole process.
prometheus_client.disable_created_metrics()

# vLLM's bucket edges, so dashboards built for vLLM read the same.
TTFT_BUCKETS_S = (
    *(0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75),
    *(1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0),
)
ITL_BUCKETS_S = (
    *(0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5),
    *(0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0),
)
E2E_BUCKETS_S = (
    *(0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0),
    *(30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0),
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
# (stats field names, counter name, help): engine counters read at scrape time
ENGINE_COUNTERS = (
    (("num_preemptions",), "vllm:num_preemptions", "Preemptions (recompute) so far."),
    (
        ("prefix_cache_queries_tokens", "prefix_cache_queries"),
        "vllm:prefix_cache_queries",
        "Prompt tokens looked up in the prefix cache.",
    ),
    (
        ("prefix_cache_hits_tokens", "prefix_cache_hits"),
        "vllm:prefix_cache_hits",
        "Prompt tokens found in the prefix cache.",
    ),
)
SPEC_DECODE_COUNTERS = (
    ("num_drafts", "Speculative drafts verified (sequence-steps with proposed tokens)."),
    ("num_draft_tokens", "Speculative tokens proposed."),
    ("num_accepted_tokens", "Speculative tokens accepted."),
)


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


class EngineStatsCollector(Collector):
    """The engine's own figures, read from the latest `engine.stats()` value at each scrape."""

    def __init__(self, model_name: str, block_size: int) -> None:
        self.model_name = model_name
        self.block_size = block_size
        self.stats: Any = None

    def collect(self) -> Iterator[Metric]:
        stats, model = self.stats, [self.model_name]

        def gauge(name: str, help_text: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, help_text, labels=["model_name"])
            family.add_metric(model, float(value))
            return family

        kv_usage = float(first(stats, "kv_cache_usage", "kv_usage") or 0.0)
        running = first(stats, "num_requests_running", "num_running") or 0
        waiting = first(stats, "num_requests_waiting", "num_waiting") or 0
        yield gauge("vllm:num_requests_running", "Requests in the running batch.", running)
        yield gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.", waiting)
        yield gauge("vllm:kv_cache_usage_perc", "KV cache usage (1 means 100 percent).", kv_usage)
        yield gauge(
            "vllm:gpu_cache_usage_perc", "KV cache usage (1 means 100 percent); older name.", kv_usage
        )
        for keys, name, help_text in ENGINE_COUNTERS:
            value = first(stats, *keys)
            if value is not None:
                counter = CounterMetricFamily(name, help_text, labels=["model_name"])
                counter.add_metric(model, float(value))
                yield counter
        if read(stats, "spec_decode_num_drafts", None):
            for key, help_text in SPEC_DECODE_COUNTERS:
                counter = CounterMetricFamily(f"vllm:spec_decode_{key}", help_text, labels=["model_name"])
                counter.add_metric(model, float(read(stats, f"spec_decode_{key}", 0)))
                yield counter
            per_pos = CounterMetricFamily(
                "vllm:spec_decode_num_accepted_tokens_per_pos",
                "Speculative tokens accepted, by draft position.",
                labels=["model_name", "position"],
            )
            for i, n in enumerate(read(stats, "spec_decode_num_accepted_tokens_per_pos", ()) or ()):
                per_pos.add_metric([self.model_name, str(i)], float(n))
            yield per_pos
        report = read(stats, "startup_report", None)
        num_blocks = read(report, "num_kv_blocks", None)
        info = GaugeMetricFamily(
            "vllm:cache_config_info",
            "KV cache configuration.",
            labels=["block_size", "num_gpu_blocks", "model_name"],
        )
        block_size = read(report, "block_size", None) or self.block_size
        info.add_metric(
            [str(block_size), "" if num_blocks is None else str(num_blocks), self.model_name], 1.0
        )
        yield info
        for key, (name, help_text) in STARTUP_GAUGES.items():
            value = read(report, key, None)
            if value is not None:
                yield gauge(name, help_text, float(value))


class ServerMetrics:
    """One registry per server: request figures observed as they happen, engine figures at scrape."""

    def __init__(self, model_name: str, block_size: int = 16) -> None:
        self.model_name = model_name
        self.registry = CollectorRegistry()
        self.engine = EngineStatsCollector(model_name, block_size)
        self.registry.register(self.engine)
        lab = ["model_name"]

        def counter(name: str, help_text: str, labels: list[str] = lab) -> Counter:
            return Counter(name, help_text, labels, registry=self.registry)

        def histogram(name: str, help_text: str, buckets: tuple[float, ...]) -> Histogram:
            # the child is made now so the histogram shows (at 0) before the first request
            return Histogram(name, help_text, lab, registry=self.registry, buckets=buckets).labels(model_name)

        self.prompt_tokens = counter("vllm:prompt_tokens", "Prompt tokens processed.").labels(model_name)
        self.generation_tokens = counter("vllm:generation_tokens", "Tokens generated.").labels(model_name)
        self.request_success = counter(
            "vllm:request_success", "Finished requests by finish reason.", [*lab, "finished_reason"]
        )
        for reason in FINISHED_REASONS:
            self.request_success.labels(model_name, reason)  # every reason shows, at 0 until it happens
        self.ttft = histogram("vllm:time_to_first_token_seconds", "Time to first token.", TTFT_BUCKETS_S)
        self.itl = histogram(
            "vllm:inter_token_latency_seconds", "Time between consecutive output tokens.", ITL_BUCKETS_S
        )
        self.tpot = histogram(
            "vllm:time_per_output_token_seconds",
            "Mean time per output token after the first, per request.",
            ITL_BUCKETS_S,
        )
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "End-to-end request latency.", E2E_BUCKETS_S)

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
        self.prompt_tokens.inc(num_prompt_tokens)
        self.generation_tokens.inc(num_generated_tokens)
        self.request_success.labels(self.model_name, reason).inc()
        self.e2e.observe(e2e_s)
        if decode_s is not None and num_generated_tokens > 1:
            self.tpot.observe(decode_s / (num_generated_tokens - 1))

    def render(self, stats: Any, block_size: int) -> str:
        """The text exposition, with the engine's figures taken from `stats`."""
        self.engine.stats, self.engine.block_size = stats, block_size
        try:
            return generate_latest(self.registry).decode()
        finally:
            self.engine.stats = None
