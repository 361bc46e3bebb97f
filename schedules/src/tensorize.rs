//! The *tensorize* step of lowering: the three innermost loops of a stage
//! that a schedule tensorizes (`tensorize C(ii, ji, ki) with op`) become
//! one tensor-core operation per warp ([`Stmt::Mma`]).
//!
//! It runs on the lowered loop nest. The stage's update nest must end in
//! the three loops, perfectly nested, each as long as the op's tile
//! (16, 8, 16), without guards (the tiles divide the tensors), around the
//! accumulation `C[..] = C[..] + f32(A[..]) * f32(B[..])`, where each
//! operand is indexed by its two tile loops with coefficient 1, each in its
//! own dimension, and by none of the third. The tiles' origins are the
//! indices with the three loops at 0. Anything else is an error that says
//! what differs; nothing is left untensorized silently.
//!
//! On CPUs with AMX-INT8, `amx_dpbusd` makes a [`TileDot`] of every copy
//! of the three loops (a block's last, shorter copies too) around
//! `C[..] = C[..] + @dot4(0, A[..], B[..])` (or the stage's local
//! accumulators): at most 32 × 32 accumulators, the sum a multiple of 16
//! packed elements, each operand's columns its last dimension. A copy of
//! the loops around anything else (the accumulators' zeroing or
//! write-back) is not one: left as it is, as it computes the same.
//!
//! A warpgroup's `wgmma` (64 × N × 16) reads `A` and `B` from shared
//! buffers through matrix descriptors, so this pass also lays those
//! buffers out as the descriptors say ([`SmemMatrix`]). Where a row of the
//! layout can be a whole 128 bytes — `A`'s buffer 64 wide along K, `B`'s a
//! multiple of 64 along N — with the 128-byte swizzle: `As[m, k]` as it
//! is, `Bs[k, n]` becoming `Bs[n / 64, k, n % 64]` (MN-major), each row's
//! 16-byte chunks permuted by the row where they are stored
//! (`crate::ir::swizzle128`, applied by the backends to every access), so
//! that a warp's copies of whole rows coalesce. Otherwise core matrices of
//! 8 × 8 without swizzling: `A` K-major, a buffer `As[m, k]`
//! becoming `As[k / 8, m, k % 8]`; `B` MN-major (its rows of 8 along N
//! stay 16 contiguous bytes, as in the global tensor, so its copies stay
//! 16-byte wide), `Bs[k, n]` becoming `Bs[k / 8, n / 8, k % 8, n % 8]`;
//! every store and load rewritten, and the operation's operands pointing
//! at their tiles' first elements. Such a buffer is 2-D, in shared memory,
//! its K extent (and N extent, for `B`) a multiple of 8 and each tile's
//! origin along them a provable multiple of 8. An index `8·a + b` with `b`
//! a loop from 0 below 8 (a vectorized copy's lane) splits into `a` and
//! `b` rather than `(8·a + b) / 8` and `% 8`, so that the copies stay
//! visibly contiguous.

use crate::analysis::{coefficient, involves};
use crate::ir::{ForKind, LoopFunc, Major, SmemMatrix, Stmt, TensorOp, Tile, TileDot, Wgmma};
use crate::normalize::subst;
use crate::schedule::Schedules;
use std::collections::HashMap;
use std::collections::HashSet;
use texc_compiler::ops::BinOp;
use texc_compiler::ops::Intrinsic;
use texc_compiler::tir::{TExpr, TExprId, TensorId, Ty, VarId};
use texc_compiler::types::ElemType;
use texc_grammar::Diagnostic;

