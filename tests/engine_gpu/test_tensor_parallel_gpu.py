"""On 2 CUDA GPUs: tensor parallelism over NCCL, with and without CUDA graphs, matches tp=1.

Random Qwen2.5-0.5B (14 heads, 2 KV heads: one KV head per rank) in float32, so tp=2 can be held to
tp=1's logits; through LLMEngine with CUDA graphs (all-reduces captured in the graphs) the greedy
tokens must be identical, the graphs must actually be replayed, and the worker must exit on close.
Every all-reduce path (NCCL, torch's symmetric-memory one-shot, this project's p2p and push kernels),
and this project's kernels on their own between two spawned ranks. A process sets up symmetric memory once (a
second set-up hung), so the tests that need it skip after the first: run them one per process
(`pytest tests/engine_gpu/test_tensor_parallel_gpu.py::NAME`, one call each).
"""

from __future__ import annotations

import os
import time
from typing import Any

import pytest
import torch
from llmdeploy_engine.config import EngineConfig
from llmdeploy_engine.core.forward_batch import ForwardBatch
from llmdeploy_engine.runner.model_runner import ModelRunner

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs"
    ),
]

MODEL = "random:Qwen/Qwen2.5-0.5B"


def needs_fresh_symm_mem(allreduce: str = "auto") -> None:
    """Skip a test that sets up a symmetric-memory all-reduce when this process already has one: a
    second set-up hung, so init_parallel then gives NCCL only. Run each of these tests in its own
    pytest process."""
    from llmdeploy_engine.parallel.distributed import symm_mem_set_up

    if allreduce != "nccl" and symm_mem_set_up():
        pytest.skip("symmetric memory already set up in this process: run this test in a process of its own")


def config(tp: int, eager: bool, dtype: str = "float32", **kw: Any) -> EngineConfig:
    return EngineConfig(
        model=MODEL,
        device="cuda",
        dtype=dtype,
        tensor_parallel_size=tp,
        max_model_len=512,
        max_num_seqs=4,
        max_num_batched_tokens=512,
        gpu_memory_utilization=0.3,
        enforce_eager=eager,
        **kw,
    )


