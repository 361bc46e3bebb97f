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
//! - distinct threads and blocks store distinct elements of a tensor other
//!   than a local buffer (proven as [`crate::independence`] says, from the
//!   stores' indices: all of a launch's stores to a global tensor together,
//!   each store to a shared buffer on its own);
//! - a tensor the launch writes is read in it only by the stores that write
//!   it, at the same indices (an accumulation): no thread reads what
//!   another thread wrote, since nothing orders them;
//! - a block's shared buffer (`shared` in the loop IR, `in shared` in a
//!   schedule) is declared inside the block loops and outside the thread
//!   loops; its threads store distinct elements of it, and two statements
//!   that access it, one of them writing, have a barrier between them
//!   (checked by walking the block's statements in order, loops twice,
//!   each thread loop one statement);
//!   barriers are outside thread loops and `if`s, so every thread reaches them;
//! - the grid, the block and the shared memory fit the target's limits, and
//!   so do the thread-private buffers open at once, in registers (255 a
//!   thread, 65536 a block).
//!
//! Under these rules the iterations of bound loops are independent between
//! barriers, so running the loop nest in order — each thread loop to its
//! end before the next statement, as the loop-IR evaluator and the CPU
//! emulation do — computes what the GPU computes.

use crate::independence::{Access as Touch, Parties, Role};
use crate::interval::{self, Iv};
use crate::ir::{AsyncStep, ForKind, GpuDim, LoopFunc, Stmt, Wgmma, WgmmaOp};
use std::collections::{BTreeSet, HashMap, HashSet};
use texc_compiler::ops::BinOp;
use texc_compiler::target::{GpuSpec, Target};
use texc_compiler::tir::{TExpr, TExprId, TensorId, VarId};

type R = Result<(), RuleError>;

/// A launch rule a loop nest breaks, and where, when one statement is at fault.
#[derive(Clone, Debug, PartialEq)]
pub struct RuleError {
    pub message: String,
    pub at: Option<Site>,
}

/// What a [`RuleError`] is about.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Site {
    Loop(VarId),
    Tensor(TensorId),
    /// An expression of the statement at fault (a store's value).
    Expr(TExprId),
}

impl RuleError {
    pub fn at(site: Site, message: String) -> RuleError {
        RuleError { message, at: Some(site) }
    }
}

impl From<String> for RuleError {
    fn from(message: String) -> RuleError {
        RuleError { message, at: None }
    }
}

impl From<&str> for RuleError {
    fn from(message: &str) -> RuleError {
        message.to_string().into()
    }
}

impl std::fmt::Display for RuleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// One kernel launch: top-level statement `stmt` of the body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launch {
    pub stmt: usize,
    /// Blocks per grid dimension (x, y, z).
    pub grid: [i64; 3],
    /// Threads per block dimension (x, y, z).
    pub block: [i64; 3],
    /// Bytes of dynamic shared memory the launch asks for: its shared
    /// buffers, where they are more than a kernel may declare statically
    /// (each then lies at [`shared_offsets`] in one dynamic array); else 0.
    pub dynamic_shared: i64,
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
/// That threads and blocks store distinct elements is proven from the
/// indices, or else by running `f` where that is a proof
/// ([`crate::independence::runs_without_races`]).
pub fn launches(f: &LoopFunc, t: &Target) -> Result<Vec<Launch>, RuleError> {
    launches_with(f, t, true)
}

/// [`launches`] with distinct stores proven from the indices alone.
pub fn launches_from_indices(f: &LoopFunc, t: &Target) -> Result<Vec<Launch>, RuleError> {
    launches_with(f, t, false)
}

fn launches_with(f: &LoopFunc, t: &Target, or_by_running: bool) -> Result<Vec<Launch>, RuleError> {
    let spec = t.gpu.ok_or_else(|| RuleError::from(format!("target `{t}` is not a GPU")))?;
    f.body.iter().enumerate().map(|(i, s)| launch(f, i, s, &spec, or_by_running)).collect()
}

/// Whether `f` has loops bound to blocks or threads.
pub fn has_bound_loops(f: &LoopFunc) -> bool {
    fn any(body: &[Stmt]) -> bool {
        body.iter().any(|s| match s {
            Stmt::For { kind, body, .. } => kind.is_gpu() || any(body),
            Stmt::If { then: body, .. } | Stmt::Alloc { body, .. } => any(body),
            Stmt::Mma { .. } | Stmt::Wgmma(_) | Stmt::WarpReduce(_) => true,
            Stmt::Store { .. } | Stmt::TileDot(_) | Stmt::Barrier | Stmt::Async(_) | Stmt::Prefetch { .. } => false,
        })
    }
    any(&f.body)
}