/// Replace every tensorized stage's innermost loops by its `mma` (every
/// copy of them, for an AMX tile product, whose loops may be a block's
/// shorter last one).
pub fn tensorize(f: &mut LoopFunc, s: &Schedules) -> Result<(), Diagnostic> {
    for (si, ss) in s.stages.iter().enumerate() {
        let Some(t) = &ss.tensorize else { continue };
        let names: Vec<String> = t.leaves.iter().map(|&l| ss.ivs[l].name.clone()).collect();
        // The stage's own tensor, or the local accumulators it is computed in.
        let tensor = match &ss.cache_write {
            Some((_, acc)) => f.p.tensors.iter().position(|d| &d.name == acc).map(|i| TensorId(i as u32)),
            None => None,
        }
        .unwrap_or(f.p.stages[si].tensor);
        let want = Want { tensor, names: &names, op: t.op };
        let mut body = std::mem::take(&mut f.body);
        let mut relayouts = Vec::new();
        let found = if t.op == TensorOp::TileDot {
            replace_tile_dots(f, &mut body, &want).map(|n| n > 0)
        } else {
            replace(f, &mut body, &want, &mut relayouts)
        };
        f.body = body;
        match found {
            Ok(true) => {
                for r in relayouts {
                    relayout(f, r).map_err(|why| Diagnostic::at(t.span, why))?;
                }
            }
            Ok(false) => {
                return Err(Diagnostic::at(
                    t.span,
                    format!(
                        "no loop nest of `{}` ends in `{}`, perfectly nested and without guards: the tiles must \
                         divide the tensor (its extents multiples of {:?}), and nothing may sit between the loops",
                        f.p.tensor(tensor).name,
                        names.join("`, `"),
                        t.op.shape()
                    ),
                ))
            }
            Err(why) => return Err(Diagnostic::at(t.span, why)),
        }
    }
    Ok(())
}

struct Want<'a> {
    tensor: TensorId,
    /// Loop names of the m, n and k extents.
    names: &'a [String],
    op: TensorOp,
}

/// A wgmma operand's shared buffer to lay out as its descriptor says: its
/// M-or-N and K dimensions.
#[derive(Clone, Copy, PartialEq)]
struct Relayout {
    tensor: TensorId,
    mn: usize,
    k: usize,
    major: Major,
    swizzled: bool,
}

/// Replace the first matching nest in `body`; whether one was found.
fn replace(f: &mut LoopFunc, body: &mut [Stmt], w: &Want, relayouts: &mut Vec<Relayout>) -> Result<bool, String> {
    for s in body.iter_mut() {
        if let Some(mma) = matching(f, s, w, relayouts)? {
            *s = mma;
            return Ok(true);
        }
        let found = match s {
            Stmt::For { body, .. } | Stmt::If { then: body, .. } | Stmt::Alloc { body, .. } => {
                replace(f, body, w, relayouts)?
            }
            Stmt::Store { .. }
            | Stmt::Barrier
            | Stmt::Async(_)
            | Stmt::WarpReduce(_)
            | Stmt::Mma { .. }
            | Stmt::Wgmma(_)
            | Stmt::TileDot(_)
            | Stmt::Prefetch { .. } => false,
        };
        if found {
            return Ok(true);
        }
    }
    Ok(false)
}

