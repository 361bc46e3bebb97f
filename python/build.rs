//! Links the extension module with the functions a run uses laid out
//! together, as the `texc` executable is (`texc/build.rs`): loading the
//! module runs LLVM's static constructors, scattered across its code.
//! MEASURED (Zen 4, release build, `ctypes.CDLL` of `lib_texc.so` then
//! `VmRSS`): 49.5 → 25.0 MiB resident, bare Python 13.5.
#[path = "../texc/link/order.rs"]
mod order;

fn main() {
    order::order_functions("cdylib", "../texc/link/text-order.txt.gz");
}
