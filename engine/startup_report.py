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

    @property
    def weights_gib(self) -> float:
        return self.weights_bytes / GIB

    @property
    def available_kv_gib(self) -> float:
        return self.kv_cache_bytes / GIB

    @property
    def kv_cache_tokens(self) -> int:
        return self.num_kv_blocks * self.block_size

    def log_lines(self) -> list[str]:
        kind = "GPU" if self.device == "cuda" else "CPU"
        return [
            f"Model loading took {self.weights_gib:.4f} GiB and {self.load_time_s:.6f} seconds",
            f"Available KV cache memory: {self.available_kv_gib:.2f} GiB",
            f"{kind} KV cache size: {self.kv_cache_tokens:,} tokens",
            f"Maximum concurrency for {self.max_model_len:,} tokens per request: {self.max_concurrency:.2f}x",
            f"KV cache dtype: {self.kv_cache_dtype}, {self.kv_bytes_per_token:,} bytes per token",
        ]

    def to_dict(self) -> dict[str, float | int | str]:
        return {
            "device": self.device,
            "dtype": self.dtype,
            "weights_gib": self.weights_gib,
            "activation_gib": self.peak_activation_bytes / GIB,
            "non_torch_gib": self.non_torch_bytes / GIB,
            "available_kv_gib": self.available_kv_gib,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "kv_cache_tokens": self.kv_cache_tokens,
            "num_kv_blocks": self.num_kv_blocks,
            "block_size": self.block_size,
            "max_model_len": self.max_model_len,
            "max_concurrency": self.max_concurrency,
            "load_time_s": self.load_time_s,
            "kv_cache_dtype": self.kv_cache_dtype,
        }
