#!/usr/bin/env bash
# Rendered by llmdeploy from recipe 'personal' (recipe sha256 8b655a8abfbfebb11f1743934841f883523ec41570d2d7b191bcf31beeda000e).
# Generated file: edit the recipe and run `llmdeploy render` again instead.
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
