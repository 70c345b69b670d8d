"""Options, prompt lengths, the workload generators (seeded) and request files (plain and ShareGPT)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from llmdeploy.bench.datasets import read_dataset
from llmdeploy.bench.load import work_units
from llmdeploy.bench.options import BenchOptions, LengthSpec
from llmdeploy.bench.words import PromptCalibration, random_words, word_list
from llmdeploy.bench.workload import dataset_requests, make_workload
from llmdeploy.errors import UserError
from llmdeploy.recipe.schema import BenchSection, LengthRange

CALIBRATION = PromptCalibration(overhead_tokens=4, tokens_per_word=2.0, measured=True)


def test_length_spec_parses_fixed_and_ranges() -> None:
    assert LengthSpec.parse(128) == LengthSpec(128, 128)
    assert LengthSpec.parse("64:256") == LengthSpec(64, 256)
    assert LengthSpec.parse(LengthRange(min=4, max=8)) == LengthSpec(4, 8)
    with pytest.raises(ValueError):
        LengthSpec.parse("9:3")


def test_options_from_recipe_section_with_flag_overrides() -> None:
    section = BenchSection(num_requests=10, concurrency=[1, 2, 4], input_len=LengthRange(min=5, max=9))
    options = BenchOptions.from_section(section, num_requests=None, seed=7)
    assert (options.num_requests, options.concurrency, options.seed) == (10, (1, 2, 4), 7)
    assert options.input_len == LengthSpec(5, 9)
    assert options.points == ((1, None), (2, None), (4, None))
    rated = BenchOptions.from_section(BenchSection(request_rate=3.0, concurrency=[8]))
    assert rated.points == ((8, 3.0),)


def test_sweep_points_cross_rates_and_concurrency() -> None:
    options = BenchOptions(concurrency=(4, 16), request_rates=(1.0, 2.0))
    assert options.points == ((4, 1.0), (16, 1.0), (4, 2.0), (16, 2.0))
    with pytest.raises(ValueError, match="endpoint chat"):
        BenchOptions(workload="multi-turn")
    with pytest.raises(ValueError, match="replaces the generated workload"):
        BenchOptions(workload="shared-prefix", dataset="x.jsonl")


@pytest.mark.parametrize(
    "options",
    [
        BenchOptions(num_requests=20, input_len=LengthSpec(10, 20), output_len=LengthSpec(3, 5)),
        BenchOptions(num_requests=20, workload="shared-prefix", num_prefixes=3, suffixes_per_prefix=4),
        BenchOptions(num_requests=20, workload="multi-turn", endpoint="chat", num_turns=3),
    ],
    ids=["random", "shared-prefix", "multi-turn"],
)
def test_every_generator_is_seeded(options: BenchOptions) -> None:
    first = make_workload(options, CALIBRATION)
    again = make_workload(options, CALIBRATION)
    assert (first.warmup, first.measured) == (again.warmup, again.measured)
    assert first.summary == again.summary and len(first.summary.digest) == 64
    other = make_workload(BenchOptions(**{**options.__dict__, "seed": 1}), CALIBRATION)
    assert other.measured != first.measured and other.summary.digest != first.summary.digest
    assert len(first.measured) == 20 and len(first.warmup) == options.warmup_requests
    assert all(s.session is None for s in first.warmup)  # warm-up requests never carry a history


def test_random_prompts_are_sized_by_calibration() -> None:
    options = BenchOptions(num_requests=20, input_len=LengthSpec(10, 20), output_len=LengthSpec(3, 5))
    workload = make_workload(options, CALIBRATION)
    for spec in workload.warmup + workload.measured:
        assert spec.target_input_len is not None and 10 <= spec.target_input_len <= 20
        assert len(spec.prompt.split()) == CALIBRATION.words_for(spec.target_input_len)
        assert 3 <= spec.output_len <= 5
    assert workload.summary.name == "random" and "random, 20 requests, seed 0" in workload.summary.describe()


def test_shared_prefix_is_n_prefixes_times_m_suffixes() -> None:
    options = BenchOptions(
        num_requests=12, warmup_requests=0, workload="shared-prefix", num_prefixes=3,
        suffixes_per_prefix=4, prefix_len=40, input_len=LengthSpec(10, 10),
    )  # fmt: skip
    specs = make_workload(options, CALIBRATION).measured
    prefix_words = CALIBRATION.words_for(40)  # 18 words carry 40 tokens with the 4-token overhead
    prefixes = {" ".join(s.prompt.split()[:prefix_words]) for s in specs}
    assert len(prefixes) == 3
    assert len({s.prompt for s in specs}) == 12  # every (prefix, suffix) pair once
    for prefix in prefixes:
        assert sum(s.prompt.startswith(prefix + " ") for s in specs) == 4
    assert all(len(s.prompt.split()) == prefix_words + 5 and s.target_input_len == 50 for s in specs)


def test_multi_turn_sessions_hold_their_turns_in_order() -> None:
    options = BenchOptions(
        num_requests=10, warmup_requests=1, workload="multi-turn", endpoint="chat", num_turns=4
    )
    workload = make_workload(options, CALIBRATION)
    assert [(s.session, s.turn) for s in workload.measured] == [
        (0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1), (1, 2), (1, 3), (2, 0), (2, 1),
    ]  # fmt: skip
    units = work_units(workload.measured)
    assert [len(u) for u in units] == [4, 4, 2]
    assert dict(workload.summary.details)["num_turns"] == 4


def test_calibration_fit() -> None:
    fitted = PromptCalibration.fit((32, 40), (160, 200))  # 1.25 tokens/word, 0 overhead
    assert fitted.tokens_per_word == pytest.approx(1.25)
    assert fitted.words_for(100) == 80
    assert not PromptCalibration.fit((32, 40), (160, 40)).measured
    assert all(w in word_list() for w in random_words(50, random.Random(0)).split())


def test_dataset_cycles_and_reports_bad_lines(tmp_path: Path) -> None:
    good = tmp_path / "good.jsonl"
    good.write_text('{"prompt": "a b c", "output_len": 4}\n\n{"prompt": "d e"}\n')
    rows = read_dataset(good)
    specs = dataset_requests(rows, BenchOptions(output_len=LengthSpec(9, 9)), CALIBRATION, 5, seed=0)
    assert [(s.prompt, s.output_len) for s in specs] == [
        ("a b c", 4),
        ("d e", 9),
        ("a b c", 4),
        ("d e", 9),
        ("a b c", 4),
    ]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\nnot json\n{"text": "x"}\n{"prompt": "y", "output_len": 0}\n')
    with pytest.raises(UserError) as info:
        read_dataset(bad)
    assert [p.line for p in info.value.problems] == [2, 3, 4]
    assert all(p.file == str(bad) for p in info.value.problems)


def _sharegpt(*turns: tuple[str, str]) -> str:
    return json.dumps({"id": "x", "conversations": [{"from": f, "value": v} for f, v in turns]})


def test_sharegpt_prompts_and_output_lengths_from_replies(tmp_path: Path) -> None:
    path = tmp_path / "sharegpt.jsonl"
    lines = [
        _sharegpt(("human", "what is two plus two"), ("gpt", "it is four of course"), ("human", "and three")),
        _sharegpt(("system", "be brief"), ("human", "name a colour"), ("gpt", "blue")),
        _sharegpt(("human", "no reply here")),
    ]
    path.write_text("\n".join(lines) + "\n")
    options = BenchOptions(num_requests=3, warmup_requests=0, dataset=str(path), output_len=LengthSpec(7, 7))
    workload = make_workload(options, CALIBRATION)
    # the reply's words x 2 tokens per word; a conversation without a reply takes --output-len's draw
    assert [(s.prompt, s.output_len) for s in workload.measured] == [
        ("what is two plus two", 10),
        ("name a colour", 2),
        ("no reply here", 7),
    ]
    assert workload.summary.name == "sharegpt"
    fixed = make_workload(
        BenchOptions(**{**options.__dict__, "override_dataset_output_len": True}), CALIBRATION
    )
    assert [s.output_len for s in fixed.measured] == [7, 7, 7]


def test_malformed_sharegpt_lines_are_named(tmp_path: Path) -> None:
    path = tmp_path / "broken.jsonl"
    path.write_text(
        "\n".join(
            [
                _sharegpt(("human", "fine"), ("gpt", "ok")),
                '{"conversations": "not a list"}',
                '{"conversations": [{"from": "human"}]}',
                _sharegpt(("gpt", "a reply to nothing")),
                '{"conversations": [{"from": "human", "value": "cut',
            ]
        )
        + "\n"
    )
    with pytest.raises(UserError) as info:
        read_dataset(path)
    problems = info.value.problems
    assert [p.line for p in problems] == [2, 3, 4, 5]
    assert all(p.file == str(path) for p in problems)
    assert "must be a non-empty list" in problems[0].message
    assert 'turn 0 must be an object with "from" and "value"' in problems[1].message
    assert "no non-empty human turn" in problems[2].message
    assert problems[3].message.startswith("not JSON")
    assert f"{path}:3: " in problems[1].render()
