"""Generated workloads, seeded: the same options and seed give the same requests, byte for byte.

- random: prompts of random common words sized to a token length (fixed or uniform in a range), as
  `vllm bench serve --dataset-name random` draws lengths
- shared-prefix: N prefixes x M suffixes, every prompt one prefix then one suffix (what prefix caching
  serves), in a seeded shuffled order
- multi-turn: sessions of T user turns; the load generator resends each session's history
"""

from __future__ import annotations

import random

from llmdeploy.bench.options import BenchOptions, LengthSpec
from llmdeploy.bench.request import RequestSpec
from llmdeploy.bench.words import PromptCalibration, random_words


def draw_length(length: LengthSpec, rng: random.Random) -> int:
    return length.min_tokens if length.fixed else rng.randint(length.min_tokens, length.max_tokens)


def random_requests(
    options: BenchOptions, calibration: PromptCalibration, count: int, seed: int
) -> tuple[RequestSpec, ...]:
    rng = random.Random(seed)
    specs = []
    for _ in range(count):
        input_len = draw_length(options.input_len, rng)
        output_len = draw_length(options.output_len, rng)
        specs.append(RequestSpec(random_words(calibration.words_for(input_len), rng), output_len, input_len))
    return tuple(specs)


def shared_prefix_requests(
    options: BenchOptions, calibration: PromptCalibration, count: int, seed: int
) -> tuple[RequestSpec, ...]:
    """Every (prefix, suffix) pair once in a seeded order, cycled to `count`."""
    rng = random.Random(seed)
    # the prefix is the prompt's start, so it carries the template overhead the calibration measured
    prefixes = [
        random_words(calibration.words_for(options.prefix_len), rng) for _ in range(options.num_prefixes)
    ]
    pairs = []
    for prefix in prefixes:
        for _ in range(options.suffixes_per_prefix):
            input_len = draw_length(options.input_len, rng)
            suffix_words = max(1, round(input_len / calibration.tokens_per_word))
            pairs.append((prefix, random_words(suffix_words, rng), input_len))
    rng.shuffle(pairs)
    return tuple(
        RequestSpec(
            f"{prefix} {suffix}", draw_length(options.output_len, rng), options.prefix_len + input_len
        )
        for prefix, suffix, input_len in (pairs[i % len(pairs)] for i in range(count))
    )


def multi_turn_requests(
    options: BenchOptions, calibration: PromptCalibration, count: int, seed: int
) -> tuple[RequestSpec, ...]:
    """Sessions of `num_turns` user messages (the last one shorter when `count` does not divide)."""
    rng = random.Random(seed)
    specs = []
    for i in range(count):
        session, turn = divmod(i, options.num_turns)
        input_len = draw_length(options.input_len, rng)
        output_len = draw_length(options.output_len, rng)
        words = (
            calibration.words_for(input_len) if turn == 0 else round(input_len / calibration.tokens_per_word)
        )
        specs.append(RequestSpec(random_words(max(1, words), rng), output_len, input_len, session, turn))
    return tuple(specs)
