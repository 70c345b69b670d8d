#!/usr/bin/env bash
# On the GPU machine, from the repository root: the GPU tests (four pytest processes at once, so that
# Triton's kernel compiles overlap), then benchmarks/gpu_kernels.py. Full logs go to $OUT (or
# /tmp/gpu_kernels_out); the summary lines and the benchmark table are printed last.
set -u
out=${OUT:-/tmp/gpu_kernels_out}
mkdir -p "$out"
if [ -d .whl ] && ! python3 -c "import pydantic, yaml" 2>/dev/null; then
    pip install -q --no-deps --target /tmp/site .whl/*.whl
fi
mkdir -p /tmp/pkgs && ln -sfn "$PWD/engine" /tmp/pkgs/llmdeploy_engine
export PYTHONPATH=/tmp/pkgs:$PWD:/tmp/site
nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv,noheader
run_tests() {  # log name, then test paths
    local name=$1
    shift
    timeout "${TEST_TIMEOUT_S:-170}" python3 -m pytest -v -rfE --tb=short -s -W ignore --noconftest \
        -p no:cacheprovider "$@" >"$out/t_$name.log" 2>&1
    echo "exit $? (124: timed out)" >>"$out/t_$name.log"
}
start=$(date +%s)
run_tests varlen tests/engine_gpu/test_triton_varlen.py &
run_tests attention tests/engine_gpu/test_triton_attention.py &
run_tests ops_engine tests/engine_gpu/test_triton_ops.py tests/engine_gpu/test_triton_engine.py &
run_tests graphs tests/engine_gpu/test_cuda_graph_runner.py tests/engine_gpu/test_graph_pick.py \
    tests/engine_model/test_gpu_runner.py &
wait
echo "tests took $(($(date +%s) - start)) s"
for f in "$out"/t_*.log; do
    echo "== $f"
    grep -E "^(FAILED|ERROR) | in [0-9.]+s|^step |^exit " "$f" | tail -30
done
PYTHONUNBUFFERED=1 timeout "${BENCH_TIMEOUT_S:-120}" python3 benchmarks/gpu_kernels.py 2>&1 | tee "$out/bench.log" | tail -45
