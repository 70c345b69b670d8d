#!/usr/bin/env bash
# Rendered by llmdeploy from recipe 'kserve' (recipe sha256 6d24d4ff7438cbb1091efc36d5412772085b45ec6eab62990574f1cdf63e62eb).
# Generated file: edit the recipe and run `llmdeploy render` again instead.
# Planned capacity per replica: 2,080,752 KV cache tokens, max concurrency 63.50 at max_model_len 32,768.
# Starts the engine in the foreground on this machine; `llmdeploy apply` does the same and keeps state.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
set -a
. "$here/engine.env"
set +a
model=Qwen/Qwen2.5-7B-Instruct
exec "${LLMDEPLOY_VLLM_PYTHON:-python3}" \
  -m vllm.entrypoints.openai.api_server \
  --host 127.0.0.1 \
  --port 8000 \
  --model "$model" \
  --dtype bfloat16 \
  --kv-cache-dtype fp8 \
  --max-model-len 32768 \
  --max-num-seqs 128 \
  --max-num-batched-tokens 8192 \
  --gpu-memory-utilization 0.9 \
  --block-size 16 \
  --enable-prefix-caching \
  --enable-chunked-prefill \
  --served-model-name qwen2.5-7b-instruct
