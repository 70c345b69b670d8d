from llmdeploy.planner.builtin_rule import kv_bytes_per_token, kv_cache_bytes, max_concurrency, num_kv_blocks

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
