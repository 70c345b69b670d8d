"""`llmdeploy models list|show`: the model catalog and one model's architecture facts."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import click


@click.group("models")
def models_command() -> None:
    """The model catalog: list it, or show one model (catalog name, checkpoint folder or GGUF file)."""


@models_command.command("list")
@click.option("--family", help="Only this family (prefix match, e.g. 'qwen2.5', 'llama').")
@click.option("--max-params-b", type=float, help="Only models with at most this many billion parameters.")
@click.option("--output", type=click.Choice(["table", "json"]), default="table", show_default=True)
def list_cmd(family: str | None, max_params_b: float | None, output: str) -> None:
    """List catalog models with their size and KV cost."""
    from llmdeploy.catalog.model_card import kv_bytes_per_token
    from llmdeploy.catalog.models import list_models

    specs = list_models()
    if family:
        specs = [s for s in specs if s.family.lower().startswith(family.lower())]
    if max_params_b is not None:
        specs = [s for s in specs if s.num_params <= max_params_b * 1e9]
    rows: list[dict[str, Any]] = [
        {
            "hf_id": s.hf_id,
            "family": s.family,
            "architecture": s.architecture,
            "num_params": s.num_params,
            "num_layers": s.num_layers,
            "num_kv_heads": s.num_kv_heads,
            "max_position_embeddings": s.max_position_embeddings,
            "kv_bytes_per_token_bf16": kv_bytes_per_token(s, 2),
            "moe": s.is_moe,
            "hybrid": s.is_hybrid,
        }
        for s in specs
    ]
    if output == "json":
        click.echo(json.dumps(rows, indent=2))
        return
    for line in _table(rows):
        click.echo(line)


_COLUMNS: tuple[tuple[str, Callable[[dict[str, Any]], str], bool], ...] = (  # header, cell, left-aligned
    ("model", lambda r: str(r["hf_id"]), True),
    ("family", lambda r: str(r["family"]), True),
    ("params", lambda r: f"{r['num_params'] / 1e9:.2f}B", False),
    ("layers", lambda r: str(r["num_layers"]), False),
    ("kv", lambda r: str(r["num_kv_heads"]), False),
    ("context", lambda r: f"{r['max_position_embeddings']:,}", False),
    ("KV B/tok", lambda r: f"{r['kv_bytes_per_token_bf16']:,}", False),
)


def _table(rows: list[dict[str, Any]]) -> list[str]:
    """Columns as wide as their longest cell, two spaces apart, so long values never run together."""
    cells = [[cell(r) for _, cell, _ in _COLUMNS] for r in rows]
    widths = [max([len(h), *(len(c[i]) for c in cells)]) for i, (h, _, _) in enumerate(_COLUMNS)]

    def line(values: list[str]) -> str:
        parts = [
            v.ljust(w) if left else v.rjust(w)
            for v, w, (_, _, left) in zip(values, widths, _COLUMNS, strict=True)
        ]
        return "  ".join(parts)

    out = [line([h for h, _, _ in _COLUMNS])]
    for r, c in zip(rows, cells, strict=True):
        tags = (" moe" if r["moe"] else "") + (" hybrid" if r["hybrid"] else "")
        out.append(line(c) + tags)
    return out


@models_command.command("show")
@click.argument("model")
@click.option("--output", type=click.Choice(["table", "json"]), default="table", show_default=True)
def show_cmd(model: str, output: str) -> None:
    """Show one model: shape, attention layout, MoE/MLA, parameter split, KV cost, weight sizes."""
    from llmdeploy.catalog.model_card import card_text, model_card
    from llmdeploy.catalog.models import resolve_model

    card = model_card(resolve_model(model))
    click.echo(json.dumps(card, indent=2) if output == "json" else card_text(card))
