"""`models show` on the default model's GGUF agrees with the file's own metadata and tensor table."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import pytest
from click.testing import CliRunner
from default_model import DEFAULT_MODEL_GGUF, needs_default_model

from llmdeploy.catalog.models import resolve_model
from llmdeploy.cli.models_cmd import models_command

GGUF = DEFAULT_MODEL_GGUF
pytestmark = needs_default_model


def _meta(reader: gguf.GGUFReader, key: str) -> object:
    return reader.fields[key].contents()


@pytest.mark.slow
def test_show_gguf_agrees_with_its_metadata() -> None:
    reader = gguf.GGUFReader(str(GGUF))
    out = CliRunner().invoke(models_command, ["show", str(GGUF), "--output", "json"])
    assert out.exit_code == 0, out.output
    card = json.loads(out.output)
    assert card["num_layers"] == _meta(reader, "llama.block_count")
    assert card["hidden_size"] == _meta(reader, "llama.embedding_length")
    assert card["num_attention_heads"] == _meta(reader, "llama.attention.head_count")
    assert card["num_kv_heads"] == _meta(reader, "llama.attention.head_count_kv")
    assert card["intermediate_size"] == _meta(reader, "llama.feed_forward_length")
    assert card["max_position_embeddings"] == _meta(reader, "llama.context_length")
    assert card["rope_theta"] == _meta(reader, "llama.rope.freq_base")
    assert card["head_dim"] == _meta(reader, "llama.rope.dimension_count")
    assert card["tie_word_embeddings"] is True  # no output.weight tensor
    loaded = sum(int(t.n_elements) for t in reader.tensors)
    assert card["num_params"] == loaded == resolve_model("HuggingFaceTB/SmolLM2-135M").num_params
    assert card["kv_bytes_per_token"]["bf16"] == 2 * 30 * 3 * 64 * 2
    assert card["weights_gib"]["file (Q4_1)"] == round(sum(int(t.n_bytes) for t in reader.tensors) / 2**30, 3)


def test_list_filters() -> None:
    out = CliRunner().invoke(
        models_command, ["list", "--family", "smollm2", "--max-params-b", "0.5", "--output", "json"]
    )
    assert out.exit_code == 0, out.output
    ids = [r["hf_id"] for r in json.loads(out.output)]
    assert ids == ["HuggingFaceTB/SmolLM2-135M", "HuggingFaceTB/SmolLM2-360M"]


def test_show_catalog_model_table_mentions_moe_and_mla() -> None:
    out = CliRunner().invoke(models_command, ["show", "deepseek-ai/DeepSeek-V3"])
    assert out.exit_code == 0, out.output
    assert "kv_lora_rank" in out.output and "num_experts" in out.output and "awq/gptq int4" in out.output


def test_broken_gguf_is_a_user_error(tmp_path: Path) -> None:
    from llmdeploy.errors import UserError

    bad = tmp_path / "broken.gguf"
    bad.write_bytes(GGUF.read_bytes()[:4096])  # header cut in the middle
    with pytest.raises(UserError) as e:
        resolve_model(str(bad))
    assert "cannot read GGUF file" in str(e.value)


def test_show_local_checkpoint_folder(tmp_path: Path) -> None:
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "vocab_size": 49152,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": True,
        "rope_theta": 100000.0,
        "rms_norm_eps": 1e-5,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    out = CliRunner().invoke(models_command, ["show", str(tmp_path), "--output", "json"])
    assert out.exit_code == 0, out.output
    card = json.loads(out.output)
    assert card["source"] == "config" and card["num_params"] == 134_515_008 and card["gqa_group_size"] == 3
