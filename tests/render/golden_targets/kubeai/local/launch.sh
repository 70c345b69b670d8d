#!/usr/bin/env bash
# Rendered by llmdeploy from recipe 'kubeai' (recipe sha256 ce1246c61abdea262b4112dc0c423ace1df5e7369cf3c7a61f804d5c5e1ff424).
# Generated file: edit the recipe and run `llmdeploy render` again instead.
# Planned capacity per replica: 207,584 KV cache tokens, max concurrency 25.34 at max_model_len 8,192.
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
  --max-model-len 8192 \
  --max-num-seqs 32 \
  --gpu-memory-utilization 0.92 \
  --block-size 16 \
  --enable-prefix-caching \
  --enable-chunked-prefill \
  --served-model-name qwen2.5-7b-instruct
