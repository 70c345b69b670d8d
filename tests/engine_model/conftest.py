"""Session fixtures for the engine model tests: the default GGUF, our runner and transformers' model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from engine_model_helpers import default_gguf
from llmdeploy_engine.config import EngineConfig
from llmdeploy_engine.facts import AUTO_MAX_MODEL_LEN
from llmdeploy_engine.loading.tokenizer import Tokenizer
from llmdeploy_engine.runner.model_runner import ModelRunner

TEST_KV_CACHE_BYTES = 256 * 2**20


@pytest.fixture(scope="session")
def gguf_path() -> Path:
    return default_gguf()


@pytest.fixture(scope="session")
def runner(gguf_path: Path) -> ModelRunner:
    # one thread: the CI/dev machines are shared and OpenMP threads spin-wait badly when oversubscribed
    torch.set_num_threads(1)
    return ModelRunner(
        # float32 weights: this runner is checked against transformers (the compact CPU weights are
        # checked against it in test_cpu_quant.py)
        EngineConfig(
            model=str(gguf_path),
            device="cpu",
            kv_cache_memory_bytes=TEST_KV_CACHE_BYTES,
            max_model_len=AUTO_MAX_MODEL_LEN,  # the longest context the small test pool holds
            cpu_weights="float32",
        )
    )


@pytest.fixture(scope="session")
def tokenizer(gguf_path: Path) -> Tokenizer:
    return Tokenizer.from_model(gguf_path)


@pytest.fixture(scope="session")
def hf_model(gguf_path: Path) -> Iterator[torch.nn.Module]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
    ).eval()
    yield model
