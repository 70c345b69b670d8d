"""The sampler warm-up of vLLM V1's profile run: which [max_num_seqs, vocab] tensors are live at its
peak, per release family.

vLLM's `profile_run` runs the model on `max_num_batched_tokens` dummy tokens, then
`_dummy_sampler_run` on the hidden states of the last token of each of `max_num_seqs` dummy requests:
`compute_logits` gives [num_seqs, vocab] logits in the model dtype, and the sampler runs with
temperature 0.5, top-k = vocab - 1 and top-p = 0.9 (both on, so the top-k/top-p path is exercised).
The sampler converts the logits to float32 (a copy), takes the greedy argmax, divides by the
temperature in place, then either
- the PyTorch path (`forward_native`): `apply_top_k_top_p` sorts the float32 logits (values +
  int64 indices, plus torch's own sort scratch), masks, soft-maxes the sorted values, cum-sums them in
  place, masks again and scatters back; then `softmax` gives the probabilities and `random_sample`
  an exponential noise tensor of the same size; or
- FlashInfer (`forward_cuda`, when FlashInfer is installed and enabled): 0.8 soft-maxes first and
  samples from the probabilities; 0.9 and later sample from the logits, where FlashInfer's
  `top_k_top_p_sampling_from_logits` makes a masked copy of the logits and soft-maxes it.

Newer releases replace the sort by a Triton kernel that masks in place (with a cached scratch of
min(next_pow2(min(SMs, rows)), SMs) x vocab float32), and run the sampler twice (FlashInfer, then the
PyTorch path with a per-request generator), so the peak is the larger of the two calls.

Sources (vLLM release wheels): vllm/v1/worker/gpu_model_runner.py `_dummy_sampler_run`,
vllm/v1/sample/sampler.py, vllm/v1/sample/ops/topk_topp_sampler.py (and topk_topp_triton.py), in
the tags named by each `SamplerFamily`. The per-entry byte counts are those tensors' element sizes;
the sort scratch is torch's, measured on an H200 by benchmarks/vllm_sampler_peak.py (which imports
this module and prints measured vs these formulas). Standard library only, so the benchmark can carry
this file to a GPU machine without installing llmdeploy.
"""

from __future__ import annotations

from dataclasses import dataclass

# torch's CUDA sort of [rows, vocab] float32 with int64 indices: scratch beyond its two outputs, in
# bytes per element (cub segmented radix sort keeps a second key/value buffer and an index input)
SORT_SCRATCH_BYTES = 20


@dataclass(frozen=True)
class SamplerFamily:
    """One family of releases whose dummy sampler run allocates the same tensors."""

    since: tuple[int, int, int]
    topk_topp: str  # "sort" (PyTorch sort + scatter) or "triton" (in-place masking kernel)
    scatter_in_place: bool  # the sort path scatters back into the logits (else into a new tensor)
    flashinfer: str  # FlashInfer call in the dummy run: "probs" (0.8), "logits" (0.9+)
    flashinfer_by_default: bool  # FlashInfer sampling is on unless VLLM_USE_FLASHINFER_SAMPLER=0
    native_after_flashinfer: bool  # the dummy run also calls the PyTorch path (a generator is set)
    source: str


SAMPLER_FAMILIES = (
    # V1 samples with FlashInfer when it is installed, unless VLLM_USE_FLASHINFER_SAMPLER=0; the
    # wheel on PyPI leaves FlashInfer out (an extra), so the PyTorch sort path is the default here
    # (forward_cuda would soft-max first, then sample from the probabilities)
    SamplerFamily((0, 7, 0), "sort", False, "probs", False, False, "v0.8.5 topk_topp_sampler.forward_cuda"),
    # forward_cuda passes the logits to top_k_top_p_sampling_from_logits
    SamplerFamily((0, 9, 0), "sort", False, "logits", False, False, "v0.9.2, v0.10.2 flashinfer_sample"),
    # FlashInfer sampling becomes opt-in (VLLM_USE_FLASHINFER_SAMPLER=1): the PyTorch sort path runs
    SamplerFamily((0, 11, 0), "sort", False, "logits", False, False, "v0.11.2, v0.13.0, v0.16.0 __init__"),
    # apply_top_k_top_p uses the Triton kernel for 8 rows or more (the sort only below that)
    SamplerFamily((0, 17, 0), "triton", True, "logits", False, False, "v0.17.1 to v0.20.2 apply_top_k_top_p"),
    # FlashInfer on by default again, and _dummy_sampler_run warms up the PyTorch path a second time
    SamplerFamily((0, 21, 0), "triton", True, "logits", True, True, "v0.21.0 to v0.32.0 _dummy_sampler_run"),
)


