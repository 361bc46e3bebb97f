//! GPU launches: how a loop nest for a GPU target runs, and the rules that
//! make running it on many threads equal to running it in order.
//!
//! Each top-level statement of a kernel's body is one *launch*; launches run
//! one after another. A launch's grid is the chain of loops bound to
//! `block.{x,y,z}` that opens it (perfectly nested, each dimension at most
//! once; an unbound dimension has extent 1). Below the grid, loops bound to
//! `thread.{x,y,z}` give the block: its extent in a dimension is the largest
//! thread loop of that dimension, and a thread loop shorter than the block
//! runs only on the threads below its extent. A launch without bound loops
//! runs on one thread.
//!
//! The rules ([`launches`] checks them; each error says which one broke):
//! - a block loop is one of the loops that open a launch;
//! - thread loops of one dimension do not nest;
//! - in a launch with threads, every store and every local buffer lies
//!   inside thread loops of every dimension the launch uses (otherwise every
//!   thread would store the same element, or share one buffer);
//! - a store to a tensor other than a local buffer depends on every bound
//!   loop around it (otherwise two threads or blocks write one element);
//! - a tensor the launch writes is read in it only by the stores that write
//!   it, at the same indices (an accumulation): no thread reads what
//!   another thread wrote, since nothing orders them;
//! - the grid and the block fit the target's limits.
//!
//! Under these rules the iterations of bound loops are independent, so
//! running them in order (the loop-IR evaluator, the CPU emulation of the
//! backend) computes what the GPU computes.

use crate::analysis::involves;
use crate::ir::{ForKind, GpuDim, LoopFunc, Stmt};
use std::collections::HashSet;
use texc_compiler::target::{GpuSpec, Target};
use texc_compiler::tir::{TExpr, TExprId, TensorId, VarId};

/// One kernel launch: top-level statement `stmt` of the body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launch {
    pub stmt: usize,
    /// Blocks per grid dimension (x, y, z).
    pub grid: [i64; 3],
    /// Threads per block dimension (x, y, z).
    pub block: [i64; 3],
}

impl Launch {
    pub fn blocks(&self) -> i64 {
        self.grid.iter().product()
    }

    pub fn threads(&self) -> i64 {
        self.block.iter().product()
    }
}

/// The launches of `f` on GPU target `t`, or the rule a statement breaks.
pub fn launches(f: &LoopFunc, t: &Target) -> Result<Vec<Launch>, String> {
    let spec = t.gpu.ok_or_else(|| format!("target `{t}` is not a GPU"))?;
    f.body.iter().enumerate().map(|(i, s)| launch(f, i, s, &spec)).collect()
}

/// Whether `f` has loops bound to blocks or threads.
pub fn has_bound_loops(f: &LoopFunc) -> bool {
    fn any(body: &[Stmt]) -> bool {
        body.iter().any(|s| match s {
            Stmt::For { kind, body, .. } => kind.is_gpu() || any(body),
            Stmt::If { then: body, .. } | Stmt::Alloc { body, .. } => any(body),
            Stmt::Store { .. } => false,
        })
    }
    any(&f.body)
}

fn launch(f: &LoopFunc, stmt: usize, s: &Stmt, spec: &GpuSpec) -> Result<Launch, String> {
    let name = |v: VarId| f.vars[v as usize].name.clone();
    let mut grid = [1i64; 3];
    let mut seen = [false; 3];
    let mut bound: Vec<VarId> = Vec::new();
    let mut inner = std::slice::from_ref(s);
    // The grid: the chain of block loops that opens the statement.
    while let [Stmt::For { var, extent, kind: ForKind::Block(d), body, .. }] = inner {
        if std::mem::replace(&mut seen[d.index()], true) {
            return Err(format!("`{}` is a second loop bound to block.{}", name(*var), d.name()));
        }
        grid[d.index()] = *extent;
        bound.push(*var);
        inner = body;
    }
    let mut w = Walk { f, locals: locals(f), block: [1; 3], used: [false; 3], written: HashSet::new() };
    w.stmts(inner, &mut bound.clone(), &mut [false; 3])?;
    let threads = w.used.iter().any(|&u| u);
    if threads {
        w.check_coverage(inner, &mut [false; 3])?;
    }
    // With one thread in one block, nothing runs at once.
    if threads || !bound.is_empty() {
        w.check_reads(inner)?;
    }
    let l = Launch { stmt, grid, block: w.block };
    check_limits(f, &l, spec)?;
    Ok(l)
}

