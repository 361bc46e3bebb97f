//! Products over short image rows computed over the whole map: a
//! TIR-to-TIR pass for CPU targets (the *merge-product-rows* preparation
//! step, after [`crate::filters_last`]).
//!
//! A channels-last `Linear` over an image (ConvNeXt's and Swin's MLPs,
//! `Y[n, y, x, j] = Σ[k] A[n, y, x, k] · W[k, j]`) has its vectors along
//! `j` and its register block's rows along `x`: on a 14 × 14 map each image
//! row is 14 rows of A, blocks of 5 + 5 + 4 on AVX2 (6 + 6 + 2 would leave
//! four accumulators waiting on the FMA latency), and the blocks' panels of
//! `W` are read again for every image row. The rows `(y, x)` of such a product lie
//! one after another in memory — in `A`, whose last dimension is the
//! reduction, and in `Y` — so they are one axis `p = y · W + x` of `H · W`
//! rows: the stage computes `Y[n, p, j]` over it, reading `A[n, p / W,
//! p % W, k]`, and `Y`'s shape merges the two dimensions (`[n, H · W,
//! j]`, the same bytes), its readers indexing `Y[n, e_y · W + e_x, j]`.
//!
//! Taken where the register blocks take fewer steps so (the caller's
//! count), the stage sums products (of two loads, as
//! [`crate::filters_last::product_body`] reads them), its last axis is not
//! one of the two (the vectors stay along it), the row is shorter than
//! [`SHORT_ROW`], `Y` is a temporary that this stage alone writes (and
//! does not read), and every load walks `(y, x)` as one dense axis of
//! `H · W` would ([`crate::analysis::dense_pair`]: `y` moves its flat
//! offset by `W` steps of `x`; nothing but loads mentions them).
//!
//! Invariants: the program computes the same values (the same expression
//! per output element, stored at the same address); only the merged
//! stage's variables, `Y`'s shape and the loads of `Y` change; every other
//! stage keeps its loop variables.

use crate::analysis::{dense_pair, loads_in};
use crate::filters_last::product_body;
use crate::normalize::subst;
use std::collections::HashMap;
use texc_compiler::ops::BinOp;
use texc_compiler::target::{Target, TargetKind};
use texc_compiler::tir::*;

/// Image rows shorter than this may merge: up to two blocks of rows on
/// AVX2 (6 rows) or one on AVX-512 (7 to 12), where each image row ends in
/// a short block (a 14 × 14 map's rows as 5 + 5 + 4, a 7 × 7 map's as
/// 4 + 3). Longer rows keep their blocks: a few short blocks among many,
/// measured only on those two maps (see [`merge_product_rows`]).
pub const SHORT_ROW: i64 = 16;

/// Merge the short image rows of every product of `p` that qualifies (see
/// the module header) where `pays(p, stage, (y, x))` says the register blocks
/// take fewer steps over `h · w` rows than over `h` rows of `w` (the CPU
/// strategy's count); CPU targets only. MEASURED (AMD Zen 4, 1 thread,
/// `bench --profile`, ConvNeXt-T's products, new against old): `x86-avx2`
/// the 18 at 14 × 14 40.9 → 39.0 ms, the 6 at 7 × 7 17.4 → 15.5; on `host`
/// (blocks of 7, where the count says no) merged anyway they took 36.8 → 37.5
/// and 12.9 → 12.8.
pub fn merge_product_rows(p: &mut Program, target: &Target, pays: &dyn Fn(&Program, usize, (usize, usize)) -> bool) {
    if target.kind != TargetKind::Cpu {
        return;
    }
    // Stages are neither added nor removed here: the writers are counted once.
    let mut writers: HashMap<TensorId, usize> = HashMap::new();
    for st in &p.stages {
        *writers.entry(st.tensor).or_default() += 1;
    }
    for si in 0..p.stages.len() {
        let sole = writers[&p.stages[si].tensor] == 1 && p.tensor(p.stages[si].tensor).role == TensorRole::Temp;
        if let Some((y, x)) = mergeable(p, si).filter(|_| sole) {
            if pays(p, si, (y, x)) {
                merge(p, si, y, x);
            }
        }
    }
}

