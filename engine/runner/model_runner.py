"""ModelRunner: load the model on its device, size and allocate the paged KV cache, run forward steps.

Start-up, in order: load weights (measure their bytes), run one profiling forward pass of
max_num_batched_tokens tokens without a KV cache (CUDA: the allocator's peak is the activation
peak), size the KV pool with the planner's rule (`llmdeploy_engine.facts`), allocate one K and
one V tensor [num_blocks, block_size, num_kv_heads, head_dim] per layer. On CPU there is no memory to
measure against: the KV budget is `kv_cache_memory_bytes` (default 4 GiB, as vLLM's CPU KV space).
"""

from __future__ import annotations

import gc
import logging
import os
import time
from typing import Any

import torch
from llmdeploy_engine.config import EngineConfig
from llmdeploy_engine.core.forward_batch import ForwardBatch
from llmdeploy_engine.core.runner_interface import Runner
from llmdeploy_engine.kernels import kv_cache
from llmdeploy_engine.kernels.attention import (
    build_attention_metadata,
    build_profile_metadata,
    pack_aligned,
    profile_batch,
)
from llmdeploy_engine.kernels.quant_linear import Int4Weight, QuantWeight
from llmdeploy_engine.model.model import CausalLM
from llmdeploy_engine.parallel.distributed import (
    SINGLE,
    ParallelState,
    all_reduce_min,
    destroy_parallel,
    init_parallel,
)
from llmdeploy_engine.runner import graph_sizing
from llmdeploy_engine.runner.multi_step import DecodeWindow
from llmdeploy_engine.runner.setup import (
    QUANTIZATION_FLAGS,
    check_quantization,
    check_tensor_parallel,
    default_max_num_batched_tokens,
    load_model_config,
    local_kv_heads,
    resolve_device,
    resolve_dtype,
)
from llmdeploy_engine.runner.startup_report import StartupReport
from llmdeploy_engine.runner.window_steps import EagerWindows
from llmdeploy_engine.sampling_params import SamplingParams

logger = logging.getLogger("llmdeploy_engine")

CPU_DEFAULT_KV_CACHE_BYTES = 4 * 2**30
# fp8 KV scale calibration (calculate_kv_scales): 512 tokens in 4 sequences
CALIBRATION_TOKENS = 512
CALIBRATION_SEQ_LEN = 128


