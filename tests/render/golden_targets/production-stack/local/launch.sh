#!/usr/bin/env bash
# Rendered by llmdeploy from recipe 'production-stack' (recipe sha256 bf7e103aedfa8122b398489a669bd7be6d7725db4e865099704e689a12611bb0).
# Generated file: edit the recipe and run `llmdeploy render` again instead.
# Planned capacity per replica: 450,608 KV cache tokens, max concurrency 13.75 at max_model_len 32,768.
# Starts the engine in the foreground on this machine; `llmdeploy apply` does the same and keeps state.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
set -a
. "$here/engine.env"
set +a
export HF_TOKEN="${LLMDEPLOY_SECRET:?set LLMDEPLOY_SECRET (server.hf_token)}"
model=meta-llama/Llama-3.1-8B-Instruct
exec "${LLMDEPLOY_VLLM_PYTHON:-python3}" \
  -m vllm.entrypoints.openai.api_server \
  --host 127.0.0.1 \
  --port 8000 \
  --model "$model" \
  --dtype bfloat16 \
  --max-model-len 32768 \
  --max-num-seqs 128 \
  --max-num-batched-tokens 8192 \
  --gpu-memory-utilization 0.9 \
  --block-size 16 \
  --enable-prefix-caching \
  --enable-chunked-prefill
