"""vLLM V1 accounting: KV bytes per token per attention kind, parallelism, quantization, and failures."""

from __future__ import annotations

from dataclasses import replace

import pytest

from llmdeploy.catalog.gpus import resolve_gpu
from llmdeploy.catalog.models import resolve_model
from llmdeploy.memory.footprint import weights_bytes_per_gpu
from llmdeploy.memory.kv_layout import kv_layout
from llmdeploy.memory.memory_plan import GIB
from llmdeploy.planner import PlanInputs, plan_from_inputs

KEYS = {
    "weights_gib",
    "activation_gib",
    "non_torch_gib",
    "cuda_graph_gib",
    "kv_cache_gib",
    "kv_bytes_per_token",
    "kv_cache_tokens",
    "num_kv_blocks",
    "max_concurrency",
    "fits",
    "problems",
    "suggestions",
}


def _inputs(model: str, gpu: str = "H100", **kw: object) -> PlanInputs:
    return PlanInputs(spec=resolve_model(model), gpu=resolve_gpu(gpu), **kw)  # type: ignore[arg-type]


def test_plan_json_has_the_contract_keys() -> None:
    plan = plan_from_inputs(_inputs("meta-llama/Llama-3.1-8B-Instruct", max_model_len=32768))
    assert set(plan.to_json()) >= KEYS
    assert plan.fits and plan.problems == () and plan.suggestions == ()


def test_budget_adds_up() -> None:
    plan = plan_from_inputs(_inputs("Qwen/Qwen2.5-7B-Instruct", max_model_len=32768))
    parts = (
        plan.weights_gib + plan.activation_gib + plan.non_torch_gib + plan.cuda_graph_gib + plan.kv_cache_gib
    )
    assert parts == pytest.approx(plan.usable_gib, abs=1e-6)
    assert plan.kv_cache_tokens == plan.num_kv_blocks * 16
    assert plan.num_kv_blocks == int(plan.kv_cache_gib * GIB) // (plan.kv_bytes_per_token * 16)


def test_gqa_and_tp_split_kv_heads_then_replicate() -> None:
    base = _inputs("meta-llama/Llama-3.1-70B-Instruct")
    assert kv_layout(base).bytes_per_token == 2 * 80 * 8 * 128 * 2
    assert kv_layout(replace(base, tensor_parallel_size=4)).bytes_per_token == 2 * 80 * 2 * 128 * 2
    # Qwen2.5-7B has 4 KV heads: at TP 8 each GPU still holds one (replicated)
    qwen = _inputs("Qwen/Qwen2.5-7B-Instruct", tensor_parallel_size=8)
    assert kv_layout(qwen).num_kv_heads_per_gpu == 1


def test_mla_is_not_split_by_tensor_parallelism() -> None:
    one = kv_layout(_inputs("deepseek-ai/DeepSeek-V3", "H200", tensor_parallel_size=1))
    eight = kv_layout(_inputs("deepseek-ai/DeepSeek-V3", "H200", tensor_parallel_size=8))
    assert one.bytes_per_token == eight.bytes_per_token == 61 * (512 + 64) * 2
    plan = plan_from_inputs(_inputs("deepseek-ai/DeepSeek-V3", "H200", tensor_parallel_size=8))
    assert plan.block_size == 64 and plan.kv_cache_tokens % 64 == 0


def test_fp8_kv_halves_bytes_per_token() -> None:
    auto = kv_layout(_inputs("Qwen/Qwen3-8B"))
    fp8 = kv_layout(_inputs("Qwen/Qwen3-8B", kv_cache_dtype="fp8"))
    assert fp8.bytes_per_token * 2 == auto.bytes_per_token


def test_hybrid_sliding_window_counts_window_for_concurrency() -> None:
    gemma = _inputs("google/gemma-3-27b-it", max_model_len=131072)
    layout = kv_layout(gemma)
    assert (
        layout.num_groups == 7 and layout.sliding_window == 1024
    )  # 10 full + 52 sliding -> 1 + 6 groups of 10
    plan = plan_from_inputs(gemma)
    dense_concurrency = plan.kv_cache_tokens / 131072
    assert plan.max_concurrency > dense_concurrency  # sliding layers only hold their window