/// The axes `(y, x)` of stage `si` that merge, if they do (its tensor a
/// temporary it alone writes).
fn mergeable(p: &Program, si: usize) -> Option<(usize, usize)> {
    let st = &p.stages[si];
    let n = st.n_axes;
    if n < 3 || st.vars.len() == n || product_body(p, st.value).is_none() {
        return None;
    }
    let (y, x) = (n - 3, n - 2);
    let (h, w) = (st.vars[y].extent, st.vars[x].extent);
    if w >= SHORT_ROW || h < 2 || w < 2 {
        return None;
    }
    let (yv, xv) = (y as VarId, x as VarId);
    let mut loads = Vec::new();
    loads_in(p, st.value, &mut loads);
    // A stage that reads what it writes would read it at the old rank.
    if loads.iter().any(|&l| matches!(p.expr(l), TExpr::Load(t, _) if *t == st.tensor)) {
        return None;
    }
    // Every read walks `(y, x)` as one dense axis would, and nothing but
    // reads mentions them.
    dense_pair(p, st.value, &loads, (yv, xv), w).then_some((y, x))
}

/// Stage `si` over `p = y · W + x` instead of `y, x`, its tensor's two
/// dimensions one, and every read of that tensor indexed so.
fn merge(p: &mut Program, si: usize, y: usize, x: usize) {
    let st = p.stages[si].clone();
    let (span, w) = (st.span, st.vars[x].extent);
    let mut vars: Vec<VarDecl> = Vec::new();
    let mut rename: HashMap<VarId, VarId> = HashMap::new();
    let mut exprs: HashMap<VarId, TExprId> = HashMap::new();
    for (d, v) in st.vars.iter().enumerate() {
        if d == x {
            continue;
        }
        if d == y {
            let merged = p.alloc(TExpr::Var(vars.len() as VarId), Ty::Index, span);
            let width = p.alloc(TExpr::Int(w), Ty::Index, span);
            exprs.insert(y as VarId, p.alloc(TExpr::Binary(BinOp::FloorDiv, merged, width), Ty::Index, span));
            exprs.insert(x as VarId, p.alloc(TExpr::Binary(BinOp::FloorMod, merged, width), Ty::Index, span));
            vars.push(VarDecl { name: format!("{}.{}", v.name, st.vars[x].name), extent: v.extent * w });
            continue;
        }
        rename.insert(d as VarId, vars.len() as VarId);
        vars.push(v.clone());
    }
    let value = subst(p, st.value, &exprs, &rename);
    let stage = &mut p.stages[si];
    stage.vars = vars;
    stage.n_axes -= 1;
    stage.value = value;
    let t = st.tensor;
    p.tensors[t.0 as usize].shape.splice(y..=x, [st.vars[y].extent * w]);
    // Every read of `t` in the arena names the same element by its new
    // index: rewritten in place, so stages sharing the node follow (as
    // `channels_last` moves a dimension). The merged stage reads none.
    let width = p.alloc(TExpr::Int(w), Ty::Index, span);
    for e in 0..p.exprs.len() {
        let TExpr::Load(u, idx) = &p.exprs[e] else { continue };
        if *u != t {
            continue;
        }
        let mut idx = idx.clone();
        let row = p.alloc(TExpr::Binary(BinOp::Mul, idx[y], width), Ty::Index, span);
        let merged = p.alloc(TExpr::Binary(BinOp::Add, row, idx[y + 1]), Ty::Index, span);
        idx.splice(y..=y + 1, [merged]);
        p.exprs[e] = TExpr::Load(t, idx);
    }
}