/// `s` as an `mma`, if it is the three loops around the stage's accumulation.
fn matching(f: &mut LoopFunc, s: &Stmt, w: &Want, relayouts: &mut Vec<Relayout>) -> Result<Option<Stmt>, String> {
    let mut vars: [Option<VarId>; 3] = [None; 3];
    let mut at = s;
    for _ in 0..3 {
        let Stmt::For { var, extent, kind, body, .. } = at else { return Ok(None) };
        let name = &f.vars[*var as usize].name;
        let Some(role) = w.names.iter().position(|n| n == name) else { return Ok(None) };
        let (m, n, k) = w.op.shape();
        let want = [m, n, k][role];
        if *kind != ForKind::Serial || *extent != want || vars[role].is_some() {
            return Err(format!(
                "loop `{name}` has {extent} iterations{}, but a tile is {want} long: the tiles must divide the tensors",
                kind.name()
            ));
        }
        vars[role] = Some(*var);
        let [inner] = body.as_slice() else {
            return Err(format!("loop `{name}` holds more than the tensorized loops and the accumulation"));
        };
        at = inner;
    }
    let Stmt::Store { tensor, indices, value } = at else {
        return Err(format!(
            "the tensorized loops hold a guard, not the accumulation into `{}`: the tiles must divide the tensors",
            f.p.tensor(w.tensor).name
        ));
    };
    if *tensor != w.tensor {
        return Ok(None);
    }
    let [m, n, k] = vars.map(|v| v.expect("three loops"));
    let (a, b) = accumulation(f, *value, *tensor, indices).ok_or_else(|| {
        format!(
            "`{}` is not computed as a sum of products `f32(A) * f32(B)` (or `A * B` of f32, or `i32(A) * i32(B)`)",
            f.p.tensor(w.tensor).name
        )
    })?;
    // The operand indexed by m and k is `a`, by k and n `b`.
    let (a, b) = if uses(f, &a.1, m) { (a, b) } else { (b, a) };
    let want = [w.op.types().0, w.op.b_type()];
    for ((t, _), ab) in [&a, &b].into_iter().zip(want) {
        if f.p.tensor(*t).elem != ab {
            return Err(format!(
                "`{}` is {}, but the operation multiplies {ab}",
                f.p.tensor(*t).name,
                f.p.tensor(*t).elem
            ));
        }
    }
    let c = tile(f, *tensor, indices, m, n, k)?;
    let a = tile(f, a.0, &a.1, m, k, n)?;
    let b = tile(f, b.0, &b.1, k, n, m)?;
    match w.op {
        TensorOp::Mma(op) => Ok(Some(Stmt::Mma { op, c, a, b })),
        TensorOp::Wgmma(op) => {
            // `a`'s rows run along M and `b`'s columns along N; K is the other dimension of each.
            let a = operand(f, a, true, Major::K, relayouts)?;
            let b = operand(f, b, false, Major::Mn, relayouts)?;
            Ok(Some(Stmt::Wgmma(Box::new(Wgmma { op, c, a, b }))))
        }
        TensorOp::TileDot => unreachable!("tile products are matched by `tile_dot`"),
    }
}

/// Replace every nest in `body` that [`tile_dot`] matches; how many.
/// A tile product right after the nest that zeroes its accumulators
/// starts from zero instead ([`TileDot::zero`]: `tilezero`), and the nest
/// goes where it zeroes the tile alone (where it zeroes more, it stays for
/// the rest).
fn replace_tile_dots(f: &mut LoopFunc, body: &mut Vec<Stmt>, w: &Want) -> Result<usize, String> {
    let mut n = 0;
    let mut i = 0;
    while i < body.len() {
        if let Some(mut d) = tile_dot(f, &body[i], w)? {
            let zeroed = if i > 0 { zeroes(f, &body[i - 1], &d) } else { None };
            d.zero = zeroed.is_some();
            if zeroed == Some(Zeroes::Tile) {
                body.remove(i - 1);
                i -= 1;
            }
            body[i] = Stmt::TileDot(Box::new(d));
            n += 1;
        } else if let Stmt::For { body: inner, .. } | Stmt::If { then: inner, .. } | Stmt::Alloc { body: inner, .. } =
            &mut body[i]
        {
            n += replace_tile_dots(f, inner, w)?;
        }
        i += 1;
    }
    Ok(n)
}

/// What a nest storing 0 before a tile product zeroes ([`zeroes`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Zeroes {
    /// Exactly the product's accumulator tile.
    Tile,
    /// The tile and more of its block, from the tile's origin: a last
    /// block of columns inside a group of blocks (`strategy::cpu::tiles`)
    /// keeps a guard on its columns, which bounds the product and the
    /// write-back but not the zeroing.
    Block,
}

/// Whether `s` is two loops storing 0 to `d`'s accumulator tile (and to
/// what more of a 32 × 32 block, from the tile's origin).
fn zeroes(f: &mut LoopFunc, s: &Stmt, d: &TileDot) -> Option<Zeroes> {
    let Stmt::For { var: va, lo: la, extent: ea, body, .. } = s else { return None };
    let [Stmt::For { var: vb, lo: lb, extent: eb, body, .. }] = body.as_slice() else { return None };
    let [Stmt::Store { tensor, indices, value }] = body.as_slice() else { return None };
    if *tensor != d.c.tensor || !matches!(f.p.expr(*value), TExpr::Int(0)) {
        return None;
    }
    let (indices, (va, la, ea), (vb, lb, eb)) = (indices.clone(), (*va, *la, *ea), (*vb, *lb, *eb));
    [((va, la, ea), (vb, lb, eb)), ((vb, lb, eb), (va, la, ea))].into_iter().find_map(|((r, rl, re), (c, cl, ce))| {
        let covers = (d.m..=TileDot::MAX_ROWS).contains(&re) && (d.n..=TileDot::MAX_COLS).contains(&ce);
        let at_origin = covers
            && tile_from(f, *tensor, &indices, (r, rl), (c, cl), None)
                .is_ok_and(|t| (t.rows, t.cols) == (d.c.rows, d.c.cols) && same(f, &t.origin, &d.c.origin));
        at_origin.then_some(if (re, ce) == (d.m, d.n) { Zeroes::Tile } else { Zeroes::Block })
    })
}

