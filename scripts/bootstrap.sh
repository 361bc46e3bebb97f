#!/usr/bin/env bash
# Installs what a fresh Debian 12 machine lacks to build and test texc.
# Idempotent: each step checks first and does nothing when already satisfied.
set -euo pipefail

need_apt=()
command -v cc >/dev/null 2>&1 || need_apt+=(gcc)
command -v python3 >/dev/null 2>&1 || need_apt+=(python3 python3-pip)
# `python3 -m venv` for the Python package's tests (scripts/test_python.sh):
# Debian's own python3 makes virtual environments with pip only with python3-venv.
case "$(command -v python3 || echo /usr/bin/python3)" in
    /usr/bin/python3) dpkg -s python3-venv >/dev/null 2>&1 || need_apt+=(python3-venv) ;;
esac
# LLVM 19 for the x86 and NVPTX backends (inkwell links LLVM's static
# libraries from llvm-19-dev; llvm-sys also wants Polly and zstd headers to
# be present).
[ -x /usr/lib/llvm-19/bin/llvm-config ] || need_apt+=(llvm-19-dev)
[ -e /usr/lib/llvm-19/lib/libPolly.a ] || need_apt+=(libpolly-19-dev)
[ -e /usr/include/zstd.h ] || need_apt+=(libzstd-dev)
[ -e /usr/include/zlib.h ] || need_apt+=(zlib1g-dev)
# MLIR 19 for the MLIR export (feature `mlir`: melior links the MLIR C API;
# its bindgen needs libclang), and mlir-opt/mlir-translate, which the tests
# use to lower, compile and run the exported MLIR.
[ -e /usr/lib/llvm-19/include/mlir-c/IR.h ] || need_apt+=(libmlir-19-dev)
[ -x /usr/lib/llvm-19/bin/mlir-opt ] || need_apt+=(mlir-19-tools)
[ -e /usr/lib/llvm-19/lib/libclang.so ] || need_apt+=(libclang-19-dev)
if [ ${#need_apt[@]} -gt 0 ]; then
    echo "bootstrap: installing ${need_apt[*]} with apt"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}"
fi

if ! command -v cargo >/dev/null 2>&1; then
    echo "bootstrap: cargo not found; install Rust (rustup) first" >&2
    exit 1
fi

# NumPy computes the conformance references (tests/reference/cases.py).
if ! python3 -c 'import numpy' >/dev/null 2>&1; then
    echo "bootstrap: installing numpy with pip"
    python3 -m pip install -q numpy 2>/dev/null || python3 -m pip install -q --break-system-packages numpy
fi

# ONNX models for the importer's tests (tests/onnx/models.py builds them with
# onnx's graph builder and takes reference outputs from ONNX Runtime; 37 MB).
if ! python3 -c 'import onnx, onnxruntime' >/dev/null 2>&1; then
    echo "bootstrap: installing onnx and onnxruntime with pip"
    python3 -m pip install -q onnx==1.23.2 onnxruntime==1.32.0 2>/dev/null \
        || python3 -m pip install -q --break-system-packages onnx==1.23.2 onnxruntime==1.32.0
fi

# scikit-learn for its 8x8 digits (inside the package, no download): the accuracy
# test of `texc quantize` trains a small CNN on them (texc/tests/quantize_cli.rs).
# About 165 MB installed, most of it SciPy, which scikit-learn requires.
if ! python3 -c 'import sklearn' >/dev/null 2>&1; then
    echo "bootstrap: installing scikit-learn with pip"
    python3 -m pip install -q scikit-learn==1.9.1 2>/dev/null \
        || python3 -m pip install -q --break-system-packages scikit-learn==1.9.1
fi

# CUDA's offline tools for the NVPTX backend, no GPU needed: `ptxas` (tests
# assemble every kernel's PTX) and libdevice (GPU math), from NVIDIA's PyPI
# wheel (40 MB). texc finds them through python3 (codegen/src/cuda.rs).
if ! python3 -c 'import nvidia.cuda_nvcc' >/dev/null 2>&1; then
    echo "bootstrap: installing nvidia-cuda-nvcc-cu12 (ptxas, libdevice) with pip"
    python3 -m pip install -q nvidia-cuda-nvcc-cu12==12.9.86 2>/dev/null \
        || python3 -m pip install -q --break-system-packages nvidia-cuda-nvcc-cu12==12.9.86
fi
# nvdisasm (5 MB): tests check that tensor-core kernels contain HMMA instructions.
if ! python3 -m pip show -q nvidia-cuda-nvdisasm >/dev/null 2>&1; then
    echo "bootstrap: installing nvidia-cuda-nvdisasm with pip"
    python3 -m pip install -q nvidia-cuda-nvdisasm==13.5.37 2>/dev/null \
        || python3 -m pip install -q --break-system-packages nvidia-cuda-nvdisasm==13.5.37
fi
