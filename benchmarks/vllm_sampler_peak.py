"""The memory vLLM V1's dummy sampler run takes, measured with torch at the real shapes, next to
the planner's formula (llmdeploy/memory/sampler_peak.py).

For each vocabulary size, max_num_seqs and release family, the script builds [num_seqs, vocab]
model-dtype logits and runs the torch ops that family's sampler warm-up runs on them (float32 copy,
greedy argmax, in-place temperature, then the PyTorch top-k/top-p path: sort + masks + softmax +
cumsum + scatter, or the Triton path's in-place masking and cached scratch; then softmax and the
exponential noise of `random_sample`; and, for the FlashInfer path, the tensors FlashInfer's
sampling functions allocate around their kernels: the probabilities, or a masked copy of the logits
and its softmax). It prints torch.cuda.max_memory_allocated() minus the baseline, per entry, and
the ratio measured / formula. Each case is caught on its own, so one failure does not stop the rest.

    python benchmarks/vllm_sampler_peak.py --device cuda            # the full grid
    python benchmarks/vllm_sampler_peak.py --device cpu             # small shapes, checks only

Needs only torch; imports the planner's formula module from llmdeploy, or from a copy of
sampler_peak.py next to this file (to run on a machine without llmdeploy).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

if (Path(__file__).resolve().parent / "sampler_peak.py").exists():  # a copy carried to a GPU machine
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import sampler_peak as formula  # type: ignore[import-not-found,no-redef]
else:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from llmdeploy.memory import sampler_peak as formula


def _sampler_prelude(logits: torch.Tensor) -> torch.Tensor:
    """Sampler.forward up to the top-k/top-p sampler: float32 copy, greedy argmax, temperature."""
    x = logits.to(torch.float32)
    greedy = x.argmax(dim=-1)
    temp = torch.full((x.shape[0],), 0.5, device=x.device)
    x.div_(temp.unsqueeze(1))
    del greedy
    return x


def _random_sample(probs: torch.Tensor) -> torch.Tensor:
    q = torch.empty_like(probs)
    q.exponential_()
    return probs.div_(q).argmax(dim=-1)


def _top_k_top_p_sort(x: torch.Tensor, k: torch.Tensor, p: torch.Tensor, in_place: bool) -> torch.Tensor:
    logits_sort, logits_idx = x.sort(dim=-1, descending=False)
    top_k_mask = logits_sort.size(1) - k.to(torch.long)
    top_k_mask = logits_sort.gather(1, top_k_mask.unsqueeze(dim=1))
    top_k_mask = logits_sort < top_k_mask
    logits_sort.masked_fill_(top_k_mask, -float("inf"))
    probs_sort = logits_sort.softmax(dim=-1)
    probs_sum = torch.cumsum(probs_sort, dim=-1, out=probs_sort)
    top_p_mask = probs_sum <= 1 - p.unsqueeze(dim=1)
    top_p_mask[:, -1] = False
    logits_sort.masked_fill_(top_p_mask, -float("inf"))
    if in_place:
        return x.scatter_(dim=-1, index=logits_idx, src=logits_sort)
    return logits_sort.scatter(dim=-1, index=logits_idx, src=logits_sort)


def _top_k_top_p_triton(x: torch.Tensor, num_sms: int) -> tuple[torch.Tensor, torch.Tensor]:
    # the kernel masks in place with one cached float32 vocab row per program; the stand-in here
    # allocates that scratch and masks in place, as the kernel does, without its search
    scratch = torch.empty(
        (formula.triton_scratch_bytes(x.shape[0], x.shape[1], num_sms) // (4 * x.shape[1]), x.shape[1]),
        dtype=torch.float32,
        device=x.device,
    )
    x.masked_fill_(x < x.amin(dim=-1, keepdim=True), -float("inf"))
    return x, scratch  # vLLM caches the scratch, so it stays live through the rest of the call


def native_call(logits: torch.Tensor, fam: formula.SamplerFamily, num_sms: int) -> torch.Tensor:
    n, vocab = logits.shape
    k = torch.full((n,), vocab - 1, device=logits.device)
    p = torch.full((n,), 0.9, device=logits.device)
    x = _sampler_prelude(logits)
    scratch = None
    if fam.topk_topp == "triton" and n >= 8:
        masked, scratch = _top_k_top_p_triton(x, num_sms)
    else:
        masked = _top_k_top_p_sort(x, k, p, fam.scatter_in_place)
    probs = masked.softmax(dim=-1, dtype=torch.float32)
    out = _random_sample(probs)
    del scratch
    return out


def flashinfer_call(logits: torch.Tensor, fam: formula.SamplerFamily) -> torch.Tensor:
    """The tensors around FlashInfer's kernels (which themselves allocate only [rows] outputs)."""
    x = _sampler_prelude(logits).contiguous()
    if fam.flashinfer == "probs":
        probs = x.softmax(dim=-1, dtype=torch.float32)
    else:  # top_k_mask_logits makes a masked copy, then softmax
        masked = torch.empty_like(x).copy_(x)
        probs = torch.softmax(masked, dim=-1)
    return probs.argmax(dim=-1)