/// `s` as an AMX tile product, if it is the three tensorized loops (in any
/// order, perfectly nested) around `C[..] = C[..] + @dot4(0, A[..], B[..])`:
/// at most [`TileDot::MAX_ROWS`] × [`TileDot::MAX_COLS`] accumulators (a
/// block's last, shorter copy of the loops too), the sum a whole number of
/// [`TileDot::K_STEP`]s, `A` (the unsigned bytes) indexed by the rows and
/// the sum, `B` by the sum and the columns, each operand's columns its
/// contiguous last dimension.
fn tile_dot(f: &mut LoopFunc, s: &Stmt, w: &Want) -> Result<Option<TileDot>, String> {
    let mut vars: [Option<(VarId, i64, i64)>; 3] = [None; 3];
    let mut at = s;
    for _ in 0..3 {
        let Stmt::For { var, lo, extent, kind, body } = at else { return Ok(None) };
        let name = &f.vars[*var as usize].name;
        let Some(role) = w.names.iter().position(|n| n == name) else { return Ok(None) };
        let (max_m, max_n, step) = w.op.shape();
        let fits = match role {
            0 => *extent <= max_m,
            1 => *extent <= max_n,
            _ => *extent % step == 0,
        };
        // Another stage's loops may have these names: only the stage's
        // own accumulation (checked below) is an error to miss.
        if *kind != ForKind::Serial || !fits || *extent < 1 || vars[role].is_some() {
            return Ok(None);
        }
        vars[role] = Some((*var, *lo, *extent));
        // Loops of these names around something else: the accumulators'
        // initialization or write-back, or attached producers.
        let [inner] = body.as_slice() else { return Ok(None) };
        at = inner;
    }
    let Stmt::Store { tensor, indices, value } = at else { return Ok(None) };
    if *tensor != w.tensor {
        return Ok(None);
    }
    let [m, n, k] = vars.map(|v| v.expect("three loops"));
    let (a, b) = dot4_accumulation(f, *value, *tensor, indices).ok_or_else(|| {
        format!(
            "`{}` is not computed as a sum of packed byte products `@dot4(0, A[..], B[..])` of i32 operands \
             (the default schedule packs a `.tex` product so; a `.loops` file can write `amx_dpbusd` itself)",
            f.p.tensor(w.tensor).name
        )
    })?;
    let c = tile_from(f, *tensor, indices, (m.0, m.1), (n.0, n.1), Some(k.0))?;
    let a = tile_from(f, a.0, &a.1, (m.0, m.1), (k.0, k.1), Some(n.0))
        .map_err(|why| format!("{why} (the unsigned operand of `@dot4` must run along the rows and the sum)"))?;
    let b = tile_from(f, b.0, &b.1, (k.0, k.1), (n.0, n.1), Some(m.0))?;
    for t in [&c, &a, &b] {
        let d = f.p.tensor(t.tensor);
        if t.cols + 1 != d.shape.len() {
            return Err(format!(
                "the tile of `{}` runs along its dimension {}, not its last: AMX loads rows of contiguous elements",
                d.name, t.cols
            ));
        }
    }
    Ok(Some(TileDot { c, a, b, m: m.2, n: n.2, k: k.2, zero: false }))
}

