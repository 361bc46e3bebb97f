//! The loop IR: a kernel as nested loops over buffers.
//!
//! A [`LoopFunc`] keeps the specialized [`Program`] for its tensors, scalars,
//! parameters and expression arena (expressions are TIR expressions without
//! reductions, whose `Var`s are loop variables of [`LoopFunc::vars`]), and
//! adds a statement tree. Reductions have become explicit accumulation:
//! an init nest stores the identity, an update nest folds into the buffer.
//!
//! Invariants (checked by [`crate::verify`]): every `Var` is bound by an
//! enclosing `For`, each loop variable is bound once, loads and stores have
//! one index per dimension, and no expression contains a reduction.

use std::collections::BTreeSet;
use std::fmt::Write;
use texc_compiler::target::LoopKind;
use texc_compiler::tir::{Program, ProgramParam, TExpr, TExprId, TensorId, TensorRole, VarDecl, VarId};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ForKind {
    Serial,
    /// Iterations run on the thread pool.
    Parallel,
    /// Iterations become vector lanes.
    Vectorized,
    /// The loop is unrolled.
    Unrolled,
    /// Iterations are GPU blocks along one grid dimension (`bind ... to block.x`).
    Block(GpuDim),
    /// Iterations are GPU threads of a block along one dimension (`bind ... to thread.x`).
    Thread(GpuDim),
}

/// A dimension of a GPU grid or block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GpuDim {
    X,
    Y,
    Z,
}

impl GpuDim {
    pub const ALL: [GpuDim; 3] = [GpuDim::X, GpuDim::Y, GpuDim::Z];

    pub fn index(self) -> usize {
        self as usize
    }

    pub fn name(self) -> &'static str {
        match self {
            GpuDim::X => "x",
            GpuDim::Y => "y",
            GpuDim::Z => "z",
        }
    }

    pub fn parse(s: &str) -> Option<GpuDim> {
        GpuDim::ALL.into_iter().find(|d| d.name() == s)
    }
}

impl ForKind {
    /// The kind of loop a target must support to run this one.
    pub fn loop_kind(self) -> LoopKind {
        match self {
            ForKind::Serial => LoopKind::Serial,
            ForKind::Parallel => LoopKind::Parallel,
            ForKind::Vectorized => LoopKind::Vectorized,
            ForKind::Unrolled => LoopKind::Unrolled,
            ForKind::Block(_) => LoopKind::GpuBlock,
            ForKind::Thread(_) => LoopKind::GpuThread,
        }
    }

