//! Loop-nest evaluator: runs a [`LoopFunc`] statement by statement on the
//! interpreter's memory and expression evaluator. It executes exactly the
//! loops, guards and accumulation order that the schedule produced, so
//! comparing it with the interpreter checks lowering and scheduling
//! independently of any code generator.
//!
//! Asynchronous copies (`ForKind::Async`) read their source when issued
//! and write their destination only when an `async wait` retires their
//! group, as late as the GPU may: a schedule that reads a shared buffer
//! before its copy was waited for reads stale data here too.

use crate::ir::{AsyncStep, ForKind, LoopFunc, MmaOp, Stmt, Tile, WarpReduce};
use texc_compiler::interp::{Arg, InterpError, Machine};
use texc_compiler::semantics::V;
use texc_runtime::Tensor;

pub fn run(f: &LoopFunc, args: Vec<Arg>) -> Result<Vec<Tensor>, InterpError> {
    let mut m = Machine::new(&f.p, args)?;
    let mut env = vec![0i64; f.vars.len()];
    let mut copies = Copies::default();
    exec(f, &mut m, &f.body, &mut env, &mut copies, false)?;
    Ok(m.outputs())
}

/// An element an asynchronous copy writes when it lands.
type Landing = (texc_compiler::tir::TensorId, Vec<i64>, V);

/// Asynchronous copies in flight: the elements of the open group and of
/// the committed groups, oldest first. Every thread of a block issues the
/// same groups, so one queue stands for all.
#[derive(Default)]
struct Copies {
    open: Vec<Landing>,
    committed: std::collections::VecDeque<Vec<Landing>>,
}

fn exec(
    f: &LoopFunc,
    m: &mut Machine,
    body: &[Stmt],
    env: &mut [i64],
    copies: &mut Copies,
    in_async: bool,
) -> Result<(), InterpError> {
    for s in body {
        match s {
            Stmt::Barrier => {}
            Stmt::Async(AsyncStep::Commit) => {
                let group = std::mem::take(&mut copies.open);
                copies.committed.push_back(group);
            }
            Stmt::Async(AsyncStep::Wait(n)) => {
                while copies.committed.len() as i64 > (*n).max(0) {
                    for (t, idx, v) in copies.committed.pop_front().unwrap_or_default() {
                        m.store(t, &idx, v)?;
                    }
                }
            }
            Stmt::Mma { op, c, a, b } => mma(f, m, *op, [c, a, b], env)?,
            Stmt::WarpReduce(w) => warp_reduce(f, m, *w)?,
            Stmt::For { var, lo, extent, body, kind } => {
                for x in *lo..*lo + *extent {
                    env[*var as usize] = x;
                    exec(f, m, body, env, copies, in_async || *kind == ForKind::Async)?;
                }
            }
            Stmt::Alloc { body, .. } => exec(f, m, body, env, copies, in_async)?,
            Stmt::If { cond, then } => {
                if m.eval(&f.vars, *cond, env)?.b() {
                    exec(f, m, then, env, copies, in_async)?;
                }
            }
            Stmt::Store { tensor, indices, value } => {
                let idx =
                    indices.iter().map(|&i| m.eval(&f.vars, i, env).map(|v| v.i())).collect::<Result<Vec<_>, _>>()?;
                let v = m.eval(&f.vars, *value, env)?;
                if in_async {
                    copies.open.push((*tensor, idx, v));
                } else {
                    m.store(*tensor, &idx, v)?;
                }
            }
        }
    }
    Ok(())
}

/// A warp reduction's butterfly ([`WarpReduce`]): at each step every
/// element combined with its partner's value from before the step, each
/// result rounded to the buffer's type as the lanes' registers hold it.
fn warp_reduce(f: &LoopFunc, m: &mut Machine, w: WarpReduce) -> Result<(), InterpError> {
    let d = f.p.tensor(w.tensor);
    let ty = texc_compiler::tir::Ty::Elem(d.elem);
    let n = d.shape[0];
    for step in w.steps() {
        let before = (0..n).map(|i| m.load_at(w.tensor, &[i])).collect::<Result<Vec<_>, _>>()?;
        for i in 0..n {
            let v = texc_compiler::semantics::reduce_step(w.op, ty, before[i as usize], before[(i ^ step) as usize]);
            m.store(w.tensor, &[i], v)?;
        }
    }
    Ok(())
}

