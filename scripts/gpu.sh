#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: run the GPU tests on the device (every
# example, std operator and random GPU schedule against the interpreter; PTX
# assembled by ptxas), a few kernels with `run --check`, and the GPU
# benchmarks against PyTorch (benches/gpu.py), then print one table.
#
#   bash scripts/gpu.sh                   builds texc and the tests here first
#   bash scripts/gpu.sh --prebuilt DIR    uses DIR/{texc,suite}
#                                         (a GPU machine without Rust: see
#                                         scripts/gpu_bundle.sh)
# Full logs go to $LOG_DIR (default: a new temporary directory). Without a
# GPU the same tests run the CPU emulation and say so. GPU_TESTS=0 skips
# the tests and checks; GPU_PYTHON=0 the Python package's tests and timings
# on CUDA tensors (python/tests, benches/gpu_python.py: the wheel DIR/wheel
# of a bundle, or one maturin builds here); GPU_BENCH=0 benches/gpu.py;
# GPU_BENCH_ARGS are more arguments of benches/gpu.py (`--tune 12 --budget 30`,
# `--only igemm`); GPU_TEST_MODULES the test modules to run (`gpu`).
set -uo pipefail
cd "$(dirname "$0")/.."
logs=${LOG_DIR:-$(mktemp -d)}
if [ "${1:-}" = --prebuilt ]; then
    bin=${2:?--prebuilt DIR}
    texc=$bin/texc
    suite=$bin/suite
    wheel=$(ls "$bin"/wheel/*.whl 2>/dev/null | head -1)
    [ -x "$suite" ] || { echo "gpu.sh: no test binary $suite (a bundle made before tests/tests/suite.rs?)" >&2; exit 1; }
    # No cargo to ask for the workspace: the snapshots are under this checkout.
    export INSTA_WORKSPACE_ROOT=$PWD
else
    bash scripts/bootstrap.sh
    cargo build --release -p texc || exit 1
    texc=target/release/texc
    suite=$(cargo test --release --no-run -p texc-tests --test suite --message-format=json | python3 -c 'import json, sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["executable"])')
    [ -n "$suite" ] || exit 1
    wheel=
    if [ "${GPU_PYTHON:-1}" = 1 ] && command -v maturin >/dev/null; then
        (cd python && maturin build --release --locked --auditwheel skip --out "$logs/wheel") >"$logs/wheel.log" 2>&1
        wheel=$(ls "$logs"/wheel/*.whl 2>/dev/null | head -1)
    fi
fi
nvidia-smi -L 2>/dev/null || echo "gpu.sh: nvidia-smi not found: the tests will say whether the CUDA driver is there"
status=0
summary=()
# The test files (modules of the one test binary, tests/tests/suite.rs) that
# run kernels on GPU targets.
# GPU_TEST_MODULES: fewer of them, separated by spaces.
read -r -a modules <<< "${GPU_TEST_MODULES:-gpu backends pipeline}"
[ "${GPU_TESTS:-1}" = 0 ] && modules=()
for name in "${modules[@]}"; do
    # The conformance set on the GPU targets only (the CPU ones run in CI).
    # A kernel that hangs on the GPU costs one module's tests, not the run.
    TEXC_TEST_TARGETS=nvptx-sm80,nvptx-sm90 timeout "${GPU_TEST_TIMEOUT_S:-300}" "$suite" "$name::" --nocapture \
        >"$logs/test-$name.log" 2>&1 || status=1
    grep -E "^test .*(FAILED|ok)$|running on|skipped|panicked" "$logs/test-$name.log" | sort | uniq -c | sort -rn | head -40
    summary+=("tests/$name: $(grep -E '^test result' "$logs/test-$name.log" | tail -1)")
done
checks=()
targets=(nvptx-sm80 nvptx-sm90)
[ "${GPU_TESTS:-1}" = 0 ] && targets=()
for t in "${targets[@]}"; do
    for k in "examples/softmax.tex" "examples/norms.tex --kernel ln" "examples/matmul.tex" \
             "examples/conv2d.tex" "examples/gemm_f16.tex" "examples/gemm_f16.tex --shape M=512,K=320,N=384" \
             "examples/gemm_f16.tex --shape M=512,K=320,N=384 --knob wgmma=0" \
             "benches/gemm_bf16.tex --shape M=384,K=256,N=512" \
             "benches/gemm_tf32.tex --shape M=256,K=128,N=256" "benches/hgemm_shared.tex --shape M=256,K=96,N=384" \
             "benches/hgemm_pipelined.tex --shape M=256,K=160,N=384" "benches/gemm_bf16.tex --shape M=256,K=96,N=128" \
             "benches/hgemm_wgmma.tex --shape M=256,K=192,N=384" \
             "benches/conv_f16.tex --shape N=2,C=32,H=18,W=20,K=48" \
             "benches/conv_f16.tex --shape N=2,C=32,H=18,W=20,K=48 --knob gather=0" \
             "benches/matmul.tex --shape M=200,K=96,N=130" "benches/conv_layer.tex --shape N=2,C=32,H=14,W=14" \
             "examples/softmax.tex --shape N=1000,D=4097" "benches/layer_norm.tex --shape N=999,D=4096"; do
        [ "$t" = nvptx-sm80 ] && [[ $k == *tf32* || $k == *hgemm_* ]] && continue  # schedules written for sm90
        # shellcheck disable=SC2086 # the kernel's arguments are words
        line=$(timeout 120 "$texc" run $k --target "$t" --check 2>&1 | grep -E "check|error" | head -3 | tr '\n' ' ')
        checks+=("$t $k: $line")
        [[ $line == *error:* ]] && status=1
    done
done
# The Python package on CUDA tensors (issue 39), installed from the wheel
# into a directory of its own; the machine's PyTorch, NumPy and pytest.
if [ "${GPU_PYTHON:-1}" = 1 ]; then
    if [ -n "${wheel:-}" ]; then
        site=$(mktemp -d)
        python3 -m pip install -q --no-deps --no-index --target "$site" "$wheel" >"$logs/pip.log" 2>&1 || status=1
        PYTHONPATH=$site TEXC_CACHE_DIR=$logs/cache timeout 600 python3 -m pytest -q -rs python/tests \
            >"$logs/test-python.log" 2>&1 || status=1
        grep -E "passed|failed|error" "$logs/test-python.log" | tail -3
        summary+=("python/tests: $(tail -1 "$logs/test-python.log")")
        PYTHONPATH=$site timeout 300 python3 benches/gpu_python.py --texc "$texc" 2>&1 | tee "$logs/bench-python.log" || status=1
    else
        summary+=("python/tests: not run (no wheel: a bundle without one, or no maturin here)")
    fi
fi
echo
echo "# scripts/gpu.sh: logs in $logs"
printf '%s\n' "${summary[@]}" "${checks[@]}"
echo
[ "${GPU_BENCH:-1}" = 0 ] && exit $status
# shellcheck disable=SC2086 # GPU_BENCH_HGEMM: more GEMM schedules to time, separated by spaces
python3 benches/gpu.py --texc "$texc" ${GPU_BENCH_HGEMM:+--hgemm $GPU_BENCH_HGEMM} ${GPU_BENCH_ARGS:-} 2>&1 | tee "$logs/bench.log" | grep -v "^#" || status=1
exit $status