/// `C[idx] + @dot4(0, A[..], B[..])` (either order of the sum) of `i32` loads.
fn dot4_accumulation(f: &LoopFunc, e: TExprId, c: TensorId, idx: &[TExprId]) -> Option<(Operand, Operand)> {
    let p = &f.p;
    let dot = accumulated(f, e, c, idx)?;
    let TExpr::Intrinsic(Intrinsic::Dot4, args) = p.expr(dot) else { return None };
    let [zero, a, b] = args.as_slice() else { return None };
    if !matches!(p.expr(*zero), TExpr::Int(0)) {
        return None;
    }
    let operand = |e: TExprId| -> Option<Operand> {
        match p.expr(e) {
            TExpr::Load(t, i) if p.ty(e) == Ty::Elem(ElemType::I32) => Some((*t, i.clone())),
            _ => None,
        }
    };
    Some((operand(*a)?, operand(*b)?))
}

type Operand = (TensorId, Vec<TExprId>);

/// A wgmma operand: its tile in a shared buffer, which [`relayout`] will
/// lay out as `major` says (`mn_is_rows`: the tile's rows run along M or
/// N, as `A`'s do; `B`'s columns run along N). Its origin is still the
/// tile's logical one until then.
fn operand(
    f: &LoopFunc,
    t: Tile,
    mn_is_rows: bool,
    major: Major,
    relayouts: &mut Vec<Relayout>,
) -> Result<SmemMatrix, String> {
    let d = f.p.tensor(t.tensor);
    if !f.shared.contains(&t.tensor) {
        return Err(format!(
            "`wgmma` reads `{}` from shared memory through a matrix descriptor: stage it there first \
             (`cache_read {} for ... in shared`)",
            d.name, d.name
        ));
    }
    let (mn, k) = if mn_is_rows { (t.rows, t.cols) } else { (t.cols, t.rows) };
    let mn_too = major == Major::Mn;
    if d.shape.len() != 2 || d.shape[k] % 8 != 0 || (mn_too && d.shape[mn] % 8 != 0) {
        return Err(format!(
            "`wgmma` reads `{}` ({:?}) as core matrices of 8 × 8: a 2-D shared buffer whose K extent{} is a \
             multiple of 8",
            d.name,
            d.shape,
            if mn_too { " and N extent" } else { "" }
        ));
    }
    let eight = |i: TExprId| crate::analysis::multiple_of(&f.p, i, 8, None);
    if !eight(t.origin[k]) || (mn_too && !eight(t.origin[mn])) {
        return Err(format!("a `wgmma` tile of `{}` does not start at a multiple of 8 along K (and N)", d.name));
    }
    // The 128-byte swizzle where a row of the layout is a whole 128 bytes:
    // `A`'s K extent 64, `B`'s N extent a multiple of 64 (the tile starting
    // at one); a warp's copies of whole rows then coalesce.
    let swizzled = d.elem.size() == 2
        && match major {
            Major::K => d.shape[k] == 64 && d.shape[mn] % 8 == 0 && eight(t.origin[mn]),
            Major::Mn => d.shape[mn] % 64 == 0 && crate::analysis::multiple_of(&f.p, t.origin[mn], 64, None),
        };
    let r = Relayout { tensor: t.tensor, mn, k, major, swizzled };
    if relayouts.iter().any(|o| o.tensor == r.tensor && *o != r) {
        return Err(format!("`{}` is read as two different `wgmma` operands", d.name));
    }
    if !relayouts.contains(&r) {
        relayouts.push(r);
    }
    let (lbo, sbo) = match (major, swizzled) {
        // K-major rows hold the operation's 16 of K: no leading offset (1).
        (Major::K, true) => (16, 1024),
        // MN-major: atoms of 64 along N, each K rows of 128 bytes.
        (Major::Mn, true) => (128 * d.shape[k], 1024),
        (_, false) => (16 * d.shape[mn], 128),
    };
    Ok(SmemMatrix { tensor: t.tensor, origin: t.origin, major, lbo, sbo, swizzled })
}

