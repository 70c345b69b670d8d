"""Host time of n-gram (prompt lookup) proposals per engine step, CPU only (issue 6, v15).

B sequences of L random tokens (a vocabulary of V ids, so matches are rare, as on most real text:
the scan's worst case is when no suffix recurs) each get one proposal a step, then one token
appended, for S steps. Timed: `NgramIndex.propose` (the engine's, kept per sequence) against the
scan of the whole sequence every step that it replaced (v14's `propose_ngram`, kept here as the
reference; both give the same proposals, which the script checks). Prints ms per step.

    python benchmarks/ngram_host.py --seqs 32 --context 8192 --steps 20
"""

from __future__ import annotations

import argparse
import random
import time

from llmdeploy_engine.spec_decode.ngram_proposer import NgramIndex, _continuation


def scan(tokens: list[int], k: int, lo: int, hi: int) -> list[int]:
    """v14's proposer: for n = hi..lo, the latest earlier occurrence of the suffix, found by scanning
    back from the end for its first token."""
    num = len(tokens)
    if k < 1 or num < lo + 1:
        return []
    tokens = list(tokens)
    for n in range(min(hi, num - 1), lo - 1, -1):
        suffix = tokens[num - n :]
        first = suffix[0]
        start = num - n - 1
        while start >= 0:
            while start >= 0 and tokens[start] != first:
                start -= 1
            if start < 0:
                break
            if tokens[start : start + n] == suffix:
                return _continuation(tokens, start + n, k)
            start -= 1
    return []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", type=int, default=32)
    parser.add_argument("--context", type=int, default=8192)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--lookup-min", type=int, default=5)
    parser.add_argument("--lookup-max", type=int, default=5)
    args = parser.parse_args()
    rng = random.Random(0)
    lo, hi = args.lookup_min, args.lookup_max
    seqs = [[rng.randrange(args.vocab) for _ in range(args.context)] for _ in range(args.seqs)]
    indexes = [NgramIndex(lo, hi) for _ in seqs]
    t0 = time.perf_counter()
    for seq, index in zip(seqs, indexes, strict=True):  # the first proposal indexes the prompt
        index.propose(seq, args.k)
    first = time.perf_counter() - t0
    scan_s = index_s = 0.0
    for _ in range(args.steps):
        for seq in seqs:
            seq.append(rng.randrange(args.vocab))
        t0 = time.perf_counter()
        want = [scan(seq, args.k, lo, hi) for seq in seqs]
        scan_s += time.perf_counter() - t0
        t0 = time.perf_counter()
        got = [index.propose(seq, args.k) for seq, index in zip(seqs, indexes, strict=True)]
        index_s += time.perf_counter() - t0
        assert got == want
    print(f"{args.seqs} sequences x {args.context} tokens, lookup {lo}..{hi}, k {args.k}:")
    print(f"  scan of every sequence (v14): {scan_s / args.steps * 1e3:8.2f} ms a step")
    print(f"  NgramIndex (v15):             {index_s / args.steps * 1e3:8.3f} ms a step")
    print(f"  NgramIndex's first call (indexes the prompts): {first * 1e3:.1f} ms in all")


if __name__ == "__main__":
    main()
