"""`plan --fit`: every GPU type x tensor-parallel size x replica count that meets a serving target.

For each catalog GPU and each tensor-parallel size the model's heads divide by, the engine's memory
rule sizes the KV cache (the same `plan_for` that `plan` shows); the replicas needed then follow from
the target, and the roofline model (`roofline.py`) gives the decode speed at the batch each replica
carries:

- a concurrency target: replicas = ceil(target / sequences one replica holds at the context length);
- a request-rate target (requests/s with input and output lengths): per replica, prefill takes a share
  of the GPU's time and the rest decodes; the running batch follows from Little's law
  (batch = rate x (TTFT + output x TPOT)), solved by fixed-point iteration. The TTFT and TPOT limits
  are compared with these steady-state step times; queueing tails are not modelled.

Options are ranked by cost per hour (from the price table), cheapest first.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from llmdeploy.catalog.gpus import GPUSpec
from llmdeploy.errors import UserError
from llmdeploy.memory.memory_plan import MemoryPlan
from llmdeploy.memory.plan_inputs import PlanInputs
from llmdeploy.planner.plan import plan_for
from llmdeploy.planner.roofline import decode_step, prefill_step

TENSOR_PARALLEL_SIZES = (1, 2, 4, 8)  # one node
MAX_REPLICAS = 4096
_FIXED_POINT_ROUNDS = 60


@dataclass(frozen=True)
class FitTarget:
    max_model_len: int
    concurrency: int | None = None
    context_tokens: int | None = None  # tokens a sequence holds while decoding (default max_model_len)
    requests_per_s: float | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    p99_tpot_ms: float | None = None
    p99_ttft_ms: float | None = None

    def __post_init__(self) -> None:
        problems = []
        if (self.concurrency is None) == (self.requests_per_s is None):
            problems.append("give one target: concurrent sequences or requests per second")
        if self.requests_per_s is not None and (self.input_tokens is None or self.output_tokens is None):
            problems.append("a request-rate target needs input and output lengths")
        if self.requests_per_s is not None and not (0 < self.requests_per_s < 1e6):
            problems.append(f"requests per second must be in (0, 1e6), got {self.requests_per_s}")
        both = self.input_tokens is not None and self.output_tokens is not None
        if both and self.sequence_tokens > self.max_model_len:
            problems.append(
                f"input + output tokens ({self.sequence_tokens:,}) exceed the context length ({self.max_model_len:,})"
            )
        for name in ("p99_tpot_ms", "p99_ttft_ms"):
            value = getattr(self, name)
            if value is not None and not (0 < value < 1e7):
                problems.append(f"{name} must be a positive number of milliseconds, got {value}")
        if problems:
            raise UserError.one("; ".join(problems), fix="see `llmdeploy plan --help` (the --fit options)")

    @property
    def decode_context(self) -> int:
        """Tokens in a sequence's KV cache while it decodes, for the bandwidth it costs."""
        if self.input_tokens is not None and self.output_tokens is not None:
            return self.input_tokens + self.output_tokens // 2
        return self.context_tokens or self.max_model_len

    @property
    def sequence_tokens(self) -> int:
        """Tokens of KV cache one sequence must be able to hold."""
        if self.input_tokens is not None and self.output_tokens is not None:
            return self.input_tokens + self.output_tokens
        return self.context_tokens or self.max_model_len

    def describe(self) -> str:
        if self.concurrency is not None:
            ctx = f", {self.context_tokens:,} tokens each" if self.context_tokens else ""
            text = f"{self.concurrency} concurrent sequences at max_model_len {self.max_model_len:,}{ctx}"
        else:
            text = (
                f"{self.requests_per_s:g} requests/s of {self.input_tokens:,} in + {self.output_tokens:,} out "
                f"tokens at max_model_len {self.max_model_len:,}"
            )
        limits = [
            f"{label} <= {value:g} ms"
            for label, value in (("TPOT", self.p99_tpot_ms), ("TTFT", self.p99_ttft_ms))
            if value is not None
        ]
        return text + (f" ({', '.join(limits)})" if limits else "")


