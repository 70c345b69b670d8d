"""SGLang's start-up memory accounting, as release 0.5.15 does it (read at commit f63458b5b of its
release/v0.5.15 branch).

`python/sglang/srt/server_args.py`, `ServerArgs._handle_gpu_memory_settings`: from the GPU's
memory in MiB (`get_device_memory_capacity`) it picks the chunked-prefill size and the decode
CUDA-graph max batch size by memory tier, then, when `--mem-fraction-static` is not given,
reserves for what lives outside the static pool (MiB)

    reserved = 512                                   # attention back-end metadata
             + max(chunked_prefill_size, 2048) * 1.5 # activations (max_prefill_tokens when chunking is off)
             + decode_max_bs * 2                     # decode CUDA graphs
             + tp_size * pp_size / 8 * 1024          # large parallel sizes
             + len(prefill_graph_sizes) * 8          # piecewise prefill graphs (1.5 GiB with MLA)
    reserved = max(reserved, 10 * 1024) on GPUs over 60 GiB
    mem_fraction_static = round((gpu_mem - reserved) / gpu_mem, 3)

`python/sglang/srt/model_executor/model_runner_kv_cache_mixin.py`, `_profile_available_bytes`:
after the weights load, `rest_memory = available - pre_model_load_memory * (1 - mem_fraction_static)`,
where pre_model_load_memory is the free memory before the weights (the CUDA context taken);
`pool_configurator.py` (`DefaultPoolConfigurator`): `max_total_num_tokens = rest // cell_size`,
rounded down to whole pages, with `cell_size = kv_heads/tp * (head_dim + v_head_dim) * layers *
kv dtype bytes` ((kv_lora_rank + qk_rope_head_dim) * layers * bytes with MLA), capped by
`--max-total-tokens`. That count is logged as "KV Cache is allocated. ... #tokens: N" and exported
as the gauge `sglang:max_total_num_tokens`.

llmdeploy passes `--mem-fraction-static` itself: SGLang's default formula with the GPU's memory
scaled by the recipe's `limits.gpu_memory_utilization`, so the engine's whole footprint (static
pool plus SGLang's own reservation) stays inside that share, as it does for vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = 2**20
# (upper bound of the tier in MiB, chunked_prefill_size, decode max_bs for tp < 4, for tp >= 4)
_TIERS = (
    (20 * 1024, 2048, 8, 8),
    (35 * 1024, 2048, 24, 80),
    (60 * 1024, 4096, 32, 160),
    (90 * 1024, 8192, 256, 512),
    (160 * 1024, 8192, 256, 512),
)
_LARGEST_TIER = (16384, 512, 512)
DEFAULT_MAX_PREFILL_TOKENS = 16384
RESERVED_FLOOR_ABOVE_MIB = 60 * 1024
RESERVED_FLOOR_MIB = 10 * 1024


@dataclass(frozen=True)
class Reservation:
    """What SGLang keeps outside its static pool (MiB), term by term."""

    activation_mib: float
    decode_graphs_mib: float
    prefill_graphs_mib: float
    fixed_mib: float  # back-end metadata, the parallel-size term and the floor's top-up

    @property
    def total_mib(self) -> float:
        return self.activation_mib + self.decode_graphs_mib + self.prefill_graphs_mib + self.fixed_mib


def tier_defaults(gpu_mem_mib: float, tp_size: int) -> tuple[int, int]:
    """(chunked_prefill_size, decode CUDA-graph max batch size) SGLang picks for this GPU."""
    for bound, chunked, small_tp_bs, large_tp_bs in _TIERS:
        if gpu_mem_mib < bound:
            return chunked, small_tp_bs if tp_size < 4 else large_tp_bs
    return _LARGEST_TIER[0], _LARGEST_TIER[1]


def prefill_graph_sizes(max_bs: int) -> list[int]:
    """`_generate_prefill_cuda_graph_batch_sizes`: the token counts captured for prefill."""
    sizes = [
        *range(4, 33, 4),
        *range(48, 257, 16),
        *range(288, 513, 32),
        *range(576, 1025, 64),
        *range(1280, 4097, 256),
        *range(4608, max_bs + 1, 512),
    ]
    return [s for s in sizes if s <= max_bs]


def reservation(
    gpu_mem_mib: float,
    tp_size: int,
    pp_size: int,
    chunked_prefill_size: int,
    decode_max_bs: int,
    context_length: int | None,
    is_mla: bool,
) -> Reservation:
    """SGLang's reserved_mem for one GPU (chunked_prefill_size <= 0: chunking off)."""
    prefill_tokens = chunked_prefill_size if chunked_prefill_size > 0 else DEFAULT_MAX_PREFILL_TOKENS
    activation = max(prefill_tokens, 2048) * 1.5
    # prefill graphs are captured up to the chunk size (none with chunking off), 2048 tokens with MLA
    prefill_max_bs = 2048 if is_mla else chunked_prefill_size
    if context_length is not None:
        prefill_max_bs = min(prefill_max_bs, context_length)
    prefill = 1.5 * 1024 if is_mla else len(prefill_graph_sizes(prefill_max_bs)) * 8
    fixed = 512 + tp_size * pp_size / 8 * 1024
    total = activation + decode_max_bs * 2 + prefill + fixed
    if gpu_mem_mib > RESERVED_FLOOR_ABOVE_MIB and total < RESERVED_FLOOR_MIB:
        fixed += RESERVED_FLOOR_MIB - total
    return Reservation(activation, decode_max_bs * 2, prefill, fixed)


def mem_fraction_static(gpu_mem_mib: float, utilization: float, reserved: Reservation) -> float:
    """SGLang's default fraction with the GPU's memory scaled by `utilization` (1.0 gives SGLang's own)."""
    return round((gpu_mem_mib * utilization - reserved.total_mib) / gpu_mem_mib, 3)


def pool_tokens(rest_bytes: int, cell_size: int, page_size: int, max_total_tokens: int | None) -> int:
    """max_total_num_tokens: the rest after the weights in cells, whole pages, capped by --max-total-tokens."""
    tokens = max(0, rest_bytes) // cell_size // page_size * page_size
    if max_total_tokens is not None:
        tokens = min(tokens, max_total_tokens // page_size * page_size)
    return tokens