def test_int4_weights_keep_embeddings_16bit_and_shrink_layers() -> None:
    fp16 = weights_bytes_per_gpu(_inputs("meta-llama/Llama-3.1-8B-Instruct"))
    awq = weights_bytes_per_gpu(_inputs("hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4"))
    assert fp16 == 8_030_261_248 * 2
    assert 5.2 * GIB < awq < 5.5 * GIB  # vLLM logs ~5.4 GiB for this checkpoint
    tp2 = weights_bytes_per_gpu(_inputs("meta-llama/Llama-3.1-8B-Instruct", tensor_parallel_size=2))
    assert tp2 == fp16 // 2


def test_does_not_fit_says_it_like_vllm_and_offers_numbers() -> None:
    plan = plan_from_inputs(_inputs("meta-llama/Llama-3.1-8B-Instruct", "RTX-3090", max_model_len=131072))
    assert not plan.fits
    assert plan.problems[0] == f"max_model_len 131,072 exceeds the KV cache's {plan.kv_cache_tokens:,} tokens"
    text = "\n".join(plan.suggestions)
    assert f"--max-model-len {plan.kv_cache_tokens:,}" in text
    assert "--tensor-parallel-size 2" in text and "a larger GPU" in text
    # fp8 KV and int4 weights alone leave it short of 131,072 tokens, so they are not offered
    assert "--kv-cache-dtype fp8" not in text and "int4 weights" not in text


def test_weights_larger_than_gpu() -> None:
    plan = plan_from_inputs(_inputs("meta-llama/Llama-3.1-70B-Instruct", "A100-80GB", max_model_len=8192))
    assert not plan.fits and plan.kv_cache_tokens == 0
    assert "no memory left for the KV cache" in plan.problems[0]
    assert any(s.startswith("--tensor-parallel-size 2") for s in plan.suggestions)


def test_graphs_outside_budget_before_v020() -> None:
    # 0.19 and 0.20 warm the sampler up with the same peak (sampler_peak) and capture the same graphs
    # (cuda_graphs); 0.20 turned VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS on, so only the budget differs
    new = plan_from_inputs(_inputs("Qwen/Qwen3-8B", engine_version="0.20.0"))
    old = plan_from_inputs(_inputs("Qwen/Qwen3-8B", engine_version="0.19.1"))
    assert old.activation_gib == pytest.approx(new.activation_gib, abs=1e-9)
    assert old.kv_cache_gib == pytest.approx(new.kv_cache_gib + new.cuda_graph_gib, abs=1e-6)


def test_vllm_defaults_depend_on_gpu_size() -> None:
    big = plan_from_inputs(_inputs("Qwen/Qwen3-8B", "H100"))
    small = plan_from_inputs(_inputs("Qwen/Qwen3-8B", "L4"))
    a100 = plan_from_inputs(_inputs("Qwen/Qwen3-8B", "A100-80GB"))
    assert (big.max_num_batched_tokens, big.max_num_seqs) == (8192, 1024)
    assert (small.max_num_batched_tokens, small.max_num_seqs) == (2048, 256)
    assert (a100.max_num_batched_tokens, a100.max_num_seqs) == (2048, 256)
    # since 0.28 a GPU with >= 160 GiB (B200, B300) gets 16,384 batched tokens; 0.27 kept 8,192
    for gpu in ("B200", "B300"):
        huge = plan_from_inputs(_inputs("Qwen/Qwen3-8B", gpu, engine_version="0.28.0"))
        assert (huge.max_num_batched_tokens, huge.max_num_seqs) == (16384, 1024)
    before = plan_from_inputs(_inputs("Qwen/Qwen3-8B", "B200", engine_version="0.27.1"))
    assert (before.max_num_batched_tokens, before.max_num_seqs) == (8192, 1024)
    h200 = plan_from_inputs(_inputs("Qwen/Qwen3-8B", "H200", engine_version="0.28.0"))
    assert h200.max_num_batched_tokens == 8192  # 139.8 GiB: under 160


