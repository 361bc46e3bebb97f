#!/usr/bin/env bash
# The test command (README.md, .ci/run): install what is missing, then run
# every test of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
cargo fmt --all -- --check
# `mlir`: the MLIR export is built and its tests run (tests/tests/mlir.rs).
cargo test --workspace --locked --features texc/mlir,texc-tests/mlir
# The Python package: built with maturin into .venv-py, tested with pytest;
# it fails if that build compiles a texc crate the tests' build made.
TEXC_TESTS_BUILT=1 bash scripts/test_python.sh
