"""Structured-output overhead on a running server: N concurrent chat requests, unconstrained, then the
same requests with a `json_schema` response_format; prints output tokens/s of each and their ratio.

Works against any OpenAI-compatible server (the built-in engine, vLLM, ...). Both rounds send the
same prompts, temperature and max_tokens; the default schema (an open-ended list of records) lets a
model keep writing until max_tokens, so both rounds generate about the same number of tokens and the
ratio measures the cost of the grammar mask, not a shorter answer. Each constrained reply is parsed
as JSON and the count of replies that do not parse is printed (a reply cut by max_tokens is
incomplete JSON by design; those are counted apart).

    python benchmarks/structured_outputs.py --url http://127.0.0.1:8000 --num-requests 64
    python benchmarks/structured_outputs.py --url URL --schema my_schema.json --max-tokens 512 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

DEFAULT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "records": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer"},
                    "name": {"type": "string"},
                    "tags": {"type": "array", "items": {"type": "string"}},
                    "score": {"type": "number"},
                    "active": {"type": "boolean"},
                },
                "required": ["id", "name", "tags", "score", "active"],
            },
        },
    },
    "required": ["title", "records"],
}
PROMPT = "Write a JSON catalogue of {topic}: a title and as many records as you can."
TOPICS = ["books", "rivers", "tools", "songs", "planets", "recipes", "cities", "birds"]


@dataclass(frozen=True)
class Round:
    name: str
    num_requests: int
    output_tokens: int
    elapsed_s: float
    num_length: int  # replies cut by max_tokens
    num_invalid_json: int  # constrained replies that stopped but do not parse (should be 0)

    @property
    def output_tok_s(self) -> float:
        return self.output_tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0


async def _one(client: httpx.AsyncClient, body: dict[str, Any], constrained: bool) -> tuple[int, bool, bool]:
    r = await client.post("/v1/chat/completions", json=body)
    if r.status_code != 200:
        raise SystemExit(f"the server answered {r.status_code}: {r.text[:500]}")
    data = r.json()
    choice = data["choices"][0]
    cut = choice.get("finish_reason") == "length"
    invalid = False
    if constrained and not cut:
        try:
            json.loads(choice["message"]["content"] or "")
        except json.JSONDecodeError:
            invalid = True
    return int(data["usage"]["completion_tokens"]), cut, invalid


async def run_round(
    client: httpx.AsyncClient, args: argparse.Namespace, model: str, schema: dict[str, Any] | None
) -> Round:
    bodies = []
    for i in range(args.num_requests):
        body: dict[str, Any] = {
            "model": model,
            "messages": [{"role": "user", "content": PROMPT.format(topic=TOPICS[i % len(TOPICS)])}],
            "max_tokens": args.max_tokens,
            "temperature": args.temperature,
        }
        if args.seed is not None:
            body["seed"] = args.seed + i
        if schema is not None:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "catalogue", "schema": schema},
            }
        bodies.append(body)
    start = time.perf_counter()
    results = await asyncio.gather(*(_one(client, b, schema is not None) for b in bodies))
    elapsed = time.perf_counter() - start
    return Round(
        name="json_schema" if schema is not None else "unconstrained",
        num_requests=len(bodies),
        output_tokens=sum(r[0] for r in results),
        elapsed_s=elapsed,
        num_length=sum(r[1] for r in results),
        num_invalid_json=sum(r[2] for r in results),
    )


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limits = httpx.Limits(max_connections=args.num_requests + 4)
    async with httpx.AsyncClient(
        base_url=args.url.rstrip("/"), headers=headers, timeout=args.timeout_s, limits=limits
    ) as client:
        model = args.model
        if model is None:
            listed = (await client.get("/v1/models")).json()
            model = listed["data"][0]["id"]
        schema = json.loads(Path(args.schema).read_text()) if args.schema else DEFAULT_SCHEMA
        # warm-up: the constrained round's schema compiled once, both paths run once
        for warm in (None, schema):
            warm_args = argparse.Namespace(**{**vars(args), "num_requests": 1, "max_tokens": 8})
            await run_round(client, warm_args, model, warm)
        rounds = []
        for _ in range(args.repeats):
            rounds.append(await run_round(client, args, model, None))
            rounds.append(await run_round(client, args, model, schema))
    free = [r for r in rounds if r.name == "unconstrained"]
    bound = [r for r in rounds if r.name == "json_schema"]
    best_free = max(r.output_tok_s for r in free)
    best_bound = max(r.output_tok_s for r in bound)
    return {
        "url": args.url,
        "model": model,
        "commit": _commit(),
        "num_requests": args.num_requests,
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "rounds": [{**asdict(r), "output_tok_s": r.output_tok_s} for r in rounds],
        "ratio": best_bound / best_free if best_free else None,
    }


def _commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip() or None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", help="model name (default: the first of /v1/models)")
    p.add_argument("--api-key", help="bearer token, when the server has one")
    p.add_argument("--num-requests", type=int, default=64, help="concurrent requests per round (default 64)")
    p.add_argument("--max-tokens", type=int, default=256, help="max_tokens per request (default 256)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument(
        "--seed", type=int, default=None, help="per-request seeds seed, seed + 1, ... (default none)"
    )
    p.add_argument("--schema", help="a JSON schema file (default: an open-ended list of records)")
    p.add_argument(
        "--repeats", type=int, default=2, help="rounds of each kind, alternating; best counts (default 2)"
    )
    p.add_argument("--timeout-s", type=float, default=600.0)
    p.add_argument("--json", help="also write the results to this JSON file")
    args = p.parse_args(argv)
    result = asyncio.run(main_async(args))
    print(f"# structured outputs: {result['url']} model={result['model']} commit={result['commit']}")
    print(
        f"# {args.num_requests} concurrent requests, max_tokens={args.max_tokens}, temperature={args.temperature}"
    )
    print(
        f"{'round':<14} {'requests':>8} {'out tokens':>10} {'seconds':>8} {'out tok/s':>10} {'cut':>5} {'bad json':>8}"
    )
    for r in result["rounds"]:
        print(
            f"{r['name']:<14} {r['num_requests']:>8} {r['output_tokens']:>10} {r['elapsed_s']:>8.2f} "
            f"{r['output_tok_s']:>10.1f} {r['num_length']:>5} {r['num_invalid_json']:>8}"
        )
    print(f"json_schema / unconstrained (best round of each): {result['ratio']:.3f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
