#!/usr/bin/env bash
# v9 A/B on one GPU (run 41): the 0.5B through gpu_bench.py with the CUDA graph batch sizes of df564fd
# (every 8 up to 64, every 16 up to 256: "new") and the powers of two before it ("old", patched into
# the planner module the engine reads them from), alternating new, old, new, old in fresh processes.
#   OUT=/tmp/ab bash benchmarks/ab_graph_sizes.sh
export PYTHONPATH=/tmp/pkgs:$PWD:/tmp/site PYTHONUNBUFFERED=1
pip install -q --no-deps --target /tmp/site .whl/*.whl >/dev/null 2>&1
mkdir -p /tmp/pkgs && ln -sfn "$PWD/engine" /tmp/pkgs/llmdeploy_engine
for v in new old new old; do
  i=$((${i:-0}+1)); mkdir -p $OUT/ab$i-$v
  SIZES=$v timeout 120 python3 -c "
import os, runpy, sys
sys.path.insert(0, 'benchmarks')
import llmdeploy_engine.facts as b
if os.environ['SIZES'] == 'old':
    b.CUDA_GRAPH_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
sys.argv = ['gpu_bench.py', '--no-peer', '--models', 'qwen', '--throughput-models', 'qwen', '--num-scheduler-steps', '8', '--out', sys.argv[1]]
runpy.run_path('benchmarks/gpu_bench.py', run_name='__main__')
" $OUT/ab$i-$v > $OUT/ab$i-$v/gpu_bench.log 2>&1
  echo "== $i $v exit $?"; grep -a -E "CUDA graphs \||^\| qwen \| (single stream \| tok|single stream \| host us|256 requests \| (output|host s))" $OUT/ab$i-$v/gpu_bench.log | cut -c1-170
done
