//! Every cross-crate test in one test binary: each file beside this one is a
//! module of it. One binary, not one per file, because each links texc's
//! whole back end (LLVM, and MLIR's static libraries through `texc-mlir`):
//! two dozen such binaries took about 7 GB of disk and two dozen links of a
//! third of a gigabyte each. Run one file's tests with its module as the
//! filter: `cargo test -p texc-tests --test suite transpose::`.

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
