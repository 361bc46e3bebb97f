//! Slices of a large folded constant. A part of the constant prologue
//! ([`texc_compiler::constants::parts`]) whose one output is larger than a
//! part may be — a classifier's weight packed into panels: AlexNet's first
//! `Linear` reads 151 MB and writes 156 MB — runs as programs that each
//! compute a range of rows of the output (its first axis) into the output's
//! memory. After each slice, the rows of the part's parameters that no
//! later slice reads are released ([`texc_runtime::Tensor::release`]), so
//! computing the constant holds about one of its weight and its folded form,
//! not both whole.
//!
//! Only a part whose output has at least two axes (a slice's rows leave
//! the innermost axis, which the schedule's lanes and reduction splits
//! follow, as it was: the slices compute what the whole computes, bit for
//! bit) and whose other stages are element-wise (each slice computes them
//! whole where they are not inlined: a reduction would be recomputed per
//! slice) is sliced.
//!
//! Invariants: the slices' rows cover the output's first axis in order,
//! without overlap. A slice's program is the part with the output stage's
//! first axis cut to the slice's rows and shifted by its first row; every
//! other stage is unchanged. A parameter's released prefix only grows from
//! slice to slice, and no value a later slice's output depends on reads a
//! released row: what the output's rows read is bounded by interval
//! arithmetic over its loads, through the elements of the temporaries it
//! reads (a temporary's other elements, computed where it is not inlined,
//! may read zeros and are not used); an unknown bound releases nothing.

use std::collections::HashMap;
use std::ops::Range;
use texc_compiler::ops::BinOp;
use texc_compiler::tir::{Program, TExpr, TExprId, TensorId, TensorRole, Ty};
use texc_schedules::interval::{self, Iv};
use texc_schedules::normalize::{contains_reduce, subst};

/// One slice of a part: the output rows it computes and the program that
/// computes them (its output is those rows alone).
pub struct Slice {
    pub rows: Range<usize>,
    pub program: Program,
    /// Each parameter tensor of the part with the number of its leading
    /// rows that may be released once this slice has run.
    pub release: Vec<(TensorId, usize)>,
}

/// The rows of a tensor's first axis a program may read: none, a range,
/// or not known.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Rows {
    None,
    Within(i128, i128),
    Unknown,
}

impl Rows {
    fn union(self, o: Rows) -> Rows {
        match (self, o) {
            (Rows::None, x) | (x, Rows::None) => x,
            (Rows::Within(a, b), Rows::Within(c, d)) => Rows::Within(a.min(c), b.max(d)),
            _ => Rows::Unknown,
        }
    }
}

/// Expression nodes visited (through temporaries, once per visit) before
/// the reads count as unknown: the bound keeps the analysis of a slice
/// within a fixed cost, whatever the part's expressions share.
const MAX_NODES: usize = 100_000;

/// `part` cut into slices of at most about `max_bytes` of output each, or
/// `None` where it is not one large output written by its last stage.
pub fn slices(part: &Program, max_bytes: u64) -> Option<Vec<Slice>> {
    let (&[out], Some(last)) = (part.outputs.as_slice(), part.stages.last()) else { return None };
    let decl = part.tensor(out);
    let rows = *decl.shape.first()?;
    let bytes = (decl.len().max(0) as u64).saturating_mul(decl.elem.size() as u64);
    let one_writer = part.stages.iter().filter(|s| s.tensor == out).count() == 1;
    let axes_match = last.n_axes == decl.shape.len() && last.vars.first().is_some_and(|v| v.extent == rows);
    let temps_elementwise = part.stages.iter().rev().skip(1).all(|st| !contains_reduce(part, st.value));
    let sliceable = last.tensor == out && one_writer && axes_match && temps_elementwise && decl.shape.len() >= 2;
    if !sliceable || rows < 2 || bytes <= max_bytes.max(1) {
        return None;
    }
    let count = bytes.div_ceil(max_bytes.max(1)).min(rows as u64) as i64;
    let per = (rows + count - 1) / count;
    let cuts: Vec<Range<i64>> = (0..rows).step_by(per as usize).map(|lo| lo..(lo + per).min(rows)).collect();
    let programs: Vec<Program> = cuts.iter().map(|r| slice_program(part, r.clone())).collect();
    let params: Vec<TensorId> = part.input_tensors().filter(|&t| !part.tensor(t).shape.is_empty()).collect();
    let reads: Vec<Vec<Rows>> = programs.iter().map(|p| params.iter().map(|&t| rows_read(p, t)).collect()).collect();
    let mut slices = Vec::with_capacity(cuts.len());
    for (k, (r, program)) in cuts.into_iter().zip(programs).enumerate() {
        let release = params
            .iter()
            .enumerate()
            .map(|(i, &t)| (t, releasable(part.tensor(t).shape[0], reads[k + 1..].iter().map(|rs| rs[i]))))
            .collect();
        slices.push(Slice { rows: r.start as usize..r.end as usize, program, release });
    }
    Some(slices)
}