def measure(device: str, fn, make_logits) -> tuple[int, tuple[int, ...]]:  # type: ignore[no-untyped-def]
    """(peak bytes above the baseline, output shape); the peak is 0 on CPU (not measured there)."""
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    logits = make_logits()
    out = fn(logits)
    shape = tuple(out.shape)
    if device == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    else:
        peak = 0
    del logits, out
    return peak, shape


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--vocab", type=int, nargs="*", default=None)
    ap.add_argument("--num-seqs", type=int, nargs="*", default=None)
    args = ap.parse_args(argv)
    cpu = args.device == "cpu"
    vocabs = args.vocab or ([1000, 4099] if cpu else [32000, 128256, 151936, 262144])
    seqs_list = args.num_seqs or ([3, 8] if cpu else [256, 1024])
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count if not cpu else 4
    name = torch.cuda.get_device_name(0) if not cpu else "cpu"
    print(f"# torch {torch.__version__}, device {name}, SMs {num_sms}, logits bfloat16", flush=True)
    print(
        f"{'family':<12}{'path':<11}{'vocab':>8}{'seqs':>6}{'measured GiB':>14}{'B/entry':>9}"
        f"{'formula B/entry':>16}{'ratio':>7}",
        flush=True,
    )
    failures = 0
    # one case per distinct recipe of ops (families that share one are listed together)
    recipes: dict[tuple[str, object], list[str]] = {}
    for fam in formula.SAMPLER_FAMILIES:
        label = ".".join(str(x) for x in fam.since)
        recipes.setdefault(("native", (fam.topk_topp, fam.scatter_in_place)), []).append(label)
        recipes.setdefault(("flashinfer", fam.flashinfer), []).append(label)
    first: dict[tuple[str, object], formula.SamplerFamily] = {}
    for fam in formula.SAMPLER_FAMILIES:
        first.setdefault(("native", (fam.topk_topp, fam.scatter_in_place)), fam)
        first.setdefault(("flashinfer", fam.flashinfer), fam)
    for key, labels in recipes.items():
        path, fam = key[0], first[key]
        name = "/".join(labels)
        recipe = (
            f"{fam.topk_topp}{'' if fam.scatter_in_place else '+copy'}"
            if path == "native"
            else fam.flashinfer
        )
        print(f"# {path} ({recipe}) of families {name}", flush=True)
        for vocab in vocabs:
            for seqs in seqs_list:
                per_entry = (
                    formula.native_bytes_per_entry(fam, 2)
                    if path == "native"
                    else formula.flashinfer_bytes_per_entry(fam, 2)
                )
                triton = path == "native" and fam.topk_topp == "triton" and seqs >= 8
                extra = formula.triton_scratch_bytes(seqs, vocab, num_sms) if triton else 0

                def make(seqs: int = seqs, vocab: int = vocab) -> torch.Tensor:
                    return torch.randn(seqs, vocab, device=args.device, dtype=torch.bfloat16)

                def run(lg: torch.Tensor, path: str = path, fam: formula.SamplerFamily = fam) -> torch.Tensor:
                    return native_call(lg, fam, num_sms) if path == "native" else flashinfer_call(lg, fam)

                try:
                    t0 = time.perf_counter()
                    peak, shape = measure(args.device, run, make)
                    assert shape == (seqs,), shape
                    entries = seqs * vocab
                    predicted = per_entry * entries + extra
                    ratio = f"{peak / predicted:.3f}" if peak else "-"
                    print(
                        f"{name[:11]:<12}{path:<11}{vocab:>8}{seqs:>6}{peak / 2**30:>14.3f}"
                        f"{peak / entries:>9.2f}{(per_entry + extra / entries):>16.2f}{ratio:>7}"
                        f"  ({time.perf_counter() - t0:.2f} s)",
                        flush=True,
                    )
                except Exception as exc:  # keep going: one bad case must not stop the grid
                    failures += 1
                    print(
                        f"{name[:11]:<12}{path:<11}{vocab:>8}{seqs:>6}  FAILED: {type(exc).__name__}: "
                        f"{str(exc)[:200]}",
                        flush=True,
                    )
                    if not cpu:
                        torch.cuda.empty_cache()
    # torch's sort alone: its scratch beyond the two outputs, the figure SORT_SCRATCH_BYTES holds
    for vocab in vocabs:
        for seqs in seqs_list:
            try:

                def sort_only(lg: torch.Tensor) -> torch.Tensor:
                    x = lg.to(torch.float32)
                    values, _idx = x.sort(dim=-1)
                    return values[:, 0]

                peak, _ = measure(
                    args.device,
                    sort_only,
                    lambda s=seqs, v=vocab: torch.randn(s, v, device=args.device, dtype=torch.bfloat16),
                )
                entries = seqs * vocab
                scratch = (peak - entries * (2 + 4 + 12)) / entries if peak else 0.0
                print(
                    f"sort scratch vocab {vocab} seqs {seqs}: {scratch:.2f} B/entry "
                    f"(formula {formula.SORT_SCRATCH_BYTES})",
                    flush=True,
                )
            except Exception as exc:
                failures += 1
                print(
                    f"sort scratch vocab {vocab} seqs {seqs}: FAILED {type(exc).__name__}: {str(exc)[:200]}",
                    flush=True,
                )
    if not cpu:
        try:
            non_torch_after_gemm()
        except Exception as exc:
            failures += 1
            print(f"non-torch: FAILED {type(exc).__name__}: {str(exc)[:200]}", flush=True)
    print(f"# {failures} case(s) failed", flush=True)


def non_torch_after_gemm() -> None:
    """Device memory in use outside torch's pool once cuBLAS has run a bf16 GEMM (its handle and
    workspace), the single-GPU part of vLLM's non-torch figure (context excluded: measured from here)."""
    torch.cuda.synchronize()
    free0, total = torch.cuda.mem_get_info()
    reserved0 = torch.cuda.memory_reserved()
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    (a @ a).sum().item()
    torch.cuda.synchronize()
    free1, _ = torch.cuda.mem_get_info()
    grown = (free0 - free1) - (torch.cuda.memory_reserved() - reserved0)
    print(
        f"non-torch after first bf16 GEMM: {grown / 2**30:.3f} GiB (total {total / 2**30:.2f} GiB, "
        f"in use before it {(total - free0) / 2**30:.3f} GiB)",
        flush=True,
    )


if __name__ == "__main__":
    main()
