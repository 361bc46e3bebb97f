#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: build texc, run the GPU tests on the
# device (every example, std operator and random GPU schedule against the
# interpreter; PTX assembled by ptxas), and run a few kernels with --check.
# Without a GPU the same tests run the CPU emulation and say so.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
nvidia-smi -L 2>/dev/null || echo "gpu.sh: nvidia-smi not found: the tests will say whether the CUDA driver is there"
cargo build --release -p texc
cargo test -p texc-tests --test gpu --test backends -- --nocapture 2>&1 | grep -E "^test |running on|skipped|ptxas -arch|test result"
for t in nvptx-sm80 nvptx-sm90; do
    for k in "examples/softmax.tex" "examples/norms.tex --kernel ln" "examples/matmul.tex" \
             "examples/conv2d.tex" "examples/gemm_f16.tex"; do
        # shellcheck disable=SC2086 # the kernel's arguments are words
        ./target/release/texc run $k --target "$t" --check 2>&1 | grep -E "check|error" || true
    done
done