/// The leading rows (of `rows`) that no read of `later` can touch.
fn releasable(rows: i64, later: impl Iterator<Item = Rows>) -> usize {
    let mut first = rows as i128;
    for r in later {
        match r {
            Rows::None => {}
            Rows::Within(lo, _) => first = first.min(lo.max(0)),
            Rows::Unknown => return 0,
        }
    }
    first.clamp(0, rows as i128) as usize
}

/// `part` computing only the output rows `r`: the output's first axis is
/// `r.end - r.start` long and its stage reads row `v + r.start` where it read `v`.
fn slice_program(part: &Program, r: Range<i64>) -> Program {
    let mut p = part.clone();
    let out = p.outputs[0];
    let si = p.stages.len() - 1;
    p.tensors[out.0 as usize].shape[0] = r.end - r.start;
    p.stages[si].vars[0].extent = r.end - r.start;
    let value = p.stages[si].value;
    let span = p.span(value);
    let v = p.alloc(TExpr::Var(0), Ty::Index, span);
    let lo = p.alloc(TExpr::Int(r.start), Ty::Index, span);
    let shifted = p.alloc(TExpr::Binary(BinOp::Add, v, lo), Ty::Index, span);
    p.stages[si].value = subst(&mut p, value, &HashMap::from([(0, shifted)]), &HashMap::new());
    p
}

/// The rows of `t`'s first axis that `p`'s output stage reads, directly or
/// through the temporaries it reads.
fn rows_read(p: &Program, t: TensorId) -> Rows {
    let si = p.stages.len() - 1;
    let full: Vec<Iv> = p.stages[si].vars.iter().map(|v| interval::range(0, v.extent as i128 - 1)).collect();
    let mut budget = MAX_NODES;
    stage_reads(p, si, &full, t, &mut budget)
}

/// The rows of `t` that stage `si` reads when its variables range over `vars`.
fn stage_reads(p: &Program, si: usize, vars: &[Iv], t: TensorId, budget: &mut usize) -> Rows {
    let mut loads = Vec::new();
    if !collect_loads(p, p.stages[si].value, &mut loads, budget) {
        return Rows::Unknown;
    }
    let var = |v: u32| vars.get(v as usize).copied().unwrap_or(interval::ANY);
    let mut rows = Rows::None;
    for (u, idx) in loads {
        let decl = p.tensor(u);
        let ivs: Vec<Iv> = idx.iter().map(|&i| interval::of(p, i, &var)).collect();
        if u == t {
            rows = rows.union(match ivs.first() {
                Some(Iv { lo: Some(lo), hi: Some(hi) }) => Rows::Within(*lo, *hi),
                _ => Rows::Unknown,
            });
        } else if decl.role == TensorRole::Temp {
            let mut writers = p.stages[..si].iter().enumerate().filter(|(_, s)| s.tensor == u).map(|(i, _)| i);
            let (Some(writer), None) = (writers.next(), writers.next()) else { return Rows::Unknown };
            let stage = &p.stages[writer];
            // The writer's axes over the indices read (within the tensor),
            // its reduction variables over their whole ranges.
            let inner: Vec<Iv> = stage
                .vars
                .iter()
                .enumerate()
                .map(|(d, v)| {
                    let whole = interval::range(0, v.extent as i128 - 1);
                    ivs.get(d).filter(|_| d < stage.n_axes).map_or(whole, |iv| iv.meet(whole))
                })
                .collect();
            rows = rows.union(stage_reads(p, writer, &inner, t, budget));
        }
        if rows == Rows::Unknown {
            return rows;
        }
    }
    rows
}

/// Every load in `e` with its indices, each node visited counted against
/// `budget`; false once it is spent.
fn collect_loads(p: &Program, e: TExprId, out: &mut Vec<(TensorId, Vec<TExprId>)>, budget: &mut usize) -> bool {
    let Some(left) = budget.checked_sub(1) else { return false };
    *budget = left;
    if let TExpr::Load(t, idx) = p.expr(e) {
        out.push((*t, idx.clone()));
    }
    p.children(e).into_iter().all(|c| collect_loads(p, c, out, budget))
}
