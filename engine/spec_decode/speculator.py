"""The engine's speculative-decoding step helpers: propose before scheduling, fill in draft tokens
after it, verify the target's logits afterwards, and count acceptance.

One step for a decoding sequence with tokens t_0..t_{L-1} (t_{L-1} sampled, its KV not yet written):
the proposer suggests d_1..d_k; the scheduler feeds [t_{L-1}, d_1..d_k] at positions L-1..L+k-1
with slots for all of them; the target returns k + 1 logit rows; verification keeps a prefix of the
drafts plus one token of the target's own; KV at the accepted positions is already right, and the
rest is overwritten later.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from llmdeploy_engine.config import EngineConfig
from llmdeploy_engine.core.scheduler import ScheduledSeq, Scheduler, SchedulerOutput
from llmdeploy_engine.core.sequence import Sequence
from llmdeploy_engine.model.sampler import plain_greedy
from llmdeploy_engine.outputs import Logprob
from llmdeploy_engine.spec_decode.config import SpeculativeConfig
from llmdeploy_engine.spec_decode.draft_proposer import DraftProposer, DraftRequest
from llmdeploy_engine.spec_decode.ngram_proposer import NgramIndex
from llmdeploy_engine.spec_decode.rejection_sampler import verify_greedy, verify_sampled


@dataclass
class SpecDecodeStats:
    """Cumulative acceptance counters (vLLM's spec_decode_* metrics)."""

    num_drafts: int = 0  # sequence-steps that verified at least one proposed token
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)

    def record(self, num_proposed: int, num_accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += num_proposed
        self.num_accepted_tokens += num_accepted
        if len(self.num_accepted_tokens_per_pos) < num_proposed:
            self.num_accepted_tokens_per_pos.extend(
                [0] * (num_proposed - len(self.num_accepted_tokens_per_pos))
            )
        for pos in range(num_accepted):
            self.num_accepted_tokens_per_pos[pos] += 1


@dataclass(frozen=True)
class Verified:
    seq: Sequence
    token_ids: list[int]  # to append, in order (accepted drafts, then the target's token)
    logprobs: list[dict[int, Logprob] | None]
    num_proposed: int


class Speculator:
    def __init__(self, config: SpeculativeConfig, sampler: Any, draft: DraftProposer | None = None) -> None:
        assert (config.method == "draft_model") == (draft is not None)
        self.config = config
        self.sampler = sampler
        self.draft = draft
        self.stats = SpecDecodeStats()
        self._q: dict[int, torch.Tensor] = {}  # this step's draft distributions of sampled sequences
        self._ngram: dict[int, NgramIndex] = {}  # n-gram: each running sequence's lookup index

    # ---- before scheduling --------------------------------------------------------------------
    def set_proposals(self, running: list[Sequence], max_new_tokens: Callable[[Sequence], int]) -> None:
        """Give each decoding sequence its proposal (n-gram) or placeholder slots (draft model).

        `max_new_tokens(seq)`: how many more tokens the sequence may still produce; proposals leave
        room for the target's own token after them."""
        cfg = self.config
        ngram = cfg.method == "ngram"
        if ngram and len(self._ngram) > len(running):  # indexes of sequences no longer running
            live = {seq.seq_id for seq in running}
            self._ngram = {sid: index for sid, index in self._ngram.items() if sid in live}
        for seq in running:
            seq.spec_token_ids = []
            if seq.num_uncomputed_tokens != 1 or seq.num_output_tokens == 0:
                continue
            if seq.params.structured_outputs is not None:
                # its grammar masks one row per step (drafts would need the matcher rolled forward
                # and back per proposal): constrained sequences are not speculated
                continue
            k = min(cfg.num_speculative_tokens, max_new_tokens(seq) - 1)
            if k < 1:
                continue
            if ngram:
                index = self._ngram.get(seq.seq_id)
                if index is None:
                    index = self._ngram[seq.seq_id] = NgramIndex(cfg.prompt_lookup_min, cfg.prompt_lookup_max)
                seq.spec_token_ids = index.propose(seq.token_ids, k)
            else:
                seq.spec_token_ids = [0] * k  # filled in by `fill` once the slots exist

    # ---- after scheduling ---------------------------------------------------------------------
    def fill(self, out: SchedulerOutput, scheduler: Scheduler, requests: dict[str, Any]) -> SchedulerOutput:
        """Draft model: run it over the scheduled sequences' slots and put its tokens in the batch."""
        self._q = {}
        if self.draft is None:
            return out
        self.draft.forget_except({s.seq_id for s in scheduler.running})
        wanted = []
        for e in out.scheduled:
            if e.spec_token_ids:
                req = requests[e.seq.request_id]
                wanted.append(
                    DraftRequest(
                        e.seq,
                        len(e.spec_token_ids),
                        e.seq.params,
                        req.prompt_token_ids,
                        req.generators[e.seq.index],
                    )
                )
        if not wanted:
            return out
        drafts, self._q = self.draft.propose(wanted)
        return scheduler.with_proposals(out, drafts)

    # ---- after the target's forward pass ------------------------------------------------------
    def verify(self, out: SchedulerOutput, logits: torch.Tensor, requests: dict[str, Any]) -> list[Verified]:
        """Every sampled entry's tokens to append; entries without proposals sample one token as usual."""
        entries: list[ScheduledSeq] = [e for e in out.scheduled if e.samples]
        counts = out.batch.num_logits or [1] * len(entries)
        assert logits.shape[0] == sum(counts)
        probs: torch.Tensor | None = None
        if all(plain_greedy(e.seq.params, e.seq.num_output_tokens, logprobs=False) for e in entries):
            # every row's token is its logits' argmax (what Sampler.sample's plain-greedy path takes,
            # and processed_probs' one-hot rows): no distributions, and no copy of each sequence's
            # outputs per row for min_tokens and penalties
            argmax = logits.argmax(dim=-1).tolist()
        else:
            row_params, row_prompts, row_outputs = [], [], []
            for e in entries:
                req = requests[e.seq.request_id]
                base = e.seq.output_token_ids
                for j in range(len(e.spec_token_ids) + 1):
                    row_params.append(e.seq.params)
                    row_prompts.append(req.prompt_token_ids)
                    row_outputs.append(base + list(e.spec_token_ids[:j]))
            probs = self.sampler.processed_probs(logits, row_params, row_prompts, row_outputs)
            argmax = probs.argmax(dim=-1).tolist()
        results: list[Verified] = []
        lp_rows: list[int] = []
        lp_tokens: list[int] = []
        lp_params = []
        offset = 0
        for e in entries:
            seq, drafts = e.seq, list(e.spec_token_ids)
            rows = slice(offset, offset + len(drafts) + 1)
            if seq.params.greedy:
                verdict = verify_greedy(argmax[rows], drafts)
            else:
                gen = requests[seq.request_id].generators[seq.index]
                assert probs is not None  # a sampled row takes the distributions' branch above
                verdict = verify_sampled(probs[rows], drafts, self._q_of(seq), gen)
            if drafts:
                self.stats.record(len(drafts), verdict.num_accepted)
            if seq.params.logprobs is not None:
                for j, tok in enumerate(verdict.token_ids):
                    lp_rows.append(offset + j)
                    lp_tokens.append(tok)
                    lp_params.append(seq.params)
            results.append(Verified(seq, verdict.token_ids, [None] * len(verdict.token_ids), len(drafts)))
            offset += len(drafts) + 1
        if lp_rows:
            lps = iter(self.sampler.raw_logprobs(logits[lp_rows], lp_params, lp_tokens))
            results = [
                dataclasses.replace(v, logprobs=[next(lps) for _ in v.token_ids])
                if v.seq.params.logprobs is not None
                else v
                for v in results
            ]
        return results

    def _q_of(self, seq: Sequence) -> torch.Tensor | None:
        return self._q.get(seq.seq_id)


def build_speculator(config: EngineConfig, runner: Any, sampler: Any) -> Speculator:
    """The speculator for `config.speculative_config`; a draft model gets its own ModelRunner with the
    target's block size and block count."""
    spec = config.speculative_config
    assert isinstance(spec, SpeculativeConfig)
    if spec.method == "ngram":
        return Speculator(spec, sampler)
    from llmdeploy_engine.runner.model_runner import ModelRunner
    from llmdeploy_engine.runner.setup import load_model_config

    assert spec.model is not None
    target_vocab = _vocab_size(runner)
    draft_vocab = load_model_config(spec.model).vocab_size
    if target_vocab is not None and draft_vocab != target_vocab:
        raise ValueError(
            f"speculative_config: the draft model {spec.model!r} has a vocabulary of {draft_vocab} tokens, "
            f"the target {target_vocab}; draft and target must share a tokenizer"
        )
    draft_config = dataclasses.replace(
        config,
        model=spec.model,
        tokenizer=None,
        quantization=None,
        speculative_config=None,
        max_model_len=runner.max_model_len,
        tensor_parallel_size=1,  # the draft runs whole on rank 0's device, as vLLM's default draft TP
    )
    try:
        draft_runner = ModelRunner(draft_config, num_kv_blocks=runner.num_kv_blocks)
        assert draft_runner.block_size == runner.block_size
        assert draft_runner.num_kv_blocks == runner.num_kv_blocks
        proposer_runner: Any = draft_runner
        if draft_runner.device.type == "cuda" and not config.enforce_eager:
            # the draft's steps replay CUDA graphs like the target's decode steps (eagerly, each
            # launched ~300 kernels from Python: a small draft's step cost more host time than the 8B
            # target's whole decode step); multi-token rows: its first step feeds the 1 to k + 1
            # tokens verification appended, evened out per sequence (draft_proposer.uniform_catch_up)
            from llmdeploy_engine.runner.cuda_graph_runner import CudaGraphRunner

            proposer_runner = CudaGraphRunner(
                draft_runner, logits_max_batch=draft_runner.graph_logits_rows(), multi_token_rows=True
            )
    except torch.OutOfMemoryError as e:
        raise ValueError(
            f"speculative_config: no device memory left for the draft model {spec.model!r}, its KV cache "
            f"({runner.num_kv_blocks} blocks, as many as the target's) and its CUDA graphs; lower "
            "gpu_memory_utilization or set kv_cache_memory_bytes so the target leaves room for the draft"
        ) from e
    return Speculator(spec, sampler, DraftProposer(proposer_runner, sampler))


def _vocab_size(runner: Any) -> int | None:
    model_config = getattr(runner, "model_config", None)
    return getattr(model_config, "vocab_size", None)
