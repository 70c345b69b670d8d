#!/usr/bin/env bash
# Run suite scripts on the GPU machine from a plain copy of the repository (no install needed).
#
#   benchmarks/device.sh "latency" "throughput --peer-requests 32"     # each argument: one script + its flags
#
# Each script runs in turn with the checkout's engine as llmdeploy_engine and the toolkit on the path;
# its table goes to stdout and to OUT/<name>.log, its JSON to OUT/<name>.json (OUT: $OUT, the device
# tool's folder, else /tmp/llmdeploy-bench). A script that fails is reported and the next one still runs; the
# exit status is the number of failures. LLMDEPLOY_COMMIT names the commit where the copy has no .git.
set -uo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
out="${OUT:-/tmp/llmdeploy-bench}"
mkdir -p "$out"
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if [ -z "${LLMDEPLOY_COMMIT:-}" ] && git -C "$repo" rev-parse --short HEAD >/dev/null 2>&1; then
  export LLMDEPLOY_COMMIT="$(git -C "$repo" rev-parse --short HEAD)"
fi
if [ "$#" -eq 0 ]; then
  echo "usage: benchmarks/device.sh 'SCRIPT [FLAGS]' ...  (SCRIPT: latency, throughput, decode_kernels, serving)" >&2
  exit 2
fi
python3 -c 'import torch; print("torch", torch.__version__, "GPUs:", torch.cuda.device_count())'
failed=0
n=0
for job in "$@"; do
  read -r -a words <<<"$job"
  name="${words[0]%.py}"
  n=$((n + 1))
  script="$repo/benchmarks/$name.py"
  if [ ! -f "$script" ]; then
    echo "no suite script $script" >&2
    failed=$((failed + 1))
    continue
  fi
  tag="$n-$name"
  echo "==> $name ${words[*]:1}"
  start=$SECONDS
  if ! python3 "$script" "${words[@]:1}" --json "$out/$tag.json" 2>&1 | tee "$out/$tag.log"; then
    echo "==> $name FAILED" >&2
    failed=$((failed + 1))
  fi
  echo "==> $name took $((SECONDS - start)) s"
done
exit "$failed"