def family(version: tuple[int, int, int] | None) -> SamplerFamily:
    """The family of a release (the newest family when no release is given)."""
    rules = [f for f in SAMPLER_FAMILIES if version is None or version >= f.since]
    return rules[-1] if rules else SAMPLER_FAMILIES[0]


def native_bytes_per_entry(fam: SamplerFamily, logits_dtype_bytes: int) -> float:
    """Peak bytes per [num_seqs, vocab] entry of one PyTorch-path sampler call, model logits included."""
    base = logits_dtype_bytes + 4  # model-dtype logits + the sampler's float32 copy
    if fam.topk_topp == "triton":
        return base + 4 + 4  # probabilities + exponential noise (the masking is in place)
    # inside apply_top_k_top_p: sorted values (4) + int64 indices (8) + torch's sort scratch
    during_sort = base + 12 + SORT_SCRATCH_BYTES
    # at the scatter: sorted values + indices + cumsum'd probabilities (4) + two bool masks (2),
    # + the scatter's output when it is not in place (4)
    at_scatter = base + 12 + 4 + 2 + (0 if fam.scatter_in_place else 4)
    # after it: (new) masked logits + probabilities + noise
    after = base + (0 if fam.scatter_in_place else 4) + 4 + 4
    return float(max(during_sort, at_scatter, after))


def flashinfer_bytes_per_entry(fam: SamplerFamily, logits_dtype_bytes: int) -> float:
    base = logits_dtype_bytes + 4
    return float(base + (4 if fam.flashinfer == "probs" else 8))  # probs / masked logits + probs


def triton_scratch_bytes(num_seqs: int, vocab_size: int, num_sms: int) -> int:
    """The Triton top-k/top-p kernel's cached float32 scratch: one vocab row per program."""
    rows = max(1, min(num_sms, num_seqs))
    return min(1 << (rows - 1).bit_length(), num_sms) * vocab_size * 4


def sampler_peak_bytes(
    version: tuple[int, int, int] | None,
    num_seqs: int,
    vocab_size: int,
    logits_dtype_bytes: int = 2,
    flashinfer: bool | None = None,
    num_sms: int = 132,
) -> int:
    """Peak bytes the dummy sampler run adds on top of what the model forward left live;
    `flashinfer` None means the family's default (FlashInfer installed, as in vLLM's images)."""
    fam = family(version)
    use_flashinfer = fam.flashinfer_by_default if flashinfer is None else flashinfer
    entries = num_seqs * vocab_size
    native = native_bytes_per_entry(fam, logits_dtype_bytes) * entries
    if fam.topk_topp == "triton" and num_seqs >= 8:
        native += triton_scratch_bytes(num_seqs, vocab_size, num_sms)
    if not use_flashinfer:
        return int(native)
    fi = flashinfer_bytes_per_entry(fam, logits_dtype_bytes) * entries
    return int(max(fi, native) if fam.native_after_flashinfer else fi)


__all__ = [
    "SAMPLER_FAMILIES",
    "SORT_SCRATCH_BYTES",
    "SamplerFamily",
    "family",
    "flashinfer_bytes_per_entry",
    "native_bytes_per_entry",
    "sampler_peak_bytes",
    "triton_scratch_bytes",
]
