#!/usr/bin/env bash
# Packs what scripts/gpu.sh needs on a GPU machine that has no Rust, no LLVM
# and no network (only the NVIDIA driver, CUDA's tools and a PyTorch): the
# texc binary and the test binary (stripped; both link LLVM statically), the
# Python package's wheel (its extension too), the shared libraries they load
# that such a machine may lack, and an entry script.
#
#   bash scripts/gpu_bundle.sh DIR      (DIR inside the checkout, e.g. .dev)
#   then, on the GPU machine, in a copy of this checkout: bash DIR/run.sh
#
# The test binary finds the repository's files at the path it was built in
# ($PWD here); run.sh links that path to the copy when it does not exist.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:?usage: scripts/gpu_bundle.sh DIR}
mkdir -p "$dir/bins" "$dir/lib"
# texc itself optimized: `benches/gpu.py` reports its compile times too.
cargo build --release -p texc
suite=$(cargo test --no-run -p texc-tests --test suite --message-format=json | python3 -c 'import json, sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["executable"])')
strip -o "$dir/bins/texc" target/release/texc
# The wheel, for the Python package's tests on CUDA tensors (needs maturin:
# scripts/test_python.sh puts it in .venv-py).
maturin=$(command -v maturin || echo "$PWD/.venv-py/bin/maturin")
if [ -x "$maturin" ]; then
    out="$(cd "$dir" && pwd)/bins/wheel"
    # No auditwheel repair: what the extension loads beyond the C/C++
    # runtime travels in lib/ (below), not in the wheel.
    (cd python && "$maturin" build --release --locked --auditwheel skip --out "$out")
else
    echo "gpu_bundle: no maturin (run scripts/test_python.sh first): the bundle has no wheel" >&2
fi
strip -o "$dir/bins/suite" "$suite"
# The binaries' shared libraries (libffi, …), but not the C/C++ runtime
# every machine has.
ldd target/release/texc "$suite" | awk '$3 ~ /^\// {print $3}' | sort -u \
    | { grep -vE '/(libc|libm|libstdc\+\+|libgcc_s|ld-linux-x86-64|libz|libzstd|liblzma)\.so' || true; } \
    | xargs -r -I{} cp -L {} "$dir/lib/"
# The libdevice the tests here compiled against: the PTX snapshots hold its
# code, and a GPU machine's own CUDA may have another version.
libdevice=$(python3 -c 'import nvidia.cuda_nvcc as m, os; print(os.path.join(list(m.__path__)[0], "nvvm", "libdevice", "libdevice.10.bc"))' 2>/dev/null || true)
if [ -f "$libdevice" ]; then mkdir -p "$dir/bins/cuda/nvvm/libdevice" && cp "$libdevice" "$dir/bins/cuda/nvvm/libdevice/"; fi
(cd "$dir" && tar cf - bins | xz -6 -T0 > bins.tar.xz && tar cf - lib | xz -6 -T0 > lib.tar.xz && rm -r bins lib)
cat > "$dir/run.sh" <<RUN
#!/usr/bin/env bash
# Made by scripts/gpu_bundle.sh: unpack, then bash scripts/gpu.sh --prebuilt.
set -eu
here=\$(cd "\$(dirname "\$0")" && pwd)
repo=\$(cd "\$here/.." && pwd)
x=\$(mktemp -d)
tar xJf "\$here/bins.tar.xz" -C "\$x"
tar xJf "\$here/lib.tar.xz" -C "\$x"
# The machine's own copy of a library wins (a Debian one may need others in turn).
for l in "\$x"/lib/*; do
    [ -e "\$l" ] || continue
    n=\$(basename "\$l")
    if ldconfig -p | grep -q "\$n "; then rm "\$l"; fi
done
echo "bundle: libraries taken from the bundle: \$(ls "\$x/lib" | tr '\n' ' ')"
if [ -d "\$x/bins/cuda" ]; then export TEXC_CUDA_DIR=\$x/bins/cuda; fi
export LD_LIBRARY_PATH=\$x/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}
if [ ! -e "$PWD" ]; then mkdir -p "$(dirname "$PWD")"; ln -s "\$repo" "$PWD"; fi
exec bash "\$repo/scripts/gpu.sh" --prebuilt "\$x/bins"
RUN
echo "gpu_bundle: $(du -sh "$dir" | cut -f1) in $dir; run: bash $dir/run.sh"