def test_tgi_and_builtin_rules() -> None:
    tgi = plan_from_inputs(
        _inputs("mistralai/Mistral-7B-Instruct-v0.3", "L40S", engine="tgi", max_model_len=8192)
    )
    assert tgi.fits and tgi.engine == "tgi"
    builtin = plan_from_inputs(
        PlanInputs(
            spec=resolve_model("HuggingFaceTB/SmolLM2-135M"),
            engine="builtin",
            device="cpu",
            kv_cache_memory_gib=0.5,
            max_model_len=2048,
        )
    )
    assert builtin.kv_cache_gib == 0.5
    assert builtin.kv_bytes_per_token == 2 * 30 * 3 * 64 * 4  # fp32 on CPU
    assert builtin.num_kv_blocks == int(0.5 * GIB) // (builtin.kv_bytes_per_token * 16)


def test_draft_model_adds_weights_and_kv_layers() -> None:
    base = _inputs("meta-llama/Llama-3.1-8B-Instruct", "A100-80GB", kv_cache_dtype="fp8")
    with_draft = replace(base, draft=resolve_model("meta-llama/Llama-3.2-1B-Instruct"))
    assert weights_bytes_per_gpu(with_draft) - weights_bytes_per_gpu(base) == 1_235_814_400 * 2
    assert kv_layout(with_draft).bytes_per_token == 65_536 + 2 * 16 * 8 * 64 * 1
    plan = plan_from_inputs(with_draft)
    assert plan.kv_bytes_per_token == 81_920 and any("speculative draft" in n for n in plan.notes)


def test_hybrid_that_does_not_fit_names_the_kv_needed() -> None:
    plan = plan_from_inputs(_inputs("google/gemma-3-27b-it", "L40S", max_model_len=131072))
    assert not plan.fits
    assert (
        "one request of max_model_len 131,072 needs" in plan.problems[0]
        or "no memory left" in plan.problems[0]
    )


def test_allocator_rounding_of_one_request() -> None:
    from llmdeploy.memory.footprint import MIB, allocated_bytes

    assert allocated_bytes(5 * MIB) == 5 * MIB  # below 10 MiB: carved from a shared buffer
    assert allocated_bytes(35 * MIB) == 36 * MIB  # 1 MiB left in its 36 MiB segment: not split off
    assert allocated_bytes(int(67.5 * MIB)) == 68 * MIB
    assert allocated_bytes(int(742.5 * MIB)) == int(742.5 * MIB)  # 1.5 MiB remainder is split off
    assert allocated_bytes(224 * MIB) == 224 * MIB
    assert allocated_bytes(1000) == 1024  # 512-byte granules
    # under max_split_size (vLLM's weight loading since 0.21): requests at or above it are never split
    assert allocated_bytes(int(742.5 * MIB), 20 * MIB) == 744 * MIB
    assert allocated_bytes(int(24.5 * MIB), 20 * MIB) == 26 * MIB
    assert allocated_bytes(int(12.5 * MIB), 20 * MIB) == int(12.5 * MIB)  # below it: the old rule


