#!/usr/bin/env bash
# The Python package (python/, docs/python.md): build it into a virtual
# environment and run its tests. Part of scripts/test.sh; runs alone too.
# Idempotent: the environment (.venv-py, gitignored) and its tools are made
# once; the package is rebuilt in the dev profile (pyproject.toml) in the
# workspace (python/ is a member), with the features `cargo test --features
# texc/mlir,texc-tests/mlir` resolves, so it reuses every artifact `cargo
# test` compiled and only builds and links the extension.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="$PWD/.venv-py"
if [ ! -x "$venv/bin/python" ]; then
    echo "test_python: creating $venv"
    python3 -m venv "$venv"
fi
if ! "$venv/bin/python" -m pip show -q maturin pytest numpy onnx >/dev/null 2>&1; then
    echo "test_python: installing maturin, pytest, numpy and onnx (a test builds a model) into $venv"
    "$venv/bin/python" -m pip install -q maturin==1.16.0 pytest==9.2.0 numpy==2.4.6 onnx==1.23.2
fi
# `mlir`: as the root's tests build texc-pipeline (scripts/test.sh), so that
# no dependency is compiled again with other features.
log="$(mktemp)"
if ! (cd python && VIRTUAL_ENV="$venv" PATH="$venv/bin:$PATH" maturin develop --locked --features mlir) >"$log" 2>&1; then
    cat "$log"
    exit 1
fi
# After `cargo test` (scripts/test.sh sets TEXC_TESTS_BUILT), a texc crate
# compiled again means the two builds resolved different features (a new
# dependency's): the Python part of CI would take minutes instead of
# seconds. Find the cause by comparing the two unit graphs (`cargo test
# --workspace --features texc/mlir,texc-tests/mlir --no-run --unit-graph` against `cargo
# rustc --features mlir --lib --crate-type cdylib --unit-graph` in python/,
# `-Z unstable-options`).
again="$(grep -E '^ *Compiling texc-' "$log" | grep -v 'texc-python' || true)"
rm -f "$log"
if [ "${TEXC_TESTS_BUILT:-0}" = 1 ] && [ -n "$again" ]; then
    echo "test_python: maturin compiled texc's crates again after cargo test (features differ):" >&2
    echo "$again" >&2
    exit 1
fi
# The compile cache of the tests stays in the target directory (as cargo's tests' does).
TEXC_CACHE_DIR="$PWD/target/texc-cache" "$venv/bin/python" -m pytest -q python/tests
# The README's install line in a fresh virtual environment (issue 39): the
# wheel builds (sharing the workspace's target directory), installs with
# its dependencies, and runs a kernel.
fresh="$(mktemp -d)"
trap 'rm -rf "$fresh"' EXIT
python3 -m venv "$fresh/venv"
# `MATURIN_PEP517_ARGS`: the same features as above, for the same reason; a
# user's `pip install ./python` builds the same code without the MLIR export.
MATURIN_PEP517_ARGS="--features mlir" "$fresh/venv/bin/pip" install -q ./python
(cd "$fresh" && TEXC_CACHE_DIR="$fresh/cache" "$fresh/venv/bin/python" - <<'PY'
import numpy as np, texc
k = texc.compile("kernel twice(X: f32[N]) -> Y: f32[N] { Y[i] = 2.0 * X[i]; }", shapes={"N": 5})
x = np.arange(5, dtype=np.float32)
assert np.array_equal(k(x), 2 * x), k(x)
print(f"test_python: texc {texc.__version__} installs in a fresh environment and runs ({k})")
PY
)