struct Walk<'a> {
    f: &'a LoopFunc,
    block: [i64; 3],
    used: [bool; 3],
    /// Tensors (not local buffers) the launch stores to.
    written: HashSet<TensorId>,
    locals: HashSet<TensorId>,
}

impl Walk<'_> {
    fn name(&self, v: VarId) -> &str {
        &self.f.vars[v as usize].name
    }

    /// Thread extents, nesting, and the independence of bound iterations.
    fn stmts(&mut self, body: &[Stmt], bound: &mut Vec<VarId>, open: &mut [bool; 3]) -> Result<(), String> {
        for s in body {
            match s {
                Stmt::For { var, kind: ForKind::Block(d), .. } => {
                    return Err(format!(
                        "`{}` is bound to block.{} but is not one of the loops that open its launch: \
                         block loops are the outermost loops of a nest",
                        self.name(*var),
                        d.name()
                    ));
                }
                Stmt::For { var, extent, kind: ForKind::Thread(d), body, .. } => {
                    let i = d.index();
                    if open[i] {
                        return Err(format!(
                            "`{}` is bound to thread.{} inside another thread.{} loop",
                            self.name(*var),
                            d.name(),
                            d.name()
                        ));
                    }
                    self.block[i] = self.block[i].max(*extent);
                    self.used[i] = true;
                    open[i] = true;
                    bound.push(*var);
                    self.stmts(body, bound, open)?;
                    bound.pop();
                    open[i] = false;
                }
                Stmt::For { body, .. } | Stmt::If { then: body, .. } | Stmt::Alloc { body, .. } => {
                    self.stmts(body, bound, open)?
                }
                Stmt::Store { tensor, indices, .. } => {
                    if self.is_local(*tensor) {
                        continue;
                    }
                    for &v in bound.iter() {
                        if !indices.iter().any(|&i| involves(&self.f.p, i, v)) {
                            return Err(format!(
                                "the store to `{}` does not depend on bound loop `{}`: its iterations would all \
                                 write the same element",
                                self.tensor_name(*tensor),
                                self.name(v)
                            ));
                        }
                    }
                    self.written.insert(*tensor);
                }
            }
        }
        Ok(())
    }

    /// In a launch with threads, stores and local buffers lie inside thread
    /// loops of every dimension the launch uses.
    fn check_coverage(&self, body: &[Stmt], open: &mut [bool; 3]) -> Result<(), String> {
        let missing = |open: &[bool; 3]| GpuDim::ALL.into_iter().find(|d| self.used[d.index()] && !open[d.index()]);
        for s in body {
            match s {
                Stmt::For { kind: ForKind::Thread(d), body, .. } => {
                    open[d.index()] = true;
                    self.check_coverage(body, open)?;
                    open[d.index()] = false;
                }
                Stmt::Alloc { tensor, body } => {
                    if let Some(d) = missing(open) {
                        return Err(format!(
                            "local buffer `{}` is outside the thread.{} loops of its launch: the block's threads \
                             would share it, which needs shared memory (not built yet); compute it inside the \
                             thread loops",
                            self.tensor_name(*tensor),
                            d.name()
                        ));
                    }
                    self.check_coverage(body, open)?;
                }
                Stmt::For { body, .. } | Stmt::If { then: body, .. } => self.check_coverage(body, open)?,
                Stmt::Store { tensor, .. } => {
                    if let Some(d) = missing(open) {
                        return Err(format!(
                            "the store to `{}` is outside the thread.{} loops of its launch: every thread would \
                             make it",
                            self.tensor_name(*tensor),
                            d.name()
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// A tensor the launch writes is read only by its own accumulations.
    fn check_reads(&self, body: &[Stmt]) -> Result<(), String> {
        let mut bad = None;
        let mut check = |e: TExprId, own: Option<(TensorId, &[TExprId])>| {
            self.loads(e, &mut |t, idx| {
                let accumulation = own.is_some_and(|(o, oi)| o == t && self.same_indices(oi, idx));
                if self.written.contains(&t) && !accumulation && bad.is_none() {
                    bad = Some(t);
                }
            })
        };
        fn walk(body: &[Stmt], check: &mut Check) {
            for s in body {
                match s {
                    Stmt::For { body, .. } | Stmt::Alloc { body, .. } => walk(body, check),
                    Stmt::If { cond, then } => {
                        check(*cond, None);
                        walk(then, check);
                    }
                    Stmt::Store { tensor, indices, value } => {
                        indices.iter().for_each(|&i| check(i, None));
                        check(*value, Some((*tensor, indices)));
                    }
                }
            }
        }
        walk(body, &mut check);
        match bad {
            Some(t) => Err(format!(
                "`{}` is written and read by different iterations of one launch, which nothing orders on a GPU; \
                 compute it in a nest of its own",
                self.tensor_name(t)
            )),
            None => Ok(()),
        }
    }

    fn loads(&self, e: TExprId, found: &mut dyn FnMut(TensorId, &[TExprId])) {
        if let TExpr::Load(t, idx) = self.f.p.expr(e) {
            found(*t, idx);
        }
        for c in self.f.p.children(e) {
            self.loads(c, found);
        }
    }

    fn same_indices(&self, a: &[TExprId], b: &[TExprId]) -> bool {
        // Printing is deterministic and shows every operand, so equal text is the same computation.
        let same = |x: TExprId, y: TExprId| x == y || crate::ir::expr(self.f, x) == crate::ir::expr(self.f, y);
        a.len() == b.len() && a.iter().zip(b).all(|(&x, &y)| same(x, y))
    }

    fn is_local(&self, t: TensorId) -> bool {
        self.locals.contains(&t)
    }

    fn tensor_name(&self, t: TensorId) -> &str {
        &self.f.p.tensor(t).name
    }
}

fn check_limits(f: &LoopFunc, l: &Launch, spec: &GpuSpec) -> Result<(), String> {
    let what = |unit: &str, d: GpuDim, n: i64, max: i64| {
        format!("launch {} has {n} {unit} along {}, more than the target's {max}", l.stmt + 1, d.name())
    };
    for d in GpuDim::ALL {
        let i = d.index();
        if l.grid[i] > spec.max_grid[i] {
            return Err(what("blocks", d, l.grid[i], spec.max_grid[i]));
        }
        if l.block[i] > spec.max_block[i] {
            return Err(what("threads per block", d, l.block[i], spec.max_block[i]));
        }
    }
    if l.threads() > spec.max_threads_per_block {
        return Err(format!(
            "launch {} of `{}` has {} threads per block, more than the target's {}",
            l.stmt + 1,
            f.p.name,
            l.threads(),
            spec.max_threads_per_block
        ));
    }
    Ok(())
}

/// Visits an expression; for a stored value, with the store's tensor and indices.
type Check<'a> = dyn FnMut(TExprId, Option<(TensorId, &[TExprId])>) + 'a;

/// The tensors `Alloc`ated somewhere in `f` (private buffers).
fn locals(f: &LoopFunc) -> HashSet<TensorId> {
    fn walk(body: &[Stmt], out: &mut HashSet<TensorId>) {
        for s in body {
            match s {
                Stmt::Alloc { tensor, body } => {
                    out.insert(*tensor);
                    walk(body, out)
                }
                Stmt::For { body, .. } | Stmt::If { then: body, .. } => walk(body, out),
                Stmt::Store { .. } => {}
            }
        }
    }
    let mut out = HashSet::new();
    walk(&f.body, &mut out);
    out
}
