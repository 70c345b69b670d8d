"""ModelRunner: one rank's model and paged KV cache on its device, running forward steps.

Start-up checks the device, dtype, quantization and tensor-parallel split (setup.py), starts the
tensor-parallel ranks, then calls startup.py's functions in order: load the model, profile its
memory, size the KV cache, allocate it; the runner keeps their frozen results."""

from __future__ import annotations

import gc
import logging
import time
from typing import Any

import torch
from llmdeploy_engine import facts
from llmdeploy_engine.config import EngineConfig
from llmdeploy_engine.core.forward_batch import ForwardBatch
from llmdeploy_engine.core.runner_interface import WindowRunner
from llmdeploy_engine.kernels import kv_cache
from llmdeploy_engine.kernels.attention import (
    build_attention_metadata,
    pack_aligned,
)
from llmdeploy_engine.parallel.distributed import (
    SINGLE,
    ParallelState,
    destroy_parallel,
    init_parallel,
)
from llmdeploy_engine.runner import graph_sizing, startup
from llmdeploy_engine.runner.setup import (
    QUANTIZATION_FLAGS,
    check_quantization,
    check_tensor_parallel,
    load_model_config,
    resolve_device,
    resolve_dtype,
)
from llmdeploy_engine.runner.startup_report import StartupReport
from llmdeploy_engine.runner.window_steps import EagerWindows

logger = logging.getLogger("llmdeploy_engine")


class ModelRunner(WindowRunner):
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
        # start-up in order (startup.py): load, profile, size the KV cache, allocate it
        loaded = startup.load_model(config, self.model_config, self.parallel, self.device, self.dtype)
        self.model = loaded.model
        load_time_s = time.perf_counter() - start
        model_len = facts.requested_context_len(
            config.max_model_len, self.model_config.max_position_embeddings
        )
        self.max_num_batched_tokens = config.max_num_batched_tokens or facts.default_max_num_batched_tokens(
            model_len
        )
        memory = startup.profile_memory(
            self.model,
            config,
            self.model_config,
            self.parallel,
            self.device,
            self.kv_dtype,
            self.max_num_batched_tokens,
            model_len,
        )
        if kv_cache.is_fp8(self.kv_dtype) and config.calculate_kv_scales:
            startup.calibrate_kv_scales(
                self.model, config, self.model_config, self.device, self.kv_dtype, self.max_num_batched_tokens
            )
        graph_reserve = graph_sizing.cuda_graph_reserve(
            config, self.model_config, self.device, self.dtype, self.kv_dtype, model_len
        )
        size = startup.size_kv_cache(
            config,
            self.model_config,
            self.parallel,
            self.device,
            self.kv_dtype,
            loaded,
            memory,
            held_bytes,
            graph_reserve,
            num_kv_blocks,
        )
        self.kv_cache_size = size
        self.num_kv_blocks = size.num_kv_blocks
        self.num_local_kv_heads = size.num_local_kv_heads
        self.kv_bytes_per_token = size.kv_bytes_per_token
        self.max_model_len = size.max_model_len
        self.padding_block: int | None = size.padding_block
        self.kv_caches = startup.allocate_kv_cache(
            size, self.model_config, self.block_size, self.kv_dtype, self.device
        )
        self.startup_report = StartupReport(
            device=self.device.type,
            dtype=str(self.dtype).removeprefix("torch."),
            weights_bytes=loaded.weights_bytes,
            peak_activation_bytes=memory.peak_activation_bytes,
            non_torch_bytes=memory.non_torch_bytes,
            held_bytes=held_bytes,
            kv_cache_bytes=size.kv_cache_bytes,
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

    # phase: run (decode windows: WindowRunner hands them to self.windows)
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
