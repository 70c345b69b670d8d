"""`MemoryPlan`: the per-GPU memory budget of one deployment, as JSON (ARCHITECTURE.md keys) or a table."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

GIB = 2**30


@dataclass(frozen=True)
class MemoryPlan:
    engine: str
    model: str
    gpu: str
    device: str
    tensor_parallel_size: int
    pipeline_parallel_size: int
    total_gib: float  # per GPU, as CUDA reports it (or the CPU KV budget on CPU)
    gpu_memory_utilization: float
    usable_gib: float
    weights_gib: float
    activation_gib: float
    non_torch_gib: float
    cuda_graph_gib: float
    kv_cache_gib: float
    headroom_gib: float  # total - everything planned (CUDA context and graphs live here when not counted)
    kv_bytes_per_token: int
    kv_cache_tokens: int
    num_kv_blocks: int
    block_size: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_concurrency: float
    kv_cache_dtype: str
    quantization: str
    fits: bool
    problems: tuple[str, ...] = ()
    suggestions: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    # what the table says beside "usable" and "activations" when the engine's budget reads otherwise
    # (SGLang: a static pool for weights + KV, activations reserved outside it); not in the JSON
    usable_label: str | None = None
    activation_label: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in self.__dataclass_fields__:
            if name in ("usable_label", "activation_label"):
                continue
            value = getattr(self, name)
            if isinstance(value, float):
                value = round(value, 2 if name.endswith("_gib") or name == "max_concurrency" else 4)
            elif isinstance(value, tuple):
                value = list(value)
            out[name] = value
        return out

    def to_table(self) -> str:
        def row(label: str, gib: float, note: str = "") -> str:
            return f"  {label:<22}{gib:>9.2f} GiB  {note}".rstrip()

        par = f"TP {self.tensor_parallel_size} x PP {self.pipeline_parallel_size}"
        lines = [
            f"{self.model} on {self.gpu} ({self.device}, {par}), engine {self.engine}",
            f"  weights {self.quantization}, KV cache {self.kv_cache_dtype}, "
            f"max_model_len {self.max_model_len:,}, max_num_seqs {self.max_num_seqs}, "
            f"max_num_batched_tokens {self.max_num_batched_tokens:,}",
            "",
            *(self._gpu_rows(row) if self.device == "cuda" else self._cpu_rows(row)),
            "",
            f"  KV: {self.kv_bytes_per_token:,} bytes/token, {self.num_kv_blocks:,} blocks of {self.block_size} "
            f"= {self.kv_cache_tokens:,} tokens; max concurrency at {self.max_model_len:,} tokens: "
            f"{self.max_concurrency:.2f}x",
            f"  fits: {'yes' if self.fits else 'NO'}",
        ]
        lines += [f"  problem: {p}" for p in self.problems]
        lines += [f"  fix: {s}" for s in self.suggestions]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def _gpu_rows(self, row: Callable[..., str]) -> list[str]:
        return [
            f"  per GPU{'':<15}{'':>9}",
            row("total", self.total_gib),
            row(
                "usable",
                self.usable_gib,
                self.usable_label or f"x gpu_memory_utilization {self.gpu_memory_utilization}",
            ),
            row("weights", self.weights_gib),
            row("activations", self.activation_gib, self.activation_label or "profile-run peak"),
            row("non-torch", self.non_torch_gib),
            row("CUDA graphs", self.cuda_graph_gib),
            row("KV cache", self.kv_cache_gib),
            row("headroom", self.headroom_gib, "outside the budget (CUDA context lives here)"),
        ]

    def _cpu_rows(self, row: Callable[..., str]) -> list[str]:
        # On CPU the KV space is fixed; weights and activations live in ordinary RAM beside it.
        return [
            f"  CPU (RAM){'':<13}{'':>9}",
            row("weights", self.weights_gib),
            row("activations", self.activation_gib, "profile-run peak"),
            row("KV cache", self.kv_cache_gib, "fixed KV space (limits.kv_cache_memory_gib)"),
            row("RAM needed", self.weights_gib + self.activation_gib + self.kv_cache_gib, "about"),
        ]
