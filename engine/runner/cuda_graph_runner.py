"""CUDA graphs for decode steps: capture the model's forward once per (batch size, context bucket) at
start-up, then replay it for pure-decode batches; everything else runs eagerly through ModelRunner.
LLMEngine wraps its CUDA runner in this unless `enforce_eager` is set.

Why: an eager decode step launches about 50 kernels per layer from Python, and on the H200 the host
takes ~15-30 us per launch while each kernel runs ~2 us, so single-stream decode
is bound by the host. A replay launches the whole step at once.

Shapes are fixed per graph: the batch is padded up to the next captured batch size and decode
contexts to the bucket's number of KV blocks (masked, as the eager path pads to the longest context).
Padding rows take row 0's token at position 0 and write and read only the runner's padding block,
one KV block past the pool that the scheduler never hands out (`ModelRunner.padding_block`): each
attends to one key (a few in a window's later steps) instead of a real sequence's whole context, and
no sequence's cache is touched; their outputs are dropped. A runner without that block (tests' fakes)
gets the older layout: padding rows repeat row 0 (token, position, slot, block table) and rewrite row
0's K/V into row 0's own slot, reading row 0's context again.

Uniform multi-token batches (every sequence feeds q new tokens and wants their logits, as
speculative verification does) replay the same graphs: each new token is one row that attends to
its own prefix (context length = its position + 1) through its sequence's block table, so n
sequences x q tokens use the graph of the next batch size >= n * q. All K/V of the step are written
before attention reads, so row j sees rows 0..j-1 of its sequence: causal attention, as the eager
prefill-with-context path computes it.

Host cost per replay: the step's inputs are written with numpy into one pinned host buffer and sent
with one non-blocking copy (the buffer is rewritten only after that copy has completed, checked by
an event). Graphs of up to `CUDA_GRAPH_LOGITS_MAX_BATCH` rows also compute the logits (lm_head and
the float cast) into one float32 buffer shared by those graphs, so a single-stream step launches
nothing but the copy and the replay; the returned logits are a view of that buffer, valid until the
next `execute`. Larger graphs return hidden states and the logits are computed eagerly (one matmul).

Short prefills (and other uniform multi-token steps) when the decode graphs take one token per
sequence: a second set of graphs, captured with RoPE, the KV store and attention as two launches,
serves batches of up to `PREFILL_GRAPH_ROWS` rows whose contexts fit the bucket of that many tokens
(a 128-token prompt is one replay of the 128-row graph instead of ~15 us of host time for each of
its ~400 eager launches); the logits of the rows that need them are computed after the replay. Its
largest row count is the largest decode batch size, so the planner's graph memory still covers it.

Multi-step decoding (`execute_multi_step`, num_scheduler_steps > 1): a decode window replays one
graph, picked for the context of the window's LAST step, once per step. Every step's positions,
slots and context lengths (and the block tables, once) are known on the host, packed into a second
pinned buffer and sent in one copy; per step, a device copy moves that step's inputs into the graph's
static buffers, the input ids are the previous step's argmax (gathered so padding rows take row 0's
token: without a padding block they rewrite row 0's slot, which must get row 0's K/V), and the argmax
lands in an [N, b] device tensor read back once at the end.

Memory: the planner's builtin rule (`cuda_graph_bytes`) sets the graphs' memory aside before the KV
cache is sized; after capture the measured figure is added to the start-up report.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import torch
from llmdeploy_engine.core.forward_batch import ForwardBatch
from llmdeploy_engine.core.runner_interface import WindowRunner
from llmdeploy_engine.facts import (
    CUDA_GRAPH_LOGITS_MAX_BATCH,
    cuda_graph_batch_sizes,
    cuda_graph_context_buckets,
)
from llmdeploy_engine.model.sampler import fast_argmax_rows
from llmdeploy_engine.runner.decode_graph import CaptureReport, _DecodeGraph
from llmdeploy_engine.runner.graph_inputs import pack_decode_inputs, spaced_rows, warm_up_batch
from llmdeploy_engine.runner.graph_windows import GraphWindows

PREFILL_GRAPH_ROWS = (16, 32, 64, 128, 256)
logger = logging.getLogger("llmdeploy_engine")


class CudaGraphRunner(WindowRunner):
    """Wraps a CUDA ModelRunner (`runner`); `execute` has the runner's contract and the Runner
    interface's values are the wrapped runner's. Decode windows run on its `windows` (GraphWindows)."""

    multi_step_sampling = True  # execute_multi_step takes per-sequence params and a seed

    def __init__(
        self,
        runner: Any,
        batch_sizes: tuple[int, ...] | None = None,
        max_blocks: int | None = None,
        logits_max_batch: int = CUDA_GRAPH_LOGITS_MAX_BATCH,
        multi_token_rows: bool | None = None,
        prefill_rows: tuple[int, ...] | None = None,
    ) -> None:
        """multi_token_rows: whether steps of several new tokens per sequence (speculative verification)
        replay the graphs; None: when the runner's config has a speculative_config. Graphs without
        them run RoPE, the KV store and decode attention in one kernel (attention.fused_rope_decode);
        with them those stay two launches, as a row reads the K/V other rows store.
        prefill_rows: row counts of the extra multi-token-row graphs for short prefills when the decode
        graphs take one token per sequence (None: PREFILL_GRAPH_ROWS up to the largest batch size;
        () for none); each is captured for the context buckets up to its own number of tokens."""
        if runner.device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device")
        if multi_token_rows is None:
            multi_token_rows = (
                getattr(getattr(runner, "config", None), "speculative_config", None) is not None
            )
        self.multi_token_rows = multi_token_rows
        self.runner = runner
        self.take_values(runner)
        self.padding_block: int | None = getattr(runner, "padding_block", None)
        if max_blocks is None:
            self.block_buckets = cuda_graph_context_buckets(runner.max_model_len, self.block_size)
        else:
            self.block_buckets = cuda_graph_context_buckets(max_blocks * self.block_size, self.block_size)
        if batch_sizes is None:  # the planner's sizes for max_num_seqs (it reserves their memory)
            batch_sizes = cuda_graph_batch_sizes(runner.config.max_num_seqs)
        self.batch_sizes = tuple(b for b in batch_sizes if b <= runner.config.max_num_seqs)
        self.logits_max_batch = logits_max_batch
        self.graphs: dict[tuple[int, int], _DecodeGraph] = {}
        if multi_token_rows:
            prefill_rows = ()  # the decode graphs take multi-token steps themselves
        elif prefill_rows is None:
            prefill_rows = tuple(r for r in PREFILL_GRAPH_ROWS if r <= max(self.batch_sizes, default=0))
        self.prefill_rows = tuple(sorted(prefill_rows))
        self.prefill_graphs: dict[tuple[int, int], _DecodeGraph] = {}
        self.num_replays = 0
        size = max(b * (4 + nb) for b in self.batch_sizes for nb in self.block_buckets)
        self._host = torch.zeros(size, dtype=torch.long, pin_memory=True)
        self._host_np = self._host.numpy()
        self._copied = torch.cuda.Event()
        self._logits: torch.Tensor | None = None  # shared output of the graphs that compute logits
        self.windows = GraphWindows(self)  # multi-step windows: their own buffers
        self.report = self._capture_all()
        logger.info(self.report.log_line())
        self.startup_report = self._extend_startup_report()
        self.warm_prefill_lens = self._warm_eager_prefill()

    def release_graphs(self) -> None:
        """Drop the captured graphs (before a tensor-parallel group is destroyed); execute runs eagerly
        afterwards."""
        for g in (*self.graphs.values(), *self.prefill_graphs.values()):
            g.graph.reset()
        self.graphs.clear()
        self.prefill_graphs.clear()
        self.batch_sizes = self.prefill_rows = ()

    def close(self) -> None:
        """Release the graphs, then close the wrapped runner (tensor-parallel workers and group)."""
        self.release_graphs()
        self.runner.close()

    def _extend_startup_report(self) -> Any:
        """The runner's StartupReport with the graphs' measured memory and time (the runner's too)."""
        report = getattr(self.runner, "startup_report", None)
        if report is None or not dataclasses.is_dataclass(report):
            return report
        report = dataclasses.replace(
            report,
            num_cuda_graphs=self.report.num_graphs,
            cuda_graph_bytes=self.report.memory_bytes,
            cuda_graph_capture_s=self.report.capture_time_s,
        )
        self.runner.startup_report = report
        if report.cuda_graph_bytes > report.cuda_graph_reserved_bytes:
            logger.warning(
                "CUDA graphs took %.2f GiB, more than the %.2f GiB set aside for them before the KV "
                "cache was sized; lower gpu_memory_utilization if the device runs out of memory",
                report.cuda_graph_bytes / 2**30,
                report.cuda_graph_reserved_bytes / 2**30,
            )
        return report

    @torch.inference_mode()
    def _capture_all(self) -> CaptureReport:
        device = self.runner.device
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_reserved(device)
        start = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        rows = min(self.logits_max_batch, max(self.batch_sizes, default=0))
        if rows:
            vocab = self.runner.model_config.vocab_size
            self._logits = torch.empty(rows, vocab, dtype=torch.float32, device=device)
        # one warm-up stream for all graphs: each new stream would get its own cuBLAS workspace and
        # its own cached blocks in the allocator
        side = torch.cuda.Stream(device)
        # largest first, so smaller graphs reuse the pool's blocks
        for b in sorted(self.batch_sizes, reverse=True):
            for nb in sorted(self.block_buckets, reverse=True):
                g = _DecodeGraph(b, nb, self.block_size, device, one_token_per_seq=not self.multi_token_rows)
                with_logits = b <= self.logits_max_batch
                side.wait_stream(torch.cuda.current_stream(device))
                with torch.cuda.stream(side):  # warm-up outside the capture (library handles, workspaces)
                    hidden = self._forward(g)
                    if with_logits:
                        self.runner.model.compute_logits(hidden)
                torch.cuda.current_stream(device).wait_stream(side)
                with torch.cuda.graph(g.graph, pool=pool):
                    g.hidden = self._forward(g)
                    if with_logits:
                        assert self._logits is not None
                        g.logits = self._logits[:b]
                        g.logits.copy_(self.runner.model.compute_logits(g.hidden))
                self.graphs[(b, nb)] = g
        for b, nb in sorted(self.prefill_keys(), reverse=True):
            g = _DecodeGraph(b, nb, self.block_size, device, one_token_per_seq=False)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                self._forward(g)
            torch.cuda.current_stream(device).wait_stream(side)
            with torch.cuda.graph(g.graph, pool=pool):
                g.hidden = self._forward(g)  # logits after the replay, for the rows that need them
            self.prefill_graphs[(b, nb)] = g
        fast_argmax = fast_argmax_rows()
        if fast_argmax is not None and self._logits is not None:
            # the window sampler's greedy pick compiled (or loaded) now, not in the first request
            fast_argmax(self._logits[:1], torch.empty(1, dtype=torch.long, device=device))
        torch.cuda.synchronize(device)
        return CaptureReport(
            len(self.graphs) + len(self.prefill_graphs),
            time.perf_counter() - start,
            torch.cuda.memory_reserved(device) - before,
            len(self.prefill_graphs),
        )

    @torch.inference_mode()
    def _warm_eager_prefill(self) -> list[int]:
        """Run the eager path once for each attention-kernel variant a prefill step may pick (one
        prompt of each of attention.warm_query_lens's lengths), and on CUDA once for each decode
        launch a step mixing a prompt with decodes may make (`_mixed_decode_shapes`), every K/V
        written to the padding block and the logits dropped, so that none compiles in the middle of
        serving: steps that mix prefills with decodes run eagerly, and the first one whose longest
        query fell in a new class held every stream up for 0.46-0.61 s. With tensor parallelism every
        rank runs the same steps (their all-reduces pair up). Returns the prompt lengths."""
        if self.padding_block is None:
            return []
        from llmdeploy_engine.kernels.attention import warm_query_lens

        mc = self.runner.model_config
        group = max(1, mc.num_attention_heads // max(1, mc.num_key_value_heads))
        limit = min(self.runner.max_num_batched_tokens, self.runner.max_model_len)
        pad, bs = self.padding_block, self.block_size
        lens = warm_query_lens(group, limit)
        start = time.perf_counter()
        for q in lens:
            self.runner.execute(warm_up_batch(q, [], pad, bs))
        # the decode rows of mixed steps: paged_decode's variants (splits, configuration) by their
        # count and longest context
        mixed = self._mixed_decode_shapes() if self.runner.device.type == "cuda" else []
        for n, blocks in mixed:  # contexts filling `blocks` blocks, never past max_model_len
            context = min(blocks * bs, self.runner.max_model_len)
            self.runner.execute(warm_up_batch(2, [context] * n, pad, bs))
        if self.runner.device.type == "cuda":
            torch.cuda.synchronize(self.runner.device)
        logger.info(
            "eager warm-up: prompts of %s tokens, mixed steps with (decodes, context blocks) %s, in %.2f s",
            lens, mixed, time.perf_counter() - start,
        )  # fmt: skip
        return lens

    def _mixed_decode_shapes(self) -> list[tuple[int, int]]:
        """(decode rows, context blocks) of one mixed step per distinct paged_decode launch (splits,
        configuration) that a step with a prefill and 1..max_num_seqs - 1 decodes may make."""
        from llmdeploy_engine.kernels import triton_attention as ta

        runner = self.runner
        k_cache = runner.kv_caches[0][0]
        kv_heads = int(k_cache.shape[2])
        fp8 = k_cache.dtype in ta.FP8_DTYPES
        max_blocks = -(-runner.max_model_len // self.block_size)
        # from MAX_SPLITS * MIN_SPLIT_TOKENS tokens on, the context no longer changes the splits
        max_blocks = min(max_blocks, -(-ta.MAX_SPLITS * ta.MIN_SPLIT_TOKENS // self.block_size) + 1)
        seen: dict[tuple[int, Any], tuple[int, int]] = {}
        for n in range(1, runner.config.max_num_seqs):
            config = ta.decode_config(fp8, n, kv_heads)
            for blocks in range(1, max_blocks + 1):
                splits = ta.choose_num_splits(
                    n, kv_heads, blocks * self.block_size, k_cache.device, config.programs_per_sm
                )
                seen.setdefault((splits, config), (n, blocks))
        return sorted(seen.values())

    def prefill_keys(self) -> list[tuple[int, int]]:
        """(rows, context blocks) of the short-prefill graphs: each row count with the buckets up to
        the one that holds that many tokens."""
        keys = []
        for b in self.prefill_rows:
            need = -(-b // self.block_size)
            top = next((nb for nb in self.block_buckets if nb >= need), self.block_buckets[-1])
            keys += [(b, nb) for nb in self.block_buckets if nb <= top]
        return keys

    def _forward(self, g: _DecodeGraph) -> torch.Tensor:
        out: torch.Tensor = self.runner.model(g.ids, g.positions, g.meta(), self.runner.kv_caches)
        return out

    def _pick(self, batch: ForwardBatch) -> _DecodeGraph | None:
        """The graph for a uniform batch (every sequence feeds q new tokens, every sequence samples;
        one new token: after at least one cached token), or None. A graph of batch size B serves n
        sequences x q tokens when n * q <= B: each token is a row that attends to its own prefix
        (speculative verification replays the decode graphs this way, and a prompt's prefill the
        short-prefill graphs when the decode graphs take one token per sequence)."""
        n = batch.num_seqs
        if n == 0:
            return None
        q = batch.query_len[0]
        if any(x != q for x in batch.query_len) or (q == 1 and any(c <= 1 for c in batch.context_len)):
            return None
        if batch.sample_indices != list(range(n)):
            return None
        need = -(-max(batch.context_len) // self.block_size)
        # the decode graphs fuse the KV store into attention (one token per sequence) unless they take
        # multi-token rows: other steps go to the short-prefill graphs, where they hold the step
        short = q > 1 and not self.multi_token_rows
        sizes, graphs = (self.prefill_rows, self.prefill_graphs) if short else (self.batch_sizes, self.graphs)
        b = next((s for s in sizes if s >= n * q), None)
        nb = next((s for s in self.block_buckets if s >= need), None)
        return None if b is None or nb is None else graphs.get((b, nb))

    def _fill(self, g: _DecodeGraph, batch: ForwardBatch) -> int:
        """Write the graph's packed inputs into the pinned host buffer; returns their length."""
        self._copied.synchronize()  # the previous step's copy has left the buffer
        return pack_decode_inputs(
            self._host_np, batch, g.batch_size, g.num_blocks, self.padding_block, self.block_size
        )

    @torch.inference_mode()
    def execute(self, batch: ForwardBatch) -> torch.Tensor:
        """float32 logits [len(batch.logit_rows()), vocab], as ModelRunner.execute. From a graph that
        computes logits the result is (a view of) a shared buffer: valid until the next call."""
        g = self._pick(batch)
        if g is None:
            result: torch.Tensor = self.runner.execute(batch)
            return result
        size = self._fill(g, batch)
        g.packed.copy_(self._host[:size], non_blocking=True)
        self._copied.record()
        g.graph.replay()
        self.num_replays += 1
        rows = batch.logit_rows()
        source = g.logits if g.logits is not None else g.hidden
        assert source is not None
        spaced = spaced_rows(rows)
        # evenly spaced rows (every token, or the last of each sequence's q tokens) are a view: no
        # index kernel (whose module a process loads on first use: ~20 ms in the first request)
        # and no host-to-device copy of the row numbers
        picked = source[spaced] if spaced is not None else source[torch.tensor(rows, device=source.device)]
        if g.logits is not None:
            return picked.contiguous()
        logits: torch.Tensor = self.runner.model.compute_logits(picked)
        return logits
