#!/usr/bin/env bash
# The README's first command: install what a fresh Debian 12 machine lacks
# (LLVM 19 and friends, via bootstrap.sh; idempotent), build texc, then do
# texc's main job on a real kernel: compile the ResNet-50 3x3 convolution
# layer (examples/conv_resnet.tex) for this machine's CPU, run it on seeded
# random inputs, check it against the reference interpreter, and time it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
echo "example: building texc (the first build takes several minutes)" >&2
cargo build -q --locked --bin texc
texc=target/debug/texc
set -x
"$texc" check examples/conv_resnet.tex
"$texc" run examples/conv_resnet.tex --target host --check
"$texc" bench examples/conv_resnet.tex --target host --repeat 10
