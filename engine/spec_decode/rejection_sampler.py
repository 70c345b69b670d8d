"""Verify proposed tokens against the target model: greedy acceptance or speculative sampling.

For a sequence with drafts d_1..d_k the target produced k + 1 distributions p_0..p_k (p_j is the
target's distribution for the token after d_1..d_j), already processed the way the sampler draws
(temperature, top-k/top-p, penalties; greedy rows are one-hot at the argmax).

- greedy: accept d_j while it equals the target's argmax, then emit the target's own token.
- sampling (Leviathan et al. / Chen et al.): accept d_j with probability min(1, p(d_j) / q(d_j));
  on the first rejection emit a draw from norm(max(0, p - q)); if every draft is accepted, emit a
  bonus draw from p_k. The emitted tokens are then distributed exactly as sampling from p one by one.
  N-gram drafts are deterministic, so q is one-hot at the drafted token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Verdict:
    token_ids: list[int]  # accepted drafts followed by the target's correction or bonus token
    num_accepted: int  # drafts accepted (len(token_ids) - 1)


def verify_greedy(argmax: list[int], drafts: list[int]) -> Verdict:
    """`argmax`: the target's k + 1 greedy tokens, for the drafts' k positions and the one after."""
    assert len(argmax) == len(drafts) + 1
    accepted = 0
    while accepted < len(drafts) and drafts[accepted] == argmax[accepted]:
        accepted += 1
    return Verdict([*drafts[:accepted], argmax[accepted]], accepted)


def verify_sampled(
    probs: torch.Tensor,
    drafts: list[int],
    draft_probs: torch.Tensor | None,
    generator: torch.Generator | None = None,
) -> Verdict:
    """`probs` [k + 1, vocab] target distributions; `draft_probs` [k, vocab] or None (one-hot drafts)."""
    k = len(drafts)
    assert probs.shape[0] == k + 1
    dev = probs.device
    if k:
        idx = torch.tensor(drafts, dtype=torch.long, device=dev)
        p_d = probs[:k].gather(1, idx[:, None]).squeeze(1)
        if draft_probs is None:
            q_d = torch.ones_like(p_d)
        else:
            assert draft_probs.shape[0] == k
            q_d = draft_probs.to(dev).gather(1, idx[:, None]).squeeze(1)
        u = torch.rand(k, device=dev, generator=generator)
        # u < p / q without dividing by a zero q (a token the draft could not have drawn is rejected)
        accept = (u * q_d < p_d) & (q_d > 0)
        rejected = (~accept).nonzero()
        accepted = int(rejected[0, 0]) if rejected.numel() else k
    else:
        accepted = 0
    if accepted < k:
        p = probs[accepted]
        if draft_probs is None:
            q = torch.zeros_like(p)
            q[drafts[accepted]] = 1.0
        else:
            q = draft_probs[accepted].to(dev)
        residual = (p - q).clamp_min(0.0)
        total = residual.sum()
        dist = residual / total if float(total) > 0 else p
    else:
        dist = probs[k]
    token = int(torch.multinomial(dist, 1, generator=generator))
    return Verdict([*drafts[:accepted], token], accepted)
