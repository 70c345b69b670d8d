import itertools

from llmdeploy_engine.facts import kv_bytes_per_token, kv_cache_bytes, max_concurrency, num_kv_blocks

GIB = 2**30


def test_kv_bytes_per_token_llama_8b() -> None:
    assert kv_bytes_per_token(32, 8, 128, 2) == 131_072


def test_kv_cache_bytes_rule_and_explicit_override() -> None:
    assert kv_cache_bytes(80 * GIB, 0.9, 15 * GIB, 1 * GIB, GIB // 2) == int(72 * GIB) - 16 * GIB - GIB // 2
    assert kv_cache_bytes(80 * GIB, 0.9, 15 * GIB, GIB, 0, cuda_graph_bytes=GIB) == int(72 * GIB) - 17 * GIB
    assert kv_cache_bytes(80 * GIB, 0.9, 15 * GIB, GIB, 0, kv_cache_memory_bytes=4 * GIB) == 4 * GIB
    assert kv_cache_bytes(24 * GIB, 0.9, 30 * GIB, 0, 0) < 0


def test_blocks_floor_and_concurrency() -> None:
    per_block = 131_072 * 16
    assert num_kv_blocks(10 * per_block + per_block - 1, 131_072, 16) == 10
    assert num_kv_blocks(-5, 131_072, 16) == 0
    assert max_concurrency(100, 16, 1600) == 1.0
    assert max_concurrency(100, 16, 1601) == 100 / 101


def test_cuda_graph_shapes() -> None:
    from llmdeploy_engine.facts import cuda_graph_batch_sizes, cuda_graph_context_buckets

    sizes = cuda_graph_batch_sizes(256)
    assert sizes[:11] == (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64) and sizes[-3:] == (224, 240, 256)
    assert len(sizes) == 23 and all(b - a <= 16 for a, b in itertools.pairwise(sizes))
    assert cuda_graph_batch_sizes(1000) == sizes
    assert cuda_graph_batch_sizes(100) == (*sizes[:13], 100)  # ... 80, 96, then max_num_seqs itself
    assert cuda_graph_batch_sizes(96)[-2:] == (80, 96)
    assert cuda_graph_batch_sizes(3) == (1, 2, 3)
    assert cuda_graph_batch_sizes(1) == (1,) and cuda_graph_batch_sizes(0) == (1,)
    assert cuda_graph_context_buckets(2048, 16) == (8, 16, 32, 64, 128)
    assert cuda_graph_context_buckets(100, 16) == (8,)
    assert cuda_graph_context_buckets(3000, 16) == (8, 16, 32, 64, 128, 188)


# Llama-3.1-8B shape, bf16, 256 sequences, 2048 tokens (the builtin plan's defaults for that model)
LLAMA_8B_GRAPH_SHAPE = dict(
    max_num_seqs=256,
    max_model_len=2048,
    block_size=16,
    hidden_size=4096,
    intermediate_size=14336,
    q_size=4096,
    kv_size=1024,
    vocab_size=128256,
    dtype_bytes=2,
)


def test_cuda_graph_bytes_terms() -> None:
    from llmdeploy_engine.facts import CUDA_GRAPH_FIXED_BYTES, cuda_graph_bytes

    shape = LLAMA_8B_GRAPH_SHAPE
    triton = cuda_graph_bytes(**shape, gathered_kv=False)
    act = 256 * (5 * 4096 + 2 * 4096 + 2 * 1024 + 3 * 14336) * 2 + 256 * 2 * 4096 * 4
    logits = 64 * 128256 * 10
    assert triton == act + logits + CUDA_GRAPH_FIXED_BYTES
    gathered = cuda_graph_bytes(**shape, gathered_kv=True)
    assert gathered - triton == 2 * 256 * 2048 * 1024 * 2  # 2 GiB of gathered K/V copies
    # fewer sequences: a smaller largest graph
    assert cuda_graph_bytes(**{**shape, "max_num_seqs": 8}, gathered_kv=False) < triton


def test_builtin_plan_sets_graph_memory_aside_like_the_engine() -> None:
    from dataclasses import replace

    from llmdeploy_engine.facts import cuda_graph_bytes

    from llmdeploy.catalog.models import resolve_model
    from llmdeploy.planner import PlanInputs, plan_from_inputs

    inputs = PlanInputs(
        spec=resolve_model("meta-llama/Llama-3.1-8B"),
        engine="builtin",
        device="cuda",
        gpu_memory_gib=139.8,
        max_model_len=2048,
    )
    plan = plan_from_inputs(inputs)
    expected = cuda_graph_bytes(**LLAMA_8B_GRAPH_SHAPE, gathered_kv=False)
    assert plan.cuda_graph_gib == expected / GIB
    eager = plan_from_inputs(replace(inputs, enforce_eager=True))
    assert eager.cuda_graph_gib == 0
    assert eager.kv_cache_gib - plan.kv_cache_gib == expected / GIB


def test_builtin_activation_is_linear_in_the_batched_tokens() -> None:
    """The profile step attends through the varlen kernel (no scores): Llama-3.1-8B at 8,192 batched
    tokens is charged its MLP's widest point, 8,192 x (5 x 4,096 + 3 x 14,336) x 2 bytes + 64 MiB,
    where the scores once cost 19.1 GiB; twice the tokens, about twice the bytes."""
    from dataclasses import replace

    from llmdeploy.catalog.models import resolve_model
    from llmdeploy.planner import PlanInputs, plan_from_inputs

    inputs = PlanInputs(
        spec=resolve_model("meta-llama/Llama-3.1-8B"),
        engine="builtin",
        device="cuda",
        gpu_memory_gib=139.8,
        max_model_len=8192,
    )
    plan = plan_from_inputs(inputs)
    assert plan.max_num_batched_tokens == 8192
    assert plan.activation_gib * GIB == 8192 * (5 * 4096 + 3 * 14336) * 2 + 64 * 2**20
    assert plan.activation_gib < 2
    double = plan_from_inputs(replace(inputs, max_num_batched_tokens=16384))
    assert 1.9 < double.activation_gib / plan.activation_gib < 2.0


def test_fixes_name_fewer_batched_tokens_where_that_fits() -> None:
    from dataclasses import replace

    from llmdeploy.catalog.models import resolve_model
    from llmdeploy.planner import PlanInputs, plan_from_inputs
    from llmdeploy.planner.plan import suggest_fixes

    # Llama-3.1-8B bf16 on a 24 GiB card: the weights (15 GiB) leave too little once a step batches
    # 65,536 tokens (7.8 GiB of activations); 8,192 leave room for the cache
    inputs = PlanInputs(
        spec=resolve_model("meta-llama/Llama-3.1-8B"),
        engine="builtin",
        device="cuda",
        gpu_memory_gib=24.0,
        max_model_len=8192,
        max_num_batched_tokens=65536,
    )
    plan = plan_from_inputs(inputs)
    assert not plan.fits
    fixes = [fix for fix in suggest_fixes(inputs, plan) if fix.startswith("--max-num-batched-tokens ")]
    assert len(fixes) == 1 and "(limits.max_num_batched_tokens)" in fixes[0], fixes
    tokens = int(fixes[0].split()[1].replace(",", ""))
    assert plan_from_inputs(replace(inputs, max_num_batched_tokens=tokens)).fits
    assert not plan_from_inputs(
        replace(inputs, max_num_batched_tokens=2 * tokens)
    ).fits  # the smallest change
