"""`random:<catalog id>`: catalog architectures map onto the engine's model, unsupported ones are refused."""

from __future__ import annotations

import json

import pytest
import torch
from llmdeploy_engine.loading.random_weights import config_from_spec, init_random_weights, random_model_config
from llmdeploy_engine.model.model import CausalLM
from random_models_gen import TABLE


@pytest.mark.parametrize(
    "model,architecture,bias,qk_norm,rope",
    [
        ("Qwen/Qwen2.5-0.5B", "qwen2", True, False, "default"),
        ("Qwen/Qwen3-8B", "qwen3", False, True, "default"),
        ("meta-llama/Llama-3.1-8B", "llama", False, False, "llama3"),
        ("mistralai/Mistral-7B-v0.1", "mistral", False, False, "default"),
    ],
)
def test_catalog_architectures(model: str, architecture: str, bias: bool, qk_norm: bool, rope: str) -> None:
    config = random_model_config(f"random:{model}")
    assert config.architecture == architecture
    assert (config.attention_bias, config.qk_norm, config.rope_scaling.rope_type) == (bias, qk_norm, rope)


@pytest.mark.parametrize("model", ["mistralai/Mixtral-8x7B-v0.1", "google/gemma-2-2b"])
def test_unsupported_architectures_are_refused(model: str) -> None:
    with pytest.raises(ValueError, match="not an architecture the built-in engine runs"):
        random_model_config(f"random:{model}")


def test_random_init_fills_every_parameter() -> None:
    config = random_model_config("random:Qwen/Qwen2.5-0.5B")
    small = type(config)(**{**config.__dict__, "num_hidden_layers": 1, "vocab_size": 512})
    with torch.device("meta"):
        model = CausalLM(small)
    model = model.to_empty(device="cpu")
    model.reset_rope()
    init_random_weights(model, seed=0)
    for name, param in model.named_parameters():
        p = param.detach()
        assert torch.isfinite(p).all(), name
        if name.endswith("norm.weight"):
            assert bool((p == 1).all()), name
        else:
            assert 0.01 < float(p.std()) < 0.03, name


def test_engine_table_matches_the_catalog() -> None:
    from random_models_gen import table

    assert json.loads(TABLE.read_text()) == json.loads(json.dumps(table())), (
        "engine/random_models.json is out of date: python tests/engine_model/random_models_gen.py"
    )


@pytest.mark.parametrize("name", ["meta-llama/Llama-3.2-1B-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"])
def test_fine_tunes_resolve_like_the_catalog(name: str) -> None:
    from llmdeploy.catalog.models import resolve_model

    assert random_model_config(f"random:{name}") == config_from_spec(resolve_model(name))
