"""On a Hopper GPU: decode graphs whose Triton kernels launch with programmatic dependent launch
(triton_pdl) give bit for bit the logits and KV cache of the same graphs captured without it. A kernel
that read its predecessor's output before `gdc_wait`, or wrote before it, would race and differ."""

from __future__ import annotations

import pytest
import torch
from gpu_engine_helpers import batch_for, qwen_runner
from llmdeploy_engine.runner.cuda_graph_runner import CudaGraphRunner

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_pdl_graphs_match_graphs_without_pdl(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("triton")
    from llmdeploy_engine.kernels import triton_pdl

    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch needs sm_90 or later")
    runner = qwen_runner(max_model_len=1024, max_num_seqs=4)
    probe = torch.empty(1, device="cuda")
    monkeypatch.setattr(triton_pdl, "_switched_on", lambda: True)
    assert triton_pdl.enabled(probe)
    with_pdl = CudaGraphRunner(runner, batch_sizes=(1, 2))
    monkeypatch.setattr(triton_pdl, "_switched_on", lambda: False)
    assert not triton_pdl.enabled(probe)
    without = CudaGraphRunner(runner, batch_sizes=(1, 2))

    bs = runner.block_size
    gen = torch.Generator().manual_seed(3)
    # one sequence crosses the 256-token context where decode splits (and the merge kernel) begin;
    # the pair runs the two-row path (cuBLAS between the PDL kernels)
    lengths = [230, 60]
    prompts = [torch.randint(0, 1000, (n,), generator=gen).tolist() for n in lengths]
    per_seq = -(-(max(lengths) + 64) // bs)
    tables = [list(range(i, 2 * per_seq, 2)) for i in range(2)]
    logits = runner.execute(batch_for(prompts, [0, 0], tables, bs))
    last = [int(t) for t in logits.argmax(-1).tolist()]
    ctx = list(lengths)
    for step in range(48):
        active = [0] if step % 3 else [0, 1]
        batch = batch_for(
            [[last[i]] for i in active], [ctx[i] for i in active], [tables[i] for i in active], bs
        )
        ours = with_pdl.execute(batch).clone()
        kv_ours = [(k.clone(), v.clone()) for k, v in runner.kv_caches]
        ref = without.execute(batch).clone()  # rewrites the same slots with the same values
        assert with_pdl.num_replays == without.num_replays == step + 1
        assert torch.equal(ours, ref), f"step {step}: logits differ with PDL"
        for (k, v), (k0, v0) in zip(runner.kv_caches, kv_ours, strict=True):
            assert torch.equal(k, k0) and torch.equal(v, v0), f"step {step}: KV cache differs with PDL"
        for j, i in enumerate(active):
            last[i] = int(ref[j].argmax())
            ctx[i] += 1
    assert ctx[0] > 256