def test_vllm_load_overhead_rope_cache_and_rounding() -> None:
    from llmdeploy.memory.footprint import MIB, vllm_load_overhead_bytes

    # Llama-3.1-8B: every matrix is a whole number of 2 MiB (qkv 48, o 32, gate_up 224, down 112
    # MiB), so only the cos/sin cache counts: 131,072 positions x 128 x 2 bytes = 32 MiB
    assert vllm_load_overhead_bytes(_inputs("meta-llama/Llama-3.1-8B")) == 32 * MIB
    # Qwen2.5-32B at TP 2: qkv (3584 x 5120), o (5120 x 2560) and down (5120 x 13824) are 35, 25 and
    # 135 MiB, each booked as the next 2 MiB (64 layers x 3 MiB), + 32,768 x 128 x 2 bytes of cache
    qwen = _inputs("Qwen/Qwen2.5-32B", tensor_parallel_size=2, engine_version="0.20.0")
    assert vllm_load_overhead_bytes(qwen) == 64 * 3 * MIB + 8 * MIB
    # since 0.21 the weights load under max_split_size_mb:20: a request of 20 MiB or more is never
    # split, so the 742.5 MiB vocab shards of the untied embedding and head book 744 MiB each too
    newer = _inputs("Qwen/Qwen2.5-32B", tensor_parallel_size=2, engine_version="0.21.0")
    assert vllm_load_overhead_bytes(newer) == 64 * 3 * MIB + 8 * MIB + 2 * int(1.5 * MIB)
    # Qwen2.5-7B at TP 1 (0.28): the 24.5 MiB o_proj books its 26 MiB segment, +1.5 MiB x 28 layers
    seven = _inputs("Qwen/Qwen2.5-7B", engine_version="0.28.0")
    older = _inputs("Qwen/Qwen2.5-7B", engine_version="0.20.0")
    assert vllm_load_overhead_bytes(seven) - vllm_load_overhead_bytes(older) >= 28 * int(1.5 * MIB)
    # quantized checkpoints: only the cache (their packed layouts are not modelled)
    awq = _inputs("Qwen/Qwen2.5-32B", tensor_parallel_size=2, quantization="awq")
    assert vllm_load_overhead_bytes(awq) == 8 * MIB


def test_hybrid_kv_tokens_as_each_release_prints_them() -> None:
    # gpt-oss: 18 sliding + 18 full layers -> 2 groups sharing one pool of blocks
    kw = {"gpu": "H100", "max_model_len": 131072, "max_num_seqs": 256}
    old = plan_from_inputs(_inputs("openai/gpt-oss-20b", engine_version="0.20.2", **kw))
    new = plan_from_inputs(_inputs("openai/gpt-oss-20b", engine_version="0.21.0", **kw))
    # up to 0.20: num_blocks // num_groups * block_size
    assert old.kv_cache_tokens == old.num_kv_blocks // 2 * old.block_size
    # since 0.21: max concurrency x max_model_len (the sliding group needs only its window)
    assert new.kv_cache_tokens == int(new.max_concurrency * 131072)
    assert new.kv_cache_tokens > new.num_kv_blocks // 2 * new.block_size


def test_mxfp4_experts_take_the_marlin_layout_before_hopper() -> None:
    from llmdeploy.catalog.gpus import resolve_gpu
    from llmdeploy.catalog.models import resolve_model
    from llmdeploy.memory.footprint import vllm_mxfp4_marlin as mxfp4_marlin
    from llmdeploy.memory.footprint import weights_bytes_per_gpu
    from llmdeploy.memory.plan_inputs import PlanInputs

    spec = resolve_model("openai/gpt-oss-120b")

    def gib(gpu: str, version: str) -> float:
        inputs = PlanInputs(spec=spec, gpu=resolve_gpu(gpu), engine_version=version)
        return weights_bytes_per_gpu(inputs, mxfp4_marlin(inputs)) / 2**30

    a100 = PlanInputs(spec=spec, gpu=resolve_gpu("A100-80GB"), engine_version="0.19.0")
    assert mxfp4_marlin(a100)
    assert not mxfp4_marlin(PlanInputs(spec=spec, gpu=resolve_gpu("H100"), engine_version="0.19.0"))
    # Marlin pads 2880 x 2880 experts to 3072 x 2944; the other layout to 2880 x 3072
    experts = 36 * 128 * 3 * 4.25 / 8 / 2**30
    assert gib("A100-80GB", "0.19.0") - gib("H100", "0.19.0") == pytest.approx(
        experts * (3072 * 2944 - 2880 * 3072), rel=1e-6
    )
    assert gib("H100", "0.10.1") == gib("A100-80GB", "0.19.0")