fn launch(f: &LoopFunc, stmt: usize, s: &Stmt, spec: &GpuSpec, or_by_running: bool) -> Result<Launch, RuleError> {
    let name = |v: VarId| f.vars[v as usize].name.clone();
    let mut grid = [1i64; 3];
    let mut seen = [false; 3];
    let mut bound: Vec<VarId> = Vec::new();
    let mut inner = std::slice::from_ref(s);
    // The grid: the chain of block loops that opens the statement.
    let mut parties = Parties::new(f, vec![interval::exact(0); 6]);
    while let [Stmt::For { var, lo, extent, kind: ForKind::Block(d), body }] = inner {
        if std::mem::replace(&mut seen[d.index()], true) {
            return Err(RuleError::at(
                Site::Loop(*var),
                format!("`{}` is a second loop bound to block.{}", name(*var), d.name()),
            ));
        }
        grid[d.index()] = *extent;
        parties.set(*var, Role::Id { id: BLOCK_IDS + d.index(), offset: *lo });
        bound.push(*var);
        inner = body;
    }
    let private = locals(f).into_iter().filter(|t| !f.shared.contains(t) && !f.registers.contains(t)).collect();
    let mut w = Walk {
        f,
        private,
        block: [1; 3],
        used: [false; 3],
        written: HashSet::new(),
        mma: false,
        wgmma: false,
        thread_x: None,
        warp_reduces: Vec::new(),
        local_words: 0,
        most_local: (0, None),
        parties,
        guards: Vec::new(),
        threads: [1; 3],
        units: 0,
        writes: Vec::new(),
    };
    w.stmts(inner, &mut bound.clone(), &mut [false; 3], false)?;
    for &t in &w.warp_reduces {
        w.check_warp_reduce(t)?;
    }
    w.check_registers(spec)?;
    if w.mma && w.block[0] != WARP {
        return Err(RuleError::from(format!(
            "launch {} has `mma` and {} threads along x: the 32 lanes of a warp are thread.x, so thread.x loops \
             beside it have at most 32 iterations",
            stmt + 1,
            w.block[0]
        )));
    }
    if w.wgmma && (w.mma || w.block[0] != WgmmaOp::LANES) {
        return Err(RuleError::from(format!(
            "launch {} has `wgmma` and {}: the 128 lanes of a warpgroup are thread.x, so thread.x loops beside it \
             have at most 128 iterations, and `mma` does not share its launch",
            stmt + 1,
            if w.mma { "`mma`".to_string() } else { format!("{} threads along x", w.block[0]) }
        )));
    }
    let threads = w.used.iter().any(|&u| u);
    if threads {
        w.check_coverage(inner, &mut [false; 3])?;
    }
    w.check_distinct_writes(grid, or_by_running)?;
    // With one thread in one block, nothing runs at once.
    if threads || !bound.is_empty() {
        w.check_reads(inner)?;
    }
    w.check_shared(inner)?;
    let shared = shared_bytes(f, inner);
    let dynamic_shared = if shared > spec.static_shared_bytes { shared } else { 0 };
    let l = Launch { stmt, grid, block: w.block, dynamic_shared };
    check_limits(f, &l, spec)?;
    if shared > spec.shared_bytes_per_block {
        return Err(RuleError::from(format!(
            "launch {} uses {shared} bytes of shared memory, more than the {} a block may have",
            stmt + 1,
            spec.shared_bytes_per_block
        )));
    }
    Ok(l)
}

struct Walk<'a> {
    f: &'a LoopFunc,
    block: [i64; 3],
    used: [bool; 3],
    /// Tensors in memory every block sees that the launch stores to.
    written: HashSet<TensorId>,
    /// Buffers private to a thread (local `Alloc`s).
    private: HashSet<TensorId>,
    /// The launch has tensor-core operations (its block is one warp wide).
    mma: bool,
    /// The launch has warpgroup operations (its block is 128 threads wide).
    wgmma: bool,
    /// The variable of the open `thread.x` loop, where it starts at 0: the
    /// index of the thread's element of a `registers` buffer.
    thread_x: Option<VarId>,
    /// The buffers of the launch's warp reductions.
    warp_reduces: Vec<TensorId>,
    /// 32-bit words of the thread-private buffers open at the statement
    /// being walked, and the most at any statement (with the innermost
    /// buffer open there).
    local_words: i64,
    most_local: (i64, Option<TensorId>),
    /// The role of each loop variable for telling threads and blocks apart
    /// (ids: thread x, y, z, then block x, y, z).
    parties: Parties,
    /// The conditions of the `if`s around the statement being walked.
    guards: Vec<TExprId>,
    /// The extent of the open thread loop of each dimension (1 where none is open).
    threads: [i64; 3],
    /// Counts the block-level statements with threads walked so far.
    units: usize,
    /// The launch's stores and tensor-core tiles to memory that more than
    /// one thread sees, for [`Walk::check_distinct_writes`].
    writes: Vec<Write>,
}

/// A store (or an `mma` tile) to a global or shared tensor.
struct Write {
    access: Touch,
    /// A warp's tensor-core tile: its lanes make it together.
    mma: bool,
    at: Site,
    /// The block-level statement (a thread loop, between barriers) it is in.
    unit: usize,
}

/// The first of the ids of [`Walk::parties`] that are block coordinates.
const BLOCK_IDS: usize = 3;

/// Threads of a warp.
const WARP: i64 = 32;

