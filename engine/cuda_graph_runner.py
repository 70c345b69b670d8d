"""CUDA graphs for decode steps: capture the model's forward once per (batch size, context bucket) at
start-up, then replay it for pure-decode batches; everything else runs eagerly through ModelRunner.
LLMEngine wraps its CUDA runner in this unless `enforce_eager` is set.

Why: an eager decode step launches about 50 kernels per layer from Python, and on the H200 the host
takes ~15-30 us per launch while each kernel runs ~2 us (docs/gpu-notes.md), so single-stream decode
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
import itertools
import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from llmdeploy_engine.attention import AttentionMetadata
from llmdeploy_engine.facts import (
    CUDA_GRAPH_LOGITS_MAX_BATCH,
    cuda_graph_batch_sizes,
    cuda_graph_context_buckets,
)
from llmdeploy_engine.forward_batch import ForwardBatch
from llmdeploy_engine.multi_step import (
    NO_CAP,
    DecodeWindow,
    check_decode_window,
    check_follow_rows,
    last_step_batch,
    pack_window_steps,
)
from llmdeploy_engine.runner_interface import Runner
from llmdeploy_engine.sampler import WindowSampler, fast_argmax_rows
from llmdeploy_engine.sampling_params import SamplingParams
from llmdeploy_engine.window_steps import device_window

PREFILL_GRAPH_ROWS = (16, 32, 64, 128, 256)
logger = logging.getLogger("llmdeploy_engine")


@dataclass(frozen=True)
class PackedTables:
    """The block tables a window was packed with, kept for the window that follows it: rows [n, nb]
    as packed (zeros past each row's blocks), blocks per row and each row's last block id."""

    window: DecodeWindow
    tables: np.ndarray
    lens: np.ndarray
    lasts: np.ndarray


@dataclass(frozen=True)
class CaptureReport:
    num_graphs: int
    capture_time_s: float
    memory_bytes: int  # device memory reserved by the graphs' pool (and capture) beyond what was there
    num_prefill_graphs: int = 0  # of num_graphs: the multi-token-row graphs for short prefills

    def log_line(self) -> str:
        prefill = f" (+{self.num_prefill_graphs} for short prefills)" if self.num_prefill_graphs else ""
        return (
            f"Captured {self.num_graphs - self.num_prefill_graphs} CUDA graphs for decode{prefill} in "
            f"{self.capture_time_s:.2f} s, {self.memory_bytes / 2**30:.2f} GiB"
        )


class _DecodeGraph:
    """Static inputs (one packed int64 buffer, so a step needs one host-to-device copy) and the graph."""

    def __init__(
        self, batch_size: int, num_blocks: int, block_size: int, device: torch.device, one_token_per_seq: bool
    ) -> None:
        self.batch_size, self.num_blocks = batch_size, num_blocks
        self.one_token_per_seq = one_token_per_seq
        b = batch_size
        self.packed = torch.zeros(b * (4 + num_blocks), dtype=torch.long, device=device)
        self.ids, self.positions = self.packed[:b], self.packed[b : 2 * b]
        self.slots, self.lengths = self.packed[2 * b : 3 * b], self.packed[3 * b : 4 * b]
        self.blocks = self.packed[4 * b :]
        self.token_index = torch.arange(b, device=device)
        self.key_pos = torch.arange(num_blocks * block_size, device=device)
        self.lengths.fill_(1)
        self.graph = torch.cuda.CUDAGraph()
        self.hidden: torch.Tensor | None = None
        self.logits: torch.Tensor | None = None  # view of the shared logits buffer, if computed inside

    def meta(self) -> AttentionMetadata:
        mask = self.key_pos[None, :] < self.lengths[:, None]
        return AttentionMetadata(
            slot_mapping=self.slots,
            decode_token_index=self.token_index,
            decode_blocks=self.blocks,
            decode_mask=mask[:, None, None, :],
            prefills=(),
            decode_lengths=self.lengths.to(torch.int32),  # inside the capture: once per replay
            decodes_in_order=True,  # token_index is arange(batch_size)
            decode_one_token_per_seq=self.one_token_per_seq,
        )


class CudaGraphRunner(Runner):
    """Wraps a CUDA ModelRunner; `execute` has the runner's contract. The Runner interface's values are
    the wrapped runner's; other attributes pass through."""

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
        self.block_size: int = runner.block_size
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
        # multi-step windows: their own pinned buffer (grown on demand), event and device copy
        self._window_host = torch.zeros(0, dtype=torch.long)
        self._window_dev: torch.Tensor | None = None
        self._window_copied = torch.cuda.Event()
        self._packed: PackedTables | None = None  # the last window's block tables
        self.report = self._capture_all()
        logger.info(self.report.log_line())
        self.startup_report = self._extend_startup_report()
        self.warm_prefill_lens = self._warm_eager_prefill()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.runner, name)

    @property
    def device(self) -> Any:  # type: ignore[override]
        return self.runner.device

    @property
    def max_num_batched_tokens(self) -> int | None:  # type: ignore[override]
        return self.runner.max_num_batched_tokens

    @property
    def model_config(self) -> Any:
        return self.runner.model_config

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
        query fell in a new class held every stream up for 0.46-0.61 s (runs 75-76,
        docs/gpu-notes.md v15). With tensor parallelism every rank runs the same steps (their
        all-reduces pair up). Returns the prompt lengths."""
        if self.padding_block is None:
            return []
        from llmdeploy_engine.attention import warm_query_lens

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
        from llmdeploy_engine import triton_attention as ta

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
        # index kernel (whose module a process loads on first use: ~20 ms in the first request, v8
        # run 27) and no host-to-device copy of the row numbers
        picked = source[spaced] if spaced is not None else source[torch.tensor(rows, device=source.device)]
        if g.logits is not None:
            return picked.contiguous()
        logits: torch.Tensor = self.runner.model.compute_logits(picked)
        return logits

    @torch.inference_mode()
    def execute_multi_step(
        self,
        batch: ForwardBatch,
        num_steps: int,
        params: list[SamplingParams] | None = None,
        seed: int | None = None,
    ) -> list[list[int]]:
        """A decode window (multi_step.py): num_steps steps replayed from one graph, each fed the
        tokens the previous step chose on the device (as ModelRunner.execute_multi_step: argmax, or
        `WindowSampler` draws after the replay); the ids [num_steps][num_seqs] after one sync.
        Batches no graph serves run the wrapped runner's eager window."""
        return self.launch_multi_step(batch, num_steps, params, seed).result()

    @torch.inference_mode()
    def launch_multi_step(
        self,
        batch: ForwardBatch,
        num_steps: int,
        params: list[SamplingParams] | None = None,
        seed: int | None = None,
        follow: DecodeWindow | None = None,
        follow_rows: list[int] | None = None,
    ) -> DecodeWindow:
        """`execute_multi_step` without waiting for the ids (as ModelRunner.launch_multi_step). With
        `follow`, step 0's ids are gathered from its last step's ids on the device (padding rows take
        row 0's source row, so they keep repeating row 0)."""
        cap = self.runner.max_model_len - 1  # a sequence at the longest context repeats its last step
        check_decode_window(batch, num_steps, self.block_size, cap)
        check_follow_rows(follow, follow_rows, batch.num_seqs)
        g = self._pick(last_step_batch(batch, num_steps, cap))
        if g is None:
            window: DecodeWindow = self.runner.launch_multi_step(
                batch, num_steps, params, seed, follow, follow_rows
            )
            return window
        n, b, nb = batch.num_seqs, g.batch_size, g.num_blocks
        step0 = b * (4 + nb)
        size = window_size(b, nb, num_steps)
        total = size + (b if follow is not None else 0)
        host = self._window_buffer(total)
        prev = self._packed if follow is not None and self._packed is not None else None
        following = (prev, follow_rows) if prev is not None and prev.window is follow else None
        pack_decode_window(host, batch, num_steps, b, nb, self.block_size, cap, self.padding_block, following)
        if follow_rows is not None:
            host[size : size + n] = follow_rows
            host[size + n : total] = follow_rows[0]
        if self._window_dev is None or self._window_dev.numel() < total:
            self._window_dev = torch.empty(
                self._window_host.numel(), dtype=torch.long, device=g.packed.device
            )
        dev = self._window_dev[:total]
        dev.copy_(self._window_host[:total], non_blocking=True)
        self._window_copied.record()
        gather = dev[step0 : step0 + b]
        later_dev = dev[step0 + b : size].view(max(num_steps - 1, 0), 3 * b)
        sampled = torch.empty(num_steps, n, dtype=torch.long, device=g.packed.device)
        sampler = WindowSampler(params, self.runner.model_config.vocab_size, g.packed.device, seed)
        g.packed.copy_(dev[:step0])
        if follow is not None:
            torch.index_select(follow.last_ids, 0, dev[size:total], out=g.ids)
        for k in range(num_steps):
            if k:
                g.packed[b : 4 * b].copy_(later_dev[k - 1])
                torch.index_select(sampled[k - 1], 0, gather, out=g.ids)
            g.graph.replay()
            if g.logits is not None:
                logits = g.logits[:n]
            else:
                assert g.hidden is not None
                logits = self.runner.model.compute_logits(g.hidden[:n])
            sampler.sample(logits, sampled[k])
        self.num_replays += num_steps
        window = device_window(sampled)
        self._packed = packed_tables(window, host[4 * b : 4 * b + n * nb].reshape(n, nb), batch)
        return window

    def _window_buffer(self, size: int) -> np.ndarray:
        """The window's pinned host buffer as numpy, at least `size` long, once the previous window's
        copy has left it."""
        self._window_copied.synchronize()
        if self._window_host.numel() < size:
            self._window_host = torch.zeros(size, dtype=torch.long, pin_memory=True)
        return self._window_host.numpy()


