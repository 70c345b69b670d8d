#!/usr/bin/env bash
# Issue 6 on the lent 2-GPU machine (nvidia-h200-x2), from the repository root, in two device calls:
#
#   bash benchmarks/gpu_all.sh check   # GPU tests (both GPUs, parallel), tensor-parallel tests and
#                                      # benchmarks/gpu_tp.py (both GPUs), ~4 min
#   bash benchmarks/gpu_all.sh bench   # GPU 0: benchmarks/gpu_bench.py (single stream, 256 requests,
#                                      # transformers peer); GPU 1 at the same time: gpu_fp8.py then
#                                      # gpu_spec.py; ~9 min
#
# Logs and JSON go to $OUT (or /tmp/gpu_all_out); each job's table is printed at the end.
set -u
phase=${1:?usage: gpu_all.sh check|bench|final|probe|gemv|final5|tests5|pdl|fused|final6|tests6|fp8diag|v7|v7b|final7|first|diag8|first8|v8|tp8|gemv8|final8|tp9|tp9b|ar9|tp9c|bench9|bench9b|v10a|v10b|v10c|v10d|v11a|v11b|v11c|v12b|v12c|v12d|v13a|v13b|v13c|v13d|v13e|v13f|v13g|v13h|v14a|v14b|v14c|v14d|v14e|v14f|v14g|v15a|v15b|v15c|v15d|v15e|v15f|v15g|v16a|v16b|v16c|v16d|v16e|v16f|v17a|v17b|v17c|v17d|v17e|v17f|v17g}
out=${OUT:-/tmp/gpu_all_out}
mkdir -p "$out"
if [ -d .whl ] && ! python3 -c "import pydantic, yaml" 2>/dev/null; then
    pip install -q --no-deps --target /tmp/site .whl/*.whl
fi
mkdir -p /tmp/pkgs && ln -sfn "$PWD/engine" /tmp/pkgs/llmdeploy_engine
export PYTHONPATH=/tmp/pkgs:$PWD:/tmp/site PYTHONUNBUFFERED=1
# NVLink multicast stays off on shared hosts (the device notes say why)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=index,name,memory.used --format=csv,noheader
git log --oneline -1 2>/dev/null || true

tests() {  # gpu, log name, timeout, test paths
    local gpu=$1 name=$2 limit=$3
    shift 3
    CUDA_VISIBLE_DEVICES=$gpu timeout "$limit" python3 -m pytest -q -rfE --tb=short -W ignore --noconftest \
        -p no:cacheprovider "$@" >"$out/t_$name.log" 2>&1
    echo "exit $? (124: timed out)" >>"$out/t_$name.log"
}
diag() {  # label, gpu_single_diag.py args: one engine setting per process on GPU 0 (v8)
    local label=$1
    shift
    CUDA_VISIBLE_DEVICES=0 timeout 120 python3 benchmarks/gpu_single_diag.py --label "$label" --out "$out" \
        "$@" >>"$out/diag.log" 2>&1
    echo "exit $? ($label)" >>"$out/diag.log"
}
tp_bench() {  # log name, timeout, gpu_tp.py args: on both GPUs, JSON and log under $out
    local name=$1 limit=$2
    shift 2
    CUDA_VISIBLE_DEVICES=0,1 timeout "$limit" python3 benchmarks/gpu_tp.py --out "$out/$name.json" "$@" \
        >"$out/$name.log" 2>&1
    echo "exit $?" >>"$out/$name.log"
}
bench_8b_profiled() {  # v10, GPU 0: the 8B alone (single stream, 256 requests; bf16 then fp8 KV),
    # kernel profiles (top kernels) at a prefill chunk and at decode steps with ~240/~210/~150/~80 running
    local kv
    for kv in auto fp8_e4m3; do
        mkdir -p "$out/$kv"
        CUDA_VISIBLE_DEVICES=0 timeout 200 python3 benchmarks/gpu_bench.py --no-peer --models llama \
            --throughput-models llama --kv-cache-dtype $kv --profile-step 8,296,440,704,944 --profile-top 14 \
            --out "$out/$kv" ${ARGS:-} >"$out/gpu_bench_$kv.log" 2>&1
        echo "exit $?" >>"$out/gpu_bench_$kv.log"
    done
    summary "$out"/t_*.log
    grep -a -E "TB/s|^exit" "$out/gpu_batch_diag.log" 2>/dev/null | cut -c1-260
    for kv in auto fp8_e4m3; do
        echo "== 8B, kv $kv"
        grep -v -E "Warning|enable\(self" "$out/gpu_bench_$kv.log" | grep -a -E "^\| |^exit|compiled during" \
            | cut -c1-300 | tail -24
    done
}
bench_with_fp8() {  # v9, GPU 0: gpu_bench.py (both models, no peer), then the 8B with the fp8 KV cache; report
    CUDA_VISIBLE_DEVICES=0 timeout 240 python3 benchmarks/gpu_bench.py --no-peer --out "$out" ${ARGS:-} \
        >"$out/gpu_bench.log" 2>&1
    echo "exit $?" >>"$out/gpu_bench.log"
    mkdir -p "$out/fp8"
    CUDA_VISIBLE_DEVICES=0 timeout 200 python3 benchmarks/gpu_bench.py --no-peer --models llama \
        --throughput-models llama --kv-cache-dtype fp8_e4m3 --out "$out/fp8" ${ARGS:-} >"$out/gpu_bench_fp8.log" 2>&1
    echo "exit $?" >>"$out/gpu_bench_fp8.log"
    summary "$out"/t_*.log
    for f in gpu_bench gpu_bench_fp8; do
        echo "== $f"
        grep -v -E "Warning|enable\(self" "$out/$f.log" | grep -a -E "^\| |^exit|compiled during" | cut -c1-300 | tail -30
    done
}
arrivals_by_steps() {  # model:steps ...: gpu_arrivals.py on GPU 0, the 8B at 20 requests/s (300), the
    # 0.5B at $QWEN_RATE/s ($QWEN_N; default 30/s, 400), one process each, into $out/gpu_arrivals.log (v15);
    # labels model-steps$ARRIVALS_TAG
    local cfg model steps rate n
    for cfg in "$@"; do
        model=${cfg%%:*} steps=${cfg#*:}
        rate=${QWEN_RATE:-30} n=${QWEN_N:-400}
        [ "$model" = llama ] && rate=20 n=300
        CUDA_VISIBLE_DEVICES=0 timeout 100 python3 benchmarks/gpu_arrivals.py --model "$model" --rate $rate \
            --num-requests $n --num-scheduler-steps "$steps" --label "$model-$steps${ARRIVALS_TAG:-}" --out "$out" \
            >>"$out/gpu_arrivals.log" 2>&1
        echo "exit $? ($cfg)" >>"$out/gpu_arrivals.log"
    done
}
tp_report() {  # names: the table of each $out/gpu_tp_NAME.log there is (v9)
    for f in "$@"; do
        [ -f "$out/gpu_tp_$f.log" ] || continue
        echo "== gpu_tp $f"
        grep -v -E "Warning|enable\(self|_warn_once" "$out/gpu_tp_$f.log" | grep -a -E "^ *[12] |^exit|us/step|Captured" |
            cut -c1-200
    done
}
bench_report() {  # gpu_bench.py logs: the device's idle time, the eager steps, the table's figures (v16)
    local f
    for f in "$@"; do
        echo "== $f"
        grep -a -E "device idle|eager steps \(" "$f" | cut -c1-400
        grep -v -E "Warning|enable\(self" "$f" | grep -a -E "(requests|single stream) \| (output|SM|tok)|roofline|^exit"
    done
}
old_engine_link() {  # .whl/old_engine (the commit before a change) importable as llmdeploy_engine
    mkdir -p /tmp/pkgs_old && ln -sfn "$PWD/.whl/old_engine" /tmp/pkgs_old/llmdeploy_engine
}
engine_pythonpath() {  # engine label -> PYTHONPATH: old* the engine in .whl/old_engine, else this checkout's
    case $1 in old*) echo "/tmp/pkgs_old:$PWD:/tmp/site" ;; *) echo "/tmp/pkgs:$PWD:/tmp/site" ;; esac
}
ab_bench() {  # model, timeout, engine labels: gpu_bench.py (no peer) on one GPU, a process per label (v17)
    local model=$1 limit=$2 eng
    shift 2
    old_engine_link
    for eng in "$@"; do
        PYTHONPATH=$(engine_pythonpath "$eng") CUDA_VISIBLE_DEVICES=0 timeout "$limit" python3 \
            benchmarks/gpu_bench.py --no-peer --models "$model" --throughput-models "$model" --out "$out" \
            >"$out/gpu_bench_${model}_$eng.log" 2>&1
        echo "exit $?" >>"$out/gpu_bench_${model}_$eng.log"
        rm -f "$out/gpu_bench.json"
    done
}
summary() {
    for f in "$@"; do
        echo "== $f"
        grep -a -E "^(FAILED|ERROR)|passed|failed|^exit |Error" "$f" | tail -25
    done
}

start=$(date +%s)
if [ "$phase" = check ]; then
    tests 0 kernels 200 tests/engine_gpu/test_triton_varlen.py tests/engine_gpu/test_triton_attention.py \
        tests/engine_gpu/test_fused_decode_ops.py tests/engine_gpu/test_varlen_metadata.py &
    tests 1 engine 200 tests/engine_gpu/test_triton_ops.py tests/engine_gpu/test_triton_engine.py \
        tests/engine_gpu/test_cuda_graph_runner.py tests/engine_gpu/test_graph_pick.py \
        tests/engine_gpu/test_fp8_kv_cache_gpu.py tests/engine_gpu/test_spec_decode_gpu.py \
        tests/engine_gpu/test_multi_step_gpu.py \
        tests/engine_model/test_gpu_runner.py tests/planner/test_builtin_engine_gpu.py &
    wait
    echo "single-GPU tests took $(($(date +%s) - start)) s"
    tests 0,1 tp 150 tests/engine_gpu/test_tensor_parallel_gpu.py
    tp_bench "gpu_tp" 200 --allreduce auto,nccl
    summary "$out"/t_*.log
    echo "== gpu_tp"
    tail -20 "$out/gpu_tp.log"
elif [ "$phase" = bench ]; then
    (CUDA_VISIBLE_DEVICES=0 timeout 570 python3 benchmarks/gpu_bench.py --budget-s 540 --out "$out" \
        >"$out/gpu_bench.log" 2>&1; echo "exit $?" >>"$out/gpu_bench.log") &
    (CUDA_VISIBLE_DEVICES=1 timeout 330 python3 benchmarks/gpu_fp8.py --kv-dtypes auto,fp8_e4m3,fp8_e5m2 \
        --out "$out" >"$out/gpu_fp8.log" 2>&1; echo "exit $?" >>"$out/gpu_fp8.log"
     CUDA_VISIBLE_DEVICES=1 timeout 230 python3 benchmarks/gpu_spec.py --repeats 2 --out "$out/gpu_spec.json" \
        >"$out/gpu_spec.log" 2>&1; echo "exit $?" >>"$out/gpu_spec.log") &
    wait
    for f in gpu_fp8 gpu_spec gpu_bench; do
        echo "== $f"
        tail -40 "$out/$f.log"
    done
elif [ "$phase" = final ]; then
    # one call (~8.5 min): GPU 0 gpu_bench.py (the 8B's transformers peer skipped by the time budget:
    # it takes ~200 s and does not depend on the engine) then gpu_fp8.py; GPU 1 the single-GPU tests
    # and gpu_spec.py (period-8 prompt on both models, a one-token-repeat prompt on the 8B); then both
    # GPUs: the tensor-parallel tests and gpu_tp.py. ARGS adds engine options to every benchmark.
    (CUDA_VISIBLE_DEVICES=0 timeout 230 python3 benchmarks/gpu_bench.py --budget-s 200 --out "$out" ${ARGS:-} \
        >"$out/gpu_bench.log" 2>&1; echo "exit $?" >>"$out/gpu_bench.log"
     CUDA_VISIBLE_DEVICES=0 timeout 150 python3 benchmarks/gpu_fp8.py --kv-dtypes auto,fp8_e4m3,fp8_e5m2 \
        --out "$out" ${ARGS:-} >"$out/gpu_fp8.log" 2>&1; echo "exit $?" >>"$out/gpu_fp8.log") &
    (tests 1 gpu1 190 tests/engine_gpu --ignore=tests/engine_gpu/test_tensor_parallel_gpu.py \
        tests/engine_model/test_gpu_runner.py tests/planner/test_builtin_engine_gpu.py
     CUDA_VISIBLE_DEVICES=1 timeout 60 python3 benchmarks/gpu_spec.py --repeats 1 --out "$out/gpu_spec.json" \
        >"$out/gpu_spec.log" 2>&1; echo "exit $?" >>"$out/gpu_spec.log"
     CUDA_VISIBLE_DEVICES=1 timeout 40 python3 benchmarks/gpu_spec.py --models llama --period 1 --ks 4 \
        --repeats 1 --out "$out/gpu_spec_p1.json" >"$out/gpu_spec_p1.log" 2>&1; echo "exit $?" >>"$out/gpu_spec_p1.log") &
    wait
    echo "GPU 0 / GPU 1 jobs took $(($(date +%s) - start)) s"
    tests 0,1 tp 90 tests/engine_gpu/test_tensor_parallel_gpu.py
    tp_bench "gpu_tp" 100 --allreduce auto --profile-steps 4 ${ARGS:-}
    summary "$out"/t_*.log
    for f in gpu_fp8 gpu_spec gpu_spec_p1 gpu_tp gpu_bench; do
        echo "== $f"
        grep -v -E "Warning|enable\(self" "$out/$f.log" | tail -30
    done
    # the device tool returns at most 8 files: every log and JSON in one archive
    (cd "$out" && tar czf final_logs.tgz ./*.log ./*.json && rm -f ./*.log ./*.json)
elif [ "$phase" = probe ]; then
    # one short call (~6 min): the single-GPU tests on GPU 1 then the 8B n-gram run with --echo-lm-head;
    # GPU 0: the 0.5B throughput run with its eager steps listed and the first steps profiled, then the
    # 32 x 8k bf16 / e4m3 decode; then the tensor-parallel tests on both GPUs. Logs archived.
    (CUDA_VISIBLE_DEVICES=0 timeout 150 python3 benchmarks/gpu_bench.py --models qwen --no-peer \
        --profile-step 0 --out "$out" ${ARGS:-} >"$out/gpu_bench.log" 2>&1; echo "exit $?" >>"$out/gpu_bench.log"
     CUDA_VISIBLE_DEVICES=0 timeout 150 python3 benchmarks/gpu_fp8.py --kv-dtypes auto,fp8_e4m3 \
        --out "$out" ${ARGS:-} >"$out/gpu_fp8.log" 2>&1; echo "exit $?" >>"$out/gpu_fp8.log") &
    (tests 1 gpu1 200 tests/engine_gpu --ignore=tests/engine_gpu/test_tensor_parallel_gpu.py \
        tests/engine_model/test_gpu_runner.py tests/planner/test_builtin_engine_gpu.py
     CUDA_VISIBLE_DEVICES=1 timeout 80 python3 benchmarks/gpu_spec.py --models llama --echo-lm-head \
        --ks 4 6 --repeats 1 --out "$out/gpu_spec_echo.json" >"$out/gpu_spec_echo.log" 2>&1
     echo "exit $?" >>"$out/gpu_spec_echo.log") &
    wait
    echo "GPU 0 / GPU 1 jobs took $(($(date +%s) - start)) s"
    tests 0,1 tp 100 tests/engine_gpu/test_tensor_parallel_gpu.py
    summary "$out"/t_*.log
    for f in gpu_fp8 gpu_spec_echo gpu_bench; do
        echo "== $f"
        grep -v -E "Warning|enable\(self" "$out/$f.log" | tail -25
    done
    (cd "$out" && tar czf probe_logs.tgz ./*.log ./*.json && rm -f ./*.log ./*.json)
elif [ "$phase" = gemv ]; then
    # GPU 0: the fused GEMV sweep, the single-sequence decode split sweep, then gpu_bench (single
    # (run 11 also ran the 9-64-row skinny GEMM sweep, since removed: docs/gpu-notes.md v5)
    # stream of both models, the 0.5B's throughput); GPU 1: the single-GPU tests (-v: the last line
    # names a test that hangs); then the tensor-parallel tests on both GPUs. Logs archived.
    (CUDA_VISIBLE_DEVICES=0 timeout 110 python3 benchmarks/gpu_gemv.py --budget-s 60 >"$out/gpu_gemv.log" 2>&1
     echo "exit $?" >>"$out/gpu_gemv.log"
     CUDA_VISIBLE_DEVICES=0 timeout 45 python3 benchmarks/gpu_decode_small.py >"$out/gpu_decode_small.log" 2>&1
     echo "exit $?" >>"$out/gpu_decode_small.log"
     CUDA_VISIBLE_DEVICES=0 timeout 130 python3 benchmarks/gpu_bench.py --throughput-models qwen --no-peer --eager-phases \
        --out "$out" ${ARGS:-} >"$out/gpu_bench.log" 2>&1; echo "exit $?" >>"$out/gpu_bench.log") &
    g=tests/engine_gpu
    (CUDA_VISIBLE_DEVICES=1 timeout 330 python3 -m pytest -v -rfE --tb=short -W ignore --noconftest \
        -p no:cacheprovider --durations=15 $g/test_triton_gemv.py \
        $g/test_triton_attention.py $g/test_triton_varlen.py $g/test_fused_decode_ops.py $g/test_triton_ops.py \
        $g/test_varlen_metadata.py >"$out/t_kernels.log" 2>&1
     echo "exit $? (124: timed out)" >>"$out/t_kernels.log") &
    (CUDA_VISIBLE_DEVICES=1 timeout 330 python3 -m pytest -v -rfE --tb=short -W ignore --noconftest \
        -p no:cacheprovider --durations=15 $g/test_cuda_graph_runner.py $g/test_graph_pick.py \
        $g/test_fp8_kv_cache_gpu.py $g/test_spec_decode_gpu.py $g/test_multi_step_gpu.py $g/test_triton_engine.py \
        tests/engine_model/test_gpu_runner.py tests/planner/test_builtin_engine_gpu.py >"$out/t_engine.log" 2>&1
     echo "exit $? (124: timed out)" >>"$out/t_engine.log") &
    wait
    echo "GPU 0 / GPU 1 jobs took $(($(date +%s) - start)) s"
    CUDA_VISIBLE_DEVICES=0,1 timeout 150 python3 -m pytest -v -rfE --tb=short -W ignore --noconftest \
        -p no:cacheprovider --durations=10 tests/engine_gpu/test_tensor_parallel_gpu.py >"$out/t_tp.log" 2>&1
    echo "exit $? (124: timed out)" >>"$out/t_tp.log"
    for f in t_kernels t_engine t_tp; do
        echo "== $f"
        grep -a -E "FAILED|ERROR|passed|failed|^exit " "$out/$f.log" | tail -25
        tail -3 "$out/$f.log"
    done
    for f in gpu_gemv gpu_decode_small gpu_bench; do
        echo "== $f"
        grep -v -E "Warning|enable\(self" "$out/$f.log" | tail -32
    done
    (cd "$out" && tar czf gemv_logs.tgz ./*.log ./*.json && rm -f ./*.log ./*.json)
elif [ "$phase" = final5 ]; then
    # one call (~8 min, v5): GPU 0 gpu_bench.py (both models, no transformers peer: it does not depend
    # on the engine and run 9 measured it) then gpu_fp8.py; GPU 1 the planner's GPU check alone (other
    # processes on the GPU would count in its non-torch memory), the kernel tests not seen in run 11,
    # then gpu_spec.py; then both GPUs: the bf16 tensor-parallel tests (one sequence: fused GEMVs) and
    # the graph test, then gpu_tp.py. Logs archived.
    g=tests/engine_gpu
    (CUDA_VISIBLE_DEVICES=0 timeout 235 python3 benchmarks/gpu_bench.py --no-peer --out "$out" ${ARGS:-} \
        >"$out/gpu_bench.log" 2>&1; echo "exit $?" >>"$out/gpu_bench.log"
     CUDA_VISIBLE_DEVICES=0 timeout 120 python3 benchmarks/gpu_fp8.py --kv-dtypes auto,fp8_e4m3,fp8_e5m2 \
        --out "$out" ${ARGS:-} >"$out/gpu_fp8.log" 2>&1; echo "exit $?" >>"$out/gpu_fp8.log") &
    (tests 1 planner 60 tests/planner/test_builtin_engine_gpu.py
     tests 1 kernels 150 $g/test_triton_attention.py $g/test_triton_varlen.py $g/test_fused_decode_ops.py \
        $g/test_triton_ops.py $g/test_varlen_metadata.py
     CUDA_VISIBLE_DEVICES=1 timeout 70 python3 benchmarks/gpu_spec.py --repeats 1 --out "$out/gpu_spec.json" \
        >"$out/gpu_spec.log" 2>&1; echo "exit $?" >>"$out/gpu_spec.log") &
    wait
    echo "GPU 0 / GPU 1 jobs took $(($(date +%s) - start)) s"
    tests 0,1 tp 120 "$g/test_tensor_parallel_gpu.py::test_tp2_bf16_logits_within_bf16_rounding_of_tp1[1]" \
        "$g/test_tensor_parallel_gpu.py::test_tp2_greedy_with_cuda_graphs_matches_tp1[auto]" -vv
    tp_bench "gpu_tp" 105 --allreduce auto --profile-steps 4 ${ARGS:-}
    summary "$out"/t_*.log
    grep -a -E "PASSED|FAILED" "$out/t_tp.log" | tail -5
    for f in gpu_fp8 gpu_spec gpu_tp gpu_bench; do
        echo "== $f"
        grep -v -E "Warning|enable\(self" "$out/$f.log" | tail -28
    done
    (cd "$out" && tar czf final5_logs.tgz ./*.log ./*.json && rm -f ./*.log ./*.json)
elif [ "$phase" = tests5 ]; then
    # the GPU tests runs 11 and 12 left unfinished (time limits, not failures): the tensor-parallel
    # graph test, and the kernel tests after test_triton_attention's fp8 tuning cases, in three
    # processes at once (the kernel tests need little GPU memory)
    g=tests/engine_gpu
    (tests 0,1 tp 250 "$g/test_tensor_parallel_gpu.py::test_tp2_greedy_with_cuda_graphs_matches_tp1[auto]" \
        "$g/test_tensor_parallel_gpu.py::test_tp2_bf16_logits_within_bf16_rounding_of_tp1[2]" -vv --durations=5) &
    (tests 0 attention 250 $g/test_triton_attention.py --durations=5) &
    (tests 1 kernels 250 $g/test_triton_varlen.py $g/test_fused_decode_ops.py $g/test_triton_ops.py \
        $g/test_varlen_metadata.py --durations=5) &
    wait
    summary "$out"/t_*.log
    grep -a -E "PASSED|FAILED" "$out/t_tp.log" | tail -5
elif [ "$phase" = pdl ]; then
    # one call (~8 min, v6): GPU 0 the single streams with programmatic dependent launch off
    # (LLMDEPLOY_PDL=0), then gpu_bench.py with it on (both models, single stream and 256 requests, no
    # transformers peer), then gpu_fp8.py; GPU 1 the PDL race test, the engine and kernel GPU tests,
    # then gpu_spec.py; then both GPUs: two tensor-parallel tests and gpu_tp.py. Logs archived.
    g=tests/engine_gpu
    mkdir -p "$out/nopdl"
    (CUDA_VISIBLE_DEVICES=0 LLMDEPLOY_PDL=0 timeout 150 python3 benchmarks/gpu_bench.py --no-peer \
        --throughput-models none --out "$out/nopdl" ${ARGS:-} >"$out/gpu_bench_nopdl.log" 2>&1
     echo "exit $?" >>"$out/gpu_bench_nopdl.log"
     CUDA_VISIBLE_DEVICES=0 timeout 235 python3 benchmarks/gpu_bench.py --no-peer --out "$out" ${ARGS:-} \
        >"$out/gpu_bench.log" 2>&1; echo "exit $?" >>"$out/gpu_bench.log"
     CUDA_VISIBLE_DEVICES=0 timeout 120 python3 benchmarks/gpu_fp8.py --kv-dtypes auto,fp8_e4m3,fp8_e5m2 \
        --out "$out" ${ARGS:-} >"$out/gpu_fp8.log" 2>&1; echo "exit $?" >>"$out/gpu_fp8.log") &
    (tests 1 engine 250 $g/test_pdl_gpu.py $g/test_cuda_graph_runner.py $g/test_triton_engine.py \
        $g/test_multi_step_gpu.py $g/test_spec_decode_gpu.py $g/test_fp8_kv_cache_gpu.py $g/test_graph_pick.py \
        $g/test_fused_decode_ops.py $g/test_triton_ops.py $g/test_triton_gemv.py -v --durations=5
     CUDA_VISIBLE_DEVICES=1 timeout 70 python3 benchmarks/gpu_spec.py --repeats 1 --out "$out/gpu_spec.json" \
        >"$out/gpu_spec.log" 2>&1; echo "exit $?" >>"$out/gpu_spec.log") &
    wait
    echo "GPU 0 / GPU 1 jobs took $(($(date +%s) - start)) s"
    tests 0,1 tp 120 "$g/test_tensor_parallel_gpu.py::test_tp2_bf16_logits_within_bf16_rounding_of_tp1[1]" \
        "$g/test_tensor_parallel_gpu.py::test_tp2_greedy_with_cuda_graphs_matches_tp1[auto]" -vv
    tp_bench "gpu_tp" 105 --allreduce auto --profile-steps 4 ${ARGS:-}
    summary "$out"/t_*.log
    grep -a -E "PASSED|FAILED" "$out/t_tp.log" | tail -5
    grep -a -E "FAILED|ERROR" "$out/t_engine.log" | head -20
    for f in gpu_fp8 gpu_spec gpu_tp gpu_bench_nopdl gpu_bench; do
        echo "== $f"
        grep -v -E "Warning|enable\(self" "$out/$f.log" | tail -28
    done
    (cd "$out" && tar czf pdl_logs.tgz ./*.log ./*.json ./nopdl && rm -rf ./*.log ./*.json ./nopdl)
elif [ "$phase" = fused ]; then
    # (run 15, with the in-kernel merge then the default: see final6)
    # one call (~9 min, v6): GPU 0 the single streams as run 14 ran them (RoPE + KV store and the
    # split merge as their own launches: LLMDEPLOY_FUSED_DECODE=0 LLMDEPLOY_DECODE_MERGE=launch), then
    # gpu_bench.py with the defaults (both fused into the decode kernel; single stream and 256
    # requests of both models, no peer), then gpu_fp8.py; GPU 1 the kernel and engine GPU tests, then
    # the single streams with only the merge as its own launch; then both GPUs: gpu_tp.py and the
    # tensor-parallel tests. Logs archived.
    g=tests/engine_gpu
    mkdir -p "$out/unfused" "$out/mergelaunch"
    (CUDA_VISIBLE_DEVICES=0 LLMDEPLOY_FUSED_DECODE=0 LLMDEPLOY_DECODE_MERGE=launch timeout 150 \
        python3 benchmarks/gpu_bench.py --no-peer --throughput-models none --out "$out/unfused" ${ARGS:-} \
        >"$out/gpu_bench_unfused.log" 2>&1; echo "exit $?" >>"$out/gpu_bench_unfused.log"
     CUDA_VISIBLE_DEVICES=0 timeout 235 python3 benchmarks/gpu_bench.py --no-peer --out "$out" ${ARGS:-} \
        >"$out/gpu_bench.log" 2>&1; echo "exit $?" >>"$out/gpu_bench.log"
     CUDA_VISIBLE_DEVICES=0 timeout 110 python3 benchmarks/gpu_fp8.py --kv-dtypes auto,fp8_e4m3,fp8_e5m2 \
        --out "$out" ${ARGS:-} >"$out/gpu_fp8.log" 2>&1; echo "exit $?" >>"$out/gpu_fp8.log") &
    (tests 1 engine 230 $g/test_fused_decode_ops.py $g/test_pdl_gpu.py $g/test_cuda_graph_runner.py \
        $g/test_triton_engine.py $g/test_multi_step_gpu.py $g/test_spec_decode_gpu.py $g/test_fp8_kv_cache_gpu.py \
        $g/test_graph_pick.py $g/test_triton_attention.py -k "not tuning_configs" --durations=5
     CUDA_VISIBLE_DEVICES=1 LLMDEPLOY_DECODE_MERGE=launch timeout 150 python3 benchmarks/gpu_bench.py --no-peer \
        --throughput-models none --out "$out/mergelaunch" ${ARGS:-} >"$out/gpu_bench_mergelaunch.log" 2>&1
     echo "exit $?" >>"$out/gpu_bench_mergelaunch.log") &
    wait
    echo "GPU 0 / GPU 1 jobs took $(($(date +%s) - start)) s"
    tp_bench "gpu_tp" 80 --allreduce auto --profile-steps 4 ${ARGS:-}
    left=$((570 - $(date +%s) + start))
    tests 0,1 tp $((left > 30 ? left : 30)) "$g/test_tensor_parallel_gpu.py::test_tp2_bf16_logits_within_bf16_rounding_of_tp1[1]" \
        "$g/test_tensor_parallel_gpu.py::test_tp2_greedy_with_cuda_graphs_matches_tp1[auto]" -vv
    summary "$out"/t_*.log
    grep -a -E "PASSED|FAILED" "$out/t_tp.log" | tail -5
    grep -a -E "^(FAILED|ERROR)" "$out/t_engine.log" | head -30
    for f in gpu_fp8 gpu_tp gpu_bench_unfused gpu_bench_mergelaunch gpu_bench; do
        echo "== $f"
        grep -v -E "Warning|enable\(self" "$out/$f.log" | tail -22
    done
    (cd "$out" && tar czf fused_logs.tgz ./*.log ./*.json ./unfused ./mergelaunch && rm -rf ./*.log ./*.json ./unfused ./mergelaunch)
elif [ "$phase" = final6 ]; then
    # (run 16; "the defaults" then merged splits in the decode kernel, since measured slower and made
    # opt-in: LLMDEPLOY_DECODE_MERGE=kernel; the "mergelaunch" runs are today's defaults)
    # one call (~8 min, v6): GPU 0 gpu_bench.py with the defaults (fused RoPE + KV store + decode,
    # in-kernel split merge, PDL; both models, single stream and 256 requests, no peer), then the
    # single streams with the merge as its own launch, then with both as their own launches (the
    # three on one GPU, one after another); GPU 1 the GPU tests of the fused paths first, then the
    # engine's, then gpu_fp8.py; then both GPUs: gpu_tp.py. Logs archived.
    g=tests/engine_gpu
    mkdir -p "$out/unfused" "$out/mergelaunch"
    (CUDA_VISIBLE_DEVICES=0 timeout 235 python3 benchmarks/gpu_bench.py --no-peer --out "$out" ${ARGS:-} \
        >"$out/gpu_bench.log" 2>&1; echo "exit $?" >>"$out/gpu_bench.log"
     CUDA_VISIBLE_DEVICES=0 LLMDEPLOY_DECODE_MERGE=launch timeout 100 python3 benchmarks/gpu_bench.py --no-peer \
        --throughput-models none --out "$out/mergelaunch" ${ARGS:-} >"$out/gpu_bench_mergelaunch.log" 2>&1
     echo "exit $?" >>"$out/gpu_bench_mergelaunch.log"
     CUDA_VISIBLE_DEVICES=0 LLMDEPLOY_FUSED_DECODE=0 LLMDEPLOY_DECODE_MERGE=launch timeout 100 \
        python3 benchmarks/gpu_bench.py --no-peer --throughput-models none --out "$out/unfused" ${ARGS:-} \
        >"$out/gpu_bench_unfused.log" 2>&1; echo "exit $?" >>"$out/gpu_bench_unfused.log") &
    (tests 1 engine 250 $g/test_fused_decode_ops.py $g/test_triton_attention.py $g/test_pdl_gpu.py \
        $g/test_cuda_graph_runner.py $g/test_spec_decode_gpu.py $g/test_fp8_kv_cache_gpu.py $g/test_graph_pick.py \
        $g/test_triton_engine.py $g/test_multi_step_gpu.py -k "not tuning_configs and not fp16_dots" -v
     CUDA_VISIBLE_DEVICES=1 timeout 110 python3 benchmarks/gpu_fp8.py --kv-dtypes auto,fp8_e4m3,fp8_e5m2 \
        --out "$out" ${ARGS:-} >"$out/gpu_fp8.log" 2>&1; echo "exit $?" >>"$out/gpu_fp8.log") &
    wait
    echo "GPU 0 / GPU 1 jobs took $(($(date +%s) - start)) s"
    tp_bench "gpu_tp" 80 --allreduce auto --profile-steps 4 ${ARGS:-}
    grep -a -c PASSED "$out/t_engine.log"
    grep -a -E "FAILED|ERROR|^E  |passed|failed|^exit" "$out/t_engine.log" | head -40
    for f in gpu_fp8 gpu_tp gpu_bench_unfused gpu_bench_mergelaunch gpu_bench; do
        echo "== $f"
        grep -v -E "Warning|enable\(self" "$out/$f.log" | tail -20
    done
    (cd "$out" && tar czf final6_logs.tgz ./*.log ./*.json ./unfused ./mergelaunch && rm -rf ./*.log ./*.json ./unfused ./mergelaunch)
elif [ "$phase" = tests6 ]; then
    # one GPU (~2 min): the fused-decode tests (cache bytes equal, output within one ulp), both merges,
    # PDL graphs against graphs without, the graph runner and the engine on the GPU
    g=tests/engine_gpu
    tests 0 fused 200 $g/test_fused_decode_ops.py $g/test_pdl_gpu.py $g/test_cuda_graph_runner.py \
        $g/test_triton_engine.py "$g/test_triton_attention.py::test_in_kernel_merge_matches_the_merge_launch" \
        "$g/test_triton_attention.py::test_paged_decode_split_kv_and_fp8" -v
    grep -a -c PASSED "$out/t_fused.log"
    grep -a -E "FAILED|ERROR|^E  |passed|failed|^exit" "$out/t_fused.log" | head -30
elif [ "$phase" = fp8diag ]; then
    # one call (~5 min, v7): gpu_fp8.py, full-batch timing, 3 repeats, a profiled window and each
    # window's split (GPU span, host inside and outside the runner call): GPU 0 with 256 output
    # tokens, GPU 1 with 128 (v0-v6's length); then GPU 1 gpu_spec.py with spec off in multi-step
    # windows (the 8B with --continuing-model, then both random models). (Runs 18-19 used an `l2`
    # phase here for the GEMV L2 prefetch, measured slower and reverted: commit f7dc493.)
    (CUDA_VISIBLE_DEVICES=0 timeout 270 python3 benchmarks/gpu_fp8.py --repeats 3 --profile-window 4 \
        --out "$out" ${ARGS:-} >"$out/gpu_fp8.log" 2>&1; echo "exit $?" >>"$out/gpu_fp8.log") &
    (mkdir -p "$out/len128"
     CUDA_VISIBLE_DEVICES=1 timeout 200 python3 benchmarks/gpu_fp8.py --repeats 3 --output-len 128 \
        --out "$out/len128" ${ARGS:-} >"$out/gpu_fp8_len128.log" 2>&1; echo "exit $?" >>"$out/gpu_fp8_len128.log"
     CUDA_VISIBLE_DEVICES=1 timeout 80 python3 benchmarks/gpu_spec.py --models llama --continuing-model --repeats 2 \
        --out "$out/gpu_spec_cont.json" ${ARGS:-} >"$out/gpu_spec_cont.log" 2>&1
     echo "exit $?" >>"$out/gpu_spec_cont.log"
     CUDA_VISIBLE_DEVICES=1 timeout 90 python3 benchmarks/gpu_spec.py --repeats 1 --out "$out/gpu_spec.json" \
        ${ARGS:-} >"$out/gpu_spec.log" 2>&1; echo "exit $?" >>"$out/gpu_spec.log") &
    wait
    for f in gpu_fp8 gpu_fp8_len128; do
        echo "== $f"
        grep -a -E "repeat|profile per|\| |^exit" "$out/$f.log" | cut -c1-330
    done
    for f in gpu_spec_cont gpu_spec; do
        echo "== $f"
        grep -v -E "Warning|enable\(self" "$out/$f.log" | tail -11
    done
elif [ "$phase" = v7 ]; then
    # one call on one GPU (~8 min, v7): gpu_fp8.py (FINAL_ONLY, full-batch timing, 2 repeats, a
    # profiled window), gpu_bench.py (both models, single stream and 256 requests, no transformers
    # peer), then the engine GPU tests (multi-step windows, graphs, speculation)
    g=tests/engine_gpu
    CUDA_VISIBLE_DEVICES=0 timeout 200 python3 benchmarks/gpu_fp8.py --repeats 2 --profile-window 4 \
        --out "$out" ${ARGS:-} >"$out/gpu_fp8.log" 2>&1
    echo "exit $?" >>"$out/gpu_fp8.log"
    CUDA_VISIBLE_DEVICES=0 timeout 240 python3 benchmarks/gpu_bench.py --no-peer --out "$out" ${ARGS:-} \
        >"$out/gpu_bench.log" 2>&1
    echo "exit $?" >>"$out/gpu_bench.log"
    tests 0 engine 110 $g/test_multi_step_gpu.py $g/test_triton_engine.py $g/test_cuda_graph_runner.py \
        $g/test_spec_decode_gpu.py $g/test_graph_pick.py
    summary "$out"/t_*.log
    echo "== gpu_fp8"
    grep -a -E "repeat|profile per|\| |^exit" "$out/gpu_fp8.log" | cut -c1-330
    echo "== gpu_bench"
    grep -v -E "Warning|enable\(self" "$out/gpu_bench.log" | grep -a -E "^\| |single stream:|^exit" | tail -40
elif [ "$phase" = v7b ]; then
    # one call (~6 min on one GPU, less on two): the argmax and engine GPU tests; the single streams
    # (both models) with torch's argmax (LLMDEPLOY_FAST_ARGMAX=0) and with the two-stage Triton one;
    # gpu_fp8.py again; gpu_spec.py on the 8B with --continuing-model; with a second GPU, gpu_tp.py
    g=tests/engine_gpu
    gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
    other=$([ "$gpus" -gt 1 ] && echo 1 || echo 0)
    mkdir -p "$out/torch_argmax"
    (tests 0 engine 120 "$g/test_triton_ops.py::test_argmax_rows_matches_torch" $g/test_multi_step_gpu.py \
        $g/test_triton_engine.py $g/test_cuda_graph_runner.py
     CUDA_VISIBLE_DEVICES=0 LLMDEPLOY_FAST_ARGMAX=0 timeout 100 python3 benchmarks/gpu_bench.py --no-peer \
        --throughput-models none --out "$out/torch_argmax" ${ARGS:-} >"$out/gpu_bench_torch_argmax.log" 2>&1
     echo "exit $?" >>"$out/gpu_bench_torch_argmax.log"
     CUDA_VISIBLE_DEVICES=0 timeout 100 python3 benchmarks/gpu_bench.py --no-peer --throughput-models none \
        --out "$out" ${ARGS:-} >"$out/gpu_bench.log" 2>&1
     echo "exit $?" >>"$out/gpu_bench.log") &
    [ "$other" = 0 ] && wait
    (CUDA_VISIBLE_DEVICES=$other timeout 200 python3 benchmarks/gpu_fp8.py --repeats 2 --out "$out" ${ARGS:-} \
        >"$out/gpu_fp8.log" 2>&1; echo "exit $?" >>"$out/gpu_fp8.log"
     CUDA_VISIBLE_DEVICES=$other timeout 80 python3 benchmarks/gpu_spec.py --models llama --continuing-model \
        --repeats 2 --out "$out/gpu_spec_cont.json" ${ARGS:-} >"$out/gpu_spec_cont.log" 2>&1
     echo "exit $?" >>"$out/gpu_spec_cont.log") &
    wait
    if [ "$gpus" -gt 1 ]; then
        tp_bench "gpu_tp" 105 --allreduce auto --profile-steps 4 ${ARGS:-}
    fi
    summary "$out"/t_*.log
    for f in gpu_bench_torch_argmax gpu_bench; do
        echo "== $f"
        grep -a -E "switches|copy bandwidth|single stream:|^exit" "$out/$f.log" | cut -c1-170
    done
    echo "== gpu_fp8"
    grep -a -E "\| |^exit" "$out/gpu_fp8.log" | cut -c1-330
    for f in gpu_spec_cont gpu_tp; do
        [ -f "$out/$f.log" ] && { echo "== $f"; grep -v -E "Warning|enable\(self" "$out/$f.log" | tail -10; }
    done
elif [ "$phase" = final7 ]; then
    # one call (~6 min, v7 final): GPU 0 the graph / engine GPU tests (short-prefill graphs, multi-step
    # windows, speculation) then gpu_bench.py (both models, single stream and 256 requests, no peer);
    # with a second GPU, GPU 1 gpu_spec.py (the 8B with --continuing-model, then both random models)
    # and afterwards gpu_tp.py on both
    g=tests/engine_gpu
    gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
    (tests 0 engine 150 $g/test_cuda_graph_runner.py $g/test_graph_pick.py $g/test_triton_engine.py \
        $g/test_multi_step_gpu.py $g/test_spec_decode_gpu.py -v
     CUDA_VISIBLE_DEVICES=0 timeout 240 python3 benchmarks/gpu_bench.py --no-peer --out "$out" ${ARGS:-} \
        >"$out/gpu_bench.log" 2>&1; echo "exit $?" >>"$out/gpu_bench.log") &
    if [ "$gpus" -gt 1 ]; then
        (CUDA_VISIBLE_DEVICES=1 timeout 80 python3 benchmarks/gpu_spec.py --models llama --continuing-model \
            --repeats 2 --out "$out/gpu_spec_cont.json" ${ARGS:-} >"$out/gpu_spec_cont.log" 2>&1
         echo "exit $?" >>"$out/gpu_spec_cont.log"
         CUDA_VISIBLE_DEVICES=1 timeout 100 python3 benchmarks/gpu_spec.py --repeats 1 --out "$out/gpu_spec.json" \
            ${ARGS:-} >"$out/gpu_spec.log" 2>&1; echo "exit $?" >>"$out/gpu_spec.log") &
    fi
    wait
    if [ "$gpus" -gt 1 ]; then
        tp_bench "gpu_tp" 105 --allreduce auto --profile-steps 4 ${ARGS:-}
    fi
    summary "$out"/t_*.log
    grep -a -E "PASSED|FAILED|ERROR" "$out/t_engine.log" | cut -c1-150 | head -40
    echo "== gpu_bench"
    grep -v -E "Warning|enable\(self" "$out/gpu_bench.log" | grep -a -E "^\| |^exit|Captured" | tail -34
    for f in gpu_spec_cont gpu_spec gpu_tp; do
        [ -f "$out/$f.log" ] && { echo "== $f"; grep -v -E "Warning|enable\(self" "$out/$f.log" | tail -12; }
    done
elif [ "$phase" = first ]; then
    # one short call (v7, run 24): the graph runner tests, then the single streams (both models) after
    # a start-up replay of every graph (the first launch of a graph uploads it). The replay did not
    # shorten gpu_bench's first step and was removed after this run.
    g=tests/engine_gpu
    tests 0 engine 100 $g/test_cuda_graph_runner.py $g/test_graph_pick.py $g/test_multi_step_gpu.py
    CUDA_VISIBLE_DEVICES=0 timeout 100 python3 benchmarks/gpu_bench.py --no-peer --throughput-models none \
        --out "$out" ${ARGS:-} >"$out/gpu_bench.log" 2>&1
    echo "exit $?" >>"$out/gpu_bench.log"
    summary "$out"/t_*.log
    grep -a -E "Captured|single stream:|^exit" "$out/gpu_bench.log" | cut -c1-170
elif [ "$phase" = diag8 ]; then
    # one call (v8): single streams under one engine setting changed at a time (gpu_single_diag.py,
    # separate processes, GPU 0), with the GPU's clocks and power logged every 0.5 s; then the graph
    # runner tests (the _pick rewrite of 8d40d31 had not run on a GPU)
    g=tests/engine_gpu
    nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv -lms 500 \
        >"$out/smi.log" 2>&1 &
    smi=$!
    diag bench --model qwen --cprofile-first
    diag tp-like --model qwen --max-num-seqs 1 --max-model-len 1024 --gpu-memory-utilization 0.3 --warmup tp \
        --output-kind cumulative --cprofile-first
    diag bench --model llama
    diag tp-like --model llama --max-num-seqs 1 --max-model-len 1024 --gpu-memory-utilization 0.3 --warmup tp \
        --output-kind cumulative
    diag util0.3 --model llama --gpu-memory-utilization 0.3
    diag seqs1 --model llama --max-num-seqs 1
    diag warm-tp --model llama --warmup tp
    diag len1024 --model llama --max-model-len 1024
    kill $smi
    tests 0 engine 100 $g/test_cuda_graph_runner.py $g/test_graph_pick.py $g/test_multi_step_gpu.py
    summary "$out"/t_*.log
    grep -a -E "^\| |^exit|request [0-9]|engine up" "$out/diag.log" | cut -c1-300
    grep -a -E "^ +[0-9]+(/[0-9]+)? +[0-9.]+ +[0-9.]+ +[0-9.]+" "$out/diag.log" | head -130 | cut -c1-160
    awk -F, 'NR % 10 == 2' "$out/smi.log" | head -60
elif [ "$phase" = first8 ]; then
    # one call (v8): the first request's one-time costs: its first two engine steps under
    # torch.profiler, the same without the profiler, and with every CUDA module loaded at start-up
    diag trace --model qwen --trace-first 2 --cprofile-lines 40
    diag plain --model qwen
    CUDA_MODULE_LOADING=EAGER diag eager-modules --model qwen
    diag trace --model llama --trace-first 2 --cprofile-lines 30 --requests 2
    grep -a -E "^\| |^exit|request [0-9]|engine up" "$out/diag.log" | cut -c1-300
    grep -a -E "longest events| ms own" "$out/diag.log" | cut -c1-200
elif [ "$phase" = v8 ]; then
    # one call (v8, ~6 min on x2): GPU 0 the graph / engine / argmax tests then gpu_bench.py (both
    # models, no peer); GPU 1 the all-reduce kernel test; then on both GPUs the p2p all-reduce tests
    # and gpu_tp.py with the p2p kernel (auto) and torch's one-shot (symm_mem) side by side
    g=tests/engine_gpu
    (tests 0 engine 150 $g/test_triton_ops.py $g/test_graph_pick.py $g/test_cuda_graph_runner.py \
        $g/test_multi_step_gpu.py $g/test_triton_engine.py
     CUDA_VISIBLE_DEVICES=0 timeout 240 python3 benchmarks/gpu_bench.py --no-peer --out "$out" ${ARGS:-} \
        >"$out/gpu_bench.log" 2>&1; echo "exit $?" >>"$out/gpu_bench.log") &
    tests 1 allreduce 100 $g/test_triton_allreduce.py
    wait
    tests 0,1 tp 200 $g/test_tensor_parallel_gpu.py -k "p2p" -v
    tp_bench "gpu_tp" 150 --allreduce auto,symm_mem --profile-steps 4 ${ARGS:-}
    summary "$out"/t_*.log
    grep -a -E "PASSED|FAILED|ERROR" "$out/t_tp.log" | cut -c1-150 | head -20
    echo "== gpu_bench"
    grep -v -E "Warning|enable\(self" "$out/gpu_bench.log" | grep -a -E "^\| |^exit|Captured|compiled during" | cut -c1-300 | tail -34
    echo "== gpu_tp"
    grep -v -E "Warning|enable\(self" "$out/gpu_tp.log" | tail -12
elif [ "$phase" = tp8 ]; then
    # one call (v8, ~6 min on x2): gpu_tp.py with each all-reduce in its own process (p2p, torch's
    # one-shot, p2p again; no profiler), then p2p with PDL off and the profiler (kernel times without
    # early-launched kernels waiting inside them); then each p2p tensor-parallel test in its own pytest
    # process (run v8 timed out running them in one)
    tp_bench gpu_tp_p2p 100 --allreduce p2p ${ARGS:-}
    tp_bench gpu_tp_symm 100 --allreduce symm_mem ${ARGS:-}
    tp_bench gpu_tp_p2p2 100 --allreduce p2p ${ARGS:-}
    LLMDEPLOY_PDL=0 tp_bench gpu_tp_nopdl 100 --allreduce p2p --profile-steps 4 ${ARGS:-}
    g=tests/engine_gpu/test_tensor_parallel_gpu.py
    tests 0,1 tp_kernel 100 "$g::test_all_reduce_kernels_two_gpus[p2p]"
    tests 0,1 tp_eager 100 "$g::test_tp2_logits_match_tp1_eager[p2p]"
    tests 0,1 tp_graphs 150 "$g::test_tp2_greedy_with_cuda_graphs_matches_tp1[p2p]"
    summary "$out"/t_*.log
    tp_report p2p symm p2p2 nopdl
elif [ "$phase" = gemv8 ]; then
    # one call (v8, ~3 min on x2): GPU 0 the GEMV sweep of the 8B's tensor-parallel halves; GPU 1
    # gpu_bench.py alone (both models, no peer)
    (CUDA_VISIBLE_DEVICES=0 timeout 200 python3 benchmarks/gpu_gemv.py --shapes 8b-tp2 --budget-s 150 \
        >"$out/gpu_gemv.log" 2>&1; echo "exit $?" >>"$out/gpu_gemv.log") &
    (CUDA_VISIBLE_DEVICES=1 timeout 200 python3 benchmarks/gpu_bench.py --no-peer --out "$out" ${ARGS:-} \
        >"$out/gpu_bench.log" 2>&1; echo "exit $?" >>"$out/gpu_bench.log") &
    wait
    grep -a -v "^ *File\|^Traceback" "$out/gpu_gemv.log" | tail -40 | cut -c1-220
    echo "== gpu_bench"
    grep -v -E "Warning|enable\(self" "$out/gpu_bench.log" | grep -a -E "^\| |^exit|compiled during" | cut -c1-300 | tail -30
elif [ "$phase" = final8 ]; then
    # one call (v8 final, ~4 min on x2): GPU 0 the engine / graph / argmax tests, GPU 1 the all-reduce
    # kernel and GEMV config tests; then each tensor-parallel test that sets up symmetric memory in its
    # own pytest process; then gpu_tp.py with the p2p kernel and with torch's one-shot, one process each
    g=tests/engine_gpu
    tests 0 engine 150 $g/test_triton_ops.py $g/test_graph_pick.py $g/test_cuda_graph_runner.py \
        $g/test_multi_step_gpu.py $g/test_triton_engine.py &
    tests 1 allreduce 100 $g/test_triton_allreduce.py $g/test_triton_gemv.py -k "allreduce or measured or one_shot"
    wait
    t=$g/test_tensor_parallel_gpu.py
    tests 0,1 tp_kernel 100 "$t::test_all_reduce_kernels_two_gpus[p2p]"
    tests 0,1 tp_eager 100 "$t::test_tp2_logits_match_tp1_eager[p2p]"
    tests 0,1 tp_graphs 120 "$t::test_tp2_greedy_with_cuda_graphs_matches_tp1[auto]"
    tests 0,1 tp_bf16 100 "$t::test_tp2_bf16_logits_within_bf16_rounding_of_tp1[1]"
    for v in p2p symm_mem; do
        tp_bench "gpu_tp_$v" 100 --allreduce $v ${ARGS:-}
    done
    summary "$out"/t_*.log
    tp_report p2p symm_mem
elif [ "$phase" = tp9 ]; then
    # one call (v9, ~6 min on x2): the all-reduce kernels in one process (GPU 0), then the push
    # kernel between two ranks; if that passed, the push engine tests (eager, graphs with the logits'
    # all-gather inside, bf16 through auto) and gpu_tp.py with push, p2p, push again (one process each)
    g=tests/engine_gpu
    t=$g/test_tensor_parallel_gpu.py
    tests 0 allreduce 100 $g/test_triton_allreduce.py
    tests 0,1 tp_kernel 100 "$t::test_all_reduce_kernels_two_gpus[push]"
    if grep -q " passed" "$out/t_tp_kernel.log" && ! grep -q -E "failed|error" "$out/t_tp_kernel.log"; then
        tests 0,1 tp_eager 100 "$t::test_tp2_logits_match_tp1_eager[push]"
        tests 0,1 tp_graphs 120 "$t::test_tp2_greedy_with_cuda_graphs_matches_tp1[push]"
        tests 0,1 tp_bf16 100 "$t::test_tp2_bf16_logits_within_bf16_rounding_of_tp1[1]"
        tp_bench gpu_tp_push 100 --allreduce push ${ARGS:-}
        tp_bench gpu_tp_p2p 100 --allreduce p2p ${ARGS:-}
        tp_bench gpu_tp_push2 100 --allreduce push ${ARGS:-}
    else
        echo "push kernel test did not pass: the push engine tests and benchmarks were not run"
        tp_bench gpu_tp_p2p 100 --allreduce p2p ${ARGS:-}
    fi
    summary "$out"/t_*.log
    tp_report push p2p push2
elif [ "$phase" = tp9b ]; then
    # one call (v9, ~5 min on x2): gpu_tp.py at the engine's default max_num_seqs (256: the prompt's
    # prefill replays a short-prefill graph on both sides) with push, p2p, push again; then the
    # tensor-parallel graphs test through auto (now push)
    t=tests/engine_gpu/test_tensor_parallel_gpu.py
    tp_bench gpu_tp_push256 150 --allreduce push --max-num-seqs 256 ${ARGS:-}
    tp_bench gpu_tp_p2p256 150 --allreduce p2p --max-num-seqs 256 ${ARGS:-}
    tp_bench gpu_tp_push256b 150 --allreduce push --max-num-seqs 256 ${ARGS:-}
    tests 0,1 tp_graphs_auto 120 "$t::test_tp2_greedy_with_cuda_graphs_matches_tp1[auto]"
    summary "$out"/t_*.log
    tp_report push256 p2p256 push256b
elif [ "$phase" = ar9 ]; then
    # one call (v9, ~3 min on x2): the all-reduce paths alone (benchmarks/gpu_allreduce.py: push with
    # several kernel shapes, p2p, torch's one-shot), then gpu_tp.py with push at max_num_seqs 256
    CUDA_VISIBLE_DEVICES=0,1 timeout 300 python3 benchmarks/gpu_allreduce.py --out "$out/gpu_allreduce.json" \
        >"$out/gpu_allreduce.log" 2>&1
    echo "exit $?" >>"$out/gpu_allreduce.log"
    tp_bench gpu_tp_push256c 150 --allreduce push --max-num-seqs 256 ${ARGS:-}
    grep -a -E "^\||^exit|exit codes|no result" "$out/gpu_allreduce.log"
    grep -v -E "Warning|enable\(self|_warn_once" "$out/gpu_tp_push256c.log" | grep -a -E "^ *[12] |^exit" | cut -c1-200
elif [ "$phase" = tp9c ]; then
    # one call (v9 final, ~4 min on x2): the push kernel's shapes by size (triton_allreduce.push_shape)
    # in the one-process and two-rank tests, then gpu_tp.py with push at max_num_seqs 256 and 1
    g=tests/engine_gpu
    t=$g/test_tensor_parallel_gpu.py
    tests 0 allreduce 100 $g/test_triton_allreduce.py
    tests 0,1 tp_kernel 100 "$t::test_all_reduce_kernels_two_gpus[push]"
    tp_bench gpu_tp_push256d 150 --allreduce push --max-num-seqs 256 ${ARGS:-}
    tp_bench gpu_tp_push1d 150 --allreduce push ${ARGS:-}
    if [ -n "${ENGINE_TESTS:-}" ]; then  # the repeat (run 38): the engine tests through auto too
        tests 0,1 tp_graphs 120 "$t::test_tp2_greedy_with_cuda_graphs_matches_tp1[auto]"
        tests 0,1 tp_bf16 100 "$t::test_tp2_bf16_logits_within_bf16_rounding_of_tp1[1]"
        tests 0,1 tp_eager 100 "$t::test_tp2_logits_match_tp1_eager[push]"
    fi
    summary "$out"/t_*.log
    tp_report push256d push1d
elif [ "$phase" = v10a ]; then
    # one call (v10, ~7 min on one H200; run 42 ran it with the scheduler's pure-decode rows longest
    # context first, removed after run 43): the decode kernel's grid order (KV heads fastest): the
    # attention and engine GPU tests (200 s was too short for the engine tests), then
    # gpu_batch_diag.py (batch GEMMs: cuBLAS / cuBLASLt / a Triton sweep; decode attention by row
    # order and grid order), then the 8B's 256 requests (bf16, then fp8 KV) with kernel profiles at
    # a prefill chunk and at four points of the decode
    g=tests/engine_gpu
    tests 0 attn 200 $g/test_triton_attention.py $g/test_triton_engine.py $g/test_graph_pick.py
    CUDA_VISIBLE_DEVICES=0 timeout 240 python3 benchmarks/gpu_batch_diag.py --out "$out" \
        >"$out/gpu_batch_diag.log" 2>&1
    echo "exit $?" >>"$out/gpu_batch_diag.log"
    bench_8b_profiled
elif [ "$phase" = v11a ]; then
    # one call (v11, ~8 min on one H200): asynchronous scheduling (the next decode window launched
    # before the last one's tokens are processed): the engine GPU tests (graph windows followed on the
    # device, async and sync engine outputs), then gpu_bench.py (both models, no peer) with async
    # scheduling on, off, on again, each its own process
    g=tests/engine_gpu
    tests 0 engine 200 $g/test_multi_step_gpu.py $g/test_cuda_graph_runner.py $g/test_graph_pick.py
    i=0
    for mode in async-scheduling no-async-scheduling async-scheduling; do
        i=$((i + 1))
        mkdir -p "$out/$i-$mode"
        CUDA_VISIBLE_DEVICES=0 timeout 150 python3 benchmarks/gpu_bench.py --no-peer --out "$out/$i-$mode" \
            --$mode ${ARGS:-} >"$out/gpu_bench_$i-$mode.log" 2>&1
        echo "exit $?" >>"$out/gpu_bench_$i-$mode.log"
    done
    summary "$out"/t_*.log
    for f in "$out"/gpu_bench_*-*.log; do
        echo "== $f"
        grep -v -E "Warning|enable\(self" "$f" | grep -a -E "^\| |^exit|host outside|SM clock" | cut -c1-240
    done
elif [ "$phase" = v11b ]; then
    # one call (v11, ~7 min on x2): asynchronous scheduling with tensor parallelism: the tp 2 engine's
    # graph windows against tp 1 (sync, then async; each its own process), gpu_tp.py (push, max_num_seqs
    # 256) with async scheduling on and off; then on GPU 0 the single streams of both models (no
    # 256-request runs) with async scheduling off and on: another host than v11a's
    t=tests/engine_gpu/test_tensor_parallel_gpu.py
    tests 0,1 tp_windows_sync 120 "$t::test_tp2_graph_windows_match_tp1[False]"
    tests 0,1 tp_windows_async 120 "$t::test_tp2_graph_windows_match_tp1[True]"
    tp_bench gpu_tp_async 150 --allreduce push --max-num-seqs 256 ${ARGS:-}
    tp_bench gpu_tp_sync 150 --allreduce push --max-num-seqs 256 --no-async-scheduling ${ARGS:-}
    for mode in no-async-scheduling async-scheduling; do
        CUDA_VISIBLE_DEVICES=0 timeout 60 python3 benchmarks/gpu_bench.py --no-peer --throughput-models none \
            --$mode ${ARGS:-} >"$out/gpu_bench_single_$mode.log" 2>&1
        echo "exit $?" >>"$out/gpu_bench_single_$mode.log"
    done
    summary "$out"/t_*.log
    tp_report async sync
    for f in "$out"/gpu_bench_single_*.log; do
        echo "== $f"
        grep -v -E "Warning|enable\(self" "$f" | grep -a -E "^\| .*single stream \| (tok/s|decode|host us)|^exit" | cut -c1-200
    done
elif [ "$phase" = v12b ]; then
    # one call (v12, ~5 min on one H200): asynchronous scheduling of one-step windows
    # (--num-scheduler-steps 1 --async-scheduling): the multi-step GPU tests (the engine with one-step
    # windows gives the single-step tokens), then gpu_bench.py (both models, no peer) with one step
    # and no windows (the default engine), one-step asynchronous windows, and 8-step asynchronous windows
    tests 0 engine 200 tests/engine_gpu/test_multi_step_gpu.py
    for cfg in 1-no-async-scheduling 1-async-scheduling 8-async-scheduling; do
        mkdir -p "$out/$cfg"
        CUDA_VISIBLE_DEVICES=0 timeout 150 python3 benchmarks/gpu_bench.py --no-peer --out "$out/$cfg" \
            --num-scheduler-steps "${cfg%%-*}" "--${cfg#*-}" >"$out/gpu_bench_$cfg.log" 2>&1
        echo "exit $?" >>"$out/gpu_bench_$cfg.log"
    done
    summary "$out"/t_*.log
    for f in "$out"/gpu_bench_*-*.log; do
        echo "== $f"
        grep -v -E "Warning|enable\(self" "$f" | grep -a -E "^\| |^exit|^built-in|compiled during" | cut -c1-240
    done
elif [ "$phase" = v12c ]; then
    # one call (v12 final, ~5 min on one H200): asynchronous scheduling is now the default on CUDA
    # (one-step windows at --num-scheduler-steps 1): the engine GPU tests (default configs: one-step
    # windows), then gpu_bench.py with the default engine (no flags, both models, no peer)
    g=tests/engine_gpu
    tests 0 engine 240 $g/test_multi_step_gpu.py $g/test_cuda_graph_runner.py $g/test_graph_pick.py \
        $g/test_triton_engine.py
    mkdir -p "$out/default"
    CUDA_VISIBLE_DEVICES=0 timeout 200 python3 benchmarks/gpu_bench.py --no-peer --out "$out/default" \
        >"$out/gpu_bench_default.log" 2>&1
    echo "exit $?" >>"$out/gpu_bench_default.log"
    summary "$out"/t_*.log
    echo "== $out/gpu_bench_default.log"
    grep -v -E "Warning|enable\(self" "$out/gpu_bench_default.log" | grep -a -E "^\| |^exit|^built-in" | cut -c1-240
elif [ "$phase" = v13a ]; then
    # one call (v13, ~7 min on one H200): padding rows of a CUDA graph read and write only the runner's
    # padding block (they re-read row 0's context before): the engine GPU tests, then the 8B's 256
    # requests (no peer) with this engine and the one before it (b8b60d6's engine/, carried in
    # .whl/old_engine), alternating new, old, new, old, each its own process
    g=tests/engine_gpu
    tests 0 engine 240 $g/test_multi_step_gpu.py $g/test_cuda_graph_runner.py $g/test_graph_pick.py \
        $g/test_triton_engine.py
    mkdir -p /tmp/pkgs_old && ln -sfn "$PWD/.whl/old_engine" /tmp/pkgs_old/llmdeploy_engine
    i=0
    for eng in new old new old; do
        i=$((i + 1))
        path=/tmp/pkgs
        [ "$eng" = old ] && path=/tmp/pkgs_old
        mkdir -p "$out/$i-$eng"
        PYTHONPATH=$path:$PWD:/tmp/site CUDA_VISIBLE_DEVICES=0 timeout 100 python3 benchmarks/gpu_bench.py \
            --no-peer --models llama --throughput-models llama --out "$out/$i-$eng" >"$out/gpu_bench_$i-$eng.log" 2>&1
        echo "exit $?" >>"$out/gpu_bench_$i-$eng.log"
    done
    summary "$out"/t_*.log
    for f in "$out"/gpu_bench_*-*.log; do
        echo "== $f"
        grep -a -E "SM clock and board" "$f" | cut -c1-200
        grep -v -E "Warning|enable\(self" "$f" | grep -a -E "^\| llama|^exit" | cut -c1-200 | grep -v transformers
    done
elif [ "$phase" = v13b ]; then
    # one call (v13, ~5 min on one H200): the whole-engine GPU tests and the planner's in ONE process
    # again (they ran out of memory on fresh machines in runs 54 and 58): the planner's comparison now
    # collects earlier engines' garbage first and the engine sizes its KV cache without memory the
    # process already holds; the GPU runner file has the held-memory test
    g=tests/engine_gpu
    tests 0 engines 450 $g/test_fp8_kv_cache_gpu.py $g/test_spec_decode_gpu.py $g/test_pdl_gpu.py \
        tests/engine_model/test_gpu_runner.py tests/planner/test_builtin_engine_gpu.py
    tests 0 multistep 150 $g/test_multi_step_gpu.py  # run 60 failed it on the padding block (test fixed)
    summary "$out"/t_*.log
    grep -a -E "KV tokens" "$out/t_engines.log" | cut -c1-240
elif [ "$phase" = v13d ]; then
    # one call (v13, ~6 min on one H200): less host work a one-step window (a follow-on's block tables
    # packed from the window before it, the scheduler's per-sequence work inline): the engine GPU
    # tests, gpu_bench.py with the default engine (both models, no peer), then the 0.5B alone with
    # the engine before the change (5470e1a's engine/, carried in .whl/old_engine) and this one,
    # alternating, and with 8-step windows (the host-light reference); each its own process
    g=tests/engine_gpu
    tests 0 engine 240 $g/test_multi_step_gpu.py $g/test_cuda_graph_runner.py $g/test_graph_pick.py \
        $g/test_triton_engine.py
    mkdir -p /tmp/pkgs_old && ln -sfn "$PWD/.whl/old_engine" /tmp/pkgs_old/llmdeploy_engine
    for run in default 1-old 2-new 3-old 4-new 5-new-8; do
        mkdir -p "$out/$run"
        path=/tmp/pkgs args=""
        [ "$run" != default ] && args="--models qwen --throughput-models qwen"
        [ "$run" = 5-new-8 ] && args="$args --num-scheduler-steps 8"
        case $run in *old*) path=/tmp/pkgs_old ;; esac
        PYTHONPATH=$path:$PWD:/tmp/site CUDA_VISIBLE_DEVICES=0 timeout 150 python3 benchmarks/gpu_bench.py \
            --no-peer --out "$out/$run" $args >"$out/gpu_bench_$run.log" 2>&1
        echo "exit $?" >>"$out/gpu_bench_$run.log"
    done
    summary "$out"/t_*.log
    for run in default 1-old 2-new 3-old 4-new 5-new-8; do
        echo "== $run"
        grep -v -E "Warning|enable\(self" "$out/gpu_bench_$run.log" | grep -a -E "^\| |^exit|^built-in" \
            | grep -a -E "tok/s|roofline|host|^exit|^built-in" | cut -c1-200
    done
elif [ "$phase" = v13e ] || [ "$phase" = v13f ]; then
    # one call (v13, ~4 min on one H200): run 63's A/B again with more runs, in the order old new new
    # old old new (a host that slows through the call weighs on both): the 0.5B alone (single stream,
    # 256 requests, no peer) with 5470e1a's engine (.whl/old_engine) and this one
    mkdir -p /tmp/pkgs_old && ln -sfn "$PWD/.whl/old_engine" /tmp/pkgs_old/llmdeploy_engine
    i=0
    order="old new new old old new"
    # v13f (run 65): eight runs, ABBA twice, as run 64 disagreed with run 63
    [ "$phase" = v13f ] && order="new old old new old new new old"
    for eng in $order; do
        i=$((i + 1))
        path=/tmp/pkgs
        [ "$eng" = old ] && path=/tmp/pkgs_old
        mkdir -p "$out/$i-$eng"
        pin=""  # v13f: every run on the same four cores (run 64's processes ran at different host speeds)
        [ "$phase" = v13f ] && command -v taskset >/dev/null && pin="taskset -c 4-7"
        PYTHONPATH=$path:$PWD:/tmp/site CUDA_VISIBLE_DEVICES=0 timeout 100 $pin python3 benchmarks/gpu_bench.py \
            --no-peer --models qwen --throughput-models qwen --out "$out/$i-$eng" >"$out/gpu_bench_$i-$eng.log" 2>&1
        echo "exit $?" >>"$out/gpu_bench_$i-$eng.log"
    done
    for f in "$out"/gpu_bench_*-*.log; do
        echo "== $f"
        grep -a -E "^\| qwen \| (single stream \| tok/s|256 requests \| (output|host))|^exit" "$f" | cut -c1-200
    done
elif [ "$phase" = v14a ] || [ "$phase" = v14b ] || [ "$phase" = v14e ]; then
    # one call (v14, ~6 min on one H200): the engine choosing each decode window's length
    # (num_scheduler_steps auto, the new default): the multi-step GPU tests (auto included), then the
    # 0.5B alone (single stream, 256 requests, no peer) alternating auto and one-step windows (the old
    # default), each its own process, then both models with the default engine
    # v14b (run 69): the sizer's thresholds moved (grow below a 0.5 wait share, shrink above 0.8);
    # auto alternating with fixed 8-step windows (the host-light reference)
    # v14e (run 72, ~5 min): the sizer decides on the median window of 8 and shrinks above 0.75; this
    # engine (auto) alternating with 70c51f1's (.whl/old_engine, auto), the 0.5B then the 8B alone
    order="auto one auto one auto"
    [ "$phase" = v14b ] && order="auto eight auto eight auto"
    [ "$phase" = v14e ] && order="auto old auto old llama llama-old"
    [ "$phase" != v14e ] && tests 0 multistep 150 tests/engine_gpu/test_multi_step_gpu.py
    mkdir -p /tmp/pkgs_old && ln -sfn "$PWD/.whl/old_engine" /tmp/pkgs_old/llmdeploy_engine
    i=0
    for run in $order; do
        i=$((i + 1))
        args="--models qwen --throughput-models qwen"
        path=/tmp/pkgs
        [ "$run" = one ] && args="$args --num-scheduler-steps 1"
        [ "$run" = eight ] && args="$args --num-scheduler-steps 8"
        case $run in llama*) args="--models llama --throughput-models llama" ;; esac
        case $run in *old) path=/tmp/pkgs_old ;; esac
        mkdir -p "$out/$i-$run"
        PYTHONPATH=$path:$PWD:/tmp/site CUDA_VISIBLE_DEVICES=0 timeout 100 python3 benchmarks/gpu_bench.py \
            --no-peer --out "$out/$i-$run" $args >"$out/gpu_bench_$i-$run.log" 2>&1
        echo "exit $?" >>"$out/gpu_bench_$i-$run.log"
    done
    if [ "$phase" != v14e ]; then
        mkdir -p "$out/default"
        CUDA_VISIBLE_DEVICES=0 timeout 200 python3 benchmarks/gpu_bench.py --no-peer --out "$out/default" \
            >"$out/gpu_bench_default.log" 2>&1
        echo "exit $?" >>"$out/gpu_bench_default.log"
    fi
    summary "$out"/t_*.log
    for f in "$out"/gpu_bench_*.log; do
        echo "== $f"
        grep -a -E "^\| (qwen|llama) \| (single stream \| (tok/s|decode /)|256 requests \| (output|decode windows|SM))|^exit" \
            "$f" | cut -c1-200
        grep -a "window lengths in launch order" "$f" | tail -1 | cut -c1-600
    done
elif [ "$phase" = v13g ] || [ "$phase" = v13h ] || [ "$phase" = v14c ] || [ "$phase" = v14f ]; then
    # one call (v13, ~4 min on one H200): the draft model's steps replay CUDA graphs: the speculative
    # decoding GPU tests, then gpu_spec.py on the 0.5B (off, n-gram and a self-draft, k = 4) with
    # b836086's engine (eager draft, .whl/old_engine) and this one
    # v13h (run 67): the gpu_spec.py runs again without the tests (run 66's ran out of memory: the draft
    # rows shared the n-gram rows' runner, whose KV cache took 0.85 of the GPU; fixed in gpu_spec.py)
    # v14c (run 70, ~3 min): the draft's first pass after each verification replays its graphs
    # (multi-token-row graphs, catch-ups evened out per sequence): the tests, then 1511c39's engine
    # (.whl/old_engine) and this one, old new old new. (Runs 66-67 named the logs gpu_spec_old.log
    # and gpu_spec_new.log; the runs are now numbered: gpu_spec_1-old.log, ...)
    # v14f (run 73, ~3 min): a greedy draft's proposals 2..k as one decode window; old = ae960f1's engine
    [ "$phase" != v13h ] && tests 0 spec 150 tests/engine_gpu/test_spec_decode_gpu.py
    mkdir -p /tmp/pkgs_old && ln -sfn "$PWD/.whl/old_engine" /tmp/pkgs_old/llmdeploy_engine
    order="old new"
    [ "$phase" = v14c ] || [ "$phase" = v14f ] && order="old new old new"
    i=0
    for eng in $order; do
        i=$((i + 1))
        path=/tmp/pkgs
        [ "$eng" = old ] && path=/tmp/pkgs_old
        PYTHONPATH=$path:$PWD:/tmp/site CUDA_VISIBLE_DEVICES=0 timeout 110 python3 benchmarks/gpu_spec.py \
            --models qwen --ks 4 --draft-self --repeats 2 --output-len 128 --out "$out/spec_$i-$eng.json" \
            >"$out/gpu_spec_$i-$eng.log" 2>&1
        echo "exit $?" >>"$out/gpu_spec_$i-$eng.log"
    done
    summary "$out"/t_*.log
    for f in "$out"/gpu_spec_*.log; do
        echo "== $f"
        tail -6 "$f"
    done
elif [ "$phase" = v15a ]; then
    # one call (v15, ~6 min on x2): GPU 1: the whole-engine GPU tests with v14's final code (fp8 KV,
    # speculative decoding with the host-path changes, PDL, windows, graphs, the GPU runner, the
    # planner's rule); GPU 0 at the same time: gpu_arrivals.py (requests arriving as a Poisson process)
    # with auto, one-step and 8-step windows, the 0.5B then the 8B, each setting its own process
    g=tests/engine_gpu
    tests 1 engines 420 $g/test_fp8_kv_cache_gpu.py $g/test_spec_decode_gpu.py $g/test_pdl_gpu.py \
        $g/test_multi_step_gpu.py $g/test_cuda_graph_runner.py $g/test_graph_pick.py $g/test_triton_engine.py \
        tests/engine_model/test_gpu_runner.py tests/planner/test_builtin_engine_gpu.py &
    QWEN_RATE=100 QWEN_N=600 arrivals_by_steps qwen:auto qwen:1 qwen:8 qwen:auto llama:auto llama:1
    wait
    summary "$out"/t_*.log
    grep -a -E "^\| [a-z]+-|^exit" "$out/gpu_arrivals.log"
elif [ "$phase" = v15b ]; then
    # one call (v15, ~7 min on x2): tensor parallelism with window length auto (the default): the
    # tp 2 engine with a sizer that always grows against tp 1, then gpu_tp.py (push, max_num_seqs
    # 256) with auto windows (the default) and with one-step windows, each its own process
    t=tests/engine_gpu/test_tensor_parallel_gpu.py
    tests 0,1 tp_auto 150 "$t::test_tp2_auto_windows_match_tp1"
    tests 0,1 tp_graphs 150 "$t::test_tp2_greedy_with_cuda_graphs_matches_tp1[auto]"
    tp_bench gpu_tp_auto 150 --allreduce push --max-num-seqs 256 ${ARGS:-}
    tp_bench gpu_tp_one 150 --allreduce push --max-num-seqs 256 --num-scheduler-steps 1 ${ARGS:-}
    # then on GPU 0 (v15, after run 75): gpu_arrivals.py with the slow steps listed, the 8B at 20
    # requests/s and the 0.5B at 30/s (100/s overloaded it: TTFT in seconds)
    arrivals_by_steps llama:auto llama:1 qwen:auto qwen:1 qwen:8
    summary "$out"/t_*.log
    tp_report auto one
    grep -a -h -o "'windows_by_steps': {[^}]*}" "$out"/gpu_tp_*.log
    grep -a -E "^\| [a-z]+-|^exit" "$out/gpu_arrivals.log"
    grep -a -h -o "'slow_steps': .*" "$out/gpu_arrivals.log" | cut -c1-900
elif [ "$phase" = v15c ]; then
    # one call (v15, ~5 min on one H200): the eager prefill warm-up at start-up (every varlen_attention
    # BLOCK_M class compiled before serving): the graph-runner GPU tests (the new one checks that no
    # attention kernel compiles afterwards), then gpu_arrivals.py as in v15b for the 8B and the 0.5B
    # with auto and one-step windows (runs 75-76 had a 0.46-0.61 s compile stall with auto)
    g=tests/engine_gpu
    tests 0 graphs 200 $g/test_cuda_graph_runner.py $g/test_multi_step_gpu.py
    arrivals_by_steps llama:auto llama:1 qwen:auto qwen:1
    summary "$out"/t_*.log
    grep -a -E "^\| [a-z]+-|^exit|warm-up" "$out/gpu_arrivals.log" | cut -c1-250
    grep -a -h -o "'slow_steps': .*" "$out/gpu_arrivals.log" | cut -c1-600
elif [ "$phase" = v15d ]; then
    # one call (v15, ~4 min on one H200): the graph-runner and multi-step GPU tests after run 77's fix
    # of the warm-up test (its pool comparison now bitwise, after the capture), then gpu_bench.py with
    # the default engine (both models, no peer)
    g=tests/engine_gpu
    tests 0 graphs 200 $g/test_cuda_graph_runner.py $g/test_multi_step_gpu.py
    CUDA_VISIBLE_DEVICES=0 timeout 200 python3 benchmarks/gpu_bench.py --no-peer --out "$out" \
        >"$out/gpu_bench.log" 2>&1
    echo "exit $?" >>"$out/gpu_bench.log"
    summary "$out"/t_*.log
    grep -v -E "Warning|enable\(self" "$out/gpu_bench.log" | grep -a -E "^\| |^exit|^built-in|warm-up" | cut -c1-200
elif [ "$phase" = v15e ]; then
    # one call (v15, ~6 min on one H200): the decode rows of mixed steps through paged_decode (the
    # engine in .whl/old_engine: the commit before, where they ran in the varlen launch): the
    # attention, graph-runner, engine, multi-step, speculative and fp8 GPU tests; then new and old
    # alternating, each its own process: the 8B's 256 requests (bf16), and gpu_arrivals.py with
    # the 0.5B at 100 requests/s (most steps mixed)
    g=tests/engine_gpu
    tests 0 engines 240 $g/test_triton_varlen.py $g/test_cuda_graph_runner.py $g/test_triton_engine.py \
        $g/test_multi_step_gpu.py $g/test_spec_decode_gpu.py $g/test_fp8_kv_cache_gpu.py
    mkdir -p /tmp/pkgs_old && ln -sfn "$PWD/.whl/old_engine" /tmp/pkgs_old/llmdeploy_engine
    for eng in new old; do
        path=/tmp/pkgs
        [ "$eng" = old ] && path=/tmp/pkgs_old
        mkdir -p "$out/$eng"
        PYTHONPATH=$path:$PWD:/tmp/site CUDA_VISIBLE_DEVICES=0 timeout 100 python3 benchmarks/gpu_bench.py \
            --no-peer --models llama --throughput-models llama --out "$out/$eng" >"$out/gpu_bench_$eng.log" 2>&1
        echo "exit $?" >>"$out/gpu_bench_$eng.log"
        PYTHONPATH=$path:$PWD:/tmp/site CUDA_VISIBLE_DEVICES=0 timeout 60 python3 benchmarks/gpu_arrivals.py \
            --model qwen --rate 100 --num-requests 600 --label "qwen-$eng" --out "$out" >>"$out/gpu_arrivals.log" 2>&1
        echo "exit $? ($eng)" >>"$out/gpu_arrivals.log"
    done
    summary "$out"/t_*.log
    for eng in new old; do
        echo "== 8B $eng"
        grep -a -E "eager steps \(" "$out/gpu_bench_$eng.log" | cut -c1-330
        grep -v -E "Warning|enable\(self" "$out/gpu_bench_$eng.log" | grep -a -E "256 requests \| (output|SM)|^exit"
    done
    grep -a -E "^\| [a-z]+-|^exit" "$out/gpu_arrivals.log"
    grep -a -h -o "'slow_steps': .*" "$out/gpu_arrivals.log" | cut -c1-300
elif [ "$phase" = v15f ]; then
    # one call (v15, ~4 min on one H200): windows while every slot is taken and the admission interval:
    # the multi-step GPU tests, then gpu_arrivals.py with the 0.5B at 100 and 30 requests/s, admission
    # every step and every 8 steps (each its own process)
    tests 0 multistep 150 tests/engine_gpu/test_multi_step_gpu.py
    for cfg in 100:1 100:8 30:1 30:8; do
        rate=${cfg%%:*} every=${cfg#*:}
        n=600
        [ "$rate" = 30 ] && n=400
        CUDA_VISIBLE_DEVICES=0 timeout 70 python3 benchmarks/gpu_arrivals.py --model qwen --rate $rate \
            --num-requests $n --admission-interval $every --label "qwen-$rate-every$every" --out "$out" \
            >>"$out/gpu_arrivals.log" 2>&1
        echo "exit $? ($cfg)" >>"$out/gpu_arrivals.log"
    done
    summary "$out"/t_*.log
    grep -a -E "^\| [a-z]+-|^exit" "$out/gpu_arrivals.log"
    grep -a -h -o "'slow_steps': .*" "$out/gpu_arrivals.log" | cut -c1-300
elif [ "$phase" = v16a ]; then
    # one call (v16, ~7 min on one H200): the speculative (NgramIndex inside the GPU engine) and
    # graph-runner GPU tests (the warm-up's capped decode contexts); the varlen kernel's launch
    # configurations; the 8B's 256 requests with the device's idle time between launches, at the
    # default 8,192 batched tokens and at 16,384; the 0.5B's figures with v15's host-path changes
    g=tests/engine_gpu
    tests 0 engines 150 $g/test_spec_decode_gpu.py $g/test_cuda_graph_runner.py
    CUDA_VISIBLE_DEVICES=0 timeout 150 python3 benchmarks/gpu_varlen_sweep.py >"$out/varlen_sweep.log" 2>&1
    echo "exit $?" >>"$out/varlen_sweep.log"
    for budget in 8192 16384; do
        CUDA_VISIBLE_DEVICES=0 timeout 100 python3 benchmarks/gpu_bench.py --no-peer --models llama \
            --throughput-models llama --max-num-batched-tokens $budget --out "$out" >"$out/gpu_bench_8b_$budget.log" 2>&1
        echo "exit $?" >>"$out/gpu_bench_8b_$budget.log"
        mv "$out/gpu_bench.json" "$out/gpu_bench_8b_$budget.json" 2>/dev/null
    done
    CUDA_VISIBLE_DEVICES=0 timeout 80 python3 benchmarks/gpu_bench.py --no-peer --models qwen \
        --throughput-models qwen --out "$out" >"$out/gpu_bench_qwen.log" 2>&1
    echo "exit $?" >>"$out/gpu_bench_qwen.log"
    summary "$out"/t_*.log
    tail -22 "$out/varlen_sweep.log"
    bench_report "$out"/gpu_bench_*.log
elif [ "$phase" = v16b ]; then
    # one call (v16, ~7 min on one H200): windows that follow each other past a sequence's last token
    # (the engine in .whl/old_engine: the commit before, where each one broke the chain): the
    # multi-step GPU tests; the varlen kernel's launch configurations on long prompts and over an
    # fp8 cache; then new, old, new (8B, 256 requests) and new, old (0.5B), each its own process
    tests 0 multistep 120 tests/engine_gpu/test_multi_step_gpu.py
    CUDA_VISIBLE_DEVICES=0 timeout 100 python3 benchmarks/gpu_varlen_sweep.py --cases 1x8192,2x4096,chunk \
        --block-m 64,128 --block-n 32,64 --warps 4,8 --stages 2,3,4 >"$out/varlen_sweep.log" 2>&1
    echo "exit $?" >>"$out/varlen_sweep.log"
    CUDA_VISIBLE_DEVICES=0 timeout 80 python3 benchmarks/gpu_varlen_sweep.py --cases chunk,1x8192 \
        --kv-cache-dtype fp8_e4m3 --block-m 64,128 --block-n 32,64 --warps 4,8 --stages 2,3 >>"$out/varlen_sweep.log" 2>&1
    echo "exit $?" >>"$out/varlen_sweep.log"
    mkdir -p /tmp/pkgs_old && ln -sfn "$PWD/.whl/old_engine" /tmp/pkgs_old/llmdeploy_engine
    for run in llama:new llama:old llama:new2 qwen:new qwen:old; do
        model=${run%%:*} eng=${run#*:}
        path=/tmp/pkgs
        [ "$eng" = old ] && path=/tmp/pkgs_old
        PYTHONPATH=$path:$PWD:/tmp/site CUDA_VISIBLE_DEVICES=0 timeout 90 python3 benchmarks/gpu_bench.py \
            --no-peer --models $model --throughput-models $model --out "$out" >"$out/gpu_bench_${model}_$eng.log" 2>&1
        echo "exit $?" >>"$out/gpu_bench_${model}_$eng.log"
        rm -f "$out/gpu_bench.json"
    done
    summary "$out"/t_*.log
    grep -a -E "^\| |^exit" "$out/varlen_sweep.log"
    bench_report "$out"/gpu_bench_*.log
elif [ "$phase" = v16c ]; then
    # one call (v16, ~6 min on one H200): the varlen kernel's new launch configurations (64 rows a
    # program, 4 warps; BLOCK_N 32 and 3 stages over a bf16 cache): the varlen, graph-runner and fp8
    # GPU tests; gpu_bench.py with the default engine (both models, no peer); the 8B's 256 requests
    # over an fp8 e4m3 cache; gpu_arrivals.py with the 8B at 20 requests/s
    g=tests/engine_gpu
    tests 0 engines 170 $g/test_triton_varlen.py $g/test_cuda_graph_runner.py $g/test_fp8_kv_cache_gpu.py
    CUDA_VISIBLE_DEVICES=0 timeout 150 python3 benchmarks/gpu_bench.py --no-peer --out "$out" \
        >"$out/gpu_bench.log" 2>&1
    echo "exit $?" >>"$out/gpu_bench.log"
    mkdir -p "$out/fp8"
    CUDA_VISIBLE_DEVICES=0 timeout 90 python3 benchmarks/gpu_bench.py --no-peer --models llama \
        --throughput-models llama --kv-cache-dtype fp8_e4m3 --out "$out/fp8" >"$out/gpu_bench_fp8.log" 2>&1
    echo "exit $?" >>"$out/gpu_bench_fp8.log"
    rm -f "$out/fp8/gpu_bench.json"
    arrivals_by_steps llama:auto
    summary "$out"/t_*.log
    bench_report "$out"/gpu_bench*.log
    grep -a -E "^\| [a-z]+-|^exit|warm-up" "$out/gpu_arrivals.log" | cut -c1-250
    grep -a -h -o "'slow_steps': .*" "$out/gpu_arrivals.log" | cut -c1-300
elif [ "$phase" = v16d ]; then
    # one call (v16, ~1.5 min on one H200): the 8B's projections at the decode graphs' row counts from
    # 128 to 256 through cuBLAS as the engine calls it, cuBLASLt, and the transposed product W @ x^T
    CUDA_VISIBLE_DEVICES=0 timeout 200 python3 benchmarks/gpu_batch_diag.py --parts gemm --no-triton \
        --rows 64,128,144,160,176,192,208,224,240,256 --out "$out" >"$out/gemm_layout.log" 2>&1
    echo "exit $?" >>"$out/gemm_layout.log"
    grep -a -E "m=|exit|Error" "$out/gemm_layout.log" | cut -c1-260
elif [ "$phase" = v16e ]; then
    # one call (v16, ~3.5 min on one H200): requests arriving one by one after the window-chain fix:
    # gpu_arrivals.py with the 0.5B at 30 requests/s in two processes (v15 saw a 32-59 ms median
    # TTFT spread between processes of one code) and at 100/s; then the 8B's 256 requests again
    ARRIVALS_TAG=-30a arrivals_by_steps qwen:auto
    ARRIVALS_TAG=-30b arrivals_by_steps qwen:auto
    ARRIVALS_TAG=-100 QWEN_RATE=100 QWEN_N=600 arrivals_by_steps qwen:auto
    CUDA_VISIBLE_DEVICES=0 timeout 90 python3 benchmarks/gpu_bench.py --no-peer --models llama \
        --throughput-models llama --out "$out" >"$out/gpu_bench_8b.log" 2>&1
    echo "exit $?" >>"$out/gpu_bench_8b.log"
    grep -a -E "^\| [a-z]+-|^exit|warm-up" "$out/gpu_arrivals.log" | cut -c1-250
    grep -a -h -o "'slow_steps': .*" "$out/gpu_arrivals.log" | cut -c1-300
    grep -a -E "device idle" "$out/gpu_bench_8b.log" | cut -c1-300
    grep -v -E "Warning|enable\(self" "$out/gpu_bench_8b.log" | grep -a -E "(requests|single stream) \| (output|SM|tok)|roofline|^exit"
elif [ "$phase" = v16f ]; then
    # one call (v16, ~4.5 min on one H200): auto windows capped at 2 steps while requests arrive (the
    # engine in .whl/old_engine: the commit before): gpu_arrivals.py with the 0.5B at 30 requests/s,
    # new / old / new / old, each its own process; then this engine at 100/s and the 0.5B's 256
    # requests (gpu_bench.py, no peer)
    mkdir -p /tmp/pkgs_old && ln -sfn "$PWD/.whl/old_engine" /tmp/pkgs_old/llmdeploy_engine
    for eng in new old new2 old2; do
        path=/tmp/pkgs
        case $eng in old*) path=/tmp/pkgs_old ;; esac
        PYTHONPATH=$path:$PWD:/tmp/site ARRIVALS_TAG=-30-$eng arrivals_by_steps qwen:auto
    done
    ARRIVALS_TAG=-100-new QWEN_RATE=100 QWEN_N=600 arrivals_by_steps qwen:auto
    CUDA_VISIBLE_DEVICES=0 timeout 80 python3 benchmarks/gpu_bench.py --no-peer --models qwen \
        --throughput-models qwen --out "$out" >"$out/gpu_bench_qwen.log" 2>&1
    echo "exit $?" >>"$out/gpu_bench_qwen.log"
    grep -a -E "^\| [a-z]+-|^exit" "$out/gpu_arrivals.log" | cut -c1-250
    grep -a -h -o "'slow_steps': .*" "$out/gpu_arrivals.log" | cut -c1-200
    grep -v -E "Warning|enable\(self" "$out/gpu_bench_qwen.log" | grep -a -E "(requests|single stream) \| (output|SM|tok)|^exit"
elif [ "$phase" = v17a ]; then
    # one call (v17, ~6-8 min on one H200): inductor's max-autotune GEMM pick against cuBLAS for the 8B's
    # projections at decode row counts (gpu_gemm_autotune.py), weights cycled so L2 never holds them
    CUDA_VISIBLE_DEVICES=0 timeout ${V17A_LIMIT:-480} python3 benchmarks/gpu_gemm_autotune.py \
        --rows ${V17A_ROWS:-160,208,256} --out "$out" >"$out/gemm_autotune.log" 2>&1
    echo "exit $?" >>"$out/gemm_autotune.log"
    grep -a -E "m= *[0-9]+:|^\||exit|Error|inductor:|torch " "$out/gemm_autotune.log" | cut -c1-260
    grep -a -A6 "AUTOTUNE mm" "$out/gemm_autotune.log" | cut -c1-200 | head -150
elif [ "$phase" = v17b ]; then
    # one call (v17, ~9 min on one H200): gpu_bench.py end to end on the final engine, both models with
    # their transformers peers in the same run (the 0.5B's peer on its first 128 requests, to fit)
    CUDA_VISIBLE_DEVICES=0 timeout 585 python3 benchmarks/gpu_bench.py --hf-requests qwen=128,llama=128 \
        --out "$out" >"$out/gpu_bench.log" 2>&1
    echo "exit $?" >>"$out/gpu_bench.log"
    grep -a -E "transformers peer|peer skipped|copy bandwidth" "$out/gpu_bench.log" | cut -c1-250
    grep -v -E "Warning|enable\(self" "$out/gpu_bench.log" | grep -a -E "^\| |^exit" | cut -c1-250
elif [ "$phase" = v17c ]; then
    # one call (v17, ~8 min on one H200): the FP8 and n-gram targets on the final engine (last run in
    # v7): gpu_fp8.py (bf16 / e4m3 / e5m2 KV, 32 x 8k), gpu_spec.py (the 8B with --continuing-model);
    # then the engine's GPU tests (engine, multi-step, fp8, speculative decoding, graphs)
    CUDA_VISIBLE_DEVICES=0 timeout 200 python3 benchmarks/gpu_fp8.py --kv-dtypes auto,fp8_e4m3,fp8_e5m2 \
        --repeats 2 --out "$out" >"$out/gpu_fp8.log" 2>&1
    echo "exit $?" >>"$out/gpu_fp8.log"
    CUDA_VISIBLE_DEVICES=0 timeout 100 python3 benchmarks/gpu_spec.py --models llama --continuing-model \
        --repeats 2 --out "$out/gpu_spec_cont.json" >"$out/gpu_spec_cont.log" 2>&1
    echo "exit $?" >>"$out/gpu_spec_cont.log"
    g=tests/engine_gpu
    tests 0 engine 170 $g/test_triton_engine.py $g/test_multi_step_gpu.py $g/test_fp8_kv_cache_gpu.py \
        $g/test_spec_decode_gpu.py $g/test_cuda_graph_runner.py $g/test_graph_pick.py
    for f in gpu_fp8 gpu_spec_cont; do
        echo "== $f"
        grep -v -E "Warning|enable\(self" "$out/$f.log" | grep -a -E "^\| |^exit|decode [0-9]+ tok/s" | cut -c1-250
    done
    tail -4 "$out/t_engine.log"
elif [ "$phase" = v17d ]; then
    # one call (v17, ~9 min on one H200): the last layer's output projection and MLP on the logit rows
    # only (the engine in .whl/old_engine: the commit before): the engine GPU tests, then the 8B's
    # gpu_bench.py (single stream and 256 requests) new, old, new, old, each its own process
    g=tests/engine_gpu
    tests 0 engine 130 $g/test_triton_engine.py $g/test_cuda_graph_runner.py $g/test_spec_decode_gpu.py \
        $g/test_fp8_kv_cache_gpu.py
    ab_bench llama 90 new old new2 old2
    summary "$out"/t_*.log
    bench_report "$out"/gpu_bench_llama_*.log
    grep -a -H "host s schedule" "$out"/gpu_bench_llama_*.log | cut -c1-250
elif [ "$phase" = v17e ]; then
    # one call (v17, ~5 min on one H200): the last layer on the logit rows only, on long prompts: the
    # prefill of gpu_fp8.py's 32 x 8,000-token prompts (bf16 KV), new, old, new, old, each its own process
    old_engine_link
    for eng in new old new2 old2; do
        mkdir -p "$out/$eng"
        PYTHONPATH=$(engine_pythonpath "$eng") CUDA_VISIBLE_DEVICES=0 timeout 85 python3 benchmarks/gpu_fp8.py \
            --kv-dtypes auto --out "$out/$eng" >"$out/gpu_fp8_$eng.log" 2>&1
        echo "exit $?" >>"$out/gpu_fp8_$eng.log"
        echo "== $eng"
        grep -a -E "auto: decode|^exit" "$out/gpu_fp8_$eng.log" | cut -c1-250
    done
elif [ "$phase" = v17f ]; then
    # one call (v17, ~2 min on one H200): the 0.5B on the final engine (single stream, 256 requests, no peer)
    CUDA_VISIBLE_DEVICES=0 timeout 100 python3 benchmarks/gpu_bench.py --no-peer --models qwen \
        --throughput-models qwen --out "$out" >"$out/gpu_bench_qwen.log" 2>&1
    echo "exit $?" >>"$out/gpu_bench_qwen.log"
    bench_report "$out/gpu_bench_qwen.log"
elif [ "$phase" = v17g ]; then
    # one call (v17, ~2.5 min on one H200): the 0.5B's 256 requests, this engine and .whl/old_engine's
    # (before the last layer ran on logit rows only), new / old / new, each its own process
    ab_bench qwen 60 new old new2
    bench_report "$out"/gpu_bench_qwen_*.log
elif [ "$phase" = v15g ]; then
    # one call (v15, ~2 min on one H200): gpu_arrivals.py, the 0.5B at 30 requests/s, this engine and
    # .whl/old_engine's (before the mixed-step change) alternating, each its own process
    mkdir -p /tmp/pkgs_old && ln -sfn "$PWD/.whl/old_engine" /tmp/pkgs_old/llmdeploy_engine
    for eng in old new; do
        path=/tmp/pkgs
        [ "$eng" = old ] && path=/tmp/pkgs_old
        PYTHONPATH=$path:$PWD:/tmp/site CUDA_VISIBLE_DEVICES=0 timeout 50 python3 benchmarks/gpu_arrivals.py \
            --model qwen --rate 30 --num-requests 400 --label "qwen-30-$eng" --out "$out" >>"$out/gpu_arrivals.log" 2>&1
        echo "exit $? ($eng)" >>"$out/gpu_arrivals.log"
    done
    grep -a -E "^\| [a-z]+-|^exit" "$out/gpu_arrivals.log"
elif [ "$phase" = v14g ]; then
    # one call (v14, ~1 min on one H200): the engine GPU tests after the sizer's median and the draft's
    # window (both came after run 71's tests)
    g=tests/engine_gpu
    tests 0 engines 200 $g/test_multi_step_gpu.py $g/test_spec_decode_gpu.py $g/test_cuda_graph_runner.py \
        $g/test_graph_pick.py $g/test_triton_engine.py tests/engine_model/test_gpu_runner.py
    summary "$out"/t_*.log
elif [ "$phase" = v13c ] || [ "$phase" = v14d ]; then
    # one call (v13 final, ~6 min on one H200, a freshly started machine): the whole-engine GPU tests
    # and the planner's in one process with the final code (the runner collects dropped engines itself;
    # v13b's run had the collection in the planner's comparison), then gpu_bench.py with the default
    # engine (both models, no peer) and the 8B's 256 requests with the fp8 KV cache
    # v14d (run 71, ~7.5 min): the same with v14's final code, the graph, multi-step and Triton engine
    # tests in the same process
    g=tests/engine_gpu
    more=""
    [ "$phase" = v14d ] && more="$g/test_multi_step_gpu.py $g/test_cuda_graph_runner.py $g/test_graph_pick.py \
        $g/test_triton_engine.py"
    tests 0 engines 450 $g/test_fp8_kv_cache_gpu.py $g/test_spec_decode_gpu.py $g/test_pdl_gpu.py $more \
        tests/engine_model/test_gpu_runner.py tests/planner/test_builtin_engine_gpu.py
    mkdir -p "$out/default" "$out/fp8"
    CUDA_VISIBLE_DEVICES=0 timeout 200 python3 benchmarks/gpu_bench.py --no-peer --out "$out/default" \
        >"$out/gpu_bench_default.log" 2>&1
    echo "exit $?" >>"$out/gpu_bench_default.log"
    CUDA_VISIBLE_DEVICES=0 timeout 100 python3 benchmarks/gpu_bench.py --no-peer --models llama \
        --throughput-models llama --kv-cache-dtype fp8_e4m3 --out "$out/fp8" >"$out/gpu_bench_fp8.log" 2>&1
    echo "exit $?" >>"$out/gpu_bench_fp8.log"
    summary "$out"/t_*.log
    for f in "$out"/gpu_bench_default.log "$out"/gpu_bench_fp8.log; do
        echo "== $f"
        grep -v -E "Warning|enable\(self" "$f" | grep -a -E "^\| |^exit|^built-in" | grep -v transformers \
            | cut -c1-200
    done
elif [ "$phase" = v12d ]; then
    # one call (v12, ~4 min on one H200): the other GPU tests that run whole engines, now with one-step
    # asynchronous windows by default: fp8 KV cache, speculative decoding (async off with it), PDL,
    # the planner's builtin rule against the engine's start-up, the GPU runner. The planner's tests
    # (0.9 of the GPU's memory) run in a process of their own: after the others in one process they
    # ran out of memory on freshly started machines (runs 54, 58; docs/gpu-notes.md v12)
    g=tests/engine_gpu
    tests 0 engines 400 $g/test_fp8_kv_cache_gpu.py $g/test_spec_decode_gpu.py $g/test_pdl_gpu.py \
        tests/engine_model/test_gpu_runner.py
    tests 0 planner 200 tests/planner/test_builtin_engine_gpu.py
    summary "$out"/t_*.log
elif [ "$phase" = v11c ]; then
    # one call (v11 final, ~4 min on one H200): the engine GPU tests, gpu_bench.py (both models, no
    # peer; async scheduling, the default), then the 8B's 256 requests with the fp8 KV cache
    g=tests/engine_gpu
    tests 0 engine 240 $g/test_multi_step_gpu.py $g/test_cuda_graph_runner.py $g/test_graph_pick.py \
        $g/test_triton_engine.py
    CUDA_VISIBLE_DEVICES=0 timeout 150 python3 benchmarks/gpu_bench.py --no-peer --out "$out" ${ARGS:-} \
        >"$out/gpu_bench.log" 2>&1
    echo "exit $?" >>"$out/gpu_bench.log"
    mkdir -p "$out/fp8"
    CUDA_VISIBLE_DEVICES=0 timeout 120 python3 benchmarks/gpu_bench.py --no-peer --models llama \
        --throughput-models llama --kv-cache-dtype fp8_e4m3 --out "$out/fp8" ${ARGS:-} >"$out/gpu_bench_fp8.log" 2>&1
    echo "exit $?" >>"$out/gpu_bench_fp8.log"
    summary "$out"/t_*.log
    for f in "$out"/gpu_bench.log "$out"/gpu_bench_fp8.log; do
        echo "== $f"
        grep -v -E "Warning|enable\(self" "$f" | grep -a -E "^\| |^exit|hook saw|compiled during" | cut -c1-240
    done
elif [ "$phase" = v10c ] || [ "$phase" = v10d ]; then
    # one call (v10, ~3 min on one H200): v10c: the board's power limit and clocks, the engine GPU
    # tests (decode grid KV heads fastest); both: gpu_bench.py (both models, no peer) with the SM
    # clock and board power sampled through each 256-request run, the 0.5B's single stream again,
    # the 8B with fp8 KV. v10d (run 46) is the repeat after gpu_bench.py's token count was fixed.
    if [ "$phase" = v10c ]; then
        nvidia-smi -q -d POWER,CLOCK | grep -a -E "Power Limit|Power Draw|Graphics|SM|Memory" | head -24
        g=tests/engine_gpu
        tests 0 engine 300 $g/test_triton_engine.py $g/test_graph_pick.py $g/test_cuda_graph_runner.py \
            $g/test_multi_step_gpu.py
    fi
    CUDA_VISIBLE_DEVICES=0 timeout 240 python3 benchmarks/gpu_bench.py --no-peer --out "$out" ${ARGS:-} \
        >"$out/gpu_bench.log" 2>&1
    echo "exit $?" >>"$out/gpu_bench.log"
    CUDA_VISIBLE_DEVICES=0 timeout 60 python3 benchmarks/gpu_bench.py --no-peer --models qwen \
        --throughput-models none ${ARGS:-} >"$out/gpu_bench_qwen2.log" 2>&1
    echo "exit $?" >>"$out/gpu_bench_qwen2.log"
    mkdir -p "$out/fp8"
    CUDA_VISIBLE_DEVICES=0 timeout 150 python3 benchmarks/gpu_bench.py --no-peer --models llama \
        --throughput-models llama --kv-cache-dtype fp8_e4m3 --out "$out/fp8" ${ARGS:-} \
        >"$out/gpu_bench_fp8.log" 2>&1
    echo "exit $?" >>"$out/gpu_bench_fp8.log"
    summary "$out"/t_*.log
    for f in gpu_bench gpu_bench_qwen2 gpu_bench_fp8; do
        echo "== $f"
        grep -a -E "SM clock and board|throughput: " "$out/$f.log" | cut -c1-250
        grep -v -E "Warning|enable\(self" "$out/$f.log" | grep -a -E "^\| |^exit|compiled during" | cut -c1-250 \
            | grep -v -E "start-up|transformers" | tail -24
    done
elif [ "$phase" = v10b ]; then
    # one call (v10, ~5 min on one H200): decode attention variants (row order, grid order, block
    # layout, RoPE fused or not, after a GEMM) with the SM clock, then the 8B's 256 requests with the
    # standard profile only: bf16 KV, bf16 KV with the rows in admission order (A/B), fp8 KV. Run 43
    # ran it with the scheduler's longest-first rows and their LLMDEPLOY_DECODE_ROWS switch, both
    # removed after it (no gain in the engine), so "admission" now runs the default engine
    CUDA_VISIBLE_DEVICES=0 timeout 120 python3 benchmarks/gpu_batch_diag.py --parts attention --out "$out" \
        >"$out/gpu_batch_diag.log" 2>&1
    echo "exit $?" >>"$out/gpu_batch_diag.log"
    for run in auto admission fp8_e4m3; do
        kv=$run rows=longest
        [ "$run" = admission ] && kv=auto rows=admission
        mkdir -p "$out/$run"
        LLMDEPLOY_DECODE_ROWS=$rows CUDA_VISIBLE_DEVICES=0 timeout 150 python3 benchmarks/gpu_bench.py --no-peer \
            --models llama --throughput-models llama --kv-cache-dtype $kv --profile-top 14 --out "$out/$run" \
            ${ARGS:-} >"$out/gpu_bench_$run.log" 2>&1
        echo "exit $?" >>"$out/gpu_bench_$run.log"
    done
    grep -a -E "TB/s|^exit" "$out/gpu_batch_diag.log" | cut -c1-230
    for run in auto admission fp8_e4m3; do
        echo "== 8B, $run"
        grep -a -E "throughput profile|eager steps \(" "$out/gpu_bench_$run.log" | cut -c1-200
        grep -v -E "Warning|enable\(self" "$out/gpu_bench_$run.log" | grep -a -E "^\| llama|^exit" | cut -c1-250 | tail -12
    done
elif [ "$phase" = bench9b ]; then
    # one call (v9, ~4 min on one H200): batch sizes every 8 up to 64 and every 16 up to 256 (was powers
    # of two): the engine and planner GPU tests, gpu_bench.py (both models, no peer), the 8B with fp8 KV
    g=tests/engine_gpu
    tests 0 engine 150 $g/test_triton_engine.py $g/test_cuda_graph_runner.py $g/test_graph_pick.py \
        tests/planner/test_builtin_engine_gpu.py
    bench_with_fp8
elif [ "$phase" = bench9 ]; then
    # one call (v9, ~7 min on one H200): the engine / graph / multi-step tests (the v8 host-path
    # changes had not run on a GPU), gpu_bench.py (both models, no peer), then the 8B with the FP8 KV
    # cache (single stream and 256 requests)
    g=tests/engine_gpu
    tests 0 engine 150 $g/test_triton_ops.py $g/test_graph_pick.py $g/test_cuda_graph_runner.py \
        $g/test_multi_step_gpu.py $g/test_triton_engine.py $g/test_fp8_kv_cache_gpu.py
    bench_with_fp8
else
    echo "unknown phase $phase (check | bench | final | probe | gemv | final5 | tests5 | pdl | fused | final6 | tests6 | fp8diag | v7 | v7b | final7 | first | diag8 | first8 | v8 | tp8 | gemv8 | final8 | tp9 | tp9b | ar9 | tp9c | bench9 | bench9b | v10a | v10b | v10c | v10d)" >&2
    exit 2
fi
echo "took $(($(date +%s) - start)) s"
