#!/usr/bin/env bash
# Every GPU figure in BENCHMARKS.md ("GPU" section) and the CUDA tests, in one command that fits a
# 10-minute lease (about 7 minutes on one H100). Outputs go to $OUT (or ./gpu-out) as well.
#
# The lent GPU machines have torch but transformers 5.17 and no TRL or datasets, and no network.
# Download the wheels here first, then carry .whl along (.git/info/exclude lists it):
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 -d .whl transformers==5.23.0 trl==1.16.0 datasets==5.2.0 \
#     dill==0.4.1 multiprocess==0.70.19
#   bash bench/gpu_suite.sh            # on the GPU machine, from the repository root
set -u
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
fi
out=${OUT:-gpu-out}
mkdir -p "$out"
run() {  # run NAME SECONDS COMMAND...: its output to $out/NAME.txt, its last lines here
    local name=$1 limit=$2
    shift 2
    echo "== $name: $*"
    timeout "$limit" "$@" 2>&1 | grep -v Warning | tee "$out/$name.txt" | tail -12
}
run tests 150 python3 -m pytest -q -p no:cacheprovider tests/tasks/test_gpu.py \
    tests/tasks/test_precision.py "tests/tasks/test_trainer.py::test_resume_reproduces_uninterrupted_run"
run gen64 120 python3 -m bench.generation --model qwen2.5-0.5b --shapes 8x8x512 --repeats 3
run gen512 100 python3 -m bench.generation --model qwen2.5-0.5b --shapes 64x8x512 --sides static \
    --repeats 2
run eval 60 python3 -m bench.generation --model smollm2-135m --shapes 200x8x96 --sides \
    --top-p 0.7 --repeats 3
run rl_step 170 python3 -m bench.rl_step --model qwen2.5-0.5b --shapes 8x8x512 --rounds 1 --steps 3
run mfu16k 75 python3 -m bench.mfu --steps 3
run mfu32k 75 python3 -m bench.mfu --steps 3 --micro-batch-tokens 32768 --profile
