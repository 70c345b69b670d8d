"""KV capacity parsing, predicted-versus-actual, and the chat stream shape rules."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from llmdeploy.smoke.kv_capacity import capacity_from_log, capacity_from_metrics
from llmdeploy.smoke.openai_checks import CheckFailed, _check_chat_stream
from llmdeploy.smoke.report import KVCapacity, KVComparison


def test_kv_capacity_from_builtin_and_vllm_metrics() -> None:
    builtin = '# HELP x\nllmdeploy:kv_cache_tokens{model_name="m"} 4096.0\nllmdeploy:num_kv_blocks 256\n'
    assert capacity_from_metrics(builtin) == KVCapacity(4096, "/metrics llmdeploy:kv_cache_tokens")
    vllm = 'vllm:cache_config_info{block_size="16",cache_dtype="auto",num_gpu_blocks="1234",num_cpu_blocks="None"} 1.0\n'
    found = capacity_from_metrics(vllm)
    assert found is not None and found.tokens == 1234 * 16
    assert (
        capacity_from_metrics('vllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1.0\n') is None
    )
    recent = (
        'vllm:cache_config_info{block_size="128",kv_cache_size_tokens="23296",num_gpu_blocks="182"} 1.0\n'
    )
    assert capacity_from_metrics(recent) == KVCapacity(
        23296, "/metrics vllm:cache_config_info kv_cache_size_tokens"
    )


def test_kv_capacity_from_vllm_log(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_text("INFO ... GPU KV cache size: 1,048 tokens\nINFO ... GPU KV cache size: 175,920 tokens\n")
    assert capacity_from_log(log) == KVCapacity(175920, f"log {log}")
    assert capacity_from_log(tmp_path / "missing.log") is None


def test_kv_comparison_warns_beyond_tolerance_with_both_numbers() -> None:
    actual = KVCapacity(12000, "/metrics llmdeploy:kv_cache_tokens")
    close = KVComparison(11000, actual, 0.10)
    assert close.within_tolerance
    far = KVComparison(10000, actual, 0.10)
    assert not far.within_tolerance
    assert "12,000" in far.describe() and "10,000" in far.describe() and "+20.0%" in far.describe()
    assert KVComparison(None, actual, 0.1).within_tolerance


def _events(*chunks: dict[str, object], done: bool = True) -> list[str]:
    return [json.dumps(c) for c in chunks] + (["[DONE]"] if done else [])


ROLE = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
HI = {"choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": None}]}
END = {"choices": [{"index": 0, "delta": {"content": "!"}, "finish_reason": "stop"}]}
USAGE = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}


def test_good_chat_stream_shape() -> None:
    summary = _check_chat_stream(_events(ROLE, HI, END, USAGE), "r")
    assert (summary.text, summary.num_content_chunks, summary.usage_seen) == ("Hi!", 2, True)
    assert not _check_chat_stream(_events(ROLE, HI, END), "r").usage_seen


@pytest.mark.parametrize(
    ("events", "reason"),
    [
        (_events(ROLE, HI, END, done=False), "does not end with data: [DONE]"),
        (_events(HI, END), "no role 'assistant'"),
        (_events(ROLE, END, HI), "content after the finish_reason"),
        (_events(ROLE, HI), "no chunk carries a finish_reason"),
        (_events(ROLE, {"choices": [{"delta": {}, "finish_reason": "stop"}]}), "no content deltas"),
        ([*_events(ROLE, HI, END), json.dumps(USAGE), "[DONE]"], "appears 2 times"),
        (["{not json", "[DONE]"], "not JSON"),
    ],
)
def test_bad_chat_stream_shapes(events: list[str], reason: str) -> None:
    with pytest.raises(CheckFailed, match=re.escape(reason)):
        _check_chat_stream(events, "r")
