"""Speculative decoding without a model: config parsing, n-gram proposals, greedy verification, and the
scheduler/block manager under proposals (lookahead slots, rollback, prefix cache) checked against a
fake KV store that remembers which token prefix each slot was written from."""

from __future__ import annotations

import random

import pytest
from core_fakes import check_invariants, fingerprints, next_token
from llmdeploy_engine.cli_args import serve_parser
from llmdeploy_engine.config import EngineConfig
from llmdeploy_engine.core.block_manager import BlockManager
from llmdeploy_engine.core.scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from llmdeploy_engine.core.sequence import Sequence, SequenceStatus
from llmdeploy_engine.sampling_params import SamplingParams
from llmdeploy_engine.spec_decode.config import SpeculativeConfig
from llmdeploy_engine.spec_decode.ngram_proposer import NgramIndex, propose_ngram

# ---- configuration ----------------------------------------------------------------------------


def test_config_from_vllm_style_dicts() -> None:
    cfg = EngineConfig(
        model="m",
        speculative_config={
            "method": "ngram",
            "num_speculative_tokens": 3,
            "prompt_lookup_max": 4,
            "prompt_lookup_min": 2,
        },
    ).speculative_config
    assert cfg == SpeculativeConfig("ngram", 3, prompt_lookup_max=4, prompt_lookup_min=2)
    draft = SpeculativeConfig.from_dict({"model": "random:x", "num_speculative_tokens": 2})
    assert (draft.method, draft.model) == ("draft_model", "random:x")
    only_max = SpeculativeConfig.from_dict(
        {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}
    )
    assert (only_max.prompt_lookup_min, only_max.prompt_lookup_max) == (3, 3)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"method": "eagle", "num_speculative_tokens": 2}, "method 'eagle' is not supported"),
        ({"method": "ngram"}, "needs num_speculative_tokens"),
        ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens must be"),
        (
            {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2},
            "exceeds",
        ),
        ({"method": "draft_model", "num_speculative_tokens": 2}, "needs model"),
        ({"num_speculative_tokens": 2}, 'needs "method"'),
        ({"method": "ngram", "num_speculative_tokens": 2, "draft_tp": 1}, "unknown keys ['draft_tp']"),
    ],
)
def test_bad_config_is_refused_clearly(raw: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match="speculative_config") as caught:
        SpeculativeConfig.from_dict(raw)
    assert message in str(caught.value)


