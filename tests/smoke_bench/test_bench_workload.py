"""Options, prompt lengths and datasets."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from llmdeploy.bench.options import BenchOptions, LengthSpec
from llmdeploy.bench.words import PromptCalibration, random_words, word_list
from llmdeploy.bench.workload import dataset_requests, synthetic_requests
from llmdeploy.errors import UserError
from llmdeploy.recipe.schema import BenchSection, LengthRange


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


def test_synthetic_prompts_are_seeded_and_sized_by_calibration() -> None:
    options = BenchOptions(input_len=LengthSpec(10, 20), output_len=LengthSpec(3, 5))
    calibration = PromptCalibration(overhead_tokens=4, tokens_per_word=2.0, measured=True)
    first = synthetic_requests(options, calibration, 20, seed=1)
    assert first == synthetic_requests(options, calibration, 20, seed=1)
    assert first != synthetic_requests(options, calibration, 20, seed=2)
    for spec in first:
        assert spec.target_input_len is not None and 10 <= spec.target_input_len <= 20
        assert len(spec.prompt.split()) == calibration.words_for(spec.target_input_len)
        assert 3 <= spec.output_len <= 5
    assert {len(s.prompt.split()) for s in first} <= set(range(3, 9))


def test_calibration_fit() -> None:
    fitted = PromptCalibration.fit((32, 40), (160, 200))  # 1.25 tokens/word, 0 overhead
    assert fitted.tokens_per_word == pytest.approx(1.25)
    assert fitted.words_for(100) == 80
    assert not PromptCalibration.fit((32, 40), (160, 40)).measured
    assert all(w in word_list() for w in random_words(50, random.Random(0)).split())


def test_dataset_cycles_and_reports_bad_lines(tmp_path: Path) -> None:
    good = tmp_path / "good.jsonl"
    good.write_text('{"prompt": "a b c", "output_len": 4}\n\n{"prompt": "d e"}\n')
    specs = dataset_requests(str(good), BenchOptions(output_len=LengthSpec(9, 9)), 5, seed=0)
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
        dataset_requests(str(bad), BenchOptions(), 3, seed=0)
    assert [p.line for p in info.value.problems] == [2, 3, 4]
    assert all(p.file == str(bad) for p in info.value.problems)
