#!/usr/bin/env bash
# Rendered by llmdeploy from recipe 'tgi' (recipe sha256 a1facdcb6fa20037815f2d2effee99c84813d5004f81a39e505c6288a573e9df).
# Generated file: edit the recipe and run `llmdeploy render` again instead.
# Planned capacity per replica: 193,040 KV cache tokens, max concurrency 23.56 at max_model_len 8,192.
# Starts the engine in the foreground on this machine; `llmdeploy apply` does the same and keeps state.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
set -a
. "$here/engine.env"
set +a
export API_KEY="${LLMDEPLOY_SECRET:?set LLMDEPLOY_SECRET (server.api_key)}"
export HF_TOKEN="${LLMDEPLOY_SECRET:?set LLMDEPLOY_SECRET (server.hf_token)}"
model=mistralai/Mistral-7B-Instruct-v0.3
exec text-generation-launcher \
  --hostname 0.0.0.0 \
  --port 8080 \
  --model-id "$model" \
  --dtype bfloat16 \
  --max-input-tokens 8191 \
  --max-total-tokens 8192 \
  --max-concurrent-requests 64 \
  --max-batch-prefill-tokens 8192 \
  --cuda-memory-fraction 0.9 \
  --speculate 2
