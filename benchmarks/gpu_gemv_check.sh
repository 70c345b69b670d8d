#!/usr/bin/env bash
# On the GPU machine, from the repository root: tests/engine_gpu/test_triton_gemv.py (two pytest
# processes at once, so that Triton's compiles overlap), then benchmarks/gpu_gemv.py (the sweep, its
# own budget 80 s). Full logs go to $OUT (or /tmp/gpu_gemv_out); summaries are printed last.
set -u
out=${OUT:-/tmp/gpu_gemv_out}
mkdir -p "$out"
pkgs=$(mktemp -d)  # a private folder naming engine/ as llmdeploy_engine
ln -s "$PWD/engine" "$pkgs/llmdeploy_engine"
trap 'rm -rf "$pkgs"' EXIT
export PYTHONPATH=$pkgs:$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv,noheader
run_tests() {  # log name, then pytest arguments
    local name=$1
    shift
    timeout "${TEST_TIMEOUT_S:-240}" "$py" -m pytest -v -rfE --tb=short -W ignore --noconftest \
        -p no:cacheprovider tests/engine_gpu/test_triton_gemv.py "$@" >"$out/t_$name.log" 2>&1
    echo "exit $? (124: timed out)" >>"$out/t_$name.log"
}
start=$(date +%s)
run_tests linear_silu -k "test_linear or test_silu_mul_linear" &
run_tests norm_rest -k "not (test_linear or test_silu_mul_linear)" &
wait
echo "tests took $(($(date +%s) - start)) s"
for f in "$out"/t_*.log; do
    echo "== $f"
    grep -E "^(FAILED|ERROR) | passed| failed|^exit " "$f" | tail -30
done
[ "${SKIP_BENCH:-0}" = 1 ] && exit 0
timeout "${BENCH_TIMEOUT_S:-150}" "$py" benchmarks/gpu_gemv.py "$@" 2>&1 | tee "$out/bench.log" | tail -60