@dataclass(frozen=True)
class FitOption:
    gpu: str
    tensor_parallel_size: int
    replicas: int
    kv_cache_tokens: int  # per replica
    max_concurrency: float  # per replica, at max_model_len (vLLM's figure)
    sequences_per_replica: int  # what one replica holds at the target's sequence length
    batch_per_replica: float  # the running batch the target puts on each replica
    decode_tok_s_per_replica: float
    tpot_ms: float
    ttft_ms: float | None
    bound: str  # memory | compute: what limits the decode step
    usd_per_gpu_hour: float | None

    @property
    def num_gpus(self) -> int:
        return self.tensor_parallel_size * self.replicas

    @property
    def usd_per_hour(self) -> float | None:
        return None if self.usd_per_gpu_hour is None else self.usd_per_gpu_hour * self.num_gpus

    def to_json(self) -> dict[str, Any]:
        return {
            "gpu": self.gpu,
            "tensor_parallel_size": self.tensor_parallel_size,
            "replicas": self.replicas,
            "num_gpus": self.num_gpus,
            "kv_cache_tokens": self.kv_cache_tokens,
            "max_concurrency": round(self.max_concurrency, 2),
            "sequences_per_replica": self.sequences_per_replica,
            "batch_per_replica": round(self.batch_per_replica, 1),
            "decode_tok_s_per_replica": round(self.decode_tok_s_per_replica, 1),
            "tpot_ms": round(self.tpot_ms, 2),
            "ttft_ms": None if self.ttft_ms is None else round(self.ttft_ms, 1),
            "bound": self.bound,
            "usd_per_gpu_hour": self.usd_per_gpu_hour,
            "usd_per_hour": None if self.usd_per_hour is None else round(self.usd_per_hour, 2),
        }


@dataclass(frozen=True)
class Rejection:
    gpu: str
    tensor_parallel_size: int
    reason: str


@dataclass(frozen=True)
class FitResult:
    model: str
    engine: str
    target: FitTarget
    options: tuple[FitOption, ...]
    rejected: tuple[Rejection, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "engine": self.engine,
            "target": self.target.describe(),
            "options": [o.to_json() for o in self.options],
            "rejected": [
                {"gpu": r.gpu, "tensor_parallel_size": r.tensor_parallel_size, "reason": r.reason}
                for r in self.rejected
            ],
        }


def fit(
    base: PlanInputs,
    target: FitTarget,
    gpus: Iterable[GPUSpec],
    prices: Mapping[str, float],
) -> FitResult:
    """Every (GPU, TP, replicas) that meets `target`, cheapest first. `base` holds the model and every
    engine setting; its GPU and tensor-parallel size are replaced for each candidate."""
    options: list[FitOption] = []
    rejected: list[Rejection] = []
    heads = base.spec.num_attention_heads
    for gpu in gpus:
        for tp in TENSOR_PARALLEL_SIZES:
            if heads % tp:
                continue
            inputs = replace(
                base,
                gpu=gpu,
                gpu_memory_gib=None,
                tensor_parallel_size=tp,
                max_model_len=target.max_model_len,
            )
            try:
                outcome = _option(inputs, gpu, target, prices.get(gpu.name))
            except UserError as refused:  # a GPU the rules do not cover (ROCm)
                outcome = refused.problems[0].message
                rejected.append(Rejection(gpu.name, tp, outcome))
                break
            if isinstance(outcome, FitOption):
                options.append(outcome)
            else:
                rejected.append(Rejection(gpu.name, tp, outcome))
    options.sort(key=_rank)
    return FitResult(base.spec.hf_id, base.engine, target, tuple(options), tuple(rejected))


def _rank(o: FitOption) -> tuple[float, int, float]:
    cost = o.usd_per_hour if o.usd_per_hour is not None else math.inf
    return (cost, o.num_gpus, -o.decode_tok_s_per_replica * o.replicas)


def _sequences_per_replica(plan: MemoryPlan, target: FitTarget) -> int:
    held = plan.max_concurrency * plan.max_model_len / target.sequence_tokens
    return min(plan.max_num_seqs, math.floor(held + 1e-9))


def _option(inputs: PlanInputs, gpu: GPUSpec, target: FitTarget, price: float | None) -> FitOption | str:
    plan = plan_for(inputs)
    if not plan.fits:
        return plan.problems[0] if plan.problems else "does not fit"
    capacity = _sequences_per_replica(plan, target)
    if capacity < 1:
        return (
            f"the KV cache ({plan.kv_cache_tokens:,} tokens) holds no sequence of {target.sequence_tokens:,}"
        )
    if target.concurrency is not None:
        found = _for_concurrency(inputs, gpu, target, capacity)
    else:
        found = _for_rate(inputs, gpu, target, capacity)
    if isinstance(found, str):
        return found
    replicas, batch, step_s, ttft_s, bound = found
    return FitOption(
        gpu=gpu.name,
        tensor_parallel_size=inputs.tensor_parallel_size,
        replicas=replicas,
        kv_cache_tokens=plan.kv_cache_tokens,
        max_concurrency=plan.max_concurrency,
        sequences_per_replica=capacity,
        batch_per_replica=batch,
        decode_tok_s_per_replica=batch / step_s,
        tpot_ms=step_s * 1e3,
        ttft_ms=None if ttft_s is None else ttft_s * 1e3,
        bound=bound,
        usd_per_gpu_hour=price,
    )


_Found = tuple[int, float, float, float | None, str]


