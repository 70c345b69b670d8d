"""GPU check of the engine through the public LLM API: CUDA graphs + Triton decode vs enforce_eager.

Run on the GPU machine (random weights, no hub): python3 benchmarks/gpu_engine_graphs.py
Prints the time for 8 requests x 32 greedy tokens in each mode and how many requests match.
"""

import gc
import time

import torch
from llmdeploy_engine import LLM, SamplingParams

prompts = [f"Request {i}: " + "word " * (5 + 7 * i) for i in range(8)]
params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
res = {}
for eager in (False, True):
    llm = LLM(
        model="random:Qwen/Qwen2.5-0.5B",
        gpu_memory_utilization=0.3,
        max_model_len=1024,
        enforce_eager=eager,
        seed=0,
    )
    llm.generate(prompts[:1], params)
    t = time.perf_counter()
    outs = llm.generate(prompts, params)
    dt = time.perf_counter() - t
    res[eager] = [o.outputs[0].token_ids for o in outs]
    n = sum(len(x) for x in res[eager])
    print(f"enforce_eager={eager}: {n} tokens in {dt:.2f} s; first: {res[eager][0][:8]}")
    del llm
    gc.collect()
    torch.cuda.empty_cache()
same = sum(a == b for a, b in zip(res[False], res[True], strict=True))
print(f"graphs vs eager: {same}/8 requests token-identical")
