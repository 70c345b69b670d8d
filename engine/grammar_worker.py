"""A grammar worker process: proves that a constraint compiles within the time bound, and can be killed.

xgrammar's compilation is one C++ call that cannot be interrupted, and a large or deeply nested
schema can keep it busy for minutes; in a thread it would run on after its client left or its time
was up. The server (server/grammar_pool.py) first compiles each new constraint here, in a process it
kills when the time bound passes or the client hangs up, and compiles it in its own process only once
it is known to finish in time. (Handing the compiled grammar back is no option: xgrammar's
serialized form of a 30 KB schema's grammar is ~500 MB of JSON and takes minutes to write and read.)

The process gets the tokenizer's vocabulary once (xgrammar's serialized TokenizerInfo, a file named
on the command line) and then answers jobs on stdin/stdout, each a 4-byte big-endian length and JSON:

  job:    {"spec": {field: value}} (a StructuredOutputsParams) or
          {"tools": {"fmt": ..., "functions": [...]}} (a forced tool call, tool_calls.py)
  answer: {"ok": true, "grammar": the EBNF text of a tools job, else null}
          or {"ok": false, "error": reason}

Run as `python -m llmdeploy_engine.grammar_worker TOKENIZER_INFO_FILE`.
"""

from __future__ import annotations

import json
import os
import struct
import sys
from typing import IO, Any

from llmdeploy_engine.sampling_params import StructuredOutputsParams

HEADER = struct.Struct(">I")


def frame(message: dict[str, Any]) -> bytes:
    data = json.dumps(message, ensure_ascii=False).encode()
    return HEADER.pack(len(data)) + data


def spec_job(spec: StructuredOutputsParams) -> dict[str, Any]:
    fields = {
        name: value
        for name, value in (
            ("json", spec.json),
            ("regex", spec.regex),
            ("choice", list(spec.choice) if spec.choice is not None else None),
            ("grammar", spec.grammar),
            ("structural_tag", spec.structural_tag),
        )
        if value is not None
    }
    if spec.json_object:
        fields["json_object"] = True
    return {"spec": fields}


def _answer(out: IO[bytes], message: dict[str, Any]) -> None:
    out.write(frame(message))
    out.flush()


def _run(job: dict[str, Any], compiler: Any) -> dict[str, Any]:
    from llmdeploy_engine.structured_output import compile_spec

    grammar = None
    if "tools" in job:
        from llmdeploy_engine.server.tool_calls import forced_call_constraint

        spec = forced_call_constraint(job["tools"]["fmt"], job["tools"]["functions"])
        grammar = spec.grammar
    else:
        fields = dict(job["spec"])
        if "choice" in fields:
            fields["choice"] = tuple(fields["choice"])
        spec = StructuredOutputsParams(**fields)
    compile_spec(compiler, spec)
    return {"ok": True, "grammar": grammar}


def main(info_path: str) -> None:
    # answers go to the original stdout; anything a library prints goes to stderr (the server's log)
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    if os.getpriority(os.PRIO_PROCESS, 0) < 10:  # (the server lowers it as it starts the process)
        os.setpriority(os.PRIO_PROCESS, 0, 10)  # the server's event loop and engine loop come first
    import xgrammar as xgr

    with open(info_path, encoding="utf-8") as f:
        info = xgr.TokenizerInfo.deserialize_json(f.read())
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    source = sys.stdin.buffer
    _answer(out, {"ok": True, "ready": True})
    while True:
        header = source.read(HEADER.size)
        if len(header) < HEADER.size:
            return  # the server closed the pipe: it is going away
        (size,) = HEADER.unpack(header)
        job = json.loads(source.read(size))
        try:
            answer = _run(job, compiler)
        except ValueError as e:
            answer = {"ok": False, "error": str(e)}
        _answer(out, answer)


if __name__ == "__main__":
    main(sys.argv[1])
