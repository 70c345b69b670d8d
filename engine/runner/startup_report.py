"""What the engine measured at start-up, in the units and wording vLLM logs."""

from __future__ import annotations

from dataclasses import dataclass

GIB = 2**30


@dataclass(frozen=True)
class StartupReport:
    device: str  # "cuda" | "cpu"
    dtype: str
    weights_bytes: int
    peak_activation_bytes: int
    non_torch_bytes: int
    kv_cache_bytes: int  # the budget the rule gave (blocks use num_kv_blocks x block bytes of it)
    kv_bytes_per_token: int
    num_kv_blocks: int
    block_size: int
    max_model_len: int
    max_concurrency: float
    load_time_s: float
    kv_cache_dtype: str = "auto"  # storage dtype of the KV cache (torch name, e.g. float8_e4m3fn)
    # CUDA graphs of decode steps: what the sizing rule set aside for them before the KV cache, and
    # what capture measured (0 when none were captured)
    cuda_graph_reserved_bytes: int = 0
    num_cuda_graphs: int = 0
    cuda_graph_bytes: int = 0
    cuda_graph_capture_s: float = 0.0
    # GPU memory the process held before the engine started (another engine, the caller's tensors):
    # left out of the KV cache's budget like other processes' memory
    held_bytes: int = 0

    @property
    def weights_gib(self) -> float:
        return self.weights_bytes / GIB

    @property
    def available_kv_gib(self) -> float:
        return self.kv_cache_bytes / GIB

    @property
    def cuda_graph_gib(self) -> float:
        return self.cuda_graph_bytes / GIB

    @property
    def kv_cache_tokens(self) -> int:
        return self.num_kv_blocks * self.block_size

    def log_lines(self) -> list[str]:
        kind = "GPU" if self.device == "cuda" else "CPU"
        lines = [
            f"Model loading took {self.weights_gib:.4f} GiB and {self.load_time_s:.6f} seconds",
            f"Available KV cache memory: {self.available_kv_gib:.2f} GiB",
            f"{kind} KV cache size: {self.kv_cache_tokens:,} tokens",
            f"Maximum concurrency for {self.max_model_len:,} tokens per request: {self.max_concurrency:.2f}x",
            f"KV cache dtype: {self.kv_cache_dtype}, {self.kv_bytes_per_token:,} bytes per token",
        ]
        if self.held_bytes:
            lines.append(
                f"GPU memory this process held before the engine started: {self.held_bytes / GIB:.2f} GiB "
                "(another engine or other tensors; left out of the KV cache)"
            )
        if self.cuda_graph_reserved_bytes:
            lines.append(
                f"CUDA graph memory set aside before sizing the KV cache: "
                f"{self.cuda_graph_reserved_bytes / GIB:.2f} GiB"
            )
        if self.num_cuda_graphs:
            lines.append(
                f"Graph capturing finished in {self.cuda_graph_capture_s:.2f} secs, took "
                f"{self.cuda_graph_bytes / GIB:.2f} GiB ({self.num_cuda_graphs} graphs)"
            )
        return lines

    def to_dict(self) -> dict[str, float | int | str]:
        return {
            "device": self.device,
            "dtype": self.dtype,
            "weights_gib": self.weights_gib,
            "activation_gib": self.peak_activation_bytes / GIB,
            "non_torch_gib": self.non_torch_bytes / GIB,
            "held_gib": self.held_bytes / GIB,
            "available_kv_gib": self.available_kv_gib,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "kv_cache_tokens": self.kv_cache_tokens,
            "num_kv_blocks": self.num_kv_blocks,
            "block_size": self.block_size,
            "max_model_len": self.max_model_len,
            "max_concurrency": self.max_concurrency,
            "load_time_s": self.load_time_s,
            "kv_cache_dtype": self.kv_cache_dtype,
            "cuda_graph_reserved_gib": self.cuda_graph_reserved_bytes / GIB,
            "num_cuda_graphs": self.num_cuda_graphs,
            "cuda_graph_gib": self.cuda_graph_gib,
            "cuda_graph_capture_s": self.cuda_graph_capture_s,
        }
