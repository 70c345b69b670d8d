"""`llmdeploy models list`: every cell of the table stands apart from its neighbours (issue 29, item
13: a 1,024,000-token context ran into the KV-heads column)."""

from __future__ import annotations

import json
import re

from click.testing import CliRunner

from llmdeploy.cli.models_cmd import models_command


def test_every_row_splits_into_its_own_values() -> None:
    table = CliRunner().invoke(models_command, ["list"])
    rows = json.loads(CliRunner().invoke(models_command, ["list", "--output", "json"]).output)
    assert table.exit_code == 0, table.output
    header, *lines = table.output.splitlines()
    assert re.split(r"\s{2,}", header.strip()) == [
        "model",
        "family",
        "params",
        "layers",
        "kv",
        "context",
        "KV B/tok",
    ]
    assert len(lines) == len(rows)
    for line, row in zip(lines, rows, strict=True):
        cells = re.split(r"\s{2,}", line.strip())
        assert cells[:6] == [
            row["hf_id"],
            row["family"],
            f"{row['num_params'] / 1e9:.2f}B",
            str(row["num_layers"]),
            str(row["num_kv_heads"]),
            f"{row['max_position_embeddings']:,}",
        ], line
        assert cells[6].split()[0] == f"{row['kv_bytes_per_token_bf16']:,}", line
