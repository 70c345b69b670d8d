"""Value types of `llmdeploy-engine serve` flags: sizes with units, counts, ports, fractions, the
speculative config; each raises argparse.ArgumentTypeError with the accepted form."""

from __future__ import annotations

import argparse
import json
import re

from llmdeploy_engine.facts import AUTO_MAX_MODEL_LEN
from llmdeploy_engine.spec_decode.config import SpeculativeConfig

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtKMGT]?)\s*(?:[iI]?[bB])?\s*$")
_DECIMAL = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def human_readable_int(text: str) -> int:
    """Parse '4096', '32k' (x1000) or '4G' (x2^30) like vLLM: lower-case suffixes are decimal,
    upper-case binary."""
    match = _SIZE.match(text)
    if not match:
        raise argparse.ArgumentTypeError(f"expected an integer such as 4096, 32k or 4G, got {text!r}")
    number, suffix = match.groups()
    scale = _BINARY[suffix] if suffix in _BINARY else _DECIMAL[suffix]
    value = float(number) * scale
    if value != int(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number")
    return int(value)


def positive_int(text: str) -> int:
    value = human_readable_int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text!r}")
    return value


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    value = human_readable_int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {text!r}")
    return value


def steps_or_auto(text: str) -> int | None:
    """--num-scheduler-steps: a whole number >= 1, or auto (None: the engine chooses)."""
    if text.strip().lower() == "auto":
        return None
    try:
        return positive_int(text)
    except (argparse.ArgumentTypeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1 or auto, got {text!r}") from None


def context_len_or_auto(text: str) -> int:
    """--max-model-len: tokens (4096, 32k), or auto / -1 (vLLM's spelling): the longest context the KV
    cache holds, up to the model's (facts.AUTO_MAX_MODEL_LEN)."""
    if text.strip().lower() in ("auto", "-1"):
        return AUTO_MAX_MODEL_LEN
    try:
        return positive_int(text)
    except (argparse.ArgumentTypeError, ValueError):
        raise argparse.ArgumentTypeError(
            f"expected a number of tokens such as 4096 or 32k, or auto, got {text!r}"
        ) from None


def port_number(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port must be in 0..65535 (0: any free port), got {value}")
    return value


def fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {text!r}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {value}")
    return value


def speculative_config_arg(text: str) -> SpeculativeConfig:
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r} ({e.msg})") from None
    try:
        return SpeculativeConfig.from_dict(raw)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