def _for_concurrency(inputs: PlanInputs, gpu: GPUSpec, target: FitTarget, capacity: int) -> _Found | str:
    assert target.concurrency is not None
    replicas = math.ceil(target.concurrency / capacity)
    while replicas <= MAX_REPLICAS:
        batch = math.ceil(target.concurrency / replicas)
        step = decode_step(inputs, gpu, batch, target.decode_context)
        if target.p99_tpot_ms is None or step.seconds * 1e3 <= target.p99_tpot_ms:
            return replicas, float(batch), step.seconds, None, step.bound
        if batch == 1:
            return f"one sequence alone decodes at {step.seconds * 1e3:.1f} ms a token (TPOT limit {target.p99_tpot_ms:g})"
        replicas += 1
    return f"needs more than {MAX_REPLICAS} replicas"


def _for_rate(inputs: PlanInputs, gpu: GPUSpec, target: FitTarget, capacity: int) -> _Found | str:
    assert target.requests_per_s is not None and target.input_tokens is not None
    assert target.output_tokens is not None
    prefill = prefill_step(inputs, gpu, target.input_tokens).seconds
    if target.p99_ttft_ms is not None and prefill * 1e3 > target.p99_ttft_ms:
        return f"a {target.input_tokens:,}-token prefill alone takes {prefill * 1e3:.0f} ms (TTFT limit {target.p99_ttft_ms:g})"
    # fewer replicas than this leave no GPU time for decoding after the prompts
    replicas = max(1, math.ceil(target.requests_per_s * prefill))
    while replicas <= MAX_REPLICAS:
        found = _steady_state(inputs, gpu, target, capacity, target.requests_per_s / replicas, prefill)
        if found is not None:
            batch, tpot, ttft, bound = found
            return replicas, batch, tpot, ttft, bound
        replicas += 1
    return f"needs more than {MAX_REPLICAS} replicas"


def _steady_state(
    inputs: PlanInputs, gpu: GPUSpec, target: FitTarget, capacity: int, rate: float, prefill_s: float
) -> tuple[float, float, float, str] | None:
    """(batch, TPOT s, TTFT s, bound) of one replica serving `rate` requests/s, or None when it cannot."""
    assert target.output_tokens is not None
    busy = rate * prefill_s  # share of the replica's time spent on prompts
    if busy >= 0.95:
        return None
    batch = 1.0
    tpot = ttft = 0.0
    bound = "memory"
    for _ in range(_FIXED_POINT_ROUNDS):
        step = decode_step(inputs, gpu, max(1, math.ceil(batch)), target.decode_context)
        tpot = step.seconds / (1 - busy)
        ttft = prefill_s + tpot
        bound = step.bound
        new_batch = rate * (ttft + target.output_tokens * tpot)
        if new_batch > capacity:
            return None
        if abs(new_batch - batch) < 0.01:
            batch = new_batch
            break
        batch = new_batch
    if target.p99_tpot_ms is not None and tpot * 1e3 > target.p99_tpot_ms:
        return None
    if target.p99_ttft_ms is not None and ttft * 1e3 > target.p99_ttft_ms:
        return None
    return batch, tpot, ttft, bound


def render_table(result: FitResult, limit: int | None = None) -> str:
    lines = [f"{result.model}, engine {result.engine}: {result.target.describe()}", ""]
    if not result.options:
        lines.append("  no GPU type x tensor-parallel size in the catalog meets this target")
        seen: set[str] = set()
        for r in result.rejected:
            if r.gpu not in seen:
                seen.add(r.gpu)
                lines.append(f"  {r.gpu} TP {r.tensor_parallel_size}: {r.reason.splitlines()[0]}")
        return "\n".join(lines)
    header = (
        f"  {'GPU':<11}{'TP':>3}{'replicas':>9}{'GPUs':>6}{'KV tokens':>12}{'max conc.':>10}"
        f"{'batch':>7}{'decode tok/s':>14}{'TPOT ms':>9}{'TTFT ms':>9}{'$/hour':>9}"
    )
    lines += [header, "  " + "-" * (len(header) - 2)]
    shown = result.options if limit is None else result.options[:limit]
    for o in shown:
        cost = "-" if o.usd_per_hour is None else f"{o.usd_per_hour:.2f}"
        ttft = "-" if o.ttft_ms is None else f"{o.ttft_ms:.0f}"
        lines.append(
            f"  {o.gpu:<11}{o.tensor_parallel_size:>3}{o.replicas:>9}{o.num_gpus:>6}"
            f"{o.kv_cache_tokens:>12,}{o.max_concurrency:>10.1f}{o.batch_per_replica:>7.0f}"
            f"{o.decode_tok_s_per_replica:>14,.0f}{o.tpot_ms:>9.1f}{ttft:>9}{cost:>9}"
        )
    if limit is not None and len(result.options) > limit:
        lines.append(f"  ... {len(result.options) - limit} more (--output json lists all)")
    lines += [
        "",
        "  decode tok/s and TPOT: roofline ceilings per replica (docs/planner.md states the measured gap);",
        "  $/hour: the price table (--prices FILE to use your own)",
    ]
    return "\n".join(lines)