/// Lays `r.tensor` out as core matrices ([`Major`]): `[K / 8, MN, 8]`
/// K-major, `[K / 8, MN / 8, 8, 8]` MN-major; swizzled, `[M, 64]` K-major
/// (as it is) and `[N / 64, K, 64]` MN-major — in every store, load and
/// `wgmma` operand.
fn relayout(f: &mut LoopFunc, r: Relayout) -> Result<(), String> {
    let shape = f.p.tensor(r.tensor).shape.clone();
    f.p.tensors[r.tensor.0 as usize].shape = match (r.major, r.swizzled) {
        (Major::K, false) => vec![shape[r.k] / 8, shape[r.mn], 8],
        (Major::Mn, false) => vec![shape[r.k] / 8, shape[r.mn] / 8, 8, 8],
        (Major::K, true) => shape.clone(),
        (Major::Mn, true) => vec![shape[r.mn] / 64, shape[r.k], 64],
    };
    let mut lanes = HashSet::new();
    small_loops(&f.body, &mut lanes);
    let mut body = std::mem::take(&mut f.body);
    let mut done = HashSet::new();
    let out = stmts(f, &mut body, Env { r, lanes: &lanes }, &mut done);
    f.body = body;
    return out;

    /// What the rewrite needs: the buffer, and the loops from 0 below 8.
    #[derive(Clone, Copy)]
    struct Env<'a> {
        r: Relayout,
        lanes: &'a HashSet<VarId>,
    }

    fn small_loops(body: &[Stmt], out: &mut HashSet<VarId>) {
        for s in body {
            match s {
                Stmt::For { var, lo, extent, body, .. } => {
                    if *lo == 0 && *extent <= 8 {
                        out.insert(*var);
                    }
                    small_loops(body, out)
                }
                Stmt::If { then: body, .. } | Stmt::Alloc { body, .. } => small_loops(body, out),
                _ => {}
            }
        }
    }

    fn stmts(f: &mut LoopFunc, body: &mut [Stmt], e: Env, done: &mut HashSet<TExprId>) -> Result<(), String> {
        let r = e.r;
        for s in body {
            match s {
                Stmt::For { body, .. } | Stmt::Alloc { body, .. } => stmts(f, body, e, done)?,
                Stmt::If { cond, then } => {
                    loads(f, *cond, e, done);
                    stmts(f, then, e, done)?
                }
                Stmt::Store { tensor, indices, value } => {
                    for &x in indices.iter().chain([&*value]) {
                        loads(f, x, e, done);
                    }
                    if *tensor == r.tensor {
                        *indices = index(f, indices, e, false);
                    }
                }
                Stmt::Wgmma(w) => {
                    for &x in w.c.origin.clone().iter() {
                        loads(f, x, e, done);
                    }
                    for m in [&mut w.a, &mut w.b] {
                        if m.tensor == r.tensor {
                            m.origin = index(f, &m.origin, e, true);
                        }
                    }
                }
                Stmt::Mma { c, a, b, .. } => {
                    if [c, a, b].iter().any(|t| t.tensor == r.tensor) {
                        return Err(format!(
                            "`{}` is laid out for `wgmma`, and an `mma` reads it too",
                            f.p.tensor(r.tensor).name
                        ));
                    }
                }
                Stmt::Barrier | Stmt::Async(_) | Stmt::WarpReduce(_) | Stmt::TileDot(_) | Stmt::Prefetch { .. } => {}
            }
        }
        Ok(())
    }

    /// The loads of `r.tensor` in `e`, rewritten in place (the buffer is
    /// the block's own: no other expression holds them; `done` keeps a
    /// node shared by two statements from being rewritten twice).
    fn loads(f: &mut LoopFunc, x: TExprId, e: Env, done: &mut HashSet<TExprId>) {
        for c in f.p.children(x) {
            loads(f, c, e, done);
        }
        if let TExpr::Load(t, idx) = f.p.expr(x).clone() {
            if t == e.r.tensor && done.insert(x) {
                let idx = index(f, &idx, e, false);
                f.p.exprs[x.0 as usize] = TExpr::Load(t, idx);
            }
        }
    }

    /// The layout's index of a logical one; of a tile's origin (whose
    /// indices split are multiples of 8), with zeros within the core matrix.
    fn index(f: &mut LoopFunc, idx: &[TExprId], e: Env, origin: bool) -> Vec<TExprId> {
        let r = e.r;
        match (r.major, r.swizzled) {
            (Major::K, true) => return idx.to_vec(),
            (Major::Mn, true) => {
                let (n_hi, n_lo) = split64(f, idx[r.mn], e, origin);
                return vec![n_hi, idx[r.k], n_lo];
            }
            _ => {}
        }
        let (k_hi, k_lo) = split8(f, idx[r.k], e, origin);
        match r.major {
            Major::K => vec![k_hi, idx[r.mn], k_lo],
            Major::Mn => {
                let (mn_hi, mn_lo) = split8(f, idx[r.mn], e, origin);
                vec![k_hi, mn_hi, k_lo, mn_lo]
            }
        }
    }

    /// `(e / 64, e % 64)`; `(a / 8, a % 8 * 8 + b)` for `e = a * 8 + b`
    /// with `b` a lane (so that a vectorized copy stays contiguous);
    /// `(e / 64, 0)` for an origin.
    fn split64(f: &mut LoopFunc, e: TExprId, env: Env, origin: bool) -> (TExprId, TExprId) {
        let span = f.p.span(e);
        let int = |f: &mut LoopFunc, v: i64| f.p.alloc(TExpr::Int(v), Ty::Index, span);
        let bin =
            |f: &mut LoopFunc, op: BinOp, x: TExprId, y: TExprId| f.p.alloc(TExpr::Binary(op, x, y), Ty::Index, span);
        if !origin {
            if let Some((a, b)) = eights_and_lane(f, e, env.lanes) {
                let eight = int(f, 8);
                let hi = bin(f, BinOp::FloorDiv, a, eight);
                let lo = bin(f, BinOp::FloorMod, a, eight);
                let lo = bin(f, BinOp::Mul, lo, eight);
                return (hi, bin(f, BinOp::Add, lo, b));
            }
        }
        let sixty_four = int(f, 64);
        let hi = bin(f, BinOp::FloorDiv, e, sixty_four);
        let lo = if origin { int(f, 0) } else { bin(f, BinOp::FloorMod, e, sixty_four) };
        (hi, lo)
    }

    /// `(e / 8, e % 8)`; `(a, b)` for `e = a * 8 + b` with `b` a loop
    /// variable from 0 below 8; `(e / 8, 0)` for an origin.
    fn split8(f: &mut LoopFunc, x: TExprId, env: Env, origin: bool) -> (TExprId, TExprId) {
        let e = x;
        let span = f.p.span(e);
        if !origin {
            if let Some(ab) = eights_and_lane(f, e, env.lanes) {
                return ab;
            }
        }
        let eight = f.p.alloc(TExpr::Int(8), Ty::Index, span);
        let div = f.p.alloc(TExpr::Binary(BinOp::FloorDiv, e, eight), Ty::Index, span);
        let rem = if origin {
            f.p.alloc(TExpr::Int(0), Ty::Index, span)
        } else {
            f.p.alloc(TExpr::Binary(BinOp::FloorMod, e, eight), Ty::Index, span)
        };
        (div, rem)
    }

    /// `(a, b)` where `e` is `a * 8 + b` (either order) and `b` a variable
    /// of a loop from 0 of at most 8 iterations.
    fn eights_and_lane(f: &LoopFunc, e: TExprId, lanes: &HashSet<VarId>) -> Option<(TExprId, TExprId)> {
        let TExpr::Binary(BinOp::Add, x, y) = f.p.expr(e) else { return None };
        let times8 = |t: TExprId| match f.p.expr(t) {
            TExpr::Binary(BinOp::Mul, a, b) if matches!(f.p.expr(*b), TExpr::Int(8)) => Some(*a),
            TExpr::Binary(BinOp::Mul, a, b) if matches!(f.p.expr(*a), TExpr::Int(8)) => Some(*b),
            _ => None,
        };
        let lane = |t: TExprId| matches!(f.p.expr(t), TExpr::Var(v) if lanes.contains(v));
        match (times8(*x), times8(*y)) {
            (Some(a), _) if lane(*y) => Some((a, *y)),
            (_, Some(a)) if lane(*x) => Some((a, *x)),
            _ => None,
        }
    }
}