    /// The suffix the printer writes after a loop's range (` parallel`, ` block.x`).
    pub fn name(self) -> &'static str {
        match self {
            ForKind::Serial => "",
            ForKind::Parallel => " parallel",
            ForKind::Vectorized => " vectorized",
            ForKind::Unrolled => " unrolled",
            ForKind::Block(GpuDim::X) => " block.x",
            ForKind::Block(GpuDim::Y) => " block.y",
            ForKind::Block(GpuDim::Z) => " block.z",
            ForKind::Thread(GpuDim::X) => " thread.x",
            ForKind::Thread(GpuDim::Y) => " thread.y",
            ForKind::Thread(GpuDim::Z) => " thread.z",
        }
    }

    /// Whether the loop is bound to GPU blocks or threads.
    pub fn is_gpu(self) -> bool {
        matches!(self, ForKind::Block(_) | ForKind::Thread(_))
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Stmt {
    /// `var` takes the values `lo..lo + extent`.
    For {
        var: VarId,
        lo: i64,
        extent: i64,
        kind: ForKind,
        body: Vec<Stmt>,
    },
    /// Guard for the tails of splits that do not divide their extent.
    If {
        cond: TExprId,
        then: Vec<Stmt>,
    },
    /// A buffer private to each execution of `body` (a stack array).
    Alloc {
        tensor: TensorId,
        body: Vec<Stmt>,
    },
    Store {
        tensor: TensorId,
        indices: Vec<TExprId>,
        value: TExprId,
    },
    /// GPU targets: every thread of the block waits here until all have
    /// arrived (`bar.sync`), so that what threads stored to shared buffers
    /// before it is visible to all after it (see `crate::gpu`).
    Barrier,
}

#[derive(Clone, Debug)]
pub struct LoopFunc {
    pub p: Program,
    pub vars: Vec<VarDecl>,
    pub body: Vec<Stmt>,
    /// `Alloc`ated buffers that one GPU block's threads share (`in shared`);
    /// other `Alloc`s are private to whatever runs their body.
    pub shared: BTreeSet<TensorId>,
}

impl LoopFunc {
    /// Temporaries that the body writes and that live for the whole kernel
    /// (inlined stages and `Alloc`ated locals are not among them).
    pub fn live_temps(&self) -> Vec<TensorId> {
        let mut seen = vec![false; self.p.tensors.len()];
        let mut local = vec![false; self.p.tensors.len()];
        fn walk(s: &[Stmt], seen: &mut [bool], local: &mut [bool]) {
            for st in s {
                match st {
                    Stmt::For { body, .. } | Stmt::If { then: body, .. } => walk(body, seen, local),
                    Stmt::Alloc { tensor, body } => {
                        local[tensor.0 as usize] = true;
                        walk(body, seen, local)
                    }
                    Stmt::Store { tensor, .. } => seen[tensor.0 as usize] = true,
                    Stmt::Barrier => {}
                }
            }
        }
        walk(&self.body, &mut seen, &mut local);
        (0..self.p.tensors.len())
            .map(|i| TensorId(i as u32))
            .filter(|t| seen[t.0 as usize] && !local[t.0 as usize] && self.p.tensor(*t).role == TensorRole::Temp)
            .collect()
    }
}

/// Deterministic printer (`texc emit --stage loops`).
pub fn print(f: &LoopFunc) -> String {
    let mut out = String::new();
    let b: Vec<String> = f.p.bindings.iter().map(|(n, v)| format!("{n}={v}")).collect();
    let _ = writeln!(out, "func {} [{}]", f.p.name, b.join(", "));
    let decl = |t: TensorId| {
        let d = f.p.tensor(t);
        let dims: Vec<String> = d.shape.iter().map(|x| x.to_string()).collect();
        format!("{}: {}[{}]", d.name, d.elem, dims.join(", "))
    };
    if let Some(src) = &f.p.source {
        let _ = writeln!(out, "  source {src:?}");
    }
    for param in &f.p.params {
        match param {
            ProgramParam::Tensor(t) => {
                let _ = writeln!(out, "  input {}", decl(*t));
            }
            ProgramParam::Scalar(s) => {
                let s = &f.p.scalars[*s as usize];
                let d = s.default.map(|d| format!(" = {d:?}")).unwrap_or_default();
                let _ = writeln!(out, "  scalar {}: {}{d}", s.name, s.elem);
            }
        }
    }
    for &t in &f.p.outputs {
        let _ = writeln!(out, "  output {}", decl(t));
    }
    for t in f.live_temps() {
        let _ = writeln!(out, "  temp {}", decl(t));
    }
    stmts(f, &f.body, 1, &mut out);
    out
}

fn stmts(f: &LoopFunc, body: &[Stmt], depth: usize, out: &mut String) {
    let pad = "  ".repeat(depth);
    for s in body {
        match s {
            Stmt::For { var, lo, extent, kind, body } => {
                let _ =
                    writeln!(out, "{pad}for {} in {lo}..{}{}:", f.vars[*var as usize].name, lo + extent, kind.name());
                stmts(f, body, depth + 1, out);
            }
            Stmt::If { cond, then } => {
                let _ = writeln!(out, "{pad}if {}:", expr(f, *cond));
                stmts(f, then, depth + 1, out);
            }
            Stmt::Alloc { tensor, body } => {
                let d = f.p.tensor(*tensor);
                let dims: Vec<String> = d.shape.iter().map(|x| x.to_string()).collect();
                let what = if f.shared.contains(tensor) { "shared" } else { "local" };
                let _ = writeln!(out, "{pad}{what} {}: {}[{}]:", d.name, d.elem, dims.join(", "));
                stmts(f, body, depth + 1, out);
            }
            Stmt::Store { tensor, indices, value } => {
                let idx: Vec<String> = indices.iter().map(|i| expr(f, *i)).collect();
                let name = &f.p.tensor(*tensor).name;
                let lhs = if idx.is_empty() { name.clone() } else { format!("{name}[{}]", idx.join(", ")) };
                let _ = writeln!(out, "{pad}{lhs} = {}", expr(f, *value));
            }
            Stmt::Barrier => {
                let _ = writeln!(out, "{pad}barrier");
            }
        }
    }
}

/// Print one expression (loop variables by name).
pub fn expr(f: &LoopFunc, e: TExprId) -> String {
    // Reuse the TIR printer with a pseudo-stage whose variables are the loop variables.
    let st = texc_compiler::tir::Stage {
        tensor: TensorId(0),
        vars: f.vars.clone(),
        n_axes: f.vars.len(),
        value: e,
        span: Default::default(),
    };
    debug_assert!(!matches!(f.p.expr(e), TExpr::Reduce(..)));
    texc_compiler::print::expr(&f.p, &st, e)
}

/// The number of expression nodes code generation will emit for `f`: every
/// store's and guard's expression trees, times the copies that unrolled
/// loops make (vector lanes are one copy). Bounds compile time and code size.
pub fn emitted_size(f: &LoopFunc) -> u64 {
    fn tree(f: &LoopFunc, e: TExprId) -> u64 {
        1 + f.p.children(e).into_iter().map(|c| tree(f, c)).fold(0u64, u64::saturating_add)
    }
    fn walk(f: &LoopFunc, body: &[Stmt], copies: u64) -> u64 {
        body.iter()
            .map(|s| match s {
                Stmt::For { kind: ForKind::Unrolled, extent, body, .. } => {
                    walk(f, body, copies.saturating_mul((*extent).max(1) as u64))
                }
                Stmt::For { body, .. } | Stmt::Alloc { body, .. } => walk(f, body, copies),
                Stmt::If { cond, then } => copies.saturating_mul(tree(f, *cond)).saturating_add(walk(f, then, copies)),
                Stmt::Store { indices, value, .. } => {
                    let n = indices.iter().map(|&i| tree(f, i)).fold(tree(f, *value), u64::saturating_add);
                    copies.saturating_mul(n)
                }
                Stmt::Barrier => copies,
            })
            .fold(0u64, u64::saturating_add)
    }
    walk(f, &f.body, 1)
}