/// `c += a × b` on one tile of each, as the warp computes it: every lane
/// loads the fragment elements [`MmaOp::fragments`] assigns it, the
/// operation assembles the tiles from the 32 lanes' fragments by the same
/// layout, multiplies (products of f16 exact, sums in f64, rounded once where
/// `c` is stored), and each lane stores its part of the result. A layout that
/// lost or doubled an element would show here.
fn mma(f: &LoopFunc, m: &mut Machine, op: MmaOp, [c, a, b]: [&Tile; 3], env: &mut [i64]) -> Result<(), InterpError> {
    let origin = |m: &Machine, t: &Tile, env: &mut [i64]| -> Result<Vec<i64>, InterpError> {
        t.origin.iter().map(|&i| m.eval(&f.vars, i, env).map(|v| v.i())).collect()
    };
    let at = |o: &[i64], t: &Tile, (r, col): (i64, i64)| {
        let mut idx = o.to_vec();
        idx[t.rows] += r;
        idx[t.cols] += col;
        idx
    };
    let (co, ao, bo) = (origin(m, c, env)?, origin(m, a, env)?, origin(m, b, env)?);
    let (mm, nn, kk) = op.shape();
    let frag = op.fragments();
    // Each lane's registers, loaded from memory.
    let mut regs: [Vec<Vec<f64>>; 3] = Default::default();
    let input = |slot: usize, v: f64| if slot < 2 && op.rounds_to_tf32() { tf32(v) } else { v };
    for (slot, (t, o, coords)) in [(a, &ao, frag.a), (b, &bo, frag.b), (c, &co, frag.c)].into_iter().enumerate() {
        for lane in 0..32 {
            let r = coords.iter().map(|x| m.load_at(t.tensor, &at(o, t, x.at(lane))).map(|v| input(slot, v.f())));
            regs[slot].push(r.collect::<Result<_, _>>()?);
        }
    }
    // The tiles, assembled from the fragments.
    let tile = |slot: usize, coords: &[crate::ir::Coord], rows: i64, cols: i64| {
        let mut x = vec![f64::NAN; (rows * cols) as usize];
        for lane in 0..32 {
            for (i, c) in coords.iter().enumerate() {
                let (r, col) = c.at(lane);
                x[(r * cols + col) as usize] = regs[slot][lane as usize][i];
            }
        }
        x
    };
    let (ta, tb, tc) = (tile(0, frag.a, mm, kk), tile(1, frag.b, kk, nn), tile(2, frag.c, mm, nn));
    for lane in 0..32 {
        for x in frag.c {
            let (r, col) = x.at(lane);
            let mut acc = tc[(r * nn + col) as usize];
            for k in 0..kk {
                acc += ta[(r * kk + k) as usize] * tb[(k * nn + col) as usize];
            }
            m.store(c.tensor, &at(&co, c, (r, col)), V::F(acc))?;
        }
    }
    Ok(())
}

/// An f32 rounded to TF32 as `cvt.rna.tf32.f32` does: 10 bits of mantissa,
/// to nearest, ties away from zero (NaN stays NaN; overflow gives infinity).
pub fn tf32(v: f64) -> f64 {
    let x = v as f32;
    if x.is_nan() {
        return v;
    }
    f32::from_bits(x.to_bits().wrapping_add(0x1000) & !0x1fff) as f64
}

#[cfg(test)]
mod tests {
    use crate::ir::MmaOp;
    use std::collections::HashSet;

    /// Every element of every tile is in exactly one lane's fragment.
    #[test]
    fn fragments_cover_each_tile_once() {
        for op in MmaOp::ALL {
            let (m, n, k) = op.shape();
            let f = op.fragments();
            for (coords, rows, cols) in [(f.a, m, k), (f.b, k, n), (f.c, m, n)] {
                let places: HashSet<(i64, i64)> = (0..32).flat_map(|l| coords.iter().map(move |c| c.at(l))).collect();
                assert_eq!(places.len() as i64, 32 * coords.len() as i64, "{op:?}: no element twice");
                assert_eq!(places.len() as i64, rows * cols, "{op:?}: every element");
                assert!(places.iter().all(|&(r, c)| (0..rows).contains(&r) && (0..cols).contains(&c)));
            }
        }
    }

    #[test]
    fn tf32_rounds_to_nearest_ties_away() {
        let one = 1.0f32.to_bits();
        let at = |bits: u32| super::tf32(f32::from_bits(bits) as f64);
        assert_eq!(at(one + 0xfff), 1.0);
        assert_eq!(at(one + 0x1000), f32::from_bits(one + 0x2000) as f64);
        assert_eq!(at(f32::MAX.to_bits()), f64::INFINITY);
        assert!(super::tf32(f64::NAN).is_nan());
    }

    /// Lane 5 of `m16n8k8` with TF32 inputs.
    #[test]
    fn tf32_fragments_match_the_ptx_isa() {
        let f = MmaOp::M16n8k8Tf32F32.fragments();
        let a: Vec<_> = f.a.iter().map(|c| c.at(5)).collect();
        assert_eq!(a, [(1, 1), (9, 1), (1, 5), (9, 5)]);
        let b: Vec<_> = f.b.iter().map(|c| c.at(5)).collect();
        assert_eq!(b, [(1, 1), (5, 1)]);
    }

    /// Lane 5 (group 1, position 1) of `m16n8k16` with f16 inputs, as the PTX ISA's figures show it.
    #[test]
    fn fragments_match_the_ptx_isa() {
        let f = MmaOp::M16n8k16F16F32.fragments();
        let a: Vec<_> = f.a.iter().map(|c| c.at(5)).collect();
        assert_eq!(a, [(1, 2), (1, 3), (9, 2), (9, 3), (1, 10), (1, 11), (9, 10), (9, 11)]);
        let b: Vec<_> = f.b.iter().map(|c| c.at(5)).collect();
        assert_eq!(b, [(2, 1), (3, 1), (10, 1), (11, 1)]);
        let c: Vec<_> = f.c.iter().map(|c| c.at(5)).collect();
        assert_eq!(c, [(1, 2), (1, 3), (9, 2), (9, 3)]);
    }
}
