//! Loop IR verifiers. [`verify`] (after *lower*): every variable is bound
//! by an enclosing loop (once), loops kept `rolled` are serial or parallel,
//! accesses have one index per dimension, no reductions remain. [`verify_legal`] (after *legalize*): that, and only
//! operations backends translate one to one.

use crate::gpu::{RuleError, Site};
use crate::ir::{ForKind, LoopFunc, Stmt, TileDot};
use texc_compiler::ops::{BinOp, Intrinsic};
use texc_compiler::target::Target;
use texc_compiler::tir::{TExpr, TExprId, Ty};

/// A broken invariant of a loop nest, naming the loop, buffer or
/// expression node at fault.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum LoopError {
    #[error("`warp_reduce` by {lanes} lanes needs a one-dimensional `registers` buffer whose length they divide; `{buffer}` is not one")]
    WarpReduce { buffer: String, lanes: i64 },
    #[error("the `mma` tile of `{0}` does not fit its dimensions")]
    MmaTile(String),
    #[error("an `mma` tile of `{0}`, which `wgmma` reads in swizzled rows: `mma` reads it unswizzled")]
    MmaOfSwizzled(String),
    #[error("`mma {op}` needs `{buffer}` to be {want}, not {got}")]
    MmaType { op: &'static str, buffer: String, want: String, got: String },
    #[error("`wgmma {op}` reads `{buffer}` through a matrix descriptor, but {why}")]
    WgmmaLayout { op: String, buffer: String, why: String },
    #[error("the AMX tile product into `{buffer}`: {why}")]
    TileDot { buffer: String, why: String },
    #[error("loop variable `{0}` is bound twice")]
    BoundTwice(String),
    #[error("loop `{0}` is marked `rolled` but is neither serial nor parallel")]
    RolledNotSerial(String),
    #[error("loop `{0}` has a negative extent")]
    NegativeExtent(String),
    #[error("{what} of `{buffer}` has the wrong number of indices")]
    Rank { what: &'static str, buffer: String },
    #[error("node {0}: an index is not of type index")]
    IndexType(u32),
    #[error("store to `{buffer}` has type {ty}")]
    StoreType { buffer: String, ty: String },
    #[error("node {node}: variable {var} is used outside its loop")]
    Unbound { node: u32, var: u32 },
    #[error("node {0}: a reduction remains in the loop IR")]
    Reduction(u32),
    #[error("node {node}: `{op}` remains after legalization")]
    Unlegalized { node: u32, op: String },
    #[error("node {node}: intrinsic `{intrinsic}` is not one target `{target}` has")]
    Intrinsic { node: u32, intrinsic: String, target: String },
    #[error("{0}")]
    Race(String),
}

type R = Result<(), LoopError>;

/// An operand with the 128-byte swizzle: the buffer's last dimensions
/// `[M, 64]` (K-major) or `[N / 64, K, 64]` (MN-major, the operation's N
/// whole atoms of 64), after a pipeline's slot index; `sbo` 1024 (8 rows of
/// 128 bytes), MN-major `lbo` the atom's K × 128 bytes. The tile starts
/// where the swizzle's pattern does: at a row a multiple of 8 (and a
/// 16-byte chunk along K, K-major), at an atom (MN-major) — the
/// descriptor's start drops the address's low 4 bits, and its base offset
/// (for starts inside the 1024-byte pattern) stays 0.
fn swizzled_operand(f: &LoopFunc, m: &crate::ir::SmemMatrix, mn: i64, n: i64, bad: &dyn Fn(String) -> LoopError) -> R {
    use crate::ir::Major;
    let shape = &f.p.tensor(m.tensor).shape;
    let rank = shape.len();
    let (own, layout) = match m.major {
        Major::K => (2, "[M, 64]"),
        Major::Mn => (3, "[N / 64, K, 64]"),
    };
    if rank < own || shape[rank - 1] != 64 || m.origin.len() != rank || shape[rank - 2] % 8 != 0 {
        return Err(bad(format!("its shape is {shape:?}: the swizzled layout is {layout} (rows of 128 bytes)")));
    }
    let mn_extent = match m.major {
        Major::K => shape[rank - 2],
        Major::Mn => 64 * shape[rank - 3],
    };
    if mn_extent < mn || (m.major == Major::Mn && n % 64 != 0) {
        return Err(bad(format!(
            "its shape is {shape:?}: too small, or not whole 64-wide atoms, for {mn} along M or N"
        )));
    }
    let lbo = match m.major {
        Major::K => m.lbo,
        Major::Mn => 128 * shape[rank - 2],
    };
    if m.sbo != 1024 || m.lbo != lbo {
        return Err(bad(format!(
            "the descriptor says lbo {} and sbo {} bytes; the swizzled layout's are {lbo} and 1024",
            m.lbo, m.sbo
        )));
    }
    let eight = |i: TExprId| crate::analysis::multiple_of(&f.p, i, 8, None);
    let (row, last) = (m.origin[rank - 2], m.origin[rank - 1]);
    let starts = match m.major {
        Major::K => eight(row) && eight(last),
        Major::Mn => eight(row) && matches!(f.p.expr(last), TExpr::Int(0)),
    };
    if !starts {
        return Err(bad("the tile does not start where the swizzle's pattern does (a row a multiple of 8, \
                        a 16-byte chunk, or a 64-wide atom)"
            .into()));
    }
    Ok(())
}

/// A `wgmma`'s types, its `c` tile, and its operands' buffers in the layout
/// its descriptors give ([`crate::ir::SmemMatrix`]): swizzled, as
/// [`swizzled_operand`] says; else the last dimensions `[K / 8, MN, 8]`
/// (K-major) or `[K / 8, MN / 8, 8, 8]` (MN-major) of f16 or bf16, the
/// leading byte offset `16·MN`, the stride byte offset 128, the tile
/// starting at a core matrix (its indices within one 0), within the
/// buffer's M or N extent.
fn wgmma(f: &LoopFunc, w: &crate::ir::Wgmma, bound: &[bool]) -> R {
    let op = w.op.name();
    let c = f.p.tensor(w.c.tensor);
    let t = &w.c;
    if t.origin.len() != c.shape.len() || t.rows == t.cols || t.rows.max(t.cols) >= c.shape.len() {
        return Err(LoopError::MmaTile(c.name.clone()));
    }
    if c.elem != texc_compiler::types::ElemType::F32 {
        return Err(LoopError::WgmmaLayout {
            op,
            buffer: c.name.clone(),
            why: format!("it accumulates f32, not {}", c.elem),
        });
    }
    for (m, mn, _) in w.operands() {
        let d = f.p.tensor(m.tensor);
        let bad = |why: String| LoopError::WgmmaLayout { op: op.clone(), buffer: d.name.clone(), why };
        if d.elem != w.op.ab {
            return Err(bad(format!("it is {}, and the operation multiplies {}", d.elem, w.op.ab)));
        }
        let n = d.shape.len();
        if m.swizzled {
            swizzled_operand(f, m, mn, w.op.n, &bad)?;
            for &i in t.origin.iter().chain(&m.origin) {
                if f.p.ty(i) != Ty::Index {
                    return Err(LoopError::IndexType(i.0));
                }
                expr(f, i, bound)?;
            }
            continue;
        }
        // The layout's own dimensions, after a pipeline's slot index.
        let (rank, mn_extent) = match m.major {
            crate::ir::Major::K => (3, d.shape.get(n.wrapping_sub(2)).copied().unwrap_or(0)),
            crate::ir::Major::Mn => (4, 8 * d.shape.get(n.wrapping_sub(3)).copied().unwrap_or(0)),
        };
        let layout = if rank == 3 { "[K / 8, MN, 8]" } else { "[K / 8, MN / 8, 8, 8]" };
        let tail_ok = n >= rank && d.shape[n - 1] == 8 && (rank == 3 || d.shape[n - 2] == 8);
        if !tail_ok || m.origin.len() != n || mn_extent < mn {
            return Err(bad(format!(
                "its shape is {:?}: the descriptor's layout is {layout} (core matrices of 8 rows of 16 bytes)",
                d.shape
            )));
        }
        if m.lbo != 16 * mn_extent || m.sbo != 128 {
            return Err(bad(format!(
                "the descriptor says lbo {} and sbo {} bytes; the buffer's core matrices are {} apart along K \
                 and 128 along M or N",
                m.lbo,
                m.sbo,
                16 * mn_extent
            )));
        }
        let within = &m.origin[n + 1 - (rank - 1)..];
        if !within.iter().all(|&i| matches!(f.p.expr(i), TExpr::Int(0))) {
            return Err(bad("the tile starts inside a core matrix (its last indices are not 0)".into()));
        }
        for &i in t.origin.iter().chain(&m.origin) {
            if f.p.ty(i) != Ty::Index {
                return Err(LoopError::IndexType(i.0));
            }
            expr(f, i, bound)?;
        }
    }
    Ok(())
}

/// [`verify`], and that the iterations of parallel and vectorized loops
/// are proven independent ([`crate::independence`]): what *lower* produces.
pub fn verify_lowered(f: &LoopFunc) -> R {
    verify(f)?;
    crate::independence::check_loops(f).map_err(|c| LoopError::Race(c.message(f)))
}

pub fn verify(f: &LoopFunc) -> R {
    let mut bound = vec![false; f.vars.len()];
    let mut seen = vec![false; f.vars.len()];
    stmts(f, &f.body, &mut bound, &mut seen)
}

/// An AMX tile product's rules ([`TileDot`]): `i32` operands, each tile's
/// columns its tensor's last (contiguous) dimension, a block of at most
/// 32 × 32 accumulators, and `k` a whole number of 16-element steps.
fn tile_dot(f: &LoopFunc, d: &TileDot, bound: &[bool]) -> R {
    let err = |why: String| LoopError::TileDot { buffer: f.p.tensor(d.c.tensor).name.clone(), why };
    if !(1..=TileDot::MAX_ROWS).contains(&d.m) || !(1..=TileDot::MAX_COLS).contains(&d.n) {
        return Err(err(format!(
            "a block of {} × {} accumulators; at most {} × {}",
            d.m,
            d.n,
            TileDot::MAX_ROWS,
            TileDot::MAX_COLS
        )));
    }
    if d.k <= 0 || d.k % TileDot::K_STEP != 0 {
        return Err(err(format!("a sum over {} packed elements, not a multiple of {}", d.k, TileDot::K_STEP)));
    }
    for t in [&d.c, &d.a, &d.b] {
        let x = f.p.tensor(t.tensor);
        if t.origin.len() != x.shape.len() || t.rows == t.cols || t.rows.max(t.cols) >= x.shape.len() {
            return Err(LoopError::MmaTile(x.name.clone()));
        }
        if t.cols + 1 != x.shape.len() {
            return Err(err(format!(
                "the tile of `{}` runs its columns along a dimension that is not its last",
                x.name
            )));
        }
        if x.elem != texc_compiler::types::ElemType::I32 {
            return Err(err(format!("`{}` is {}, not i32 (four bytes packed to an element)", x.name, x.elem)));
        }
        for &i in &t.origin {
            if f.p.ty(i) != Ty::Index {
                return Err(LoopError::IndexType(i.0));
            }
            expr(f, i, bound)?;
        }
    }
    Ok(())
}

fn stmts(f: &LoopFunc, body: &[Stmt], bound: &mut Vec<bool>, seen: &mut Vec<bool>) -> R {
    for s in body {
        match s {
            Stmt::Barrier | Stmt::Async(_) => {}
            Stmt::Prefetch { offset, .. } => {
                if f.p.ty(*offset) != Ty::Index {
                    return Err(LoopError::IndexType(offset.0));
                }
                expr(f, *offset, bound)?;
            }
            Stmt::WarpReduce(w) => {
                let d = f.p.tensor(w.tensor);
                let fits = d.shape.len() == 1 && [2, 4, 8, 16, 32].contains(&w.lanes) && d.shape[0] % w.lanes == 0;
                if !f.registers.contains(&w.tensor) || !fits {
                    return Err(LoopError::WarpReduce { buffer: d.name.clone(), lanes: w.lanes });
                }
            }
            Stmt::Mma { op, c, a, b } => {
                let (ab, acc) = op.types();
                let swizzled = crate::ir::swizzled_buffers(f);
                for (t, elem) in [(c, acc), (a, ab), (b, op.b_type())] {
                    let d = f.p.tensor(t.tensor);
                    if swizzled.contains(&t.tensor) {
                        return Err(LoopError::MmaOfSwizzled(d.name.clone()));
                    }
                    if t.origin.len() != d.shape.len() || t.rows == t.cols || t.rows.max(t.cols) >= d.shape.len() {
                        return Err(LoopError::MmaTile(d.name.clone()));
                    }
                    if d.elem != elem {
                        let (want, got) = (elem.to_string(), d.elem.to_string());
                        return Err(LoopError::MmaType { op: op.name(), buffer: d.name.clone(), want, got });
                    }
                    for &i in &t.origin {
                        if f.p.ty(i) != Ty::Index {
                            return Err(LoopError::IndexType(i.0));
                        }
                        expr(f, i, bound)?;
                    }
                }
            }
            Stmt::Wgmma(w) => wgmma(f, w, bound)?,
            Stmt::TileDot(d) => tile_dot(f, d, bound)?,
            Stmt::For { var, extent, kind, body, .. } => {
                let v = *var as usize;
                if seen[v] {
                    return Err(LoopError::BoundTwice(f.vars[v].name.clone()));
                }
                if !matches!(kind, ForKind::Serial | ForKind::Parallel) && f.rolled.contains(var) {
                    return Err(LoopError::RolledNotSerial(f.vars[v].name.clone()));
                }
                if *extent < 0 {
                    return Err(LoopError::NegativeExtent(f.vars[v].name.clone()));
                }
                seen[v] = true;
                bound[v] = true;
                stmts(f, body, bound, seen)?;
                bound[v] = false;
            }
            Stmt::Alloc { body, .. } => stmts(f, body, bound, seen)?,
            Stmt::If { cond, then } => {
                expr(f, *cond, bound)?;
                stmts(f, then, bound, seen)?;
            }
            Stmt::Store { tensor, indices, value } => {
                if indices.len() != f.p.tensor(*tensor).shape.len() {
                    return Err(LoopError::Rank { what: "store", buffer: f.p.tensor(*tensor).name.clone() });
                }
                for &i in indices {
                    if f.p.ty(i) != Ty::Index {
                        return Err(LoopError::IndexType(i.0));
                    }
                    expr(f, i, bound)?;
                }
                if f.p.ty(*value) != Ty::Elem(f.p.tensor(*tensor).elem) {
                    let (buffer, ty) = (f.p.tensor(*tensor).name.clone(), f.p.ty(*value).to_string());
                    return Err(LoopError::StoreType { buffer, ty });
                }
                expr(f, *value, bound)?;
            }
        }
    }
    Ok(())
}

fn expr(f: &LoopFunc, e: TExprId, bound: &[bool]) -> R {
    match f.p.expr(e) {
        TExpr::Var(v) if !bound.get(*v as usize).copied().unwrap_or(false) => {
            return Err(LoopError::Unbound { node: e.0, var: *v });
        }
        TExpr::Reduce(..) => return Err(LoopError::Reduction(e.0)),
        TExpr::Load(t, idx) if idx.len() != f.p.tensor(*t).shape.len() => {
            return Err(LoopError::Rank { what: "load", buffer: f.p.tensor(*t).name.clone() });
        }
        _ => {}
    }
    for c in f.p.children(e) {
        expr(f, c, bound)?;
    }
    Ok(())
}

/// [`verify`], plus: no floor division or modulo remains, and every
/// intrinsic is one the target has.
pub fn verify_legal(f: &LoopFunc, target: &Target) -> R {
    verify(f)?;
    let mut seen = vec![false; f.p.exprs.len()];
    let mut bad = None;
    walk_exprs(&f.body, &mut |e| legal(f, e, target, &mut seen, &mut bad));
    bad.map_or(Ok(()), Err)
}

fn legal(f: &LoopFunc, e: TExprId, target: &Target, seen: &mut [bool], bad: &mut Option<LoopError>) {
    if std::mem::replace(&mut seen[e.0 as usize], true) || bad.is_some() {
        return;
    }
    match f.p.expr(e) {
        TExpr::Binary(op @ (BinOp::FloorDiv | BinOp::FloorMod), ..) => {
            *bad = Some(LoopError::Unlegalized { node: e.0, op: format!("{op:?}") });
        }
        TExpr::Intrinsic(i, _) if !target.has_intrinsic(*i) => {
            *bad = Some(LoopError::Intrinsic { node: e.0, intrinsic: i.to_string(), target: target.name.to_string() });
        }
        _ => {}
    }
    for c in f.p.children(e) {
        legal(f, c, target, seen, bad);
    }
}

/// What the target can run (errors in the user's schedule or `.loops`
/// file, not in texc): [`check_constructs`], and on a GPU the launch rules
/// of [`crate::gpu`] hold.
pub fn check_target(f: &LoopFunc, target: &Target) -> Result<(), RuleError> {
    check_constructs(f, target)?;
    if target.gpu.is_some() {
        crate::gpu::launches(f, target)?;
    }
    Ok(())
}

/// Every loop kind, buffer scope, statement and intrinsic of `f` is one
/// the target has: one walk, cheap enough to run before every code
/// generation (the launch rules, which may evaluate the nests, are the GPU
/// backends' own check there).
pub fn check_constructs(f: &LoopFunc, target: &Target) -> Result<(), RuleError> {
    /// `vector`: inside a vectorized loop.
    fn kinds(f: &LoopFunc, body: &[Stmt], target: &Target, vector: bool) -> Result<(), RuleError> {
        for s in body {
            match s {
                Stmt::For { var, kind, body, .. } => {
                    if !target.supports_loop(kind.loop_kind()) {
                        return Err(RuleError::at(
                            Site::Loop(*var),
                            format!(
                                "loop `{}` is{}, which target `{}` does not have",
                                f.vars[*var as usize].name,
                                kind.name(),
                                target.name
                            ),
                        ));
                    }
                    kinds(f, body, target, vector || *kind == crate::ir::ForKind::Vectorized)?
                }
                Stmt::Alloc { tensor, .. }
                    if target.gpu.is_none() && (f.shared.contains(tensor) || f.registers.contains(tensor)) =>
                {
                    let scope = if f.shared.contains(tensor) { "shared" } else { "registers" };
                    return Err(RuleError::at(
                        Site::Tensor(*tensor),
                        format!(
                            "`{}` is a {scope} buffer, which only GPU targets have; target `{}` has local ones",
                            f.p.tensor(*tensor).name,
                            target.name
                        ),
                    ));
                }
                Stmt::Barrier if target.gpu.is_none() => {
                    return Err(format!("barriers are for GPU targets; target `{}` is not one", target.name).into());
                }
                Stmt::Prefetch { tensor, .. } if !target.prefetches() => {
                    return Err(RuleError::at(
                        Site::Tensor(*tensor),
                        format!(
                            "target `{}` takes no software prefetches (only LLVM's CPU targets do: Cranelift has no \
                             prefetch instruction, GPU code none of texc's)",
                            target.name
                        ),
                    ));
                }
                Stmt::Prefetch { tensor, .. } if vector => {
                    return Err(RuleError::at(
                        Site::Tensor(*tensor),
                        "a prefetch is a scalar statement: it cannot be inside a vectorized loop".to_string(),
                    ));
                }
                Stmt::WarpReduce(w) if target.gpu.is_none() => {
                    return Err(RuleError::at(
                        Site::Tensor(w.tensor),
                        format!("warp reductions are for GPU targets; target `{}` is not one", target.name),
                    ));
                }
                Stmt::Mma { op, .. } if target.gpu.is_none() => {
                    return Err(format!(
                        "`mma {}` is a tensor-core operation of GPU targets; target `{}` is not one",
                        op.name(),
                        target.name
                    )
                    .into());
                }
                Stmt::Wgmma(w) if target.gpu.is_none_or(|g| g.sm < 90) => {
                    return Err(RuleError::at(
                        Site::Tensor(w.c.tensor),
                        format!(
                            "`wgmma {}` is a warpgroup tensor-core operation of Hopper (sm_90a); target `{}` does not \
                             have it (`mma_m16n8k16_*` runs on sm_80 and later)",
                            w.op.name(),
                            target.name
                        ),
                    ));
                }
                s => kinds(f, s.body(), target, vector)?,
            }
        }
        Ok(())
    }
    kinds(f, &f.body, target, false)?;
    if let Some((e, i)) = missing_intrinsic(f, target) {
        return Err(RuleError::at(
            Site::Expr(e),
            format!("`{i}` is an instruction target `{}` does not have", target.name),
        ));
    }
    Ok(())
}

/// The first target intrinsic in `f` (a `.loops` file's `@dot4`) that `target` lacks.
fn missing_intrinsic(f: &LoopFunc, target: &Target) -> Option<(TExprId, Intrinsic)> {
    fn find(f: &LoopFunc, e: TExprId, target: &Target) -> Option<(TExprId, Intrinsic)> {
        match f.p.expr(e) {
            TExpr::Intrinsic(i, _) if !target.has_intrinsic(*i) => Some((e, *i)),
            _ => f.p.children(e).into_iter().find_map(|c| find(f, c, target)),
        }
    }
    let mut found = None;
    walk_exprs(&f.body, &mut |e| {
        if found.is_none() {
            found = find(f, e, target);
        }
    });
    found
}

/// Call `visit` on the root expressions of every statement.
pub fn walk_exprs(body: &[Stmt], visit: &mut dyn FnMut(TExprId)) {
    for s in body {
        match s {
            Stmt::Barrier | Stmt::Async(_) | Stmt::WarpReduce(_) => {}
            Stmt::Prefetch { offset, .. } => visit(*offset),
            Stmt::Mma { c, a, b, .. } => [c, a, b].iter().flat_map(|t| &t.origin).for_each(|&i| visit(i)),
            Stmt::Wgmma(w) => w.origins().for_each(|&i| visit(i)),
            Stmt::TileDot(d) => d.origins().for_each(|&i| visit(i)),
            Stmt::For { body, .. } | Stmt::Alloc { body, .. } => walk_exprs(body, visit),
            Stmt::If { cond, then } => {
                visit(*cond);
                walk_exprs(then, visit);
            }
            Stmt::Store { indices, value, .. } => {
                indices.iter().for_each(|&i| visit(i));
                visit(*value);
            }
        }
    }
}