class ModelRunner(Runner):
    """One rank's model shard and KV cache. With tensor_parallel_size > 1, rank 0 (the default)
    starts ranks 1..N-1 (`llmdeploy_engine.runner.tp_worker`), which construct theirs with `rank`/`port`.
    `num_kv_blocks`: allocate exactly this many blocks instead of sizing the pool (a speculative
    draft model shares the target's block tables, so it needs the same count)."""

    # execute_multi_step also samples (temperature, top-k/p, min-p) on the device, not only argmax
    multi_step_sampling = True

    def __init__(
        self,
        config: EngineConfig,
        rank: int = 0,
        port: int | None = None,
        *,
        num_kv_blocks: int | None = None,
    ) -> None:
        from llmdeploy_engine.loading.gguf_loader import shared_gguf_reader

        self.workers: Any = None
        try:
            with shared_gguf_reader():  # its config and its weights come from one parse of a GGUF file
                self._init(config, rank, port, num_kv_blocks)
        except BaseException:
            if self.workers is not None:  # workers stuck in a collective: do not leave them behind
                self.workers.close(timeout_s=5.0)
            destroy_parallel(getattr(self, "parallel", SINGLE))
            raise

    def _init(self, config: EngineConfig, rank: int, port: int | None, num_kv_blocks: int | None) -> None:
        start = time.perf_counter()
        tp = config.tensor_parallel_size
        if config.quantization not in QUANTIZATION_FLAGS:
            raise ValueError(
                f"quantization {config.quantization!r} is not supported by the built-in engine; supported: "
                f"{', '.join(q for q in QUANTIZATION_FLAGS if q)} (or unset: read from the checkpoint)"
            )
        self.config = config
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        self.kv_dtype = kv_cache.kv_cache_dtype(config.kv_cache_dtype, self.dtype)
        self.block_size = config.block_size
        self.windows = EagerWindows(self)  # decode windows (multi_step.py), run eagerly
        torch.manual_seed(config.seed)
        held_bytes = 0
        if self.device.type == "cuda":
            # an engine dropped earlier in this process may wait for the cyclic collector (the engine
            # raises its threshold): collect it now, before memory is measured (the planner's GPU
            # tests found ~12 GiB of such engines on fresh machines)
            gc.collect()
            torch.cuda.empty_cache()
            # GPU memory this process still holds (a live engine, the caller's tensors): the KV cache is
            # sized without it, as memory another process holds is (non_torch_bytes)
            held_bytes = torch.cuda.memory_allocated(self.device)

        self.model_config = load_model_config(config.model)
        check_quantization(config.quantization, self.model_config, self.device)
        check_tensor_parallel(self.model_config, tp)
        self.rank = rank
        if self.device.type == "cpu" and config.cpu_threads is not None:
            torch.set_num_threads(config.cpu_threads)  # tensor-parallel workers split these (tp_worker.py)
        if self.device.type == "cpu":
            logger.info("CPU steps run on %d torch thread(s)", torch.get_num_threads())
        self.parallel: ParallelState = SINGLE
        if tp > 1:
            self._start_parallel(tp, rank, port)
        if (
            config.max_model_len is not None
            and config.max_model_len > self.model_config.max_position_embeddings
        ):
            raise ValueError(
                f"max_model_len {config.max_model_len} exceeds the model's context "
                f"({self.model_config.max_position_embeddings}); lower max_model_len"
            )
        self.model = self._load_model()
        weights_bytes = sum(p.numel() * p.element_size() for p in self.model.parameters())
        # quantized projections hold their weights in buffers (quant_linear.py); a tied compact LM head
        # shares its buffers with the embedding (gguf_compact.py), counted once
        seen: set[int] = set()
        for w in self.model.modules():
            if isinstance(w, QuantWeight):
                buffers = list(w.buffers())
                shared = sum(b.numel() * b.element_size() for b in buffers if b.data_ptr() in seen)
                seen.update(b.data_ptr() for b in buffers)
                weights_bytes += w.stored_bytes() - shared
        load_time_s = time.perf_counter() - start

        model_len = config.max_model_len or self.model_config.max_position_embeddings
        self.max_num_batched_tokens = config.max_num_batched_tokens or default_max_num_batched_tokens(
            model_len
        )
        peak_activation_bytes, non_torch_bytes, total_bytes = self._profile(model_len)
        if kv_cache.is_fp8(self.kv_dtype) and config.calculate_kv_scales:
            self._calibrate_kv_scales()

        from llmdeploy_engine import facts

        mc = self.model_config
        self.num_local_kv_heads = local_kv_heads(mc.num_key_value_heads, tp)
        self.kv_bytes_per_token = facts.kv_bytes_per_token(  # per rank
            mc.num_hidden_layers, self.num_local_kv_heads, mc.head_dim, self.kv_dtype.itemsize
        )
        graph_reserve = graph_sizing.cuda_graph_reserve(
            config, self.model_config, self.device, self.dtype, self.kv_dtype, model_len
        )
        explicit = config.kv_cache_memory_bytes
        if self.device.type == "cpu" and explicit is None:
            explicit = CPU_DEFAULT_KV_CACHE_BYTES
        kv_budget = facts.kv_cache_bytes(
            total_bytes,
            config.gpu_memory_utilization,
            weights_bytes,
            peak_activation_bytes,
            non_torch_bytes + held_bytes,
            cuda_graph_bytes=graph_reserve,
            kv_cache_memory_bytes=explicit,
        )
        self.num_kv_blocks = facts.num_kv_blocks(kv_budget, self.kv_bytes_per_token, self.block_size)
        if num_kv_blocks is not None:
            self.num_kv_blocks = num_kv_blocks
            kv_budget = num_kv_blocks * self.block_size * self.kv_bytes_per_token
        # every rank must hold the same blocks: the smallest pool of all ranks
        self.num_kv_blocks = all_reduce_min(self.num_kv_blocks, self.parallel, self.device)
        if self.num_kv_blocks < 1:
            raise ValueError(
                f"no memory left for the KV cache (budget {kv_budget / 2**30:.2f} GiB after "
                f"{weights_bytes / 2**30:.2f} GiB weights and {peak_activation_bytes / 2**30:.2f} GiB activations"
                + (
                    f", {held_bytes / 2**30:.2f} GiB this process held before the engine started"
                    if held_bytes
                    else ""
                )
                + "); raise gpu_memory_utilization or kv_cache_memory_bytes, or use a smaller model"
            )
        self.max_model_len = self._max_model_len(model_len)
        # CUDA graphs pad a batch up to a captured size: the padding rows write and read one block of
        # their own past the pool (the scheduler never hands it out), 2 MiB for an 8B model at 16
        # tokens a block, inside the graphs' fixed reserve (facts.CUDA_GRAPH_FIXED_BYTES)
        graphs = self.device.type == "cuda" and not config.enforce_eager
        self.padding_block: int | None = self.num_kv_blocks if graphs else None
        self.kv_caches = self._allocate_kv_cache()
        self.startup_report = StartupReport(
            device=self.device.type,
            dtype=str(self.dtype).removeprefix("torch."),
            weights_bytes=weights_bytes,
            peak_activation_bytes=peak_activation_bytes,
            non_torch_bytes=non_torch_bytes,
            held_bytes=held_bytes,
            kv_cache_bytes=kv_budget,
            kv_bytes_per_token=self.kv_bytes_per_token,
            num_kv_blocks=self.num_kv_blocks,
            block_size=self.block_size,
            max_model_len=self.max_model_len,
            max_concurrency=facts.max_concurrency(self.num_kv_blocks, self.block_size, self.max_model_len),
            load_time_s=load_time_s,
            kv_cache_dtype=str(self.kv_dtype).removeprefix("torch."),
            cuda_graph_reserved_bytes=graph_reserve,
        )
        for line in self.startup_report.log_lines():
            logger.info(line)

    def _start_parallel(self, tp: int, rank: int, port: int | None) -> None:
        if self.device.type == "cuda":
            visible = torch.cuda.device_count()
            if tp > visible:
                raise ValueError(
                    f"tensor_parallel_size {tp} exceeds the {visible} visible GPU(s); "
                    "lower tensor_parallel_size or make more GPUs visible (CUDA_VISIBLE_DEVICES)"
                )
            self.device = torch.device("cuda", rank)
        elif self.device.type != "cpu":
            raise ValueError(f"tensor parallelism runs on cuda or cpu, not {self.device.type}")
        if rank == 0:
            from llmdeploy_engine.parallel import distributed
            from llmdeploy_engine.runner.tp_worker import WorkerGroup

            port = distributed.free_port()
            self.workers = WorkerGroup.start(self.config, port, self.device.type)
        elif port is None:
            raise ValueError("a tensor-parallel worker needs the rendezvous port")
        self.parallel = init_parallel(
            rank,
            tp,
            port,
            self.device,
            graph_sizing.symm_mem_bytes(self.config.max_num_seqs, self.model_config.hidden_size),
            graph_sizing.gather_bytes(self.config.max_num_seqs, self.model_config.vocab_size, tp, self.dtype),
            self.config.tp_all_reduce,
        )

    def graph_logits_rows(self) -> int:
        """Rows up to which decode CUDA graphs compute their logits inside (graph_sizing.py)."""
        return graph_sizing.graph_logits_rows(self.parallel, self.model_config.vocab_size, self.dtype)

    @property
    def graphs_with_tensor_parallel(self) -> bool:
        """Whether decode steps may be captured in CUDA graphs at this tensor-parallel size."""
        return graph_sizing.graphs_with_tensor_parallel(self.parallel)

    def capture_graphs_on_workers(self) -> None:
        """Tell ranks 1..N-1 to capture their CUDA graphs now (rank 0 captures right after)."""
        if self.workers is not None:
            self.workers.send(("capture_graphs",))

    def close(self) -> None:
        """Stop the tensor-parallel workers and leave the process group (no-op at tp 1). Every rank
        leaves at the same time: with symmetric memory the teardown waits for all ranks (measured on
        2 H200s: a worker leaving alone hung until rank 0 left too)."""
        if self.workers is not None:
            self.workers.request_close()
        try:
            destroy_parallel(self.parallel)
        finally:
            self.parallel = SINGLE
            if self.workers is not None:
                self.workers.close()

    # phase: load
    def _load_model(self) -> CausalLM:
        from llmdeploy_engine.loading import random_weights

        mc = self.model_config
        with torch.device("meta"):
            model = CausalLM(mc, self.parallel).to(self.dtype)
        model = model.to_empty(device=self.device)
        if mc.tie_word_embeddings:
            model.lm_head.weight = model.model.embed_tokens.weight
        model.reset_rope()
        for layer in model.model.layers:
            layer.self_attn.reset_kv_scales(self.device)
        if random_weights.is_random(self.config.model):
            random_weights.init_random_weights(model, self.config.seed)
        elif self._compact_gguf():
            from llmdeploy_engine.loading.gguf_compact import load_compact

            counts = load_compact(model, self.config.model)
            logger.info("GGUF weights kept compact on the CPU (tensors per kernel: %s)", counts)
        else:
            model.load_weights(self._checkpoint_weights())
        repacked = sum(w.repack_tinygemm() for w in model.modules() if isinstance(w, Int4Weight))
        if repacked:
            logger.info(
                "int4 weights of %d projections repacked for tinygemm (torch._weight_int4pack_mm)", repacked
            )
        return model.eval()

    def _compact_gguf(self) -> bool:
        from llmdeploy_engine.loading.gguf_compact import use_compact

        c = self.config
        return use_compact(c.cpu_weights, self.device, c.model, c.tensor_parallel_size)

    def _checkpoint_weights(self) -> dict[str, torch.Tensor]:
        if self.config.model.endswith(".gguf"):
            from llmdeploy_engine.loading.gguf_loader import load_gguf

            return load_gguf(self.config.model)[1]
        from llmdeploy_engine.loading.hf_loader import load_hf

        return load_hf(self.config.model)[1]

    # phase: measure
    def _profile(self, model_len: int) -> tuple[int, int, int]:
        """(peak activation bytes, non-torch bytes, total device bytes)."""
        if self.device.type != "cuda":
            return 0, 0, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        n = self.max_num_batched_tokens
        # the server's path: a prefill step of n tokens in sequences of up to model_len, its K/V written
        # to a paged cache and attended in place (the varlen kernel, linear in the tokens). Every layer
        # shares one scratch cache of n tokens, allocated before the baseline: the real cache is budgeted
        # apart, so only what the step itself allocates counts as activation
        batch = profile_batch(n, model_len, self.block_size)
        mc = self.model_config
        kv_heads = local_kv_heads(mc.num_key_value_heads, self.parallel.world_size)
        scratch_blocks = sum(len(table) for table in batch.block_tables)
        scratch_shape = (scratch_blocks, self.block_size, kv_heads, mc.head_dim)
        scratch = (
            torch.zeros(scratch_shape, dtype=self.kv_dtype, device=self.device),
            torch.zeros(scratch_shape, dtype=self.kv_dtype, device=self.device),
        )
        ids = torch.zeros(n, dtype=torch.long, device=self.device)
        positions = torch.tensor(batch.positions, dtype=torch.long, device=self.device)
        meta = build_attention_metadata(batch, self.block_size, self.device)
        num_rows = min(self.config.max_num_seqs, n)
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        before = torch.cuda.memory_allocated(self.device)
        with torch.inference_mode():
            hidden = self.model(ids, positions, meta, [scratch] * mc.num_hidden_layers)
            self.model.compute_logits(hidden[:num_rows])
        torch.cuda.synchronize(self.device)
        peak = torch.cuda.max_memory_allocated(self.device) - before
        del scratch, meta, hidden
        free, total = torch.cuda.mem_get_info(self.device)
        non_torch = max(0, (total - free) - torch.cuda.memory_reserved(self.device))
        torch.cuda.empty_cache()
        return peak, non_torch, total

    def _calibrate_kv_scales(self) -> None:
        """Per-layer fp8 scales from the |K| / |V| maxima of one cache-free prefill of fixed pseudo-random
        tokens (CALIBRATION_TOKENS, in sequences of CALIBRATION_SEQ_LEN so several see position 0).
        Runs before any CUDA graph is captured; the scale buffers are updated in place."""
        n = min(CALIBRATION_TOKENS, self.max_num_batched_tokens)
        gen = torch.Generator().manual_seed(self.config.seed)
        ids = torch.randint(0, self.model_config.vocab_size, (n,), generator=gen).to(self.device)
        positions = torch.arange(n, device=self.device) % CALIBRATION_SEQ_LEN
        meta = build_profile_metadata(n, CALIBRATION_SEQ_LEN, self.device)
        attns = [layer.self_attn for layer in self.model.model.layers]
        for attn in attns:
            attn.kv_observer = kv_cache.KVAmaxObserver(self.device)
        try:
            with torch.inference_mode():
                self.model(ids, positions, meta, None)
        finally:
            observers = [attn.kv_observer for attn in attns]
            for attn in attns:
                attn.kv_observer = None
        for attn, obs in zip(attns, observers, strict=True):
            assert obs is not None
            attn.k_scale.copy_(kv_cache.calibrated_scale(obs.k_amax, self.kv_dtype))
            attn.v_scale.copy_(kv_cache.calibrated_scale(obs.v_amax, self.kv_dtype))
        k_scales = torch.cat([a.k_scale for a in attns]).tolist()
        v_scales = torch.cat([a.v_scale for a in attns]).tolist()
        logger.info(
            "fp8 KV scales from %d calibration tokens: k %.3g..%.3g, v %.3g..%.3g",
            n, min(k_scales), max(k_scales), min(v_scales), max(v_scales),
        )  # fmt: skip

    def _max_model_len(self, model_len: int) -> int:
        capacity = self.num_kv_blocks * self.block_size
        if self.config.max_model_len is None:
            return min(model_len, capacity)
        if self.config.max_model_len > capacity:
            raise ValueError(
                f"max_model_len {self.config.max_model_len} needs more KV cache than is available "
                f"({capacity} tokens); lower max_model_len or raise gpu_memory_utilization / kv_cache_memory_bytes"
            )
        return self.config.max_model_len

    def _allocate_kv_cache(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        mc = self.model_config
        blocks = self.num_kv_blocks + (self.padding_block is not None)
        shape = (blocks, self.block_size, self.num_local_kv_heads, mc.head_dim)
        # zeros, not empty: padded context positions read slot 0 and must never hold NaN
        return [
            (
                torch.zeros(shape, dtype=self.kv_dtype, device=self.device),
                torch.zeros(shape, dtype=self.kv_dtype, device=self.device),
            )
            for _ in range(mc.num_hidden_layers)
        ]

    # phase: run
    def execute_multi_step(
        self,
        batch: ForwardBatch,
        num_steps: int,
        params: list[SamplingParams] | None = None,
        seed: int | None = None,
    ) -> list[list[int]]:
        """A decode window run eagerly (EagerWindows.run)."""
        return self.windows.run(batch, num_steps, params, seed)

    def launch_multi_step(
        self,
        batch: ForwardBatch,
        num_steps: int,
        params: list[SamplingParams] | None = None,
        seed: int | None = None,
        follow: DecodeWindow | None = None,
        follow_rows: list[int] | None = None,
    ) -> DecodeWindow:
        """`execute_multi_step` without waiting for the ids (EagerWindows.launch)."""
        return self.windows.launch(batch, num_steps, params, seed, follow, follow_rows)

    @torch.inference_mode()
    def execute(self, batch: ForwardBatch) -> torch.Tensor:
        """float32 logits [len(batch.logit_rows()), vocab]; writes the new K/V to batch.slot_mapping."""
        n = batch.num_tokens
        rows = batch.logit_rows()
        # ids, positions and logit rows in one host-to-device copy, each 16-byte aligned (Triton
        # kernels reading positions would otherwise compile a variant per parity of n)
        ids, positions, row_index = pack_aligned(
            [batch.input_ids, batch.positions, rows], torch.long, self.device
        )
        meta = build_attention_metadata(batch, self.block_size, self.device)
        if len(rows) == n and rows == list(range(n)):
            return self.model.compute_logits(self.model(ids, positions, meta, self.kv_caches))
        # the last layer's output projection and MLP run on the logit rows only (CausalLM.forward);
        # a step that samples nothing (a long prompt's middle chunk) keeps one row, not zero
        keep = row_index if rows else torch.arange(n - 1, n, device=self.device)
        hidden = self.model(ids, positions, meta, self.kv_caches, keep)
        return self.model.compute_logits(hidden if rows else hidden[:0])