def test_cli_flag_parses_json() -> None:
    parser = serve_parser()
    args = parser.parse_args(
        ["--model", "m", "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 4}']
    )
    assert args.speculative_config.num_speculative_tokens == 4
    with pytest.raises(SystemExit):
        parser.parse_args(["--model", "m", "--speculative-config", "{not json"])


# ---- n-gram proposals -------------------------------------------------------------------------


def test_ngram_prefers_longest_match_then_most_recent() -> None:
    # suffix [1, 2] recurs at 0 and 4; with max 2 the most recent (4) wins: continues 7, 8
    assert propose_ngram([1, 2, 5, 6, 1, 2, 7, 8, 9, 1, 2], 2, 1, 2) == [7, 8]
    # a 3-gram match [9, 1, 2] beats the more recent 2-gram match
    assert propose_ngram([9, 1, 2, 3, 4, 1, 2, 6, 9, 1, 2], 2, 1, 3) == [3, 4]
    # a match overlapping the end continues periodically; nothing when no suffix recurs
    assert propose_ngram([4, 5, 4], 3, 1, 2) == [5, 4, 5]  # the copy runs on through itself
    assert propose_ngram([7, 7, 7], 4, 1, 2) == [7, 7, 7, 7]
    assert propose_ngram([1, 2, 3, 4], 3, 1, 3) == []
    assert propose_ngram([1, 2, 3, 1], 3, 2, 3) == []  # only a 1-gram recurs, min is 2


def scan_ngram(tokens: list[int], k: int, lo: int, hi: int) -> list[int]:
    """The definition, by brute force: for n = hi..lo, the latest earlier occurrence of the last n
    tokens (ending before the last token), then the k tokens after it, continuing through the copy."""
    num = len(tokens)
    if k < 1:
        return []
    for n in range(min(hi, num - 1), lo - 1, -1):
        suffix = tokens[num - n :]
        for start in range(num - n - 1, -1, -1):
            if tokens[start : start + n] == suffix:
                out: list[int] = []
                for j in range(k):
                    src = start + n + j
                    out.append(tokens[src] if src < num else out[src - num])
                return out
    return []


@pytest.mark.parametrize("lo,hi", [(1, 1), (1, 3), (2, 4), (5, 5)])
def test_ngram_index_matches_the_scan_as_the_sequence_grows(lo: int, hi: int) -> None:
    """NgramIndex, called after every appended token (and sometimes after several), proposes what the
    scan of the whole sequence does; small vocabularies make matches of every length frequent."""
    rng = random.Random(lo * 10 + hi)
    for vocab in (2, 3, 8):
        tokens = [rng.randrange(vocab) for _ in range(3)]
        index = NgramIndex(lo, hi)
        while len(tokens) < 300:
            k = rng.randrange(0, 6)
            assert index.propose(tokens, k) == scan_ngram(tokens, k, lo, hi), (vocab, len(tokens), k)
            tokens += [rng.randrange(vocab) for _ in range(rng.choice((1, 1, 1, 3)))]
    # a shorter sequence than the one indexed (not the same sequence): the index starts over
    assert index.propose([1, 2, 1, 2], 2) == scan_ngram([1, 2, 1, 2], 2, lo, hi)


# ---- scheduler and block manager under speculation ----------------------------------------------


class SpecKV:
    """Slots remember the fingerprint of the (possibly speculative) prefix they were written from."""

    def __init__(self) -> None:
        self.slots: dict[int, int] = {}

    def run(self, bm: BlockManager, out: SchedulerOutput) -> None:
        batch, bs = out.batch, bm.block_size
        assert len(set(batch.slot_mapping)) == len(batch.slot_mapping)
        for i, entry in enumerate(out.scheduled):
            seq = entry.seq
            tokens = seq.token_ids + list(entry.spec_token_ids)
            fps = fingerprints(tokens)
            start = batch.query_start[i]
            for k in range(batch.query_len[i]):
                pos = batch.positions[start + k]
                slot = batch.slot_mapping[start + k]
                assert batch.input_ids[start + k] == tokens[pos]
                assert bm.blocks[slot // bs].ref_count == 1, "write into a shared block"
                self.slots[slot] = fps[pos]
            table = batch.block_tables[i]
            for pos in range(batch.context_len[i]):
                assert self.slots.get(table[pos // bs] * bs + pos % bs) == fps[pos], (
                    f"{seq} reads wrong KV at {pos}"
                )


def spec_step(sched: Scheduler, kv: SpecKV, rng: random.Random, k: int) -> None:
    for seq in sched.running:
        if seq.num_uncomputed_tokens == 1 and seq.num_output_tokens:
            left = (seq.params.max_tokens or 1) - seq.num_output_tokens - 1
            proposal: list[int] = []
            for _ in range(min(k, left, sched.config.max_model_len - seq.num_tokens - 1)):
                right = next_token(seq.token_ids + proposal)
                proposal.append(right if rng.random() < 0.6 else (right + 1) % 50)
            seq.spec_token_ids = proposal
    out = sched.schedule()
    kv.run(sched.block_manager, out)
    sched.update_computed(out)
    for entry in out.scheduled:
        if not entry.samples:
            continue
        seq, drafts = entry.seq, list(entry.spec_token_ids)
        emitted: list[int] = []
        for d in drafts:
            if d != next_token(seq.token_ids + emitted):
                break
            emitted.append(d)
        accepted = len(emitted)
        emitted.append(next_token(seq.token_ids + emitted))
        for tok in emitted:
            seq.append_token(tok)
            if (
                seq.num_output_tokens >= (seq.params.max_tokens or 1)
                or seq.num_tokens >= sched.config.max_model_len
            ):
                sched.finish(seq, SequenceStatus.FINISHED_LENGTH)
                break
        if drafts and not seq.is_finished:
            sched.accept_speculative(seq, accepted)
    check_invariants(sched.block_manager, [*sched.running, *sched.waiting])
    bm = sched.block_manager
    for seq in sched.running:
        # never a registered block that holds unverified tokens
        for i, b in enumerate(seq.block_table):
            if bm.blocks[b].block_hash is not None:
                assert (i + 1) * bm.block_size <= seq.num_computed_tokens
        # rejected lookahead was given back
        assert len(seq.block_table) <= bm.blocks_needed(seq.num_tokens)


def reference_output(prompt: list[int], max_tokens: int) -> list[int]:
    tokens = list(prompt)
    while len(tokens) - len(prompt) < max_tokens:
        tokens.append(next_token(tokens))
    return tokens[len(prompt) :]


@pytest.mark.parametrize(("num_blocks", "prefix"), [(64, True), (20, True), (64, False)])
def test_speculative_steps_keep_kv_and_blocks_consistent(num_blocks: int, prefix: bool) -> None:
    rng = random.Random(num_blocks)
    bm = BlockManager(num_blocks, 4, prefix)
    sched = Scheduler(SchedulerConfig(8, 24, 96), bm)
    kv = SpecKV()
    seqs = []
    shared = [rng.randrange(1, 50) for _ in range(9)]
    for i in range(8):
        prompt = (shared if i % 2 else []) + [rng.randrange(1, 50) for _ in range(rng.randrange(1, 12))]
        s = Sequence(f"r{i}", prompt, SamplingParams(max_tokens=rng.randrange(5, 30)))
        seqs.append(s)
        sched.add(s)
    steps = 0
    while sched.has_unfinished():
        steps += 1
        assert steps < 2000
        spec_step(sched, kv, rng, k=4)
        if steps == 6:  # a late arrival that shares the prompt prefix of earlier sequences
            late = Sequence("late", [*shared, 7], SamplingParams(max_tokens=12))
            seqs.append(late)
            sched.add(late)
    for s in seqs:
        assert s.output_token_ids == reference_output(s.prompt_token_ids, s.params.max_tokens or 1)
    assert bm.num_free_blocks == bm.num_blocks
    if num_blocks == 20:
        assert sched.num_preemptions > 0  # the small pool exercised preemption with lookahead slots


def test_budget_cuts_proposals_and_num_logits_follows() -> None:
    bm = BlockManager(32, 4)
    sched = Scheduler(SchedulerConfig(4, 3, 64), bm)
    s = Sequence("a", [1, 2], SamplingParams(max_tokens=8))
    sched.add(s)
    out = sched.schedule()
    sched.update_computed(out)
    s.append_token(5)
    s.spec_token_ids = [6, 7, 8, 9]
    out = sched.schedule()
    assert out.scheduled[0].spec_token_ids == (6, 7)  # 1 + 2 proposals fill the budget of 3
    assert out.batch.input_ids == [5, 6, 7] and out.batch.positions == [2, 3, 4]
    assert out.batch.num_logits == [3] and out.batch.logit_rows() == [0, 1, 2]
    assert s.spec_token_ids == []
    sched.update_computed(out)
    assert s.num_computed_tokens == 3  # only the verified token counts
    s.append_token(6)
    s.append_token(11)
    sched.accept_speculative(s, 1)
    assert s.num_computed_tokens == 4 and len(s.block_table) == bm.blocks_needed(5)


# ---- metrics ----------------------------------------------------------------------------------


def test_prometheus_names_follow_vllm() -> None:
    from llmdeploy_engine.server.metrics import ServerMetrics

    class Stats:
        spec_decode_num_drafts = 3
        spec_decode_num_draft_tokens = 12
        spec_decode_num_accepted_tokens = 7
        spec_decode_num_accepted_tokens_per_pos = (3, 2, 1, 1)

    text = ServerMetrics("m").render(Stats(), block_size=16)
    assert 'vllm:spec_decode_num_drafts_total{model_name="m"} 3' in text
    assert 'vllm:spec_decode_num_draft_tokens_total{model_name="m"} 12' in text
    assert 'vllm:spec_decode_num_accepted_tokens_total{model_name="m"} 7' in text
    assert 'vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="1"} 2' in text
    assert "# TYPE vllm:spec_decode_num_drafts_total counter"  # prometheus_client's text format in text

    class Off:
        spec_decode_num_drafts = 0

    assert "spec_decode" not in ServerMetrics("m").render(Off(), block_size=16)
