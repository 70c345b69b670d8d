"""config.json files leave the architecture's defaults out; the planner must read them back in."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from llmdeploy.catalog import config_defaults
from llmdeploy.catalog.hf_config import spec_from_config, spec_from_folder
from llmdeploy.errors import UserError

# google/gemma-7b's config.json without the keys that equal GemmaConfig's defaults
GEMMA_7B = {
    "architectures": ["GemmaForCausalLM"],
    "model_type": "gemma",
    "hidden_size": 3072,
    "intermediate_size": 24576,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "vocab_size": 256000,
    "max_position_embeddings": 8192,
}
GEMMA_3_TEXT = {
    "architectures": ["Gemma3ForCausalLM"],
    "model_type": "gemma3_text",
    "hidden_size": 1152,
    "intermediate_size": 6912,
    "num_hidden_layers": 26,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "vocab_size": 262144,
    "sliding_window": 512,
    "sliding_window_pattern": 6,
}


def test_gemma_defaults_tie_and_head_dim(tmp_path: Path) -> None:
    spec = spec_from_config(GEMMA_7B, "google/gemma-7b")
    assert spec.tie_word_embeddings and spec.head_dim == 256 and spec.rope_theta == 10000.0
    assert spec.num_params == 8_537_680_896  # the published count of google/gemma-7b
    (tmp_path / "config.json").write_text(json.dumps(GEMMA_7B))
    assert spec_from_folder(tmp_path).num_params == 8_537_680_896


def test_gemma3_global_and_local_rope_and_layer_pattern() -> None:
    spec = spec_from_config(GEMMA_3_TEXT, "g3")
    assert spec.rope_theta == 1000000.0 and spec.rope_local_base_freq == 10000.0
    assert spec.kinds[:6] == ("sliding",) * 5 + ("full",) and spec.sliding_window == 512
    assert spec.num_params == 999_885_952  # google/gemma-3-1b-pt, published count


def test_stated_keys_win_over_defaults() -> None:
    spec = spec_from_config({**GEMMA_7B, "tie_word_embeddings": False, "head_dim": 192, "rope_theta": 5e5})
    assert not spec.tie_word_embeddings and spec.head_dim == 192 and spec.rope_theta == 5e5


def test_table_is_used_without_transformers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config_defaults, "_transformers_view", lambda *_: None)
    spec = spec_from_config(GEMMA_7B)
    assert spec.tie_word_embeddings and spec.head_dim == 256
    multimodal = {"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"]}
    text = {k: v for k, v in GEMMA_3_TEXT.items() if k not in ("architectures", "model_type")}
    spec = spec_from_config({**multimodal, "text_config": text})
    assert spec.tie_word_embeddings and spec.rope_theta == 1000000.0


@pytest.mark.slow
@pytest.mark.parametrize("model_type", sorted(config_defaults.DOCUMENTED_DEFAULTS))
def test_table_agrees_with_transformers(model_type: str) -> None:
    transformers = pytest.importorskip("transformers")
    cls: Any = transformers.CONFIG_MAPPING[model_type]
    minimal = {"model_type": model_type}
    full = config_defaults.transformers_view(minimal)
    assert full is not None
    for key, value in config_defaults.DOCUMENTED_DEFAULTS[model_type].items():
        assert full.get(key) == value, (model_type, key, full.get(key))
    assert cls is not None


# Qwen3-Next-style hybrid (Gated DeltaNet linear attention, every 4th layer full), shrunk
QWEN3_NEXT_SMALL = {
    "architectures": ["Qwen3NextForCausalLM"],
    "model_type": "qwen3_next",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 8,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "vocab_size": 1000,
    "full_attention_interval": 4,
    "linear_num_key_heads": 4,
    "linear_num_value_heads": 8,
    "linear_key_head_dim": 32,
    "linear_value_head_dim": 32,
    "linear_conv_kernel_dim": 4,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 64,
}


@pytest.mark.parametrize("with_transformers", [True, False])
@pytest.mark.slow
def test_linear_attention_layers_are_recorded(
    with_transformers: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if with_transformers:
        pytest.importorskip("transformers")
    else:
        monkeypatch.setattr(config_defaults, "_transformers_view", lambda *_: None)
    spec = spec_from_config(QWEN3_NEXT_SMALL)
    assert spec.kinds == ("linear",) * 3 + ("full",) + ("linear",) * 3 + ("full",)
    assert spec.is_hybrid and spec.sliding_window is None
    if with_transformers:  # a family outside the table: Qwen3NextConfig's own defaults
        assert spec.partial_rotary_factor == 0.25 and spec.rope_theta == 10000.0


def test_chunked_attention_layers_keep_their_chunk_size() -> None:
    config = {
        "architectures": ["Llama4ForCausalLM"],
        "model_type": "unknown_for_transformers",
        "hidden_size": 256,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "vocab_size": 1000,
        "attention_chunk_size": 8192,
        "layer_types": ["chunked_attention"] * 3 + ["full_attention"],
    }
    spec = spec_from_config(config)
    assert spec.kinds == ("chunked", "chunked", "chunked", "full") and spec.attention_chunk_size == 8192
    assert spec_from_config({**config, "layer_types": ["full_attention"] * 4}).attention_chunk_size is None


def test_a_catalog_family_is_completed_without_importing_transformers() -> None:
    code = (
        "import sys; from llmdeploy.catalog.hf_config import spec_from_config; "
        f"spec = spec_from_config({GEMMA_7B!r}); "
        "print(spec.num_params, 'transformers' in sys.modules, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["8537680896", "False", "False"]


# config.json files of three newer families, as their releases ship them (fields the planner reads)
SCOUT_CONFIG: dict[str, Any] = {
    "architectures": ["Llama4ForConditionalGeneration"],
    "model_type": "llama4",
    "text_config": {
        "model_type": "llama4_text",
        "num_hidden_layers": 48,
        "hidden_size": 5120,
        "num_attention_heads": 40,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 8192,
        "intermediate_size_mlp": 16384,
        "vocab_size": 202048,
        "max_position_embeddings": 10485760,
        "num_experts_per_tok": 1,
        "num_local_experts": 16,
        "interleave_moe_layer_step": 1,
        "attention_chunk_size": 8192,
        "use_qk_norm": True,
        "tie_word_embeddings": False,
    },
    "vision_config": {
        "model_type": "llama4_vision_model",
        "hidden_size": 1408,
        "image_size": 336,
        "intermediate_size": 5632,
        "num_attention_heads": 16,
        "num_channels": 3,
        "num_hidden_layers": 34,
        "patch_size": 14,
        "pixel_shuffle_ratio": 0.5,
        "projector_input_dim": 4096,
        "projector_output_dim": 4096,
        "vision_output_dim": 4096,
    },
}
QWEN3_NEXT_CONFIG: dict[str, Any] = {
    "architectures": ["Qwen3NextForCausalLM"],
    "model_type": "qwen3_next",
    "decoder_sparse_step": 1,
    "full_attention_interval": 4,
    "head_dim": 256,
    "hidden_size": 2048,
    "intermediate_size": 5120,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_value_head_dim": 128,
    "max_position_embeddings": 262144,
    "moe_intermediate_size": 512,
    "num_attention_heads": 16,
    "num_experts": 512,
    "num_experts_per_tok": 10,
    "num_hidden_layers": 48,
    "num_key_value_heads": 2,
    "partial_rotary_factor": 0.25,
    "rope_theta": 10000000,
    "shared_expert_intermediate_size": 512,
    "tie_word_embeddings": False,
    "vocab_size": 151936,
}
MISTRAL_SMALL_31_CONFIG: dict[str, Any] = {
    "architectures": ["Mistral3ForConditionalGeneration"],
    "model_type": "mistral3",
    "multimodal_projector_bias": False,
    "spatial_merge_size": 2,
    "text_config": {
        "head_dim": 128,
        "hidden_size": 5120,
        "intermediate_size": 32768,
        "max_position_embeddings": 131072,
        "model_type": "mistral",
        "num_attention_heads": 32,
        "num_hidden_layers": 40,
        "num_key_value_heads": 8,
        "rope_theta": 1000000000.0,
        "sliding_window": None,
        "vocab_size": 131072,
    },
    "vision_config": {
        "head_dim": 64,
        "hidden_size": 1024,
        "image_size": 1540,
        "intermediate_size": 4096,
        "model_type": "pixtral",
        "num_attention_heads": 16,
        "num_channels": 3,
        "num_hidden_layers": 24,
        "patch_size": 14,
    },
}


@pytest.mark.parametrize("with_transformers", [True, False])
@pytest.mark.parametrize(
    ("config", "catalog_id"),
    [
        (SCOUT_CONFIG, "meta-llama/Llama-4-Scout-17B-16E-Instruct"),
        (QWEN3_NEXT_CONFIG, "Qwen/Qwen3-Next-80B-A3B-Instruct"),
        (MISTRAL_SMALL_31_CONFIG, "mistralai/Mistral-Small-3.1-24B-Instruct-2503"),
    ],
)
def test_a_release_config_reads_as_its_catalog_entry(
    config: dict[str, Any], catalog_id: str, with_transformers: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from llmdeploy.catalog.models import resolve_model

    if with_transformers:
        pytest.importorskip("transformers")
    else:
        monkeypatch.setattr(config_defaults, "_transformers_view", lambda *_: None)
    spec, entry = spec_from_config(config), resolve_model(catalog_id)
    assert spec.params == entry.params  # vision tower included
    assert spec.kinds == entry.kinds and spec.attention_chunk_size == entry.attention_chunk_size
    assert spec.linear_num_value_heads == entry.linear_num_value_heads


def test_linear_layers_without_their_state_shape_are_refused() -> None:
    broken = {k: v for k, v in QWEN3_NEXT_CONFIG.items() if k != "linear_conv_kernel_dim"}
    with pytest.raises(UserError, match="linear_conv_kernel_dim"):
        spec_from_config(broken | {"model_type": "not_known_to_transformers"})
