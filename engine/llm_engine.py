"""LLMEngine: requests in, one scheduled forward pass per `step()`, RequestOutputs out.

Each request's `SamplingParams.output_kind` says what it gets back: CUMULATIVE (default; everything so
far, every step it advanced), DELTA (what is new since its previous output) or FINAL_ONLY (one output
at finish; no per-step outputs are built, and without stop strings no per-token detokenization).

A step (`step()`): the scheduler picks the sequences and their tokens; the window policy
(core/window_policy.py) says whether they run as a decode window of several steps on the device, maybe
launched ahead of the last one's outputs (core/decode_windows.py), or as one forward pass on the
runner, or as a speculative step whose draft tokens the target model verifies (spec_decode/); the
output processor (core/output_processor.py) turns the tokens into sequences and RequestOutputs.

Owns each of those objects: the model runner (runner_interface.Runner; runner/stack.build_runner), the
block manager, scheduler, window policy, decode windows, output processor, sampler and tokenizer. Single-threaded: every call must come from one thread (AsyncLLMEngine runs it
on its own loop thread).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

from llmdeploy_engine.config import EngineConfig
from llmdeploy_engine.core.block_manager import BlockManager
from llmdeploy_engine.core.decode_windows import DecodeWindows
from llmdeploy_engine.core.gc_tuning import raise_gc_threshold
from llmdeploy_engine.core.output_processor import OutputProcessor
from llmdeploy_engine.core.request_state import EngineStats, RequestState, window_kind
from llmdeploy_engine.core.runner_interface import Runner
from llmdeploy_engine.core.scheduler import Scheduler, SchedulerConfig
from llmdeploy_engine.core.sequence import Sequence
from llmdeploy_engine.core.stop_checker import StopChecker
from llmdeploy_engine.core.window_policy import WindowPolicy
from llmdeploy_engine.grammars import Grammars
from llmdeploy_engine.outputs import RequestMetrics, RequestOutput
from llmdeploy_engine.runner.stack import build_runner
from llmdeploy_engine.sampling_params import SamplingParams

__all__ = ["EngineStats", "LLMEngine"]

logger = logging.getLogger("llmdeploy_engine")


class LLMEngine:
    def __init__(
        self,
        config: EngineConfig,
        *,
        runner: Runner | None = None,
        tokenizer: Any = None,
        sampler: Any = None,
    ) -> None:
        from llmdeploy_engine.loading.gguf_loader import shared_gguf_reader

        self.config = config
        with shared_gguf_reader():  # the runner and the tokenizer parse a GGUF file once
            if runner is None:
                runner = build_runner(config)
            self.runner = runner
            if tokenizer is None:
                from llmdeploy_engine.loading.tokenizer import Tokenizer

                tokenizer = Tokenizer.from_model(config.tokenizer or config.model)
        self.tokenizer = tokenizer
        if sampler is None:
            from llmdeploy_engine.model.sampler import Sampler

            sampler = Sampler(set(tokenizer.eos_token_ids), runner.device)
        self.sampler = sampler
        self.max_model_len = runner.max_model_len
        self.block_manager = BlockManager(
            runner.num_kv_blocks, runner.block_size, config.enable_prefix_caching
        )
        sched_config = SchedulerConfig.from_engine(config, self.max_model_len)
        runner_budget = runner.max_num_batched_tokens
        if runner_budget is not None and config.enable_chunked_prefill:
            # never schedule more tokens per step than the runner profiled its activation memory for
            sched_config = dataclasses.replace(sched_config, max_num_batched_tokens=runner_budget)
        self.scheduler = Scheduler(sched_config, self.block_manager)
        self.speculator = None
        if config.speculative_config is not None:
            from llmdeploy_engine.spec_decode.speculator import build_speculator

            self.speculator = build_speculator(config, runner, self.sampler)
        self.requests: dict[str, RequestState] = {}
        model_config = runner.model_config
        self.grammars = Grammars(tokenizer, model_config.vocab_size if model_config is not None else None)
        self.outputs = OutputProcessor(
            self.scheduler, self.sampler, tokenizer, self.speculator, self.requests, self.grammars.mask
        )
        self.window_policy = WindowPolicy.choose(
            config.num_scheduler_steps,
            config.async_scheduling,
            runs_windows=runner.runs_windows,
            launches_windows=runner.launches_windows,
            sampling=runner.multi_step_sampling,
            on_gpu=str(runner.device).startswith("cuda"),
            speculating=self.speculator is not None,
            max_num_seqs=sched_config.max_num_seqs,
            max_model_len=self.max_model_len,
        )
        self.windows = DecodeWindows(
            self.window_policy, runner, self.scheduler, self.sampler, self.outputs, self.requests
        )
        raise_gc_threshold(config.gc_gen0_threshold)

    def close(self) -> None:
        """Release the runner's processes (tensor-parallel workers); the engine is unusable after."""
        self.runner.close()

    # ---- requests -----------------------------------------------------------------------------
    def process_prompt(
        self, prompt: str | list[int], params: SamplingParams
    ) -> tuple[str | None, list[int], int]:
        """Tokenize and validate; returns (prompt text, token ids, effective max_tokens).

        Raises ValueError with a user-facing message (the server answers 400).
        """
        if isinstance(prompt, str):
            text: str | None = prompt
            ids = self.tokenizer.encode(prompt)
        else:
            text, ids = None, [int(t) for t in prompt]
        if not ids:
            raise ValueError("the prompt is empty")
        vocab = getattr(self.tokenizer, "vocab_size", None)
        if vocab is not None and any(not 0 <= t < vocab for t in ids):
            raise ValueError(f"prompt token ids must be in [0, {vocab})")
        n_prompt = len(ids)
        if n_prompt >= self.max_model_len:
            raise ValueError(
                f"This model's maximum context length is {self.max_model_len} tokens, but the prompt has "
                f"{n_prompt} tokens; shorten the prompt to at most {self.max_model_len - 1} tokens."
            )
        max_tokens = params.max_tokens if params.max_tokens is not None else self.max_model_len - n_prompt
        if n_prompt + max_tokens > self.max_model_len:
            raise ValueError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                f"{n_prompt + max_tokens} tokens ({n_prompt} in the prompt, {max_tokens} for the completion). "
                "Please reduce the length of the prompt or max_tokens."
            )
        return text, ids, max_tokens

    def grammar_compiler(self) -> Any:
        """The structured-output compiler for this engine's tokenizer (Grammars.compiler: built once,
        on first use; any thread may call it and its `compile`)."""
        return self.grammars.compiler()

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams,
        arrival_time: float | None = None,
    ) -> None:
        text, ids, max_tokens = self.process_prompt(prompt, params)
        self.add_processed_request(request_id, text, ids, params, max_tokens, arrival_time)

    def add_processed_request(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        params: SamplingParams,
        max_tokens: int,
        arrival_time: float | None = None,
    ) -> None:
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        arrival = time.time() if arrival_time is None else arrival_time
        matchers = None
        if params.structured_outputs is not None:
            compiler = self.grammar_compiler()
            compiled = compiler.compile(params.structured_outputs)  # a cache hit when the server compiled it
            matchers = [compiler.matcher(compiled) for _ in range(params.n)]
        eos = set() if params.ignore_eos else set(self.tokenizer.eos_token_ids)
        seqs: list[Sequence] = []
        for i in range(params.n):
            parent = seqs[0] if seqs else None
            seqs.append(
                Sequence(request_id, prompt_token_ids, params, index=i, arrival_time=arrival, parent=parent)
            )
        req = RequestState(
            request_id=request_id,
            prompt=prompt,
            prompt_token_ids=list(prompt_token_ids),
            params=params,
            seqs=seqs,
            checkers=[
                StopChecker(
                    params,
                    # seeded with the prompt's tail so the first token's leading space survives
                    self.tokenizer.incremental_decoder(
                        params.skip_special_tokens, prompt_token_ids=prompt_token_ids
                    ),
                    eos,
                    max_tokens,
                    self.max_model_len,
                )
                for _ in seqs
            ],
            generators=[
                None if params.seed is None else self.sampler.make_generator(params.seed + i)
                for i in range(params.n)
            ],
            metrics=RequestMetrics(arrival_time=arrival),
            logprobs=[[] if params.logprobs is not None else None for _ in seqs],
            cumulative_logprobs=[0.0 for _ in seqs],
            sent=[(0, 0, 0) for _ in seqs],
            needs_history=params.needs_token_history,
            window_kind=window_kind(params),
            matchers=matchers,
        )
        self.requests[request_id] = req
        if self.scheduler.running:  # it will wait for the windows in flight (WindowPolicy.window_steps)
            self.window_policy.note_arrival()
        for seq in seqs:
            self.scheduler.add(seq)

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Stop a request wherever it is; its blocks are freed. Returns its final output, if it existed."""
        req = self.requests.pop(request_id, None)
        if req is None:
            return None
        self.scheduler.abort(request_id)
        return self.outputs.finish_aborted(req)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def get_num_unfinished_requests(self) -> int:
        return len(self.requests)

    # ---- one step -----------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """One step: schedule, then a decode window (WindowPolicy.plan) or one forward pass on the
        runner, then the sampled tokens into outputs. With asynchronous windows, a window launched
        last step is finished first (its follow-on launched, its tokens processed)."""
        windows = self.windows
        if windows.inflight is not None:
            return windows.finish()
        windows.chained_done_s = None  # a scheduled step breaks the chain of windows
        if self.speculator is not None:
            self.speculator.set_proposals(self.scheduler.running, self._num_tokens_left)
        out = self.scheduler.schedule()
        if out.is_empty:
            return []
        now = time.time()
        for entry in out.scheduled:
            metrics = self.requests[entry.seq.request_id].metrics
            if metrics.first_scheduled_time is None:
                metrics.first_scheduled_time = now
        if self.speculator is not None:
            out = self.speculator.fill(out, self.scheduler, self.requests)
        elif self.window_policy.enabled:
            max_steps, sampled_rows = self.window_policy.plan(out, self.requests, len(self.scheduler.running))
            if max_steps:
                out, outputs = windows.run(out, max_steps, sampled_rows)
                if outputs is not None:
                    return outputs
        logits = self.runner.execute(out.batch)
        self.scheduler.update_computed(out)
        if out.batch.num_logits is not None:
            return self.outputs.process_verified(out, logits)
        return self.outputs.process_samples(out, logits)

    def _num_tokens_left(self, seq: Sequence) -> int:
        checker = self.requests[seq.request_id].checkers[seq.index]
        return min(checker.max_tokens - seq.num_output_tokens, self.max_model_len - seq.num_tokens)

    @property
    def num_scheduler_steps(self) -> int:
        """The fixed decode-window length, or the most steps auto may choose (WindowPolicy)."""
        return self.window_policy.num_scheduler_steps

    @property
    def num_windows_by_steps(self) -> dict[int, int]:
        """Decode windows launched, by number of steps."""
        return self.windows.num_windows_by_steps

    # ---- observability ------------------------------------------------------------------------
    def stats(self) -> EngineStats:
        running = {s.request_id for s in self.scheduler.running}
        pc = self.block_manager.prefix_cache_stats()
        return EngineStats(
            num_requests_running=len(running),
            num_requests_waiting=len(self.requests) - len(running),
            kv_cache_usage=self.block_manager.usage,
            num_kv_blocks=self.block_manager.num_blocks,
            num_free_kv_blocks=self.block_manager.num_free_blocks,
            prefix_cache_queries_tokens=pc.num_query_tokens,
            prefix_cache_hits_tokens=pc.num_hit_tokens,
            num_preemptions=self.scheduler.num_preemptions,
            prompt_tokens_total=self.outputs.prompt_tokens_total,
            generation_tokens_total=self.outputs.generation_tokens_total,
            num_requests_finished=self.outputs.num_requests_finished,
            startup_report=self.runner.startup_report,
            **self._spec_decode_stats(),
        )

    def _spec_decode_stats(self) -> dict[str, Any]:
        if self.speculator is None:
            return {}
        s = self.speculator.stats
        return {
            "spec_decode_num_drafts": s.num_drafts,
            "spec_decode_num_draft_tokens": s.num_draft_tokens,
            "spec_decode_num_accepted_tokens": s.num_accepted_tokens,
            "spec_decode_num_accepted_tokens_per_pos": tuple(s.num_accepted_tokens_per_pos),
        }
