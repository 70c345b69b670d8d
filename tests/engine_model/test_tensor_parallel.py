"""Tensor parallelism on CPU (gloo, 2 processes): tp=2 matches tp=1, workers exit with rank 0.

Models are tiny transformers checkpoints saved in the test: a Qwen2.5-0.5B-shaped attention (14 heads,
2 KV heads, so each rank holds one KV head; tied embeddings; an odd vocabulary, so the vocab shards are
padded) and a Llama with one KV head (replicated on both ranks).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from llmdeploy_engine.config import EngineConfig
from llmdeploy_engine.core.forward_batch import ForwardBatch
from llmdeploy_engine.loading.hf_loader import load_hf_config
from llmdeploy_engine.model.parallel_layers import QKVParallelLinear
from llmdeploy_engine.parallel.distributed import ParallelState
from llmdeploy_engine.runner.model_runner import ModelRunner
from llmdeploy_engine.runner.setup import check_tensor_parallel

pytestmark = pytest.mark.slow

MODELS: dict[str, dict[str, Any]] = {
    # Qwen2.5-0.5B's attention shape, shrunk elsewhere
    "qwen2-kv2": {
        "model_type": "qwen2",
        "vocab_size": 515,
        "hidden_size": 896,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "tie_word_embeddings": True,
        "rope_theta": 1e6,
    },
    "llama-kv1": {
        "model_type": "llama",
        "vocab_size": 301,
        "hidden_size": 128,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "tie_word_embeddings": False,
    },
}


def save_model(folder: Path, name: str) -> Path:
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = dict(MODELS[name])
    config = AutoConfig.for_model(cfg.pop("model_type"), max_position_embeddings=512, **cfg)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # non-trivial biases and norms, so a mis-sliced one shows
        for pname, p in model.named_parameters():
            if pname.endswith("bias") or "norm" in pname:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(folder / name)
    return folder / name


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    torch.set_num_threads(1)
    folder = tmp_path_factory.mktemp("tp")
    return {name: save_model(folder, name) for name in MODELS}


def engine_config(path: Path, tp: int, **kw: Any) -> EngineConfig:
    return EngineConfig(
        model=str(path),
        tokenizer="random:byte-level",
        device="cpu",
        dtype="float32",
        tensor_parallel_size=tp,
        max_model_len=256,
        kv_cache_memory_bytes=2 * 2**20,
        max_num_seqs=4,
        max_num_batched_tokens=256,
        **kw,
    )


def prefill_then_decode(runner: Any, vocab: int) -> list[torch.Tensor]:
    """Two sequences: a prefill of both (chunk of 7 and 12 tokens), then two decode steps."""
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in (7, 12)]
    bs = runner.block_size
    tables = [[0, 1, 2], [3, 4, 5]]

    def slot(seq: int, pos: int) -> int:
        return tables[seq][pos // bs] * bs + pos % bs

    out = []
    batch = ForwardBatch(
        input_ids=prompts[0] + prompts[1],
        positions=list(range(7)) + list(range(12)),
        slot_mapping=[slot(0, p) for p in range(7)] + [slot(1, p) for p in range(12)],
        query_start=[0, 7],
        query_len=[7, 12],
        context_len=[7, 12],
        block_tables=tables,
        sample_indices=[0, 1],
        num_logits=[3, 1],
    )
    out.append(runner.execute(batch))
    lens = [7, 12]
    for _ in range(2):
        toks = torch.randint(0, vocab, (2,), generator=gen).tolist()
        batch = ForwardBatch(
            input_ids=toks,
            positions=lens[:],
            slot_mapping=[slot(0, lens[0]), slot(1, lens[1])],
            query_start=[0, 1],
            query_len=[1, 1],
            context_len=[lens[0] + 1, lens[1] + 1],
            block_tables=tables,
            sample_indices=[0, 1],
        )
        lens = [n + 1 for n in lens]
        out.append(runner.execute(batch))
    return out


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by its parent) counts as gone
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_gone(pids: list[int], timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(alive(p) for p in pids):
            return True
        time.sleep(0.2)
    return False


# ---- unit: shapes and errors -----------------------------------------------------------------
def test_tp_that_does_not_divide_heads_is_refused(checkpoints: dict[str, Path]) -> None:
    mc = load_hf_config(checkpoints["qwen2-kv2"])
    check_tensor_parallel(mc, 2)
    with pytest.raises(ValueError, match="does not divide the 14 attention heads"):
        check_tensor_parallel(mc, 4)
    with pytest.raises(ValueError, match="tensor_parallel_size 4"):
        ModelRunner(engine_config(checkpoints["qwen2-kv2"], 4))


def test_tp_beyond_visible_gpus_is_refused(
    checkpoints: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    import llmdeploy_engine.runner.model_runner as model_runner

    monkeypatch.setattr(model_runner, "resolve_device", lambda name: torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match="tensor_parallel_size 2 exceeds the 1 visible GPU"):
        ModelRunner(engine_config(checkpoints["qwen2-kv2"], 2))


def test_qkv_shards_pick_the_right_heads() -> None:
    hd, hidden = 2, 4
    full = {n: torch.randn(rows * hd, hidden) for n, rows in (("q_proj", 4), ("k_proj", 2), ("v_proj", 2))}
    # 4 ranks, 2 KV heads: KV head r // 2 replicated on ranks 2h, 2h+1
    for rank in range(4):
        layer = QKVParallelLinear(hidden, hd, 4, 2, False, ParallelState(rank, 4))
        for n, w in full.items():
            layer.load_hf(f"{n}.weight", w)
        q, k, v = layer(torch.eye(hidden))
        torch.testing.assert_close(q.T, full["q_proj"][rank * hd : (rank + 1) * hd])
        kv = rank // 2
        torch.testing.assert_close(k.T, full["k_proj"][kv * hd : (kv + 1) * hd])
        torch.testing.assert_close(v.T, full["v_proj"][kv * hd : (kv + 1) * hd])
    with pytest.raises(ValueError, match="not a multiple"):
        QKVParallelLinear(hidden, hd, 6, 2, False, ParallelState(0, 3))


# ---- two processes ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(MODELS))
def test_tp2_logits_match_tp1(checkpoints: dict[str, Path], name: str) -> None:
    from llmdeploy_engine.runner.tp_worker import TensorParallelDriver

    vocab = MODELS[name]["vocab_size"]
    ref_runner = ModelRunner(engine_config(checkpoints[name], 1))
    ref = prefill_then_decode(ref_runner, vocab)
    del ref_runner
    runner = ModelRunner(engine_config(checkpoints[name], 2))
    try:
        assert runner.parallel.world_size == 2 and runner.workers is not None
        kv_heads = MODELS[name]["num_key_value_heads"]
        assert runner.kv_caches[0][0].shape[2] == max(1, kv_heads // 2)
        got = prefill_then_decode(TensorParallelDriver(runner, runner.workers), vocab)
    finally:
        runner.close()
    assert wait_gone(runner.workers.pids)
    for a, b in zip(got, ref, strict=True):
        assert a.shape == b.shape == (a.shape[0], vocab)
        rel = float((a - b).abs().max() / b.abs().max())
        assert rel < 1e-4, rel


def test_tp2_greedy_tokens_match_through_llm_api(checkpoints: dict[str, Path]) -> None:
    from llmdeploy_engine.llm import LLM
    from llmdeploy_engine.llm_engine import LLMEngine
    from llmdeploy_engine.sampling_params import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    prompts = ["Hello, my name is", "The capital of France is", "tensor parallel"]

    def run(tp: int) -> tuple[list[list[int]], LLMEngine]:
        engine = LLMEngine(engine_config(checkpoints["qwen2-kv2"], tp))
        outs = LLM.from_engine(engine).generate(prompts, params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs], engine

    ref, ref_engine = run(1)
    ref_engine.close()  # no workers: nothing to do, must not fail
    got, engine = run(2)
    pids = engine.runner.workers.pids
    assert all(alive(p) for p in pids)
    engine.close()
    assert wait_gone(pids), "workers still running after LLMEngine.close()"
    assert got == ref
    assert all(len(t) == 12 for t in got)


def test_workers_exit_when_rank0_dies(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    script = tmp_path / "rank0.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import sys
            from llmdeploy_engine.config import EngineConfig
            from llmdeploy_engine.runner.model_runner import ModelRunner
            runner = ModelRunner(EngineConfig(model={str(checkpoints["llama-kv1"])!r}, device="cpu",
                dtype="float32", tensor_parallel_size=2, max_model_len=256,
                kv_cache_memory_bytes=2 * 2**20, max_num_batched_tokens=256))
            print(*runner.workers.pids, flush=True)
            sys.stdin.read()  # wait to be killed
            """
        )
    )
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 1 and alive(pids[0])
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        assert wait_gone(pids), "a tensor-parallel worker outlived rank 0"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_workers_stopped_when_rank0_start_up_fails(
    checkpoints: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from llmdeploy_engine.runner import tp_worker

    started: list[tp_worker.WorkerGroup] = []
    real_start = tp_worker.WorkerGroup.start

    def start(*args: Any) -> tp_worker.WorkerGroup:
        started.append(real_start(*args))
        return started[-1]

    def fail(*args: Any) -> None:
        raise RuntimeError("rank 0 failed late in start-up")

    from llmdeploy_engine.runner import startup

    monkeypatch.setattr(tp_worker.WorkerGroup, "start", start)
    monkeypatch.setattr(startup, "allocate_kv_cache", fail)  # in this process only: rank 0
    with pytest.raises(RuntimeError, match="rank 0 failed"):
        ModelRunner(engine_config(checkpoints["llama-kv1"], 2))
    assert started and wait_gone(started[0].pids, timeout=10)
