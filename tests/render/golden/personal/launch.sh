#!/usr/bin/env bash
# Rendered by llmdeploy from recipe 'personal' (recipe sha256 8f5584e1bad9c49b11267e72c3810a7d614455bbacca802c8c74511f46c1d0d9).
# Generated file: edit the recipe and run `llmdeploy render` again instead.
# Planned capacity per replica: 293,584 KV cache tokens, max concurrency 8.96 at max_model_len 32,768.
# Starts the engine in the foreground on this machine; `llmdeploy apply` does the same and keeps state.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
set -a
. "$here/engine.env"
set +a
model=Qwen/Qwen2.5-7B-Instruct-GPTQ-Int4
exec "${LLMDEPLOY_VLLM_PYTHON:-python3}" \
  -m vllm.entrypoints.openai.api_server \
  --host 127.0.0.1 \
  --port 8000 \
  --model "$model" \
  --dtype float16 \
  --quantization gptq \
  --kv-cache-dtype float16 \
  --max-model-len 32768 \
  --max-num-seqs 16 \
  --gpu-memory-utilization 0.9 \
  --block-size 16 \
  --enable-prefix-caching \
  --enable-chunked-prefill \
  --served-model-name qwen2.5-7b-instruct
