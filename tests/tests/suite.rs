//! Every cross-crate test in one test binary: each file beside this one is a
//! module of it. One binary, not one per file, because each links texc's
//! whole back end (with the feature `mlir`, LLVM and MLIR statically, through
//! `mlir-sys`): two dozen such binaries took about 7 GB of disk and two dozen
//! links of a third of a gigabyte each. Run one file's tests with its module
//! as the filter: `cargo test -p texc-tests --test suite transpose::`.

mod analysis;
mod attention;
mod backends;
mod check;
mod conformance;
mod constants;
mod gpu;
mod guard_pages;
mod int8;
mod interp_fast;
mod limits;
mod loops_text;
mod memory_plan;
#[cfg(feature = "mlir")]
mod mlir;
mod passes;
mod pipeline;
mod races;
mod rewrite;
mod robustness;
mod schedules;
mod semantics;
mod snapshots;
mod transpose;
