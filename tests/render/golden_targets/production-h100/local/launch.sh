#!/usr/bin/env bash
# Rendered by llmdeploy from recipe 'production-h100' (recipe sha256 17e1e22e66649e25c8d8a7bb9c18f9296e74b91a1513a5dfee740a542e7bd0e4).
# Generated file: edit the recipe and run `llmdeploy render` again instead.
# Planned capacity per replica: 689,072 KV cache tokens, max concurrency 21.03 at max_model_len 32,768.
# Starts the engine in the foreground on this machine; `llmdeploy apply` does the same and keeps state.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
set -a
. "$here/engine.env"
set +a
export VLLM_API_KEY="${LLMDEPLOY_SECRET:?set LLMDEPLOY_SECRET (server.api_key)}"
export HF_TOKEN="${LLMDEPLOY_SECRET:?set LLMDEPLOY_SECRET (server.hf_token)}"
model=meta-llama/Llama-3.1-8B-Instruct
exec "${LLMDEPLOY_VLLM_PYTHON:-python3}" \
  -m vllm.entrypoints.openai.api_server \
  --host 0.0.0.0 \
  --port 8000 \
  --model "$model" \
  --dtype bfloat16 \
  --kv-cache-dtype fp8_e4m3 \
  --max-model-len 32768 \
  --max-num-seqs 256 \
  --max-num-batched-tokens 8192 \
  --gpu-memory-utilization 0.9 \
  --block-size 16 \
  --enable-prefix-caching \
  --enable-chunked-prefill \
  --served-model-name llama-3.1-8b-instruct \
  --speculative-config '{"method":"draft_model","model":"meta-llama/Llama-3.2-1B-Instruct","num_speculative_tokens":4}'
