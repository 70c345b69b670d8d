"""KV-cache groups of hybrid models as vLLM V1 builds them: chunked local attention (Llama 4) and
linear attention (Qwen3-Next's Gated DeltaNet). Expected values are computed by hand from vLLM's
formulas (v1/kv_cache_interface.py ChunkedLocalAttentionSpec / MambaSpec,
v1/core/kv_cache_utils.py `_get_kv_cache_groups_uniform_page_size` and
`get_max_concurrency_for_kv_cache_config`, platforms/interface.py `_align_hybrid_block_size`,
model_executor/layers/mamba/mamba_utils.py `gated_delta_net_state_shape`)."""

from __future__ import annotations

from typing import Any

import pytest

from llmdeploy.catalog.gpus import resolve_gpu
from llmdeploy.catalog.model_spec import ModelSpec, build_spec
from llmdeploy.memory.kv_layout import kv_layout
from llmdeploy.planner import PlanInputs, plan_from_inputs

GIB = 2**30

_BASE: dict[str, Any] = {
    "hf_id": "test/hybrid",
    "family": "test",
    "num_layers": 48,
    "vocab_size": 1000,
    "max_position_embeddings": 262144,
    "tie_word_embeddings": False,
    "intermediate_size": 1024,
}


def _linear_model() -> ModelSpec:
    # Qwen3-Next-80B-A3B's attention and Gated DeltaNet shapes: 2 KV heads of 256, every 4th layer full
    return build_spec(
        {
            **_BASE,
            "architecture": "Qwen3NextForCausalLM",
            "hidden_size": 2048,
            "num_attention_heads": 16,
            "num_kv_heads": 2,
            "head_dim": 256,
            "layer_types": ["full" if (i + 1) % 4 == 0 else "linear" for i in range(48)],
            "linear_num_key_heads": 16,
            "linear_num_value_heads": 32,
            "linear_key_head_dim": 128,
            "linear_value_head_dim": 128,
            "linear_conv_kernel_dim": 4,
        }
    )


def _chunked_model() -> ModelSpec:
    # Llama-4-Scout's attention shapes: 8 KV heads of 128, 3 chunked layers of 8192 tokens per full one
    return build_spec(
        {
            **_BASE,
            "architecture": "Llama4ForConditionalGeneration",
            "hidden_size": 5120,
            "num_attention_heads": 40,
            "num_kv_heads": 8,
            "head_dim": 128,
            "layer_types": ["full" if (i + 1) % 4 == 0 else "chunked" for i in range(48)],
            "attention_chunk_size": 8192,
        }
    )


def _inputs(spec: ModelSpec, **kw: Any) -> PlanInputs:
    return PlanInputs(spec=spec, gpu=resolve_gpu("H200"), kv_cache_memory_gib=10.0, **kw)


def test_linear_layers_hold_a_padded_state_page_not_kv() -> None:
    layout = kv_layout(_inputs(_linear_model()))
    # conv (2*16*128 + 32*128 = 8192 channels) x (4 - 1) + temporal 32 x 128 x 128, bf16
    assert layout.linear_state_bytes == (8192 * 3 + 32 * 128 * 128) * 2 == 1_097_728
    # 12 full + 36 linear layers -> groups of 12: one full group, three linear groups
    assert layout.group_kinds == ("full", "linear", "linear", "linear") and layout.group_size == 12
    assert layout.layer_bytes_per_token == 2 * 2 * 256 * 2 == 2048
    assert layout.bytes_per_token == 2048 * 12 and layout.num_layers == 12
    # block = 16 x cdiv(1,097,728, 16 x 2048) = 544 tokens, so one attention page >= one state
    assert layout.hybrid_block_size(16) == 544


def test_linear_model_kv_tokens_and_concurrency() -> None:
    plan = plan_from_inputs(_inputs(_linear_model(), max_model_len=262144))
    assert plan.block_size == 544
    # 10 GiB / (2048 B x 12 layers x 544 tokens) = 803 blocks
    assert plan.num_kv_blocks == 10 * GIB // (2048 * 12 * 544) == 803
    # one request: cdiv(262,144, 544) = 482 full blocks + 3 linear groups x 2 state blocks ("align")
    assert plan.max_concurrency == pytest.approx(803 / (482 + 6))
    assert plan.kv_cache_tokens == int(803 / 488 * 262144)
    assert plan.fits


def test_linear_state_splits_with_tensor_parallelism() -> None:
    layout = kv_layout(_inputs(_linear_model(), tensor_parallel_size=2))
    assert layout.linear_state_bytes == (8192 // 2 * 3 + 16 * 128 * 128) * 2
    assert layout.layer_bytes_per_token == 2 * 1 * 256 * 2  # one KV head per GPU
    # 16 x cdiv(548,864, 16 x 1024) = 16 x 34
    assert layout.hybrid_block_size(16) == 544


def test_chunked_layers_hold_one_chunk_plus_one_batch() -> None:
    inputs = _inputs(_chunked_model(), max_model_len=131072, max_num_batched_tokens=2048)
    layout = kv_layout(inputs)
    assert layout.group_kinds == ("full", "chunked", "chunked", "chunked")
    assert layout.bytes_per_token == 2 * 8 * 128 * 2 * 12 * 4 and layout.attention_chunk_size == 8192
    plan = plan_from_inputs(inputs)
    assert plan.block_size == 16
    blocks = 10 * GIB // (4096 * 12 * 16)
    assert plan.num_kv_blocks == blocks == 13653
    # one request: 131,072 / 16 = 8,192 full blocks + 3 x cdiv(8,192 + 2,048, 16) = 3 x 640
    assert plan.max_concurrency == pytest.approx(blocks / (8192 + 3 * 640))
    assert plan.kv_cache_tokens == int(blocks / 10112 * 131072)


def test_chunked_kv_tokens_before_0_21_divide_the_pool_among_groups() -> None:
    plan = plan_from_inputs(
        _inputs(_chunked_model(), max_model_len=131072, max_num_batched_tokens=2048, engine_version="0.20.2")
    )
    assert plan.kv_cache_tokens == 13653 // 4 * 16


def test_a_short_context_caps_the_chunk_at_max_model_len() -> None:
    plan = plan_from_inputs(_inputs(_chunked_model(), max_model_len=4096, max_num_batched_tokens=2048))
    # min(8192 + 2048, 4096) = 4096 tokens: every group needs the whole request
    assert plan.max_concurrency == pytest.approx(13653 / (4 * 256))
