"""Writes engine/random_models.json, the shapes `random:<catalog id>` builds, from the toolkit's catalog.

The engine never imports the toolkit, so the catalog's entries of the architectures it runs are copied
into the engine as data; test_random_weights.py fails when the copy and the catalog disagree.
Regenerate: `python tests/engine_model/random_models_gen.py`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from llmdeploy_engine.facts import ARCHITECTURES

from llmdeploy.catalog.model_spec import ModelSpec
from llmdeploy.catalog.models import list_models

TABLE = Path(__file__).resolve().parents[2] / "engine" / "loading" / "random_models.json"


def runs_on_engine(spec: ModelSpec) -> bool:
    return (
        spec.architecture in ARCHITECTURES
        and not spec.is_moe
        and not spec.is_mla
        and spec.partial_rotary_factor == 1.0
        and spec.mlp_gated
    )


def entry(spec: ModelSpec) -> dict[str, Any]:
    """The catalog facts random_weights.config_from_spec reads, under the catalog's own names."""
    return {
        "aliases": list(spec.aliases),
        "architecture": spec.architecture,
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_layers": spec.num_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_kv_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "max_position_embeddings": spec.max_position_embeddings,
        "sliding_window": spec.sliding_window,
        "rms_norm_eps": spec.rms_norm_eps,
        "rope_theta": spec.rope_theta,
        "rope_scaling": spec.rope_scaling,
        "tie_word_embeddings": spec.tie_word_embeddings,
        "attention_bias": spec.attention_bias,
        "qk_norm": spec.qk_norm,
    }


def table() -> dict[str, Any]:
    models = {spec.hf_id: entry(spec) for spec in list_models() if runs_on_engine(spec)}
    comment = (
        "Catalog shapes `random:<id>` builds; regenerate: python tests/engine_model/random_models_gen.py"
    )
    return {"_comment": comment, "models": models}


if __name__ == "__main__":
    TABLE.write_text(json.dumps(table(), indent=1, sort_keys=True) + "\n")
    sys.stdout.write(f"wrote {TABLE}\n")
