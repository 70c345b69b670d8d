#!/usr/bin/env bash
# Rendered by llmdeploy from recipe 'sglang' (recipe sha256 d9b72aa1f9d3ad4e72312ec8bfd12b0d0c314ceabb7a41cc710599c3f1cbb531).
# Generated file: edit the recipe and run `llmdeploy render` again instead.
# Planned capacity per replica: 1,617,856 KV cache tokens, max concurrency 49.37 at max_model_len 32,768.
# Starts the engine in the foreground on this machine; `llmdeploy apply` does the same and keeps state.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
set -a
. "$here/engine.env"
set +a
model=Qwen/Qwen2.5-7B-Instruct
exec "${LLMDEPLOY_SGLANG_PYTHON:-python3}" \
  -m sglang.launch_server \
  --host 0.0.0.0 \
  --port 30000 \
  --model-path "$model" \
  --dtype bfloat16 \
  --kv-cache-dtype fp8_e4m3 \
  --context-length 32768 \
  --max-running-requests 128 \
  --chunked-prefill-size 8192 \
  --mem-fraction-static 0.729 \
  --page-size 16 \
  --served-model-name qwen2.5-7b-instruct \
  --enable-metrics
