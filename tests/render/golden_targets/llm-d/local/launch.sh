#!/usr/bin/env bash
# Rendered by llmdeploy from recipe 'llm-d' (recipe sha256 ba50612fbe5cfbd84d9c71d99edac0a2ac54604224363d603437adb9c4a43218).
# Generated file: edit the recipe and run `llmdeploy render` again instead.
# Planned capacity per replica: 353,072 KV cache tokens, max concurrency 21.55 at max_model_len 16,384.
# Starts the engine in the foreground on this machine; `llmdeploy apply` does the same and keeps state.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
set -a
. "$here/engine.env"
set +a
model=Qwen/Qwen3-8B
exec "${LLMDEPLOY_VLLM_PYTHON:-python3}" \
  -m vllm.entrypoints.openai.api_server \
  --host 127.0.0.1 \
  --port 8000 \
  --model "$model" \
  --dtype bfloat16 \
  --kv-cache-dtype fp8 \
  --max-model-len 16384 \
  --max-num-seqs 64 \
  --gpu-memory-utilization 0.9 \
  --block-size 16 \
  --enable-prefix-caching \
  --enable-chunked-prefill \
  --served-model-name qwen3-8b
