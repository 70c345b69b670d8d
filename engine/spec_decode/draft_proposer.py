"""Draft-model proposals: a second, smaller model runs k decode steps ahead of the target.

The draft's ModelRunner has the target's block size and number of KV blocks, so it writes its own K/V
tensors through the target's block tables and slots: no second block manager. On a CUDA device
(unless enforce_eager) the runner is wrapped in a CudaGraphRunner whose decode graphs also take several
tokens per sequence: the steps after the first feed one token per sequence, and the first (the
tokens verification appended) is evened out to the same count for every sequence
(`uniform_catch_up`), so both replay graphs. When every request is plain greedy and wants the same
number of proposals, the steps after the first run as one decode window (multi_step.py: k - 1 steps
back to back, one read back). The draft keeps, per
sequence, how far its KV matches the sequence's tokens; before proposing it feeds what it has not
seen (the prompt on first use, then the tokens verification appended) and then feeds its own
proposals, one pass each or as one window. Proposals it wrote KV for and that the target rejected are simply
recomputed over later, like the target's own rejected slots.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from llmdeploy_engine.core.forward_batch import ForwardBatch
from llmdeploy_engine.core.sequence import Sequence
from llmdeploy_engine.model.sampler import plain_greedy
from llmdeploy_engine.sampling_params import SamplingParams


@dataclass
class _DraftState:
    num_preemptions: int  # the sequence's blocks (and so this KV) are gone after a preemption
    base: int  # draft KV at positions < base matches the sequence's tokens
    written: list[int] = field(default_factory=list)  # tokens whose KV sits at base, base + 1, ...


# catch-ups of at most this many tokens a sequence are evened out (uniform_catch_up)
MAX_UNIFORM_CATCH_UP = 16


def uniform_catch_up(pieces: list[tuple[Any, int, int]]) -> list[tuple[Any, int, int]]:
    """(request, start, end) pieces of a catch-up pass, each moved to start at end - q, q the longest
    piece, when every piece is short (<= MAX_UNIFORM_CATCH_UP tokens) and every sequence has q tokens.

    After a verification step the draft has not seen one to k + 1 tokens of each sequence (the bonus
    token, and its last proposal when all were accepted): a batch of unequal pieces that no CUDA
    graph takes (graphs take the same number of new tokens per sequence), so it ran eagerly, ~20x a
    replay for a small draft. Feeding a sequence's already-seen tokens again rewrites their K/V with
    the same inputs (the draft's K/V only steers proposals; the target verifies every token)."""
    if not pieces:
        return pieces
    q = max(end - start for _, start, end in pieces)
    if q > MAX_UNIFORM_CATCH_UP or any(end < q for _, _, end in pieces):
        return pieces
    return [(r, end - q, end) for r, _, end in pieces]


@dataclass(frozen=True)
class DraftRequest:
    """One sequence to propose for: `k` tokens after its last one; its slots already exist."""

    seq: Sequence
    k: int
    params: SamplingParams
    prompt_token_ids: list[int]
    generator: torch.Generator | None


class DraftProposer:
    def __init__(self, runner: Any, sampler: Any) -> None:
        self.runner = runner
        self.sampler = sampler
        self.block_size: int = runner.block_size
        self.max_num_batched_tokens: int = runner.max_num_batched_tokens
        self._states: dict[int, _DraftState] = {}
        self.num_passes = 0  # draft forward passes run (CudaGraphRunner.num_replays: those replayed)
        self.num_windows = 0  # proposals made as one decode window (_propose_in_a_window)

    def forget_except(self, live_seq_ids: set[int]) -> None:
        for seq_id in [s for s in self._states if s not in live_seq_ids]:
            del self._states[seq_id]

    def propose(self, requests: list[DraftRequest]) -> tuple[dict[int, list[int]], dict[int, torch.Tensor]]:
        """Proposed tokens per seq_id, and for sampled (non-greedy) sequences the draft's
        distributions [k, vocab] they were drawn from."""
        if not requests:
            return {}, {}
        drafts: dict[int, list[int]] = {r.seq.seq_id: [] for r in requests}
        probs: dict[int, list[torch.Tensor]] = {r.seq.seq_id: [] for r in requests}
        # step 0: catch up on unseen tokens; the last one's logits give the first proposal
        pieces = uniform_catch_up([(r, self._valid_len(r.seq), r.seq.num_tokens) for r in requests])
        logits = self._run_pieces(pieces)
        greedy = self._take(requests, logits, drafts, probs)
        if greedy and self._propose_in_a_window(requests, drafts):
            return self._finish(requests, drafts, probs)
        for step in range(1, max(r.k for r in requests)):
            active = [r for r in requests if r.k > step]
            if not active:
                break
            pieces = [(r, r.seq.num_tokens + step - 1, r.seq.num_tokens + step) for r in active]
            self._take(active, self._run_pieces(pieces, drafts), drafts, probs)
        return self._finish(requests, drafts, probs)

    def _finish(
        self, requests: list[DraftRequest], drafts: dict[int, list[int]], probs: dict[int, list[torch.Tensor]]
    ) -> tuple[dict[int, list[int]], dict[int, torch.Tensor]]:
        for r in requests:
            seq = r.seq
            self._states[seq.seq_id] = _DraftState(
                seq.num_preemptions, seq.num_tokens, drafts[seq.seq_id][:-1]
            )
        q = {sid: torch.stack(rows) for sid, rows in probs.items() if rows}
        return drafts, q

    def _propose_in_a_window(self, requests: list[DraftRequest], drafts: dict[int, list[int]]) -> bool:
        """After a plain-greedy first proposal: proposals 2..k as one decode window on the draft's
        runner (multi_step.py: each step fed the argmax of the one before on the device, one read
        back at the end) when every request wants the same k; False (nothing run) otherwise. Each
        step computes what a one-token pass computes, so the proposals are the loop's."""
        k = requests[0].k
        window = getattr(self.runner, "execute_multi_step", None)
        if k < 2 or window is None or any(r.k != k for r in requests):
            return False
        pieces = [(r, r.seq.num_tokens, r.seq.num_tokens + 1, True) for r in requests]
        ids = window(self._batch(pieces, drafts), k - 1)
        self.num_passes += k - 1
        self.num_windows += 1
        for step_ids in ids:
            for r, token in zip(requests, step_ids, strict=True):
                drafts[r.seq.seq_id].append(int(token))
        return True

    # ---- internals ----------------------------------------------------------------------------
    def _valid_len(self, seq: Sequence) -> int:
        """Positions whose draft KV is known good, leaving the last token to feed."""
        state = self._states.get(seq.seq_id)
        if state is None or state.num_preemptions != seq.num_preemptions:
            return 0
        valid = state.base
        for tok in state.written:
            if valid >= seq.num_tokens or seq.token_ids[valid] != tok:
                break
            valid += 1
        return min(valid, seq.num_tokens - 1)

    def _take(
        self,
        requests: list[DraftRequest],
        logits: torch.Tensor,
        drafts: dict[int, list[int]],
        probs: dict[int, list[torch.Tensor]],
    ) -> bool:
        """Append each request's next proposal from `logits`; True when every request was plain
        greedy (the proposals are the argmax; min_tokens, the only condition that depends on the
        tokens, stays met for the later proposals)."""
        if all(
            plain_greedy(r.params, r.seq.num_output_tokens + len(drafts[r.seq.seq_id]), logprobs=False)
            for r in requests
        ):
            # the argmax is each proposal and no distribution is kept: one kernel and one read back
            # instead of processed_probs' per-row masks and index copies
            for r, token in zip(requests, logits.argmax(dim=-1).tolist(), strict=True):
                drafts[r.seq.seq_id].append(int(token))
            return True
        outputs = [r.seq.output_token_ids + drafts[r.seq.seq_id] for r in requests]
        q = self.sampler.processed_probs(
            logits, [r.params for r in requests], [r.prompt_token_ids for r in requests], outputs
        )
        greedy_tokens = q.argmax(dim=-1).tolist()
        for i, r in enumerate(requests):
            sid = r.seq.seq_id
            if r.params.greedy:
                drafts[sid].append(int(greedy_tokens[i]))
            else:
                drafts[sid].append(int(torch.multinomial(q[i], 1, generator=r.generator)))
                probs[sid].append(q[i])
        return False

    def _run_pieces(
        self, pieces: list[tuple[DraftRequest, int, int]], drafts: dict[int, list[int]] | None = None
    ) -> torch.Tensor:
        """Feed positions [start, end) of each request's sequence (then its drafts) to the draft, in
        forward passes of at most max_num_batched_tokens; logits of each piece's last position, in order."""
        budget = self.max_num_batched_tokens
        chunks: list[list[tuple[DraftRequest, int, int, bool]]] = [[]]
        used = 0
        for r, start, end in pieces:
            while start < end:
                if used == budget:
                    chunks.append([])
                    used = 0
                stop = min(end, start + budget - used)
                chunks[-1].append((r, start, stop, stop == end))
                used += stop - start
                start = stop
        out: list[torch.Tensor] = []
        for chunk in chunks:
            if chunk:
                logits = self.runner.execute(self._batch(chunk, drafts))
                self.num_passes += 1
                # a CUDA graph's logits are a view of a buffer the next replay rewrites
                out.append(logits.clone() if len(chunks) > 1 else logits)
        return torch.cat(out) if len(out) > 1 else out[0]

    def _batch(
        self, chunk: list[tuple[DraftRequest, int, int, bool]], drafts: dict[int, list[int]] | None
    ) -> ForwardBatch:
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        query_start: list[int] = []
        query_len: list[int] = []
        context_len: list[int] = []
        tables: list[list[int]] = []
        sample: list[int] = []
        for i, (r, start, end, last) in enumerate(chunk):
            seq = r.seq
            table = seq.block_table
            assert len(table) * bs >= end, "draft positions beyond the sequence's slots"
            query_start.append(len(input_ids))
            query_len.append(end - start)
            context_len.append(end)
            # positions [start, end) of the sequence's tokens followed by its drafts, without copying
            # either whole (a pass feeds a few tokens of sequences up to the longest context)
            ids = seq.token_ids
            input_ids.extend(ids[start:end])
            if end > len(ids):
                assert drafts is not None, "positions past the sequence's tokens need its drafts"
                input_ids.extend(drafts[seq.seq_id][max(start - len(ids), 0) : end - len(ids)])
            positions.extend(range(start, end))
            slots.extend(table[p // bs] * bs + p % bs for p in range(start, end))
            tables.append(table)  # read during this pass only, as the scheduler's batches alias theirs
            if last:
                sample.append(i)
        return ForwardBatch(input_ids, positions, slots, query_start, query_len, context_len, tables, sample)
