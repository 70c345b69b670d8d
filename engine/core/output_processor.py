"""Sampled tokens into sequences and RequestOutputs: the per-token stop checks, logprobs, structured
outputs' grammars, and the outputs each request's output_kind asks for."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from llmdeploy_engine.core.request_state import RequestState
from llmdeploy_engine.core.scheduler import Scheduler, SchedulerOutput
from llmdeploy_engine.core.sequence import UNFINISHED, Sequence, SequenceStatus
from llmdeploy_engine.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
from llmdeploy_engine.sampling_params import RequestOutputKind

logger = logging.getLogger("llmdeploy_engine")


class OutputProcessor:
    """Turns a step's sampled tokens into its requests' sequences and outputs; counts the tokens and
    finished requests. `requests` is the engine's table of live requests (finished ones leave it
    here); `grammar_mask(matchers)` fills the constrained rows' bitmask (LLMEngine's, which owns the
    grammar compiler)."""

    def __init__(
        self,
        scheduler: Scheduler,
        sampler: Any,
        tokenizer: Any,
        speculator: Any,
        requests: dict[str, RequestState],
        grammar_mask: Callable[[list[Any]], Any],
    ) -> None:
        self.scheduler = scheduler
        self.block_manager = scheduler.block_manager
        self.sampler = sampler
        self.tokenizer = tokenizer
        self.speculator = speculator
        self.requests = requests
        self._grammar_mask = grammar_mask
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.num_requests_finished = 0

    def process_window(self, out: SchedulerOutput, sampled: list[list[int]]) -> list[RequestOutput]:
        """After a decode window: per sequence, step k's token is appended (its fed token now counts as
        computed) through the per-token stop checks; a stop drops the later steps' tokens, and their
        KV, never counted as computed, is never registered in the prefix cache. (The per-token path
        of `_append_token`, inlined; a window never holds a sequence's first token.)"""
        now = time.time()
        bm = self.block_manager
        bs = bm.block_size
        requests = self.requests
        touched: dict[str, RequestState] = {}
        finished_any = False
        num_appended = 0
        columns: list[tuple[int, ...]] | None = None
        for i, entry in enumerate(out.scheduled):
            seq = entry.seq
            if seq.is_finished:
                # asynchronous windows: it stopped in the window before this one, or was aborted
                continue
            req = requests[seq.request_id]
            checker = req.checkers[seq.index]
            if checker.deferred:
                # no stop strings and no per-token text: the window's tokens in one call, the same
                # outcome as the loop below (StopChecker.on_window_tokens)
                if columns is None:
                    columns = list(zip(*sampled, strict=True))
                tokens = columns[i]
                num_tokens = len(seq.token_ids)  # the counts' properties, inline
                kept, status = checker.on_window_tokens(
                    tokens, num_tokens - seq.num_prompt_tokens, num_tokens
                )
                seq.token_ids.extend(tokens[:kept])  # first: the blocks registered below hash them
                before = seq.num_computed_tokens
                seq.num_computed_tokens += kept
                if seq.num_computed_tokens // bs != before // bs:
                    bm.cache_full_blocks(seq)
                num_appended += kept
            else:
                num_prompt = seq.num_prompt_tokens
                status = None
                for step_tokens in sampled:
                    seq.num_computed_tokens += 1
                    if seq.num_computed_tokens % bs == 0:
                        bm.cache_full_blocks(seq)
                    token_id = step_tokens[i]
                    seq.append_token(token_id)
                    num_appended += 1
                    num_tokens = seq.num_tokens
                    status = checker.on_token(token_id, num_tokens - num_prompt, num_tokens)
                    if status is not None:
                        break
            if status is not None:
                seq.stop_reason = checker.stop_reason
                self.scheduler.finish(seq, status)
                finished_any = True
            req.metrics.last_token_time = now
            touched[req.request_id] = req
        self.generation_tokens_total += num_appended
        return self._collect_outputs(touched, now, finished_any)

    def process_verified(self, out: SchedulerOutput, logits: Any) -> list[RequestOutput]:
        """Speculative step: append each sequence's verified tokens through the per-token stop checks;
        a stop inside the accepted run ends it there."""
        assert self.speculator is not None
        now = time.time()
        touched: dict[str, RequestState] = {}
        self._mask_verified_rows(out, logits)
        for v in self.speculator.verify(out, logits, self.requests):
            req = self.requests[v.seq.request_id]
            for token_id, lp in zip(v.token_ids, v.logprobs, strict=True):
                self._append_token(v.seq, req, token_id, lp, now)
                if v.seq.is_finished:
                    break
            if v.num_proposed and not v.seq.is_finished:
                self.scheduler.accept_speculative(v.seq, len(v.token_ids) - 1)
            touched[req.request_id] = req
        return self._collect_outputs(touched, now)

    def process_samples(self, out: SchedulerOutput, logits: Any) -> list[RequestOutput]:
        seqs = out.sampled_seqs
        if not seqs:
            return []
        requests = self.requests
        reqs = [requests[s.request_id] for s in seqs]
        no_history: list[int] = []
        # the forward pass was launched: the host fills the constrained rows' masks meanwhile
        grammar = self._grammar_mask(
            [r.matchers[s.index] if r.matchers is not None else None for s, r in zip(seqs, reqs, strict=True)]
        )
        sampled = self.sampler.sample(
            logits,
            [s.params for s in seqs],
            [r.prompt_token_ids if r.needs_history else no_history for r in reqs],
            [s.output_token_ids if r.needs_history else no_history for s, r in zip(seqs, reqs, strict=True)],
            [r.generators[s.index] for s, r in zip(seqs, reqs, strict=True)],
            **({} if grammar is None else {"grammar": grammar}),  # samplers without grammars stay valid
        )
        now = time.time()
        touched: dict[str, RequestState] = {}
        finished_any = False
        # the per-token path of _append_token, inlined: this loop runs once per output token
        for seq, req, token_id, lp in zip(seqs, reqs, sampled.token_ids, sampled.logprobs, strict=True):
            seq.append_token(token_id)
            num_output = seq.num_output_tokens
            metrics = req.metrics
            if num_output == 1 and seq.index == 0:
                self.prompt_tokens_total += seq.num_prompt_tokens
                metrics.num_cached_prompt_tokens = seq.num_cached_tokens
            if metrics.first_token_time is None:
                metrics.first_token_time = now
            metrics.last_token_time = now
            if lp is not None:
                self._record_logprobs(req, seq.index, token_id, lp)
            checker = req.checkers[seq.index]
            status = checker.on_token(token_id, num_output, seq.num_tokens)
            if req.matchers is not None and grammar_ends(req.matchers[seq.index], token_id, status):
                status = SequenceStatus.FINISHED_STOPPED
            if status is not None:
                seq.stop_reason = checker.stop_reason
                self.scheduler.finish(seq, status)
                finished_any = True
            touched[req.request_id] = req
        self.generation_tokens_total += len(seqs)
        return self._collect_outputs(touched, now, finished_any)

    def _append_token(
        self, seq: Sequence, req: RequestState, token_id: int, lp: dict[int, Logprob] | None, now: float
    ) -> bool:
        """Append one token through the stop checks; True when it finished the sequence."""
        seq.append_token(token_id)
        self.generation_tokens_total += 1
        if seq.num_output_tokens == 1 and seq.index == 0:
            self.prompt_tokens_total += seq.num_prompt_tokens
            req.metrics.num_cached_prompt_tokens = seq.num_cached_tokens
        if req.metrics.first_token_time is None:
            req.metrics.first_token_time = now
        req.metrics.last_token_time = now
        if lp is not None:
            self._record_logprobs(req, seq.index, token_id, lp)
        checker = req.checkers[seq.index]
        status = checker.on_token(token_id, seq.num_output_tokens, seq.num_tokens)
        if req.matchers is not None and grammar_ends(req.matchers[seq.index], token_id, status):
            status = SequenceStatus.FINISHED_STOPPED
        if status is None:
            return False
        seq.stop_reason = checker.stop_reason
        self.scheduler.finish(seq, status)
        return True

    def _mask_verified_rows(self, out: SchedulerOutput, logits: Any) -> None:
        """Speculative step: constrained sequences get no proposals (Speculator.set_proposals), so each
        has one logits row; mask those rows as `Sampler.sample` would."""
        entries = [e for e in out.scheduled if e.samples]
        counts = out.batch.num_logits or [1] * len(entries)
        matchers: list[Any] = []
        for e, count in zip(entries, counts, strict=True):
            req = self.requests[e.seq.request_id]
            m = req.matchers[e.seq.index] if req.matchers is not None else None
            assert m is None or count == 1, "a constrained sequence was given draft tokens"
            matchers.extend([m] + [None] * (count - 1))
        grammar = self._grammar_mask(matchers)
        if grammar is not None:
            grammar.apply(logits)

    def _collect_outputs(
        self, touched: dict[str, RequestState], now: float, finished_any: bool = True
    ) -> list[RequestOutput]:
        """Outputs of the touched requests (none for an unfinished FINAL_ONLY one); finished requests
        leave the engine. finished_any False skips the finished checks (no sequence stopped)."""
        results = []
        final_only = RequestOutputKind.FINAL_ONLY
        for req in touched.values():
            if finished_any and req.finished:
                req.metrics.finished_time = now
                del self.requests[req.request_id]
                self.num_requests_finished += 1
            elif req.params.output_kind is final_only:
                continue  # nobody reads an unfinished FINAL_ONLY output
            results.append(self.make_output(req))
        return results

    def finish_aborted(self, req: RequestState) -> RequestOutput:
        """The final output of a request the engine aborted (its sequences already left the scheduler)."""
        req.metrics.finished_time = time.time()
        self.num_requests_finished += 1
        return self.make_output(req)

    def _record_logprobs(
        self, req: RequestState, index: int, token_id: int, lp: dict[int, Logprob] | None
    ) -> None:
        store = req.logprobs[index]
        if store is None or lp is None:
            return
        for tid, entry in lp.items():
            if entry.decoded_token is None:
                entry.decoded_token = self.tokenizer.token_text(tid)
        store.append(lp)
        if token_id in lp:
            req.cumulative_logprobs[index] += lp[token_id].logprob

    def make_output(self, req: RequestState) -> RequestOutput:
        completions = []
        delta = req.params.output_kind is RequestOutputKind.DELTA
        all_finished = True
        for seq, checker in zip(req.seqs, req.checkers, strict=True):
            status = seq.status
            finished = status not in UNFINISHED  # seq.is_finished, inline (per request and step)
            all_finished = all_finished and finished
            lps = req.logprobs[seq.index]
            text = checker.visible_text(finished)
            token_ids = seq.output_token_ids
            lp_list = list(lps) if lps is not None else None
            if delta:
                sent_chars, sent_tokens, sent_lps = req.sent[seq.index]
                req.sent[seq.index] = (len(text), len(token_ids), len(lp_list or ()))
                text, token_ids = text[sent_chars:], token_ids[sent_tokens:]
                lp_list = lp_list[sent_lps:] if lp_list is not None else None
            completions.append(
                CompletionOutput(
                    index=seq.index,
                    text=text,
                    token_ids=token_ids,
                    cumulative_logprob=req.cumulative_logprobs[seq.index] if lps is not None else None,
                    logprobs=lp_list,
                    finish_reason=status.value if finished else None,  # status.finish_reason
                    stop_reason=seq.stop_reason,
                )
            )
        m = req.metrics
        metrics = object.__new__(RequestMetrics)  # a copy: the engine keeps updating its own
        metrics.__dict__.update(m.__dict__)
        return RequestOutput(
            request_id=req.request_id,
            prompt=req.prompt,
            prompt_token_ids=req.prompt_token_ids,  # never changed after add: shared, not copied
            outputs=completions,
            finished=all_finished,
            metrics=metrics,
            num_cached_tokens=m.num_cached_prompt_tokens,
        )


def grammar_ends(matcher: Any, token_id: int, status: SequenceStatus | None) -> bool:
    """Advance a sequence's grammar by its new token; True when that must end the sequence although
    the stop checks did not (its grammar is complete, e.g. with ignore_eos; or the token was refused,
    which the mask rules out)."""
    if status is not None:
        return False
    if not matcher.accept(token_id):
        logger.error("token %d was refused by the sequence's grammar; the sequence stops here", token_id)
        return True
    return bool(matcher.is_terminated)
