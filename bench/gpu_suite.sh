#!/usr/bin/env bash
# Every GPU figure in docs/benchmarks.md ("GPU" section) and the CUDA tests, in one lease: each part's
# timeouts add up to under 10 minutes, one device command each.
#   bash bench/gpu_suite.sh [tests|sampling|update|decode|draw|step|nucleus|nucleus_search|flex|
#                            rollouts|rl_split2k|rl_flex|first_calls|autotune|rl_split|rl_step]...
# (no argument: the first three)
# Outputs go to $OUT (or ./gpu-out) as well.
#
# The lent GPU machines have torch but transformers 5.17 and no TRL or datasets, and no network.
# Download the wheels here first, then carry .whl along (.git/info/exclude lists it):
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 -d .whl transformers==5.24.0
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_17_x86_64 \
#     --platform manylinux2014_x86_64 -d .whl tokenizers==0.23.3 safetensors==0.8.0
# and for the tests part pytest-xdist execnet pytest-timeout (pytest's addopts run -n auto), for the
# rl_step part trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19.
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
parts=${*:-tests sampling update}
for part in $parts; do
    case $part in
    tests)
        run tests 240 python3 -m pytest -q -p no:cacheprovider tests/tasks/test_gpu.py \
            tests/tasks/test_precision.py tests/tasks/test_compiled.py tests/core/test_logprobs.py \
            "tests/tasks/test_trainer.py::test_resume_reproduces_uninterrupted_run" -k "not autotune"
        ;;
    sampling)
        run gen64 120 python3 -m bench.generation --model qwen2.5-0.5b --shapes 8x8x512 --repeats 3 \
            --sides sorted static-shapes flex flex-static stepwise lean eager generate static
        run gen512 100 python3 -m bench.generation --model qwen2.5-0.5b --shapes 64x8x512 \
            --sides static --repeats 2
        run eval 60 python3 -m bench.generation --model smollm2-135m --shapes 200x8x96 --sides \
            --top-p 0.7 --repeats 3
        ;;
    update)  # the MFU table: before (eager, chunked head), now (as `dapo train` runs), each preset
        mfu="python3 -m bench.mfu --steps 5 --micro-batch-tokens 32768"
        run mfu_eager 50 $mfu --compile none --head chunked
        run mfu 80 $mfu --trace "$out/trace.json"
        gzip -f "$out/trace.json" && run gaps 30 python3 -m bench.gaps "$out/trace.json.gz"
        for v in gspo cispo ppo; do run "mfu_$v" 60 $mfu --variant $v; done
        long="python3 -m bench.mfu --steps 2 -P 1 -G 16 --prompt-len 512"
        run long_8k 70 $long -L 8192 --micro-batch-tokens 32768
        run long_20k 70 $long -L 20480 --micro-batch-tokens 32768
        run long_1.5b 90 $long -L 8192 --micro-batch-tokens 16384 --shape qwen2.5-1.5b
        ;;
    decode)  # the decode step's variants and profile; whole rollouts before (lean) and now
        run decode 150 python3 -m bench.decode --variants lean default static-shapes \
            --profile lean default --out /tmp/traces
        tar czf "$out/decode_traces.tgz" -C /tmp traces
        run gen64 80 python3 -m bench.generation --model qwen2.5-0.5b --shapes 8x8x512 \
            --sides lean static --repeats 3
        run gen512 60 python3 -m bench.generation --model qwen2.5-0.5b --shapes 64x8x512 \
            --sides lean --repeats 2
        run trace 40 bash -c "python3 -m bench.generation --model qwen2.5-0.5b --shapes 64x8x64 \
            --sides --repeats 1 --trace /tmp/gen.json && python3 -m bench.gaps /tmp/gen.json --min-us 50"
        run eval 80 python3 -m bench.generation --model smollm2-135m --shapes 200x8x96 --sides lean \
            --top-p 0.7 --repeats 3
        ;;
    draw)  # sampling recorded in the graphs (ours) against it beside them (stepwise), and lean
        gen="python3 -m bench.generation --model qwen2.5-0.5b"
        run gen64 100 $gen --shapes 8x8x512 --sides stepwise lean --repeats 3
        run gen512 90 $gen --shapes 64x8x512 --sides stepwise lean --repeats 2
        run eval 60 python3 -m bench.generation --model smollm2-135m --shapes 200x8x96 \
            --sides stepwise --top-p 0.7 --repeats 3
        ;;
    step)  # the step's variants and the samplers (blocked among them), one profile
        run decode 120 python3 -m bench.decode --variants lean default static-shapes \
            --profile default
        ;;
    nucleus)  # top-p 0.7 (evaluation's): the nucleus by a sort (sorted) against its bisected floor
        run nucleus_step 120 python3 -m bench.decode --variants default --top-p 0.7 0.95
        gen="python3 -m bench.generation --top-p 0.7 --sides sorted"
        run nucleus_eval 80 $gen --model smollm2-135m --shapes 200x8x96 --repeats 3
        run nucleus64 90 $gen --model qwen2.5-0.5b --shapes 8x8x512 --repeats 3
        run nucleus512 90 $gen --model qwen2.5-0.5b --shapes 64x8x512 --repeats 2
        ;;
    nucleus_search)  # the nucleus floor's search, 2x (bisection, now), 4x or 16x narrower a
        # pass (nucleus_floor's bits_per_pass: 16, 8 or 4 passes over bf16 logits); the fastest
        # becomes sampling.NUCLEUS_BITS_PER_PASS
        run nucleus_search 150 python3 -m bench.decode --variants default --batches 64 200 512 \
            --top-p 0.7 --samplers exact blocked-parts blocked-parts-x4 blocked-parts-x16
        ;;
    flex)  # FlexAttention's decoding kernel (one window, unwritten blocks skipped) against SDPA's
        run flex_step 240 python3 -m bench.decode --variants default static-shapes flex flex-static \
            --profile flex
        gen="python3 -m bench.generation --model qwen2.5-0.5b --sides flex flex-static static-shapes"
        run flex64 110 $gen --shapes 8x8x512 --repeats 3
        run flex512 110 $gen --shapes 64x8x512 --repeats 2
        # where a B = 512 rollout's time beyond its steps and sampling goes (~1.7 ms/pos, session 21)
        run gaps512 90 bash -c "python3 -m bench.generation --model qwen2.5-0.5b --shapes 64x8x512 \
            --sides --repeats 1 --trace /tmp/gen512.json && python3 -m bench.gaps /tmp/gen512.json \
            --min-us 50"
        ;;
    rollouts)  # whole rollouts: the default step against the flex and fixed-size ones (targets)
        gen="python3 -m bench.generation --model qwen2.5-0.5b --sides flex flex-static static-shapes"
        run rollouts64 120 $gen --shapes 8x8x512 --repeats 3
        run rollouts512 110 $gen --shapes 64x8x512 --repeats 2
        ;;
    rl_split2k)  # the RL step at 8 x 8 x 2048 alone (1 x 16 x 8192 ran past 300 s, session 20)
        run rl_split2k 160 python3 -m bench.rl_step --ours-only --model qwen2.5-0.5b \
            --shapes 8x8x2048 --steps 2
        ;;
    rl_flex)  # the same with rollout.decode_step=flex-static (cold compiles per batch size)
        run rl_flex 160 python3 -m bench.rl_step --ours-only --model qwen2.5-0.5b \
            --shapes 8x8x2048 --steps 2 --decode-step flex-static
        ;;
    first_calls)  # what each step's compilation costs a cold process, at each batch size
        for v in default flex static-shapes flex-static; do
            cache=$(mktemp -d)
            TORCHINDUCTOR_CACHE_DIR=$cache TRITON_CACHE_DIR=$cache/triton run "first_$v" 100 \
                python3 -m bench.decode --first-calls --variants $v --batches 512 --new 128
        done
        ;;
    autotune)  # Inductor's max-autotune for the step's products (flex-static-autotune): its first
        # compilation on a cold cache, its sampler-trainer mismatch (a CUDA test), the step
        # beside flex-static with its profile, and whole rollouts; one cache for the part
        cache=$(mktemp -d)
        export TORCHINDUCTOR_CACHE_DIR=$cache TRITON_CACHE_DIR=$cache/triton
        run first_autotune 120 python3 -m bench.decode --first-calls --variants flex-static-autotune \
            --batches 512 --new 128
        run autotune_test 90 python3 -m pytest -q -p no:cacheprovider -n 0 tests/tasks/test_gpu.py \
            -k autotune
        run autotune_step 150 python3 -m bench.decode --variants flex-static flex-static-autotune \
            --profile flex-static-autotune
        gen="python3 -m bench.generation --model qwen2.5-0.5b --sides flex-static flex-static-autotune"
        run autotune64 100 $gen --shapes 8x8x512 --repeats 3
        run autotune512 100 $gen --shapes 64x8x512 --repeats 2
        unset TORCHINDUCTOR_CACHE_DIR TRITON_CACHE_DIR
        ;;
    rl_split)  # our RL step with realistic response lengths, generation against training
        run rl_split 300 python3 -m bench.rl_step --ours-only --model qwen2.5-0.5b --shapes 8x8x2048 \
            1x16x8192 --steps 2
        ;;
    rl_step)  # ours against TRL (needs trl, datasets, dill, multiprocess in .whl)
        run rl_step 170 python3 -m bench.rl_step --model qwen2.5-0.5b --shapes 8x8x512 --rounds 1 \
            --steps 3
        ;;
    *) echo "unknown part $part: tests, sampling, update, decode, draw, step, nucleus, nucleus_search," \
            "flex, rollouts," \
            "rl_split2k, rl_flex, first_calls, autotune, rl_split or rl_step" >&2
       exit 2 ;;
    esac
done