def steps(runner: ModelRunner | object, vocab: int, num_seqs: int = 2) -> list[torch.Tensor]:
    """A prefill of num_seqs prompts (1 or 2) then 3 decode steps; the logits of each step."""
    gen = torch.Generator().manual_seed(0)
    bs = 16
    tables = [[0, 1, 2, 3], [4, 5, 6, 7]][:num_seqs]
    lens = [20, 33][:num_seqs]
    prompts = [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in lens]

    def slot(seq: int, pos: int) -> int:
        return tables[seq][pos // bs] * bs + pos % bs

    outs = [
        runner.execute(  # type: ignore[attr-defined]
            ForwardBatch(
                input_ids=[t for p in prompts for t in p],
                positions=[p for n in lens for p in range(n)],
                slot_mapping=[slot(i, p) for i, n in enumerate(lens) for p in range(n)],
                query_start=[0, lens[0]][:num_seqs],
                query_len=lens[:],
                context_len=lens[:],
                block_tables=tables,
                sample_indices=list(range(num_seqs)),
            )
        ).cpu()
    ]
    for _ in range(3):
        toks = torch.randint(0, vocab, (num_seqs,), generator=gen).tolist()
        batch = ForwardBatch(
            input_ids=toks,
            positions=lens[:],
            slot_mapping=[slot(i, n) for i, n in enumerate(lens)],
            query_start=list(range(num_seqs)),
            query_len=[1] * num_seqs,
            context_len=[n + 1 for n in lens],
            block_tables=tables,
            sample_indices=list(range(num_seqs)),
        )
        lens = [n + 1 for n in lens]
        outs.append(runner.execute(batch).cpu())  # type: ignore[attr-defined]
    return outs


@pytest.fixture(scope="module")
def eager_reference() -> tuple[list[torch.Tensor], int]:
    ref_runner = ModelRunner(config(1, True))
    vocab = ref_runner.model_config.vocab_size
    ref = steps(ref_runner, vocab)
    del ref_runner
    torch.cuda.empty_cache()
    return ref, vocab


@pytest.mark.parametrize("allreduce", ["nccl", "symm_mem", "p2p", "push"])
def test_tp2_logits_match_tp1_eager(
    allreduce: str, eager_reference: tuple[list[torch.Tensor], int], monkeypatch: pytest.MonkeyPatch
) -> None:
    from llmdeploy_engine.runner.tp_worker import TensorParallelDriver

    needs_fresh_symm_mem(allreduce)
    ref, vocab = eager_reference
    runner = ModelRunner(config(2, True, tp_all_reduce=allreduce))  # the worker gets it with the config
    try:
        got = steps(TensorParallelDriver(runner, runner.workers), vocab)
    finally:
        runner.close()
    for a, b in zip(got, ref, strict=True):
        rel = float((a - b).abs().max() / b.abs().max())
        assert rel < 1e-3, rel


@pytest.mark.parametrize("num_seqs", [2, 1])
def test_tp2_bf16_logits_within_bf16_rounding_of_tp1(num_seqs: int) -> None:
    """bf16: tp=2 sums the row-parallel products in another order, so logits differ by rounding only
    (relative error of the order of bf16's 2**-8), and the argmax agrees wherever the top two logits
    of tp=1 are further apart than that error. One sequence: its decode steps are single-row products,
    which go through the fused GEMV kernels (writing the row-parallel products into the
    symmetric-memory buffer at tp=2)."""
    from llmdeploy_engine.runner.tp_worker import TensorParallelDriver

    needs_fresh_symm_mem()
    ref_runner = ModelRunner(config(1, True, "bfloat16"))
    vocab = ref_runner.model_config.vocab_size
    ref = steps(ref_runner, vocab, num_seqs)
    del ref_runner
    torch.cuda.empty_cache()
    runner = ModelRunner(config(2, True, "bfloat16"))
    try:
        got = steps(TensorParallelDriver(runner, runner.workers), vocab, num_seqs)
    finally:
        runner.close()
    for a, b in zip(got, ref, strict=True):
        err = (a - b).abs().max(dim=-1).values
        rel = float(err.max() / b.abs().max())
        assert rel < 3e-2, rel
        top2 = b.topk(2, dim=-1).values
        clear = (top2[:, 0] - top2[:, 1]) > 2 * err
        assert torch.equal(a.argmax(-1)[clear], b.argmax(-1)[clear])


def _run_engine(
    tp: int, windows: dict[int, int] | None = None, **kw: Any
) -> tuple[list[list[int]], int, list[int]]:
    """(greedy tokens of two prompts, CUDA graph replays on rank 0, worker pids); kw: EngineConfig's.
    `windows`, where given, receives the engine's decode windows by length."""
    from llmdeploy_engine.llm import LLM
    from llmdeploy_engine.llm_engine import LLMEngine
    from llmdeploy_engine.sampling_params import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    prompts = ["Hello, my name is", "The capital of France is"]
    engine = LLMEngine(config(tp, False, **kw))
    try:
        outs = LLM.from_engine(engine).generate(prompts, params, use_tqdm=False)
        if windows is not None:
            windows.update(engine.num_windows_by_steps)
        graphs = engine.runner
        while not hasattr(graphs, "num_replays") and hasattr(graphs, "runner"):
            graphs = graphs.runner
        workers = getattr(engine.runner, "workers", None)
        pids = workers.pids if workers is not None else []
        return [list(o.outputs[0].token_ids) for o in outs], int(graphs.num_replays), pids
    finally:
        engine.close()
        del engine
        torch.cuda.empty_cache()


@pytest.fixture(scope="module")
def graph_reference() -> list[list[int]]:
    return _run_engine(1)[0]


@pytest.mark.parametrize("allreduce", ["auto", "push", "p2p", "symm_mem", "nccl"])
def test_tp2_greedy_with_cuda_graphs_matches_tp1(
    allreduce: str, graph_reference: list[list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Graphs at tp 2 with the symmetric-memory all-reduce (auto picks it on CUDA); with NCCL only the
    engine runs eagerly (no collective may be captured). Same tokens as tp 1 either way, and the
    workers exit (with NCCL collectives captured, destroying the process group hung)."""
    needs_fresh_symm_mem(allreduce)
    ref = graph_reference
    got, replays, pids = _run_engine(2, tp_all_reduce=allreduce)
    if allreduce == "nccl":
        assert replays == 0
    else:
        assert replays > 0
    assert got == ref
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.2)
    assert pids and not any(_alive(p) for p in pids)


@pytest.mark.parametrize("asynchronous", [False, True])
def test_tp2_graph_windows_match_tp1(asynchronous: bool, graph_reference: list[list[int]]) -> None:
    """Multi-step windows at tp 2 through the default all-reduce, synchronous and asynchronous (every
    rank follows its own last window on its device): the tokens of tp 1 with single steps."""
    needs_fresh_symm_mem("auto")
    got, replays, _ = _run_engine(2, num_scheduler_steps=4, async_scheduling=asynchronous)
    assert replays > 0
    assert got == graph_reference


def test_tp2_auto_windows_match_tp1(
    graph_reference: list[list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Window length auto (the default) at tp 2: the driver's sizer picks each window's length and
    every rank runs it. A sizer that grows after every two windows (a wait share is under 0.9999
    whenever the host does anything between windows) makes windows of 2, 4 and 8 steps run; the
    tokens are tp 1's with single steps."""
    import functools

    from llmdeploy_engine.core import window_policy
    from llmdeploy_engine.core.window_sizing import WindowSizer

    needs_fresh_symm_mem("auto")
    monkeypatch.setattr(
        window_policy,
        "WindowSizer",
        functools.partial(WindowSizer, span=2, grow_below=0.9999, shrink_above=1.0),
    )
    windows: dict[int, int] = {}
    got, replays, _ = _run_engine(2, windows)
    assert replays > 0
    assert max(windows) >= 4, windows
    assert got == graph_reference


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _p2p_rank(rank: int, port: int, kind: str) -> None:
    """One rank of test_all_reduce_kernels_two_gpus (a spawned process; raises on a wrong sum)."""
    from llmdeploy_engine.parallel.distributed import (
        ATTENTION_SLOT,
        EMBED_SLOT,
        MLP_SLOT,
        all_gather,
        all_reduce,
        destroy_parallel,
        init_parallel,
    )

    device = torch.device("cuda", rank)
    gather_bytes = 4 * 9000 * 4 if kind == "push" else 0
    state = init_parallel(rank, 2, port, device, 64 * 4096 * 4, gather_bytes, kind)
    fast = state.fast_all_reduce
    assert type(fast).__name__ == {"p2p": "P2PAllReduce", "push": "PushAllReduce"}[kind]
    assert fast.gather_bytes == (-(-gather_bytes // 256) * 256 if kind == "push" else 0)  # rounded up
    gen = torch.Generator().manual_seed(0)  # the same draws on both ranks: each knows both parts
    slots = (EMBED_SLOT, ATTENTION_SLOT, MLP_SLOT)
    shapes = [(1, 896), (3, 4096), (64, 4096), (7, 100), (1, 8), (33, 4096)]
    for i, (shape, dtype) in enumerate((s, d) for s in shapes for d in (torch.float32, torch.bfloat16)):
        parts = [torch.randn(shape, generator=gen).to(dtype) for _ in range(2)]
        got = all_reduce(parts[rank].to(device), state, slots[i % 3])
        assert torch.equal(got.cpu(), (parts[0].float() + parts[1].float()).to(dtype)), (shape, dtype)
        if kind == "push":  # the gather region between all-reduces, as the logits' all-gather
            gathered = all_gather(parts[rank].to(device), state)
            assert torch.equal(gathered.cpu(), torch.cat(parts, dim=-1)), (shape, dtype)
    # captured: three all-reduces in the model's slot order, replayed with new inputs each time
    x = torch.zeros(4, 4096, device=device)
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))

    def collectives() -> tuple[torch.Tensor, ...]:
        a = all_reduce(x, state, EMBED_SLOT)
        b = all_reduce(a * 0.5, state, ATTENTION_SLOT)
        c = all_reduce(b + 1.0, state, MLP_SLOT)
        d = all_gather(c[:, : 9000 // 4].contiguous(), state) if kind == "push" else c
        return a, b, c, d

    with torch.cuda.stream(side):  # warm-up outside the capture, as the engine does
        collectives()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        a, b, c, d = collectives()
    for _ in range(200):
        parts = [torch.randn(4, 4096, generator=gen) for _ in range(2)]
        x.copy_(parts[rank])
        graph.replay()
        want_a = parts[0] + parts[1]
        want_b = want_a * 0.5 + want_a * 0.5
        assert torch.equal(a.cpu(), want_a) and torch.equal(b.cpu(), want_b)
        want_c = (want_b + 1.0) * 2
        assert torch.equal(c.cpu(), want_c)
        if kind == "push":  # every rank holds the same c: the gather repeats its columns
            cols = want_c[:, : 9000 // 4]
            assert torch.equal(d.cpu(), torch.cat([cols, cols], dim=-1))
    for _ in range(500):  # back to back, no host sync between: the ranks drift apart as they may
        graph.replay()
    assert torch.equal(c.cpu(), want_c)
    if kind == "push":
        assert torch.equal(d.cpu(), torch.cat([cols, cols], dim=-1))
    destroy_parallel(state)


@pytest.mark.parametrize("kind", ["p2p", "push"])
def test_all_reduce_kernels_two_gpus(kind: str) -> None:
    """This project's all-reduce kernels on two GPUs: sums of several shapes and dtypes, bit-exact
    (rank order, float32), and with `push` all-gathers between them; then a CUDA graph of three
    all-reduces in a row (slots 2, 0, 1) and, with `push`, an all-gather, replayed 200 times back to
    back with new inputs. Neither has a closing barrier (p2p: one barrier a call; push: none), so a
    region reused too early would show here as a wrong result (or a hang, which the timeout turns
    into a failure)."""
    import multiprocessing

    from llmdeploy_engine.parallel.distributed import free_port

    ctx = multiprocessing.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=_p2p_rank, args=(rank, port, kind)) for rank in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=180)
    codes = [p.exitcode for p in procs]
    for p in procs:
        if p.is_alive():
            p.kill()
    assert codes == [0, 0], codes
