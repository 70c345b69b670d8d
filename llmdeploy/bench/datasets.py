"""Request files: one JSON object a line, either a plain prompt or a ShareGPT conversation.

- `{"prompt": "...", "output_len": 64}` (`output_len` optional)
- ShareGPT, as `vllm bench serve --dataset-name sharegpt` reads it (there a JSON array; here one
  conversation a line): `{"conversations": [{"from": "human", "value": "..."}, {"from": "gpt",
  "value": "..."}, ...]}`. The first human turn is the prompt; the reply after it sets the output
  length (its words x the endpoint's tokens per word), as vLLM uses the reply's token count.
Nothing is downloaded: the file is given. Every malformed line is reported with its number.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from llmdeploy.errors import Problem, UserError

_HUMAN = ("human", "user")
_GPT = ("gpt", "assistant", "chatgpt", "bard", "model")


@dataclass(frozen=True)
class DatasetRow:
    prompt: str
    output_len: int | None  # given by the line
    reply: str | None = None  # ShareGPT: the reference reply, sized into an output length


def read_dataset(path: Path) -> tuple[DatasetRow, ...]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) else "not UTF-8 text"
        raise UserError.one(
            f"cannot read the dataset: {reason}", file=str(path), fix="give a JSONL file"
        ) from e
    rows: list[DatasetRow] = []
    problems: list[Problem] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = _parse_line(json.loads(line))
        except json.JSONDecodeError as e:
            problems.append(Problem(f"not JSON: {e.msg}", file=str(path), line=number))
        except ValueError as e:
            problems.append(Problem(str(e), file=str(path), line=number, fix=_FIX))
        else:
            rows.append(row)
    if problems:
        raise UserError(problems)
    if not rows:
        raise UserError.one("the dataset has no prompts", file=str(path), fix=_FIX)
    return tuple(rows)


_FIX = 'one {"prompt": "..."} or ShareGPT {"conversations": [{"from": "human", "value": "..."}, ...]} a line'


def _parse_line(row: object) -> DatasetRow:
    if not isinstance(row, dict):
        raise ValueError("each line must be a JSON object")
    if "conversations" in row:
        return _sharegpt(row["conversations"])
    prompt = row.get("prompt")
    output_len = row.get("output_len")
    if not isinstance(prompt, str) or not prompt:
        raise ValueError('each line needs a non-empty "prompt" string (or ShareGPT "conversations")')
    if output_len is not None and (
        not isinstance(output_len, int) or isinstance(output_len, bool) or output_len < 1
    ):
        raise ValueError('"output_len" must be a positive integer')
    return DatasetRow(prompt, output_len)


def _sharegpt(turns: object) -> DatasetRow:
    if not isinstance(turns, list) or not turns:
        raise ValueError('ShareGPT "conversations" must be a non-empty list of turns')
    for i, turn in enumerate(turns):
        if not (
            isinstance(turn, dict)
            and isinstance(turn.get("from"), str)
            and isinstance(turn.get("value"), str)
        ):
            raise ValueError(f'ShareGPT turn {i} must be an object with "from" and "value" strings')
    first = next((i for i, t in enumerate(turns) if t["from"] in _HUMAN and t["value"].strip()), None)
    if first is None:
        raise ValueError('ShareGPT conversation has no non-empty human turn ("from": "human")')
    reply = next((t["value"] for t in turns[first + 1 :] if t["from"] in _GPT), None)
    return DatasetRow(turns[first]["value"], None, reply if reply and reply.strip() else None)
