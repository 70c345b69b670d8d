#!/usr/bin/env bash
# Rendered by llmdeploy from recipe 'long-context-agent' (recipe sha256 cb121ec46723ea70e72f11af5580f6cf082ece9a8cf644feba388c2f3711a7fa).
# Generated file: edit the recipe and run `llmdeploy render` again instead.
# Planned capacity per replica: 1,088,272 KV cache tokens, max concurrency 16.61 at max_model_len 65,536.
# Starts the engine in the foreground on this machine; `llmdeploy apply` does the same and keeps state.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
set -a
. "$here/engine.env"
set +a
export VLLM_API_KEY="${LLMDEPLOY_SECRET:?set LLMDEPLOY_SECRET (server.api_key)}"
model=hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4
exec "${LLMDEPLOY_VLLM_PYTHON:-python3}" \
  -m vllm.entrypoints.openai.api_server \
  --host 0.0.0.0 \
  --port 8000 \
  --model "$model" \
  --dtype float16 \
  --quantization awq \
  --kv-cache-dtype fp8 \
  --max-model-len 65536 \
  --max-num-seqs 32 \
  --max-num-batched-tokens 8192 \
  --gpu-memory-utilization 0.92 \
  --block-size 16 \
  --enable-prefix-caching \
  --enable-chunked-prefill \
  --served-model-name agent-llama-3.1-8b