/// `C[idx] + f32(A[..]) * f32(B[..])` (either order of sum and product).
fn accumulation(f: &LoopFunc, e: TExprId, c: TensorId, idx: &[TExprId]) -> Option<(Operand, Operand)> {
    let p = &f.p;
    let prod = accumulated(f, e, c, idx)?;
    let TExpr::Binary(BinOp::Mul, a, b) = p.expr(prod) else { return None };
    // `f32(A[..])` of f16 inputs, or `A[..]` itself of f32 ones;
    // `i32(A[..])` of 8-bit ones.
    let operand = |e: TExprId| -> Option<Operand> {
        let load = match p.expr(e) {
            TExpr::Cast(inner) => *inner,
            _ => e,
        };
        let sum = matches!(p.ty(e), Ty::Elem(ElemType::F32 | ElemType::I32));
        match p.expr(load) {
            TExpr::Load(t, i) if sum => Some((*t, i.clone())),
            _ => None,
        }
    };
    Some((operand(*a)?, operand(*b)?))
}

/// The term `x` of `C[idx] + x` (either order).
fn accumulated(f: &LoopFunc, e: TExprId, c: TensorId, idx: &[TExprId]) -> Option<TExprId> {
    let p = &f.p;
    let TExpr::Binary(BinOp::Add, x, y) = p.expr(e) else { return None };
    let is_c = |e: TExprId| matches!(p.expr(e), TExpr::Load(t, i) if *t == c && same(f, i, idx));
    match () {
        _ if is_c(*x) => Some(*y),
        _ if is_c(*y) => Some(*x),
        _ => None,
    }
}

