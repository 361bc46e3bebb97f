//! texc semantics: from parsed files to a checked, specialized tensor IR, and
//! the reference interpreter that runs it.
//!
//! Passes (sequenced by `texc-pipeline`): [`session`] parses files and
//! imports → [`resolve`] checks names and types (shape-agnostic), filling
//! [`kernel`] types → [`specialize`] binds sizes, inlines calls and lowers to
//! [`tir`] (with [`bounds`] proving every access in range; [`verify`] checks
//! it) → [`rewrite`] (e-graph, cost model) → scheduling → [`interp`] or a
//! backend.
//!
//! Shared by every later layer: the IR's operator set ([`ops`]) and what each
//! operator computes ([`semantics`]), affine forms ([`affine`]), expression
//! legalization for a target ([`legalize`]), and the [`target`] registry.

pub mod affine;
pub mod bounds;
pub mod constants;
pub mod cost;
pub mod graph;
pub mod interp;
pub mod kernel;
pub mod legalize;
pub mod nn;
pub mod ops;
pub mod print;
pub mod recognize;
pub mod resolve;
pub mod rewrite;
pub mod semantics;
pub mod session;
pub mod specialize;
pub mod symbolic;
pub mod target;
pub mod tir;
pub mod types;
pub mod verify;

pub use kernel::KernelRef;
pub use session::Session;
pub use specialize::Bindings;
pub use target::Target;
pub use tir::Program;