def test_rotary_caches_as_vllm_builds_them() -> None:
    from llmdeploy.catalog.models import resolve_model
    from llmdeploy.memory.footprint import rotary_cache_positions

    assert rotary_cache_positions(resolve_model("meta-llama/Llama-3.1-8B")) == [
        131072
    ]  # llama3: max positions
    assert rotary_cache_positions(resolve_model("openai/gpt-oss-20b")) == [
        4096 * 32
    ]  # YaRN: original x factor
    assert rotary_cache_positions(resolve_model("microsoft/Phi-4-mini-instruct")) == [
        4096 + 131072
    ]  # short+long
    # Gemma 3: the global rope's linear factor 8 over 131,072 positions, plus the local rope
    assert rotary_cache_positions(resolve_model("google/gemma-3-4b-pt")) == [131072 * 8, 131072]


def test_fused_moe_workspace_per_release() -> None:
    from llmdeploy.engines.vllm import vllm_activation_bytes
    from llmdeploy.memory.footprint import MIB, activation_bytes, moe_workspace_bytes

    h100 = resolve_gpu("H100")
    qwen3 = PlanInputs(spec=resolve_model("Qwen/Qwen3-30B-A3B"), engine_version="0.19.0", gpu=h100)
    # 8,192 tokens x top-8 x max(768, 2048) and x max(1536, 2048), bf16: two 256 MiB buffers
    assert moe_workspace_bytes(qwen3, 8192) == 2 * 256 * MIB
    # 0.14-0.18 size the buffers for 16,384-token chunks and keep the whole output beside them
    chunked = replace(qwen3, engine_version="0.17.0")
    assert moe_workspace_bytes(chunked, 32768) == (2 * 16384 * 8 * 2048 + 32768 * 2048) * 2
    assert moe_workspace_bytes(chunked, 8192) == 2 * 256 * MIB
    # per-call caches before 0.14, other kernels for quantized and MXFP4 experts, nothing for dense
    assert moe_workspace_bytes(replace(qwen3, engine_version="0.12.0"), 8192) == 0
    assert moe_workspace_bytes(replace(qwen3, quantization="fp8"), 8192) == 0
    assert moe_workspace_bytes(replace(qwen3, spec=resolve_model("openai/gpt-oss-20b")), 8192) == 0
    assert (
        moe_workspace_bytes(replace(qwen3, spec=resolve_model("meta-llama/Llama-3.1-8B-Instruct")), 8192) == 0
    )
    # the workspace stays allocated through the sampler warm-up, which sets the peak here
    from llmdeploy.memory.sampler_peak import sampler_peak_bytes

    sampler = sampler_peak_bytes((0, 19, 0), 1024, qwen3.spec.vocab_size) + 8192 * 2048 * 2
    assert vllm_activation_bytes(qwen3, 8192, 1024) == sampler + 2 * 256 * MIB
    # an engine without the persistent workspace: the MoE intermediates stay inside the forward peak
    assert activation_bytes(qwen3, 8192, 1024, v1_sampler=True) == sampler


def test_plan_names_the_allreduce_fusion_workspace_it_leaves_out() -> None:
    from llmdeploy.catalog.gpus import resolve_gpu
    from llmdeploy.catalog.models import resolve_model
    from llmdeploy.memory.plan_inputs import PlanInputs
    from llmdeploy.planner.plan import plan_for

    def notes(gpu: str, tp: int, version: str | None, eager: bool = False) -> str:
        inputs = PlanInputs(
            spec=resolve_model("meta-llama/Llama-3.1-8B-Instruct"),
            engine="vllm",
            engine_version=version,
            gpu=resolve_gpu(gpu),
            gpu_memory_gib=resolve_gpu(gpu).memory_gib,
            tensor_parallel_size=tp,
            enforce_eager=eager,
        )
        return " ".join(plan_for(inputs).notes)

    assert "allreduce + RMSNorm fusion" in notes("H100-SXM", 2, "0.19.0")
    assert "allreduce + RMSNorm fusion" in notes("H200", 4, None)
    assert "allreduce + RMSNorm fusion" not in notes("H100-SXM", 1, "0.19.0")
    assert "allreduce + RMSNorm fusion" not in notes("H100-SXM", 2, "0.14.0")
    assert "allreduce + RMSNorm fusion" not in notes("A100-80GB", 2, "0.19.0")
    assert "allreduce + RMSNorm fusion" not in notes("H100-SXM", 2, "0.19.0", eager=True)