fn same(f: &LoopFunc, a: &[TExprId], b: &[TExprId]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(&x, &y)| x == y || crate::ir::expr(f, x) == crate::ir::expr(f, y))
}

fn uses(f: &LoopFunc, idx: &[TExprId], v: VarId) -> bool {
    idx.iter().any(|&i| involves(&f.p, i, v))
}

/// The tile of `t[idx]` whose rows run along `rows` and columns along
/// `cols` (each with coefficient 1, in a dimension of its own), and which
/// does not depend on `other`.
fn tile(
    f: &mut LoopFunc,
    t: TensorId,
    idx: &[TExprId],
    rows: VarId,
    cols: VarId,
    other: VarId,
) -> Result<Tile, String> {
    tile_from(f, t, idx, (rows, 0), (cols, 0), Some(other))
}

/// [`tile`] of loops starting at `lo` (a block's last copy of its loops):
/// the origin is the index at those starts.
fn tile_from(
    f: &mut LoopFunc,
    t: TensorId,
    idx: &[TExprId],
    (rows, rows_lo): (VarId, i64),
    (cols, cols_lo): (VarId, i64),
    other: Option<VarId>,
) -> Result<Tile, String> {
    let name = f.p.tensor(t).name.clone();
    let var = |v: VarId| f.vars[v as usize].name.clone();
    let dim_of = |v: VarId| -> Result<usize, String> {
        let dims: Vec<usize> = (0..idx.len()).filter(|&d| involves(&f.p, idx[d], v)).collect();
        match dims.as_slice() {
            [d] if coefficient(&f.p, idx[*d], v) == Some(1) => Ok(*d),
            _ => Err(format!("`{name}` is not indexed by `{}` + a tile origin in one dimension", var(v))),
        }
    };
    let (r, c) = (dim_of(rows)?, dim_of(cols)?);
    if r == c || other.is_some_and(|o| uses(f, idx, o)) {
        return Err(format!("`{name}` is not a tile over `{}` and `{}`", var(rows), var(cols)));
    }
    let r0 = f.p.alloc(TExpr::Int(rows_lo), Ty::Index, Default::default());
    let c0 = f.p.alloc(TExpr::Int(cols_lo), Ty::Index, Default::default());
    let at_start: HashMap<VarId, TExprId> = [(rows, r0), (cols, c0)].into_iter().collect();
    let origin = idx.iter().map(|&i| subst(&mut f.p, i, &at_start, &HashMap::new())).collect();
    Ok(Tile { tensor: t, origin, rows: r, cols: c })
}