def warm_up_batch(prompt_len: int, decode_contexts: list[int], pad: int, block_size: int) -> ForwardBatch:
    """A prompt of prompt_len tokens and one decode row per context in decode_contexts, every slot and
    block the padding block `pad` (writes of positions past one block collide; the outputs are
    dropped). The start-up warm-ups' steps."""
    ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    query_start: list[int] = []
    query_len: list[int] = []
    context_len: list[int] = []
    tables: list[list[int]] = []
    for first, count in [(0, prompt_len), *((c - 1, 1) for c in decode_contexts)]:
        query_start.append(len(ids))
        ids += [0] * count
        positions += range(first, first + count)
        slots += [pad * block_size + p % block_size for p in range(first, first + count)]
        query_len.append(count)
        context_len.append(first + count)
        tables.append([pad] * -(-(first + count) // block_size))
    return ForwardBatch(
        input_ids=ids,
        positions=positions,
        slot_mapping=slots,
        query_start=query_start,
        query_len=query_len,
        context_len=context_len,
        block_tables=tables,
        sample_indices=list(range(len(query_len))),
    )


def follow_tables(
    out: np.ndarray, lens: np.ndarray, block_tables: list[list[int]], prev: PackedTables, rows: list[int]
) -> bool:
    """Pack the block tables of a window that follows `prev`'s window (row i continues prev's row
    rows[i]) into out [n, nb] from prev's packed rows, rewriting only the rows whose number of blocks
    or last block changed (a window's reservation appends blocks; flattening every table again was
    most of a follow-on's packing at 256 sequences). False, with nothing written, when prev's width
    differs or a table does not fit nb: the caller packs them all. A running sequence's blocks never
    change between a window and its follow-on (no preemption or re-admission runs in between, and
    blocks are shared only when full), so equal counts and last blocks mean equal tables."""
    n, nb = out.shape
    if prev.tables.shape[1] != nb or (n and int(lens.max()) > nb):
        return False
    index = np.asarray(rows, dtype=np.int64)
    np.take(prev.tables, index, axis=0, out=out)
    lasts = last_blocks(block_tables, n)
    stale = np.flatnonzero((lens != prev.lens[index]) | (lasts != prev.lasts[index]))
    for i in stale.tolist():
        table = block_tables[i]
        out[i] = 0
        out[i, : len(table)] = table
    return True


def last_blocks(block_tables: list[list[int]], n: int) -> np.ndarray:
    """Each of the n tables' last block id (-1 for an empty table)."""
    return np.fromiter((t[-1] if t else -1 for t in block_tables), dtype=np.int64, count=n)


def packed_tables(window: DecodeWindow, tables: np.ndarray, batch: ForwardBatch) -> PackedTables:
    """What `follow_tables` needs of a window just packed: a copy of its rows (the host buffer is
    rewritten by the next window), blocks per row (cut to the width) and each row's last block."""
    n, nb = tables.shape
    lens = np.fromiter(map(len, batch.block_tables), dtype=np.int64, count=n)
    np.minimum(lens, nb, out=lens)
    lasts = last_blocks(batch.block_tables, n)
    return PackedTables(window, tables.copy(), lens, lasts)


def spaced_rows(rows: list[int]) -> slice | None:
    """`rows` as a slice when they are evenly spaced and increasing (every token of a step, or the last
    token of each of its sequences of q tokens: q - 1, 2q - 1, ...), else None."""
    if not rows:
        return None
    step = rows[1] - rows[0] if len(rows) > 1 else 1
    if step <= 0 or rows != list(range(rows[0], rows[-1] + 1, step)):
        return None
    return slice(rows[0], rows[-1] + 1, step)


def window_size(b: int, nb: int, num_steps: int) -> int:
    """int64 values `pack_decode_window` writes for a graph of b rows and nb context blocks."""
    return b * (4 + nb) + b + (num_steps - 1) * 3 * b


def pack_decode_window(
    out: np.ndarray,
    batch: ForwardBatch,
    num_steps: int,
    b: int,
    nb: int,
    block_size: int,
    max_position: int = NO_CAP,
    padding_block: int | None = None,
    following: tuple[PackedTables, list[int]] | None = None,
) -> int:
    """Lay a decode window out for a graph of b rows and nb blocks: step 0 exactly as
    `pack_decode_inputs` packs it (ids, positions, slots, lengths, block tables), then the padding
    gather index (b: rows past the batch take row 0's sampled token), then per later step its
    positions, slots and lengths (3 x b; padding rows at positions 1, 2, ... of the padding block).
    `following`: the tables of the window this one follows and, per row, its row there; the block
    tables are then taken from those rows (`follow_tables`). Returns the number of int64 written."""
    n = batch.num_seqs
    step0 = pack_decode_inputs(out, batch, b, nb, padding_block, block_size, following)
    out[step0 : step0 + n] = np.arange(n)
    out[step0 + n : step0 + b] = 0
    size = window_size(b, nb, num_steps)
    later = out[step0 + b : size].reshape(num_steps - 1, 3, b)
    pack_window_steps(
        later, out[4 * b : step0].reshape(b, nb), out[b : 2 * b], num_steps, block_size, max_position
    )
    return size


def pack_decode_inputs(
    out: np.ndarray,
    batch: ForwardBatch,
    b: int,
    nb: int,
    padding_block: int | None = None,
    block_size: int = 0,
    following: tuple[PackedTables, list[int]] | None = None,
) -> int:
    """Lay a uniform batch out as a graph of b rows and nb context blocks reads it, one row per new
    token: ids, positions, slots, context lengths (position + 1: each token sees its own prefix; b
    each), then b x nb block ids (each token's sequence's table, cut to nb and padded with block 0).
    Rows past the batch's tokens take row 0's token at position 0 of `padding_block` (slot, length 1,
    a table of that block only); without one they repeat row 0. `following` (one token per
    sequence): see `follow_tables`. Returns the number of int64 written."""
    n, rows = batch.num_seqs, batch.num_tokens
    positions = np.asarray(batch.positions, dtype=np.int64)
    padded = (batch.input_ids[0], 0, padding_block * block_size, 1) if padding_block is not None else None
    for k, values in enumerate((batch.input_ids, positions, batch.slot_mapping, positions + 1)):
        out[k * b : k * b + rows] = values
        out[k * b + rows : (k + 1) * b] = values[0] if padded is None else padded[k]
    tables = out[4 * b : 4 * b + b * nb].reshape(b, nb)
    q = batch.query_len[0]
    per_seq = tables[:n] if q == 1 else np.empty((n, nb), dtype=np.int64)
    lens = np.fromiter(map(len, batch.block_tables), dtype=np.int64, count=n)
    if q == 1 and following is not None and follow_tables(per_seq, lens, batch.block_tables, *following):
        tables[rows:] = tables[0] if padding_block is None else padding_block
        return b * (4 + nb)
    per_seq[:] = 0
    if n and int(lens.max()) > nb:
        cut = [t[:nb] for t in batch.block_tables]
        lens = np.minimum(lens, nb)
    else:
        cut = batch.block_tables
    total = int(lens.sum())
    flat = np.fromiter(itertools.chain.from_iterable(cut), dtype=np.int64, count=total)
    seq_rows = np.repeat(np.arange(n), lens)
    cols = np.arange(total) - np.repeat(np.cumsum(lens) - lens, lens)
    per_seq[seq_rows, cols] = flat
    if q != 1:
        tables[:rows] = np.repeat(per_seq, q, axis=0)
    tables[rows:] = tables[0] if padding_block is None else padding_block
    return b * (4 + nb)
