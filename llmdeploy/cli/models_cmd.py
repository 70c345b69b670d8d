"""`llmdeploy models list|show`: the model catalog and one model's architecture facts."""

from __future__ import annotations

import json
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
    click.echo(
        f"{'model':<44}{'family':<14}{'params':>10}{'layers':>7}{'kv':>4}{'context':>9}{'KV B/tok':>10}"
    )
    for r in rows:
        tags = (" moe" if r["moe"] else "") + (" hybrid" if r["hybrid"] else "")
        click.echo(
            f"{r['hf_id']:<44}{r['family']:<14}{r['num_params'] / 1e9:>9.2f}B{r['num_layers']:>7}"
            f"{r['num_kv_heads']:>4}{r['max_position_embeddings']:>9,}{r['kv_bytes_per_token_bf16']:>10,}{tags}"
        )


@models_command.command("show")
@click.argument("model")
@click.option("--output", type=click.Choice(["table", "json"]), default="table", show_default=True)
def show_cmd(model: str, output: str) -> None:
    """Show one model: shape, attention layout, MoE/MLA, parameter split, KV cost, weight sizes."""
    from llmdeploy.catalog.model_card import card_text, model_card
    from llmdeploy.catalog.models import resolve_model

    card = model_card(resolve_model(model))
    click.echo(json.dumps(card, indent=2) if output == "json" else card_text(card))