impl Walk<'_> {
    /// A warpgroup's `wgmma`: outside thread.x loops and `if`s (its 128
    /// lanes are thread.x and take it together), its accumulators in global
    /// or shared memory, its operands in shared buffers laid out as its
    /// descriptors say (`crate::tensorize` made them so; checked again here
    /// for `.loops` files).
    fn wgmma(&mut self, w: &Wgmma, open: &[bool; 3], guarded: bool) -> R {
        if open[0] || guarded {
            return Err(RuleError::at(
                Site::Tensor(w.c.tensor),
                format!(
                    "`wgmma` on `{}` is inside a thread.x loop or under an `if`: the warpgroup's 128 lanes are \
                     thread.x and take it together, so it stands where a thread.x loop would",
                    self.tensor_name(w.c.tensor)
                ),
            ));
        }
        if self.private.contains(&w.c.tensor) || self.f.registers.contains(&w.c.tensor) {
            return Err(RuleError::at(
                Site::Tensor(w.c.tensor),
                format!("`wgmma` on `{}`, a buffer private to each thread", self.tensor_name(w.c.tensor)),
            ));
        }
        for m in [&w.a, &w.b] {
            if !self.f.shared.contains(&m.tensor) {
                return Err(RuleError::at(
                    Site::Tensor(m.tensor),
                    format!(
                        "`wgmma` reads `{}` through a matrix descriptor, so it is a shared buffer \
                         (`cache_read ... in shared`)",
                        self.tensor_name(m.tensor)
                    ),
                ));
            }
        }
        self.wgmma = true;
        self.used[0] = true;
        self.block[0] = self.block[0].max(WgmmaOp::LANES);
        let (m, n, _) = w.op.shape();
        let mut access = self.made_here(Touch::tile(&w.c, m, n, true));
        // Every lane of the warpgroup takes part.
        access.within[0] = (0, interval::range(0, WgmmaOp::LANES as i128 - 1));
        self.writes.push(Write { access, mma: true, at: Site::Tensor(w.c.tensor), unit: self.units });
        if !self.f.shared.contains(&w.c.tensor) {
            self.written.insert(w.c.tensor);
        }
        Ok(())
    }

    fn name(&self, v: VarId) -> &str {
        &self.f.vars[v as usize].name
    }

    /// Thread extents, nesting, and the independence of bound iterations.
    fn stmts(&mut self, body: &[Stmt], bound: &mut Vec<VarId>, open: &mut [bool; 3], guarded: bool) -> R {
        for s in body {
            match s {
                Stmt::Barrier if open.iter().any(|&o| o) => {
                    return Err(RuleError {
                        message: "a barrier inside a thread loop: every thread of the block must reach it, so \
                                  barriers are outside the thread loops"
                            .into(),
                        at: bound.last().map(|&v| Site::Loop(v)),
                    });
                }
                Stmt::Async(_) if open.iter().any(|&o| o) || guarded => {
                    return Err(RuleError {
                        message: "an `async commit` or `async wait` inside a thread loop or under an `if`: every \
                                  thread of the block takes these steps together"
                            .into(),
                        at: bound.last().map(|&v| Site::Loop(v)),
                    });
                }
                Stmt::Barrier if guarded => {
                    return Err("a barrier under an `if`: every thread of the block must reach it".into());
                }
                Stmt::Barrier | Stmt::Async(_) | Stmt::Prefetch { .. } => {}
                Stmt::TileDot(d) => {
                    return Err(RuleError::at(
                        Site::Tensor(d.c.tensor),
                        format!(
                            "an AMX tile product on `{}` in a GPU kernel: `{}` runs on x86 CPUs with AMX-INT8",
                            self.tensor_name(d.c.tensor),
                            crate::ir::TileDot::SCHEDULE_NAME
                        ),
                    ))
                }
                Stmt::WarpReduce(w) => {
                    if open.iter().any(|&o| o) || guarded {
                        return Err(RuleError::at(
                            Site::Tensor(w.tensor),
                            format!(
                                "the warp reduction of `{}` is inside a thread loop or under an `if`: it stands where \
                                 a thread.x loop over its elements would",
                                self.tensor_name(w.tensor)
                            ),
                        ));
                    }
                    self.warp_reduces.push(w.tensor);
                }
                Stmt::Mma { op, c, a, b } => {
                    if open[0] {
                        return Err("`mma` inside a thread.x loop: the warp's 32 lanes are thread.x, so `mma` \
                                    stands where a thread.x loop would"
                            .into());
                    }
                    for t in [c, a, b] {
                        if self.private.contains(&t.tensor) || self.f.registers.contains(&t.tensor) {
                            return Err(RuleError::at(
                                Site::Tensor(t.tensor),
                                format!(
                                "`mma` on `{}`, a buffer private to each thread: its tiles are in global or shared \
                                 memory",
                                self.tensor_name(t.tensor)
                            ),
                            ));
                        }
                    }
                    self.mma = true;
                    self.used[0] = true;
                    self.block[0] = self.block[0].max(WARP);
                    let (m, n, _) = op.shape();
                    let mut access = self.made_here(Touch::tile(c, m, n, true));
                    // Every lane of the warp takes part.
                    access.within[0] = (0, interval::range(0, WARP as i128 - 1));
                    self.writes.push(Write { access, mma: true, at: Site::Tensor(c.tensor), unit: self.units });
                    if !self.f.shared.contains(&c.tensor) {
                        self.written.insert(c.tensor);
                    }
                }
                Stmt::Wgmma(w) => self.wgmma(w, open, guarded)?,
                Stmt::Alloc { tensor, .. }
                    if (self.f.shared.contains(tensor) || self.f.registers.contains(tensor))
                        && open.iter().any(|&o| o) =>
                {
                    let scope = if self.f.shared.contains(tensor) { "shared" } else { "registers" };
                    return Err(RuleError::at(
                        Site::Tensor(*tensor),
                        format!(
                            "{scope} buffer `{}` is inside a thread loop: a block's {scope} buffers are outside its \
                         thread loops",
                            self.tensor_name(*tensor)
                        ),
                    ));
                }
                Stmt::For { var, kind: ForKind::Async, extent, body, .. } => {
                    self.check_async_copy(*var, *extent, body)?;
                    // Not bound: each thread at any of its values while another runs.
                    self.parties.set(*var, Role::Free);
                    self.stmts(body, bound, open, guarded)?;
                }
                Stmt::For { var, kind: ForKind::Block(d), .. } => {
                    return Err(RuleError::at(
                        Site::Loop(*var),
                        format!(
                            "`{}` is bound to block.{} but is not one of the loops that open its launch: \
                         block loops are the outermost loops of a nest",
                            self.name(*var),
                            d.name()
                        ),
                    ));
                }
                Stmt::For { var, lo, extent, kind: ForKind::Thread(d), body } => {
                    let i = d.index();
                    if open[i] {
                        return Err(RuleError::at(
                            Site::Loop(*var),
                            format!(
                                "`{}` is bound to thread.{} inside another thread.{} loop",
                                self.name(*var),
                                d.name(),
                                d.name()
                            ),
                        ));
                    }
                    self.block[i] = self.block[i].max(*extent);
                    self.used[i] = true;
                    if !open.iter().any(|&o| o) {
                        self.units += 1;
                    }
                    open[i] = true;
                    self.parties.set(*var, Role::Id { id: i, offset: *lo });
                    let outer = std::mem::replace(&mut self.threads[i], *extent);
                    // One iteration runs on one thread: nothing to tell apart.
                    let one = *extent == 1;
                    if !one {
                        bound.push(*var);
                    }
                    if *d == GpuDim::X {
                        self.thread_x = (*lo == 0).then_some(*var);
                    }
                    self.stmts(body, bound, open, guarded)?;
                    if *d == GpuDim::X {
                        self.thread_x = None;
                    }
                    if !one {
                        bound.pop();
                    }
                    self.threads[i] = outer;
                    open[i] = false;
                }
                Stmt::Alloc { tensor, body } if self.private.contains(tensor) => {
                    let d = self.f.p.tensor(*tensor);
                    let words = d.len().saturating_mul(d.elem.size() as i64).saturating_add(3) / 4;
                    self.local_words = self.local_words.saturating_add(words);
                    if self.local_words > self.most_local.0 {
                        self.most_local = (self.local_words, Some(*tensor));
                    }
                    self.stmts(body, bound, open, guarded)?;
                    self.local_words -= words;
                }
                Stmt::For { var, body, .. } => {
                    // Not bound: each thread at any of its values while another runs.
                    self.parties.set(*var, Role::Free);
                    self.stmts(body, bound, open, guarded)?
                }
                Stmt::Alloc { body, .. } => self.stmts(body, bound, open, guarded)?,
                Stmt::If { cond, then } => {
                    self.check_register_reads(*cond)?;
                    self.guards.push(*cond);
                    let r = self.stmts(then, bound, open, true);
                    self.guards.pop();
                    r?
                }
                Stmt::Store { tensor, indices, value } => {
                    for &e in indices.iter().chain([value]) {
                        self.check_register_reads(e)?;
                    }
                    if self.f.registers.contains(tensor) {
                        self.check_own_element(*tensor, indices, *value)?;
                        continue;
                    }
                    if self.private.contains(tensor) {
                        continue;
                    }
                    let access = self.made_here(Touch::element(*tensor, indices, true));
                    self.writes.push(Write { access, mma: false, at: Site::Expr(*value), unit: self.units });
                    if !self.f.shared.contains(tensor) {
                        self.written.insert(*tensor);
                    }
                }
            }
        }
        Ok(())
    }

    /// `a` as made where the walk is: under its guards, by the threads of
    /// the open thread loops.
    fn made_here(&self, mut a: Touch) -> Touch {
        a.guards = self.guards.clone();
        a.within = (0..3).map(|d| (d, interval::range(0, (self.threads[d] - 1) as i128))).collect();
        a
    }

    /// Distinct threads and blocks store distinct elements
    /// ([`crate::independence`]): of a global tensor, over all the
    /// launch's stores to it; of a shared buffer, within each block-level
    /// statement (its blocks have buffers of their own, and statements are
    /// ordered by barriers, see [`Walk::check_shared`]). A warp's lanes make its
    /// `mma` together: only its other coordinates tell its tiles apart.
    fn check_distinct_writes(&self, grid: [i64; 3], or_by_running: bool) -> R {
        let ids: Vec<Iv> = self.block.iter().chain(&grid).map(|&n| interval::range(0, (n - 1) as i128)).collect();
        let in_block = |ids: &mut Vec<Iv>| ids[BLOCK_IDS..].fill(interval::exact(0));
        let mut tensors: Vec<TensorId> = self.writes.iter().map(|w| w.access.tensor).collect();
        tensors.sort();
        tensors.dedup();
        for t in tensors {
            let of_t: Vec<&Write> = self.writes.iter().filter(|w| w.access.tensor == t).collect();
            // A shared buffer's stores race only within one statement between barriers.
            let groups: Vec<Vec<&Write>> = if self.f.shared.contains(&t) {
                let mut units: Vec<usize> = of_t.iter().map(|w| w.unit).collect();
                units.dedup();
                units.into_iter().map(|u| of_t.iter().copied().filter(|w| w.unit == u).collect()).collect()
            } else {
                vec![of_t]
            };
            for group in groups {
                let mut ids = ids.clone();
                if self.f.shared.contains(&t) {
                    in_block(&mut ids);
                }
                if group.iter().all(|w| w.mma) {
                    ids[0] = interval::exact(0);
                }
                let parties = self.parties.with_ids(ids);
                let accesses: Vec<&Touch> = group.iter().map(|w| &w.access).collect();
                let unseparated = parties.unseparated(self.f, &accesses);
                let ran = || or_by_running && crate::independence::runs_without_races(self.f);
                if let Some(id) = unseparated.filter(|_| !ran()) {
                    let who = if id < BLOCK_IDS { "thread" } else { "block" };
                    let dim = GpuDim::ALL[id % BLOCK_IDS].name();
                    let what = if group[0].mma { "the `mma` tile of" } else { "the store to" };
                    return Err(RuleError::at(
                        group[0].at,
                        format!(
                            "{what} `{}` may write an element that another {who} writes: no index tells {who}.{dim} \
                             apart, so they would race (distinct threads and blocks store distinct elements)",
                            self.tensor_name(t)
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// A thread touches only its own element of a `registers` buffer: the
    /// one at the variable of its `thread.x` loop (which starts at 0).
    fn check_own_element(&self, t: TensorId, indices: &[TExprId], at: TExprId) -> R {
        let own =
            matches!((indices, self.thread_x), ([i], Some(x)) if matches!(self.f.p.expr(*i), TExpr::Var(v) if *v == x));
        if own {
            return Ok(());
        }
        Err(RuleError::at(
            Site::Expr(at),
            format!(
                "`{}` is held in registers, an element per thread: a thread.x loop from 0 touches it only at its \
                 own variable",
                self.tensor_name(t)
            ),
        ))
    }

    fn check_register_reads(&self, e: TExprId) -> R {
        let mut bad = None;
        self.loads(e, &mut |t, idx| {
            if self.f.registers.contains(&t) && bad.is_none() && self.check_own_element(t, idx, e).is_err() {
                bad = Some(t);
            }
        });
        match bad {
            Some(t) => self.check_own_element(t, &[], e),
            None => Ok(()),
        }
    }

    /// A thread's private buffers (accumulators, small arrays) are meant for
    /// its registers: together they fit in the registers a thread may have,
    /// and the block's threads' in the registers of a block. (Beyond that
    /// they would live in local memory, a round trip per access; `ptxas`
    /// reports what it spills besides.)
    fn check_registers(&self, spec: &GpuSpec) -> R {
        let (words, Some(t)) = self.most_local else { return Ok(()) };
        let threads: i64 = self.block.iter().product();
        let name = self.tensor_name(t);
        let why = if words > spec.registers_per_thread {
            format!(
                "a thread's local buffers (with `{name}`) take {words} 32-bit registers, more than the {} a thread has",
                spec.registers_per_thread
            )
        } else if words.saturating_mul(threads) > spec.registers_per_block {
            format!(
                "a thread's local buffers (with `{name}`) take {words} 32-bit registers, and {threads} threads need {}, \
                 more than the {} of a block",
                words.saturating_mul(threads),
                spec.registers_per_block
            )
        } else {
            return Ok(());
        };
        Err(RuleError::at(Site::Tensor(t), why))
    }

    /// A warp reduction's groups are warps (or their first lanes) when the
    /// block's threads are along x only, and each of its elements is a thread's.
    fn check_warp_reduce(&self, t: TensorId) -> R {
        let n = self.f.p.tensor(t).len();
        let why = if self.block[1] > 1 || self.block[2] > 1 {
            "its launch has threads along y or z, so its warps are not groups of thread.x"
        } else if n > self.block[0] {
            "it has more elements than the block has threads"
        } else {
            return Ok(());
        };
        Err(RuleError::at(Site::Tensor(t), format!("the warp reduction of `{}`: {why}", self.tensor_name(t))))
    }

    /// An `async` loop is one `cp.async`: a store of a global tensor's
    /// elements, unchanged, into a shared buffer, 4, 8 or 16 bytes in all.
    fn check_async_copy(&self, var: VarId, extent: i64, body: &[Stmt]) -> R {
        let at = |why: String| Err(RuleError::at(Site::Loop(var), format!("`async` loop `{}`: {why}", self.name(var))));
        let [Stmt::Store { tensor, value, .. }] = body else {
            return at("its body must be one store (an asynchronous copy of its elements)".into());
        };
        let TExpr::Load(src, _) = self.f.p.expr(*value) else {
            return at("it stores a computed value; an asynchronous copy only moves elements".into());
        };
        let (dst, from) = (self.f.p.tensor(*tensor), self.f.p.tensor(*src));
        if !self.f.shared.contains(tensor) || self.f.shared.contains(src) || self.private.contains(src) {
            return at(format!(
                "it copies `{}` into `{}`; asynchronous copies go from global to shared memory",
                from.name, dst.name
            ));
        }
        let bytes = extent * dst.elem.size() as i64;
        if from.elem != dst.elem || !matches!(bytes, 4 | 8 | 16) {
            return at(format!(
                "it copies {bytes} bytes of {} into {}; `cp.async` copies 4, 8 or 16 of one type",
                from.elem, dst.elem
            ));
        }
        Ok(())
    }

    /// In a launch with threads, stores and local buffers lie inside thread
    /// loops of every dimension the launch uses.
    fn check_coverage(&self, body: &[Stmt], open: &mut [bool; 3]) -> R {
        let missing = |open: &[bool; 3]| GpuDim::ALL.into_iter().find(|d| self.used[d.index()] && !open[d.index()]);
        for s in body {
            match s {
                Stmt::For { kind: ForKind::Thread(d), body, .. } => {
                    open[d.index()] = true;
                    self.check_coverage(body, open)?;
                    open[d.index()] = false;
                }
                Stmt::Alloc { tensor, body } if self.f.shared.contains(tensor) || self.f.registers.contains(tensor) => {
                    self.check_coverage(body, open)?
                }
                Stmt::Alloc { tensor, body } => {
                    if let Some(d) = missing(open) {
                        return Err(RuleError::at(
                            Site::Tensor(*tensor),
                            format!(
                                "local buffer `{}` is outside the thread.{} loops of its launch: the block's threads \
                             would share it, which needs shared memory (not built yet); compute it inside the \
                             thread loops",
                                self.tensor_name(*tensor),
                                d.name()
                            ),
                        ));
                    }
                    self.check_coverage(body, open)?;
                }
                Stmt::For { body, .. } | Stmt::If { then: body, .. } => self.check_coverage(body, open)?,
                Stmt::Barrier | Stmt::Async(_) | Stmt::WarpReduce(_) | Stmt::TileDot(_) | Stmt::Prefetch { .. } => {}
                // The warp's lanes are its thread.x.
                Stmt::Mma { c, .. } => {
                    let mut lanes = *open;
                    lanes[0] = true;
                    if let Some(d) = missing(&lanes) {
                        return Err(RuleError::at(Site::Tensor(c.tensor), format!(
                            "the `mma` on `{}` is outside the thread.{} loops of its launch: every thread would make it",
                            self.tensor_name(c.tensor),
                            d.name()
                        )));
                    }
                }
                Stmt::Wgmma(w) => {
                    let mut lanes = *open;
                    lanes[0] = true;
                    if let Some(d) = missing(&lanes) {
                        return Err(RuleError::at(
                            Site::Tensor(w.c.tensor),
                            format!(
                                "the `wgmma` on `{}` is outside the thread.{} loops of its launch: every thread \
                                 would make it",
                                self.tensor_name(w.c.tensor),
                                d.name()
                            ),
                        ));
                    }
                }
                Stmt::Store { tensor, value, .. } => {
                    if let Some(d) = missing(open) {
                        return Err(RuleError::at(
                            Site::Expr(*value),
                            format!(
                                "the store to `{}` is outside the thread.{} loops of its launch: every thread would \
                             make it",
                                self.tensor_name(*tensor),
                                d.name()
                            ),
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// A tensor the launch writes is read only by its own accumulations.
    fn check_reads(&self, body: &[Stmt]) -> R {
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
                    Stmt::Mma { c, a, b, .. } => [c, a, b].iter().flat_map(|t| &t.origin).for_each(|&i| check(i, None)),
                    Stmt::Wgmma(w) => {
                        w.c.origin.iter().chain(&w.a.origin).chain(&w.b.origin).for_each(|&i| check(i, None))
                    }
                    Stmt::TileDot(d) => d.origins().for_each(|&i| check(i, None)),
                    Stmt::Barrier | Stmt::Async(_) | Stmt::WarpReduce(_) | Stmt::Prefetch { .. } => {}
                }
            }
        }
        walk(body, &mut check);
        // The tiles `mma` reads: other threads' elements.
        fn operands(body: &[Stmt], out: &mut Vec<TensorId>) {
            for s in body {
                match s {
                    Stmt::Mma { a, b, .. } => out.extend([a.tensor, b.tensor]),
                    Stmt::Wgmma(w) => out.extend([w.a.tensor, w.b.tensor]),
                    s => operands(s.body(), out),
                }
            }
        }
        let mut read = Vec::new();
        operands(body, &mut read);
        bad = bad.or_else(|| read.into_iter().find(|t| self.written.contains(t)));
        match bad {
            Some(t) => Err(RuleError::at(
                Site::Tensor(t),
                format!(
                    "`{}` is written and read by different iterations of one launch, which nothing orders on a GPU; \
                 compute it in a nest of its own",
                    self.tensor_name(t)
                ),
            )),
            None => Ok(()),
        }
    }

    /// Shared buffers: two statements of a block that access one, at least
    /// one of them writing it, have a barrier between them (a loop's next
    /// iteration follows its last statement); within one statement, the
    /// threads that write it read it only where they wrote it themselves.
    /// Accesses whose first index is a known constant in the walk (a slot
    /// of a pipelined buffer, `As[(ko + 2) % 3, ...]`) touch only that slot.
    /// An asynchronous copy's elements are written when an `async wait`
    /// retires its group: nothing uses them before, and other threads only
    /// after a barrier that follows the wait.
    fn check_shared(&self, body: &[Stmt]) -> R {
        if self.f.shared.is_empty() {
            return Ok(());
        }
        self.phases(body, &mut Phase::default())
    }

    fn phases(&self, body: &[Stmt], ph: &mut Phase) -> R {
        for s in body {
            match s {
                Stmt::Barrier => ph.now.clear(),
                Stmt::Async(AsyncStep::Commit) => {
                    let open = std::mem::take(&mut ph.open);
                    ph.groups.push(open);
                }
                Stmt::Async(AsyncStep::Wait(n)) => {
                    let keep = ph.groups.len().saturating_sub((*n).max(0) as usize);
                    for (key, _) in ph.groups.drain(..keep).flatten() {
                        let a = ph.now.entry(key).or_default();
                        a.write = true;
                        a.writers.push(usize::MAX);
                    }
                }
                // Block-level code: the statements inside, in order. A loop
                // with a barrier of its own is walked with its first two
                // values (slots move from one iteration to the next).
                Stmt::For { var, lo, kind, extent, body } if !kind.is_gpu() => {
                    let known = body.iter().any(|s| matches!(s, Stmt::Barrier));
                    for pass in 0..(*extent).clamp(0, 2) {
                        if known {
                            ph.env.insert(*var, lo + pass);
                        }
                        self.phases(body, ph)?;
                    }
                    ph.env.remove(var);
                }
                Stmt::Alloc { body, .. } | Stmt::If { then: body, .. } => self.phases(body, ph)?,
                // A thread loop (or a store the block makes once).
                unit => {
                    let mut acc: HashMap<Key, Access> = HashMap::new();
                    self.shared_accesses(std::slice::from_ref(unit), &ph.env, false, &mut acc);
                    let mut acc: Vec<(Key, Access)> = acc.into_iter().collect();
                    acc.sort_by_key(|(k, _)| *k);
                    for (key, a) in acc {
                        let name = self.tensor_name(key.0);
                        if a.write && a.foreign_read {
                            return Err(RuleError::at(
                                Site::Tensor(key.0),
                                format!(
                                    "shared buffer `{name}` is written and read by the threads of one statement, with \
                                 no barrier possible between them; write it in one thread loop and read it in \
                                 another, after a barrier"
                                ),
                            ));
                        }
                        // Another pass of a loop over the same copies copies other elements.
                        let same_copy = |w: &[usize]| a.copy && !a.read && a.writers.iter().all(|x| w.contains(x));
                        if ph.in_flight().any(|(k, w)| overlap(*k, key) && !same_copy(w)) {
                            return Err(RuleError::at(
                                Site::Tensor(key.0),
                                format!(
                                    "shared buffer `{name}` is used while an asynchronous copy into it is in flight: \
                                 `async wait` for its group, then a barrier, first"
                                ),
                            ));
                        }
                        for (_, p) in ph.now.iter().filter(|(k, _)| overlap(**k, key)) {
                            // Another pass of a loop over the same stores writes other elements (each
                            // stage's nest writes each element once); other stores may not race it.
                            let other_writer = p.writers.iter().any(|w| !a.writers.contains(w));
                            if (a.write && (p.read || other_writer)) || (a.read && p.write) {
                                return Err(RuleError::at(
                                    Site::Tensor(key.0),
                                    format!(
                                        "shared buffer `{name}` is written by one statement and used by another with \
                                     no barrier between them: the block's threads would race"
                                    ),
                                ));
                            }
                        }
                        if a.copy {
                            ph.open.push((key, a.writers.clone()));
                        }
                        let p = ph.now.entry(key).or_default();
                        p.read |= a.read;
                        p.write |= a.write;
                        p.writers.extend(a.writers);
                    }
                }
            }
        }
        Ok(())
    }

    /// How the statements `body` access each shared buffer (`copy`: inside
    /// an asynchronous copy's loop).
    fn shared_accesses(&self, body: &[Stmt], env: &HashMap<VarId, i64>, copy: bool, acc: &mut HashMap<Key, Access>) {
        let key = |t: TensorId, idx: &[TExprId]| (t, idx.first().and_then(|&i| slot(&self.f.p, i, env)));
        let reads = |e: TExprId, own: Option<(TensorId, &[TExprId])>, acc: &mut HashMap<Key, Access>| {
            self.loads(e, &mut |t, idx| {
                if self.f.shared.contains(&t) {
                    let a = acc.entry(key(t, idx)).or_default();
                    a.read = true;
                    a.foreign_read |= !own
                        .is_some_and(|(o, oi)| o == t && (self.same_indices(oi, idx) || self.shifted_past(oi, idx)));
                }
            })
        };
        for s in body {
            match s {
                Stmt::For { kind, body, .. } => self.shared_accesses(body, env, copy || *kind == ForKind::Async, acc),
                Stmt::Alloc { body, .. } => self.shared_accesses(body, env, copy, acc),
                Stmt::If { cond, then } => {
                    reads(*cond, None, acc);
                    self.shared_accesses(then, env, copy, acc);
                }
                Stmt::Store { tensor, indices, value } => {
                    indices.iter().for_each(|&i| reads(i, None, acc));
                    reads(*value, Some((*tensor, indices)), acc);
                    if self.f.shared.contains(tensor) {
                        let a = acc.entry(key(*tensor, indices)).or_default();
                        a.write = true;
                        a.copy |= copy;
                        a.writers.push(s as *const Stmt as usize);
                    }
                }
                Stmt::Mma { c, a, b, .. } => {
                    for t in [a, b] {
                        if self.f.shared.contains(&t.tensor) {
                            let x = acc.entry(key(t.tensor, &t.origin)).or_default();
                            x.read = true;
                            x.foreign_read = true;
                        }
                    }
                    if self.f.shared.contains(&c.tensor) {
                        let x = acc.entry(key(c.tensor, &c.origin)).or_default();
                        (x.read, x.write) = (true, true);
                        x.writers.push(s as *const Stmt as usize);
                    }
                }
                Stmt::Wgmma(w) => {
                    for m in [&w.a, &w.b] {
                        let x = acc.entry(key(m.tensor, &m.origin)).or_default();
                        x.read = true;
                        x.foreign_read = true;
                    }
                    if self.f.shared.contains(&w.c.tensor) {
                        let x = acc.entry(key(w.c.tensor, &w.c.origin)).or_default();
                        (x.read, x.write) = (true, true);
                        x.writers.push(s as *const Stmt as usize);
                    }
                }
                Stmt::Barrier | Stmt::Async(_) | Stmt::WarpReduce(_) | Stmt::TileDot(_) | Stmt::Prefetch { .. } => {}
            }
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

    /// Whether `read` is `own` with one index `v` moved to `v + c`, where
    /// `|c|` is at least `v`'s extent: the elements read are ones no
    /// iteration of `v`'s loop writes (a reduction tree's step reads
    /// `part[t + h]` and writes `part[t]` for `t < h`).
    fn shifted_past(&self, own: &[TExprId], read: &[TExprId]) -> bool {
        if own.len() != read.len() {
            return false;
        }
        let mut moved = 0;
        for (&o, &r) in own.iter().zip(read) {
            if self.same_indices(&[o], &[r]) {
                continue;
            }
            let (TExpr::Var(v), TExpr::Binary(BinOp::Add, x, c)) = (self.f.p.expr(o), self.f.p.expr(r)) else {
                return false;
            };
            let (TExpr::Var(w), TExpr::Int(c)) = (self.f.p.expr(*x), self.f.p.expr(*c)) else { return false };
            if v != w || c.unsigned_abs() < self.f.vars[*v as usize].extent.unsigned_abs() {
                return false;
            }
            moved += 1;
        }
        moved == 1
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
                s => walk(s.body(), out),
            }
        }
    }
    let mut out = HashSet::new();
    walk(&f.body, &mut out);
    out
}

/// A shared buffer, and the slot (first index) an access touches where the
/// walk knows it (`None`: any).
type Key = (TensorId, Option<i64>);

fn overlap(a: Key, b: Key) -> bool {
    a.0 == b.0 && (a.1.is_none() || b.1.is_none() || a.1 == b.1)
}

/// The state of [`Walk::phases`] at a statement of the block.
#[derive(Default)]
struct Phase {
    /// Accesses since the last barrier.
    now: HashMap<Key, Access>,
    /// The values of loops walked with known values.
    env: HashMap<VarId, i64>,
    /// What the open group of asynchronous copies writes (and by which
    /// stores), and the committed groups', oldest first.
    open: Vec<(Key, Vec<usize>)>,
    groups: Vec<Vec<(Key, Vec<usize>)>>,
}

impl Phase {
    fn in_flight(&self) -> impl Iterator<Item = &(Key, Vec<usize>)> + '_ {
        self.open.iter().chain(self.groups.iter().flatten())
    }
}

/// The value of `e` when it is `a` or `a % m`, `a` affine in the loops of
/// `env` with constant coefficients (whether two iterations' accesses
/// meet then depends only on their distance, so two passes of a loop see
/// every case).
fn slot(p: &texc_compiler::tir::Program, e: TExprId, env: &HashMap<VarId, i64>) -> Option<i64> {
    fn affine(p: &texc_compiler::tir::Program, e: TExprId, env: &HashMap<VarId, i64>) -> Option<i64> {
        match p.expr(e) {
            TExpr::Int(k) => Some(*k),
            TExpr::Var(v) => env.get(v).copied(),
            TExpr::Binary(BinOp::Add, a, b) => affine(p, *a, env)?.checked_add(affine(p, *b, env)?),
            TExpr::Binary(BinOp::Sub, a, b) => affine(p, *a, env)?.checked_sub(affine(p, *b, env)?),
            TExpr::Binary(BinOp::Mul, a, b) => match (p.expr(*a), p.expr(*b)) {
                (TExpr::Int(k), _) => affine(p, *b, env)?.checked_mul(*k),
                (_, TExpr::Int(k)) => affine(p, *a, env)?.checked_mul(*k),
                _ => None,
            },
            _ => None,
        }
    }
    // Legalization writes `%` of a non-negative value as `URem` (`TruncRem` if signed).
    match p.expr(e) {
        TExpr::Binary(op @ (BinOp::FloorMod | BinOp::URem | BinOp::TruncRem), a, m) => match p.expr(*m) {
            TExpr::Int(m) if *m > 0 => {
                let a = affine(p, *a, env)?;
                Some(if *op == BinOp::TruncRem { a % m } else { a.rem_euclid(*m) })
            }
            _ => None,
        },
        _ => affine(p, e, env),
    }
}

/// How one statement of a block uses a shared buffer.
#[derive(Clone, Default)]
struct Access {
    read: bool,
    write: bool,
    /// Written by an asynchronous copy (it lands at an `async wait`).
    copy: bool,
    /// The stores that write it (by address: statements of this loop nest).
    writers: Vec<usize>,
    /// A read of an element other than the one the same store writes.
    foreign_read: bool,
}

/// Where each shared buffer of launch statement `stmt` lies in its dynamic
/// shared memory: one after another, in order, each at a multiple of 16
/// bytes — of [`SWIZZLE_ALIGN`] for a buffer `wgmma` reads swizzled.
pub fn shared_offsets(f: &LoopFunc, stmt: &Stmt) -> HashMap<TensorId, i64> {
    fn walk(f: &LoopFunc, sw: &BTreeSet<TensorId>, body: &[Stmt], at: &mut i64, out: &mut HashMap<TensorId, i64>) {
        for s in body {
            match s {
                Stmt::Alloc { tensor, body } => {
                    if f.shared.contains(tensor) {
                        let start = if sw.contains(tensor) { round_up(*at, SWIZZLE_ALIGN) } else { *at };
                        out.insert(*tensor, start);
                        *at = at.saturating_add(buffer_bytes(f, sw, *tensor));
                    }
                    walk(f, sw, body, at, out)
                }
                s => walk(f, sw, s.body(), at, out),
            }
        }
    }
    let mut out = HashMap::new();
    walk(f, &crate::ir::swizzled_buffers(f), std::slice::from_ref(stmt), &mut 0, &mut out);
    out
}

/// The alignment of a shared buffer read with the 128-byte swizzle: its
/// pattern repeats every 8 rows of 128 bytes, from an address it divides.
pub const SWIZZLE_ALIGN: i64 = 1024;

fn round_up(x: i64, to: i64) -> i64 {
    x.saturating_add(to - 1) / to * to
}

/// A shared buffer's bytes, rounded up to 16 (the widest access); a
/// swizzled one's with room to start at [`SWIZZLE_ALIGN`] wherever the
/// buffers before it end.
fn buffer_bytes(f: &LoopFunc, swizzled: &BTreeSet<TensorId>, t: TensorId) -> i64 {
    let d = f.p.tensor(t);
    let own = round_up(d.len().saturating_mul(d.elem.size() as i64), 16);
    if swizzled.contains(&t) {
        own.saturating_add(SWIZZLE_ALIGN - 16)
    } else {
        own
    }
}

/// Bytes of the shared buffers of a launch's statements.
fn shared_bytes(f: &LoopFunc, body: &[Stmt]) -> i64 {
    shared_bytes_of(f, &crate::ir::swizzled_buffers(f), body)
}

fn shared_bytes_of(f: &LoopFunc, sw: &BTreeSet<TensorId>, body: &[Stmt]) -> i64 {
    body.iter()
        .map(|s| match s {
            Stmt::Alloc { tensor, body } => {
                let own = if f.shared.contains(tensor) { buffer_bytes(f, sw, *tensor) } else { 0 };
                own.saturating_add(shared_bytes_of(f, sw, body))
            }
            Stmt::For { body, .. } | Stmt::If { then: body, .. } => shared_bytes_of(f, sw, body),
            Stmt::Store { .. }
            | Stmt::Barrier
            | Stmt::Async(_)
            | Stmt::Mma { .. }
            | Stmt::Wgmma(_)
            | Stmt::TileDot(_)
            | Stmt::WarpReduce(_)
            | Stmt::Prefetch { .. } => 0,
        })
        .fold(0, i64::saturating_add)
}
