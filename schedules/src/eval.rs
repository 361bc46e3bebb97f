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
//!
//! A buffer `Alloc`ated by a statement holds zeros each time the statement
//! runs (what compiled code gives it, see `crate::zeroing`).
//!
//! **Races.** The evaluator runs concurrent iterations one after another;
//! compiled code runs them at once. It watches for the difference: within
//! each run of a `parallel` or `vectorized` loop, each GPU launch (its
//! blocks) and each block between two barriers (its threads), every
//! element records which iteration wrote it and which read it, and an
//! element that one iteration writes and another reads or writes is an
//! error ([`EvalError::Race`]) instead of an answer that depends on the
//! order. (Iterations' own buffers — `Alloc`ated inside the loop, a
//! thread's locals and registers — are theirs alone.) It catches, at the
//! sizes run, what the static proof of `crate::independence` refuses.

use crate::ir::{AsyncStep, ForKind, LoopFunc, MmaOp, SmemMatrix, Stmt, Tile, TileDot, WarpReduce, Wgmma};
use rustc_hash::{FxHashMap, FxHashSet};
use texc_compiler::interp::{Arg, InterpError, Machine, Reads};
use texc_compiler::semantics::V;
use texc_compiler::tir::{TExprId, TensorId};
use texc_runtime::Tensor;

/// Why the evaluator stopped.
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    #[error(transparent)]
    Interp(#[from] InterpError),
    #[error("{0}")]
    Race(Box<Race>),
}

/// Two iterations of a concurrent region touching one element, one writing it.
#[derive(Debug, thiserror::Error)]
#[error(
    "a race: `{tensor}`[{index}] is {first} by {a} and {second} by {b} of {region}, which compiled code runs at once"
)]
pub struct Race {
    pub tensor: String,
    pub index: String,
    pub first: &'static str,
    pub second: &'static str,
    pub a: String,
    pub b: String,
    pub region: String,
}

pub fn run(f: &LoopFunc, args: Vec<Arg>) -> Result<Vec<Tensor>, EvalError> {
    let mut m = Machine::new(&f.p, args)?;
    let mut env = vec![0i64; f.vars.len()];
    let mut ev = Eval { f, copies: Copies::default(), races: Races::default() };
    for (n, s) in f.body.iter().enumerate() {
        // A launch with threads but no block loops is one block.
        let one_block = !matches!(s, Stmt::For { kind: ForKind::Block(_), .. }) && crate::gpu::has_bound_loops(f);
        if one_block {
            ev.races.push(Region::Threads, format!("the threads of launch {}", n + 1));
        }
        ev.exec(&mut m, std::slice::from_ref(s), &mut env, false, n)?;
        if one_block {
            ev.races.pop();
        }
    }
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

/// Which iteration of a concurrent region (its party).
type Party = [i64; 3];

/// What a region's parties are.
#[derive(Clone, Copy, PartialEq)]
enum Region {
    /// The iterations of a `parallel` or `vectorized` loop.
    Loop,
    /// The blocks of a launch.
    Blocks,
    /// The threads of a block, between two barriers.
    Threads,
}

/// Who touched an element within a region.
#[derive(Clone, Copy, Default)]
struct Cell {
    writer: Option<Party>,
    reader: Reader,
}

#[derive(Clone, Copy, Default)]
enum Reader {
    #[default]
    None,
    One(Party),
    /// Two or more parties.
    Many,
}

struct Frame {
    region: Region,
    /// For messages: `the iterations of parallel loop `i``.
    what: String,
    party: Party,
    /// Buffers each party has its own of.
    private: FxHashSet<TensorId>,
    cells: FxHashMap<(TensorId, i64), Cell>,
}

/// The open concurrent regions, outermost first, and the GPU coordinates
/// of the thread and block being run.
#[derive(Default)]
struct Races {
    frames: Vec<Frame>,
    thread: Party,
    block: Party,
}

impl Races {
    fn push(&mut self, region: Region, what: String) {
        let party = match region {
            Region::Threads => self.thread,
            Region::Blocks => self.block,
            Region::Loop => [0; 3],
        };
        self.frames.push(Frame { region, what, party, private: FxHashSet::default(), cells: FxHashMap::default() });
    }

    fn pop(&mut self) {
        self.frames.pop();
    }

    /// The coordinates changed: the innermost regions of that kind see a new party.
    fn moved(&mut self, region: Region) {
        let party = if region == Region::Threads { self.thread } else { self.block };
        if let Some(fr) = self.frames.iter_mut().rev().find(|fr| fr.region == region) {
            fr.party = party;
        }
    }

    /// A barrier: what the block's threads did before it is ordered before what they do after.
    fn barrier(&mut self) {
        if let Some(fr) = self.frames.iter_mut().rev().find(|fr| fr.region == Region::Threads) {
            fr.cells.clear();
        }
    }

    /// `t` is allocated here: private to the parties of the open regions
    /// (but a block's shared and register buffers are its threads' together).
    fn allocate(&mut self, f: &LoopFunc, t: TensorId) -> Vec<usize> {
        let block_wide = f.shared.contains(&t) || f.registers.contains(&t);
        let mut marked = Vec::new();
        for (i, fr) in self.frames.iter_mut().enumerate() {
            if !(block_wide && fr.region == Region::Threads) && fr.private.insert(t) {
                marked.push(i);
            }
        }
        marked
    }

    fn release(&mut self, t: TensorId, marked: &[usize]) {
        for &i in marked {
            if let Some(fr) = self.frames.get_mut(i) {
                fr.private.remove(&t);
            }
        }
    }

    /// Record an access; a race when another party of an open region wrote
    /// the element, or read it and this writes it.
    fn touch(&mut self, f: &LoopFunc, t: TensorId, idx: &[i64], write: bool) -> Result<(), EvalError> {
        let d = f.p.tensor(t);
        let flat = idx.iter().zip(&d.shape).fold(0i64, |acc, (&i, &n)| acc.wrapping_mul(n).wrapping_add(i));
        self.touch_at(f, t, flat, write)
    }

    /// [`Races::touch`] of the element at row-major offset `flat`.
    fn touch_at(&mut self, f: &LoopFunc, t: TensorId, flat: i64, write: bool) -> Result<(), EvalError> {
        // A thread's register element is its own (the launch rules check it).
        if f.registers.contains(&t) {
            return Ok(());
        }
        let d = f.p.tensor(t);
        for fr in self.frames.iter_mut().filter(|fr| !fr.private.contains(&t)) {
            let me = fr.party;
            let cell = fr.cells.entry((t, flat)).or_default();
            let other = match (write, cell.writer, cell.reader) {
                (_, Some(w), _) if w != me => Some((w, "written")),
                (true, _, Reader::One(r)) if r != me => Some((r, "read")),
                (true, _, Reader::Many) => Some((me, "read")),
                _ => None,
            };
            if let Some((them, how)) = other {
                let who = |p: Party| match fr.region {
                    Region::Loop => format!("iteration {}", p[0]),
                    _ => format!("({}, {}, {})", p[0], p[1], p[2]),
                };
                let b = if how == "read" && them == me { "another".to_string() } else { who(them) };
                let index: Vec<String> = unflatten(flat, &d.shape).iter().map(|i| i.to_string()).collect();
                return Err(EvalError::Race(Box::new(Race {
                    tensor: d.name.clone(),
                    index: index.join(", "),
                    first: if write { "written" } else { "read" },
                    second: how,
                    a: who(me),
                    b,
                    region: fr.what.clone(),
                })));
            }
            if write {
                cell.writer = Some(me);
            } else {
                cell.reader = match cell.reader {
                    Reader::None => Reader::One(me),
                    Reader::One(r) if r == me => Reader::One(r),
                    _ => Reader::Many,
                };
            }
        }
        Ok(())
    }

    fn watching(&self) -> bool {
        !self.frames.is_empty()
    }
}

/// The indices of the element at row-major offset `flat` of a tensor of `shape`.
fn unflatten(mut flat: i64, shape: &[i64]) -> Vec<i64> {
    let mut idx = vec![0; shape.len()];
    for (i, &n) in idx.iter_mut().zip(shape).rev() {
        (*i, flat) = (flat.rem_euclid(n.max(1)), flat.div_euclid(n.max(1)));
    }
    idx
}

struct Eval<'f> {
    f: &'f LoopFunc,
    copies: Copies,
    races: Races,
}

/// The race watch as an evaluation's observer: every element read, as it
/// is read (one walk computes the values and records the reads).
struct Watch<'a> {
    f: &'a LoopFunc,
    races: &'a mut Races,
}

impl Reads for Watch<'_> {
    type Error = EvalError;
    fn read(&mut self, t: TensorId, offset: i64) -> Result<(), EvalError> {
        self.races.touch_at(self.f, t, offset, false)
    }
}

impl Eval<'_> {
    fn exec(
        &mut self,
        m: &mut Machine,
        body: &[Stmt],
        env: &mut [i64],
        in_async: bool,
        launch: usize,
    ) -> Result<(), EvalError> {
        let f = self.f;
        for s in body {
            match s {
                Stmt::Barrier => self.races.barrier(),
                // A hint that changes no value; its offset is still checked,
                // so that runs of the evaluator catch one outside its tensor.
                Stmt::Prefetch { tensor, offset } => {
                    let at = self.eval(m, *offset, env)?.i();
                    let t = f.p.tensor(*tensor);
                    if !(0..t.len()).contains(&at) {
                        return Err(InterpError::OutOfBounds(t.name.clone()).into());
                    }
                }
                Stmt::Async(AsyncStep::Commit) => {
                    let group = std::mem::take(&mut self.copies.open);
                    self.copies.committed.push_back(group);
                }
                Stmt::Async(AsyncStep::Wait(n)) => {
                    while self.copies.committed.len() as i64 > (*n).max(0) {
                        for (t, idx, v) in self.copies.committed.pop_front().unwrap_or_default() {
                            m.store(t, &idx, v)?;
                        }
                    }
                }
                Stmt::Mma { op, c, a, b } => {
                    if self.races.watching() {
                        self.watch_tiles(m, *op, [c, a, b], env)?;
                    }
                    mma(f, m, *op, [c, a, b], env)?
                }
                Stmt::Wgmma(w) => {
                    if self.races.watching() {
                        self.watch_wgmma(m, w, env)?;
                    }
                    wgmma(f, m, w, env)?
                }
                Stmt::TileDot(d) => {
                    if self.races.watching() {
                        self.watch_tile_dot(m, d, env)?;
                    }
                    tile_dot(f, m, d, env)?
                }
                Stmt::WarpReduce(w) => warp_reduce(f, m, *w)?,
                Stmt::For { var, lo, extent, body, kind } => {
                    self.for_loop(m, (*var, *lo, *extent, *kind), body, env, in_async, launch)?
                }
                Stmt::Alloc { tensor, body } => {
                    m.clear(*tensor);
                    let marked = self.races.allocate(f, *tensor);
                    self.exec(m, body, env, in_async, launch)?;
                    self.races.release(*tensor, &marked);
                }
                Stmt::If { cond, then } => {
                    if self.eval(m, *cond, env)?.b() {
                        self.exec(m, then, env, in_async, launch)?;
                    }
                }
                Stmt::Store { tensor, indices, value } => {
                    let idx =
                        indices.iter().map(|&i| self.eval(m, i, env).map(|v| v.i())).collect::<Result<Vec<_>, _>>()?;
                    let v = self.eval(m, *value, env)?;
                    let off = m.offset(*tensor, &idx)?;
                    if self.races.watching() {
                        self.races.touch_at(f, *tensor, off, true)?;
                    }
                    if in_async {
                        self.copies.open.push((*tensor, idx, v));
                    } else {
                        m.store_at(*tensor, off, v)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// A loop: a concurrent region around its iterations where they run at once.
    fn for_loop(
        &mut self,
        m: &mut Machine,
        (var, lo, extent, kind): (texc_compiler::tir::VarId, i64, i64, ForKind),
        body: &[Stmt],
        env: &mut [i64],
        in_async: bool,
        launch: usize,
    ) -> Result<(), EvalError> {
        let name = &self.f.vars[var as usize].name;
        let region = match kind {
            ForKind::Parallel | ForKind::Vectorized if extent > 1 => {
                Some((Region::Loop, format!("the iterations of {} loop `{name}`", kind.name().trim())))
            }
            ForKind::Block(_) if !self.races.frames.iter().any(|fr| fr.region == Region::Blocks) => {
                Some((Region::Blocks, format!("the blocks of launch {}", launch + 1)))
            }
            _ => None,
        };
        // The innermost block loop's body is one block: its threads are a region.
        let block_body =
            matches!(kind, ForKind::Block(_)) && !matches!(body, [Stmt::For { kind: ForKind::Block(_), .. }]);
        let opened = region.is_some();
        if let Some((r, what)) = region {
            self.races.push(r, what);
        }
        for x in lo..lo + extent {
            env[var as usize] = x;
            match kind {
                ForKind::Parallel | ForKind::Vectorized => {
                    if let Some(fr) = self.races.frames.last_mut().filter(|_| opened) {
                        fr.party = [x, 0, 0];
                    }
                }
                ForKind::Block(d) => {
                    self.races.block[d.index()] = x - lo;
                    self.races.moved(Region::Blocks);
                }
                ForKind::Thread(d) => {
                    self.races.thread[d.index()] = x - lo;
                    self.races.moved(Region::Threads);
                }
                _ => {}
            }
            if block_body {
                self.races.push(Region::Threads, format!("the threads of a block of launch {}", launch + 1));
            }
            let r = self.exec(m, body, env, in_async || kind == ForKind::Async, launch);
            if block_body {
                self.races.pop();
            }
            r?;
        }
        match kind {
            ForKind::Block(d) => self.races.block[d.index()] = 0,
            ForKind::Thread(d) => {
                self.races.thread[d.index()] = 0;
                self.races.moved(Region::Threads);
            }
            _ => {}
        }
        if opened {
            self.races.pop();
        }
        Ok(())
    }

    /// Record a tensor-core operation's accesses, made by the warp (its
    /// lanes are one party): every element of `a` and `b` read, of `c`
    /// read and written.
    fn watch_tiles(&mut self, m: &Machine, op: MmaOp, [c, a, b]: [&Tile; 3], env: &mut [i64]) -> Result<(), EvalError> {
        let f = self.f;
        let (mm, nn, kk) = op.shape();
        for (t, rows, cols, write) in [(a, mm, kk, false), (b, kk, nn, false), (c, mm, nn, false), (c, mm, nn, true)] {
            let origin =
                t.origin.iter().map(|&i| m.eval(&f.vars, i, env).map(|v| v.i())).collect::<Result<Vec<_>, _>>()?;
            for r in 0..rows {
                for col in 0..cols {
                    let mut idx = origin.clone();
                    idx[t.rows] += r;
                    idx[t.cols] += col;
                    self.races.touch(f, t.tensor, &idx, write)?;
                }
            }
        }
        Ok(())
    }

    /// Record an AMX tile product's accesses: its tiles read (`c` unless
    /// it starts from zero), `c`'s written.
    fn watch_tile_dot(&mut self, m: &Machine, d: &TileDot, env: &mut [i64]) -> Result<(), EvalError> {
        let f = self.f;
        let c = (&d.c, d.m, d.n);
        let reads = d.tiles().into_iter().skip(usize::from(d.zero)).map(|x| (x, false));
        for ((t, rows, cols), write) in reads.chain([(c, true)]) {
            let origin =
                t.origin.iter().map(|&i| m.eval(&f.vars, i, env).map(|v| v.i())).collect::<Result<Vec<_>, _>>()?;
            for r in 0..rows {
                for q in 0..cols {
                    self.races.touch(f, t.tensor, &TileDot::at(&origin, t, (r, q)), write)?;
                }
            }
        }
        Ok(())
    }

    /// Record a warpgroup operation's accesses (its 128 lanes are one
    /// party): the boxes of `a` and `b` its descriptors span, read; `c`'s
    /// tile read and written.
    fn watch_wgmma(&mut self, m: &Machine, w: &Wgmma, env: &mut [i64]) -> Result<(), EvalError> {
        let f = self.f;
        let (mm, nn, _) = w.op.shape();
        let mut reach = vec![0; w.c.origin.len()];
        reach[w.c.rows] += mm - 1;
        reach[w.c.cols] += nn - 1;
        let mut boxes: Vec<(TensorId, &[TExprId], Vec<i64>, bool)> =
            w.operands().iter().map(|(x, mn, k)| (x.tensor, x.origin.as_slice(), x.reach(*mn, *k), false)).collect();
        boxes.push((w.c.tensor, &w.c.origin, reach.clone(), false));
        boxes.push((w.c.tensor, &w.c.origin, reach, true));
        for (t, origin, reach, write) in boxes {
            let o = origin.iter().map(|&i| m.eval(&f.vars, i, env).map(|v| v.i())).collect::<Result<Vec<_>, _>>()?;
            let mut idx = o.clone();
            loop {
                self.races.touch(f, t, &idx, write)?;
                // The next index of the box, last dimension fastest.
                let Some(d) = (0..idx.len()).rev().find(|&d| idx[d] < o[d] + reach[d]) else { break };
                idx[d] += 1;
                idx[d + 1..].copy_from_slice(&o[d + 1..]);
            }
        }
        Ok(())
    }

    /// `e`'s value, its reads recorded when a concurrent region is open.
    fn eval(&mut self, m: &Machine, e: TExprId, env: &mut [i64]) -> Result<V, EvalError> {
        if self.races.watching() {
            m.eval_with(&self.f.vars, e, env, &mut Watch { f: self.f, races: &mut self.races })
        } else {
            Ok(m.eval(&self.f.vars, e, env)?)
        }
    }
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
/// `c` is stored; 8-bit products and their sums exact in f64, wrapped to
/// `i32` where stored), and each lane stores its part of the result. A
/// layout that lost or doubled an element would show here.
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
            // Within 2^53: |acc| < 2^31 + 32 · 2^15, exact in f64.
            let v = if op.is_integer() { V::I(i64::from(acc as i64 as i32)) } else { V::F(acc) };
            m.store(c.tensor, &at(&co, c, (r, col)), v)?;
        }
    }
    Ok(())
}

/// An AMX tile product as its definition says ([`TileDot`]): each
/// accumulator plus, over `k`, the four byte products of `a`'s element
/// (unsigned) and `b`'s (signed), wrapping in `i32` as `tdpbusd` does.
fn tile_dot(f: &LoopFunc, m: &mut Machine, d: &TileDot, env: &mut [i64]) -> Result<(), InterpError> {
    let origin = |m: &Machine, t: &Tile, env: &mut [i64]| -> Result<Vec<i64>, InterpError> {
        t.origin.iter().map(|&i| m.eval(&f.vars, i, env).map(|v| v.i())).collect()
    };
    let (co, ao, bo) = (origin(m, &d.c, env)?, origin(m, &d.a, env)?, origin(m, &d.b, env)?);
    for r in 0..d.m {
        for q in 0..d.n {
            let at = TileDot::at(&co, &d.c, (r, q));
            let mut acc = if d.zero { 0 } else { m.load_at(d.c.tensor, &at)?.i() as i32 };
            for k in 0..d.k {
                let a = m.load_at(d.a.tensor, &TileDot::at(&ao, &d.a, (r, k)))?.i();
                let b = m.load_at(d.b.tensor, &TileDot::at(&bo, &d.b, (k, q)))?.i();
                acc = acc.wrapping_add(texc_compiler::semantics::dot4(a, b) as i32);
            }
            m.store(d.c.tensor, &at, V::I(i64::from(acc)))?;
        }
    }
    Ok(())
}

/// A warpgroup's `wgmma` as the hardware computes it: each of the 128
/// lanes loads the accumulators [`crate::ir::WgmmaOp::d_fragment`] assigns
/// it; `a` and `b` are read from their shared buffers where their matrix
/// descriptors (encoded, then decoded as the ISA's bit fields say) put each
/// element in the canonical K-major layout — not by the buffers' logical
/// indices, so a buffer filled in another layout than the descriptor's
/// gives wrong products here; the tile assembled from the lanes (a lost
/// or doubled element is an error), multiplied (products exact, sums in
/// f64), and each lane stores its part.
fn wgmma(f: &LoopFunc, m: &mut Machine, w: &Wgmma, env: &mut [i64]) -> Result<(), InterpError> {
    let eval_all = |m: &Machine, o: &[TExprId], env: &mut [i64]| -> Result<Vec<i64>, InterpError> {
        o.iter().map(|&i| m.eval(&f.vars, i, env).map(|v| v.i())).collect()
    };
    let (mm, nn, kk) = w.op.shape();
    // The operands through their descriptors: element (mn, k) of each.
    let operand = |m: &Machine, x: &SmemMatrix, rows: i64, env: &mut [i64]| -> Result<Vec<f64>, InterpError> {
        let shape = &f.p.tensor(x.tensor).shape;
        let elem = f.p.tensor(x.tensor).elem.size() as i64;
        let origin = eval_all(m, &x.origin, env)?;
        let flat = origin.iter().zip(shape).fold(0, |acc, (&i, &n)| acc * n + i);
        let desc = crate::ir::wgmma_descriptor((flat * elem) as u64, x.lbo, x.sbo, x.swizzled);
        let (start, lbo, sbo, layout) = crate::ir::wgmma_descriptor_fields(desc);
        let swizzled = layout == 1;
        let mut out = vec![0.0; (rows * kk) as usize];
        for r in 0..rows {
            for k in 0..kk {
                // (Swizzled, the hardware reads `swizzle128` of this byte, where
                // the stores put `swizzle128` of the logical one: the buffer here
                // is held by logical index, and the two cancel.)
                let at = crate::ir::canonical_offset(x.major, lbo as i64, sbo as i64, swizzled, r, k);
                let byte = start as i64 + at;
                let mut at = byte / elem;
                let mut idx = vec![0; shape.len()];
                for d in (0..shape.len()).rev() {
                    idx[d] = at % shape[d];
                    at /= shape[d];
                }
                out[(r * kk + k) as usize] = m.load_at(x.tensor, &idx)?.f();
            }
        }
        Ok(out)
    };
    let ta = operand(m, &w.a, mm, env)?;
    let tb = operand(m, &w.b, nn, env)?;
    let co = eval_all(m, &w.c.origin, env)?;
    let at = |(r, col): (i64, i64)| {
        let mut idx = co.clone();
        idx[w.c.rows] += r;
        idx[w.c.cols] += col;
        idx
    };
    let frag = w.op.d_fragment();
    // An element no lane holds stays NaN (and so does the result): a
    // table that lost or doubled one fails the comparison with the interpreter.
    let mut tc = vec![f64::NAN; (mm * nn) as usize];
    for lane in 0..crate::ir::WgmmaOp::LANES {
        let r = frag.iter().map(|x| m.load_at(w.c.tensor, &at(x.at(lane))).map(|v| v.f()));
        let r: Vec<f64> = r.collect::<Result<_, _>>()?;
        for (x, &v) in frag.iter().zip(&r) {
            let (row, col) = x.at(lane);
            tc[(row * nn + col) as usize] = v;
        }
    }
    for lane in 0..crate::ir::WgmmaOp::LANES {
        for x in &frag {
            let (r, col) = x.at(lane);
            let mut acc = tc[(r * nn + col) as usize];
            for k in 0..kk {
                acc += ta[(r * kk + k) as usize] * tb[(col * kk + k) as usize];
            }
            m.store(w.c.tensor, &at((r, col)), V::F(acc))?;
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

    /// Lane 5 (group 1, position 1) of `m16n8k32` with 8-bit inputs (PTX
    /// ISA §9.7.13.4.10): `a`'s registers hold columns 4..8 and 20..24 of
    /// rows 1 and 9; `b`'s rows 4..8 and 20..24 of column 1.
    #[test]
    fn int8_fragments_match_the_ptx_isa() {
        for op in [MmaOp::M16n8k32S8S32, MmaOp::M16n8k32U8S8S32] {
            let f = op.fragments();
            let a: Vec<_> = f.a.iter().map(|c| c.at(5)).collect();
            let row = |r: i64, from: i64| (from..from + 4).map(move |c| (r, c));
            let want: Vec<_> = row(1, 4).chain(row(9, 4)).chain(row(1, 20)).chain(row(9, 20)).collect();
            assert_eq!(a, want);
            let b: Vec<_> = f.b.iter().map(|c| c.at(5)).collect();
            assert_eq!(b, [(4, 1), (5, 1), (6, 1), (7, 1), (20, 1), (21, 1), (22, 1), (23, 1)]);
            assert_eq!(f.c.iter().map(|c| c.at(5)).collect::<Vec<_>>(), [(1, 2), (1, 3), (9, 2), (9, 3)]);
        }
    }

    /// The warpgroup's accumulators: every element of the 64×N tile in
    /// exactly one of the 128 lanes, N / 2 registers each.
    #[test]
    fn wgmma_fragments_cover_each_tile_once() {
        for n in (8..=256).step_by(8) {
            let op = crate::ir::WgmmaOp { n, ab: texc_compiler::types::ElemType::F16 };
            let d = op.d_fragment();
            assert_eq!(d.len() as i64, n / 2);
            let places: HashSet<(i64, i64)> = (0..128).flat_map(|l| d.iter().map(move |c| c.at(l))).collect();
            assert_eq!(places.len() as i64, 64 * n, "m64n{n}: every element once");
            assert!(places.iter().all(|&(r, c)| (0..64).contains(&r) && (0..n).contains(&c)));
        }
    }

    /// Lane 37 (warp 1, group 1, position 1) of `wgmma` m64n16k16's D, as
    /// the PTX ISA's figure shows it: rows 16 + 1 and 16 + 9, columns 2, 3
    /// and 10, 11.
    #[test]
    fn wgmma_fragments_match_the_ptx_isa() {
        let op = crate::ir::WgmmaOp { n: 16, ab: texc_compiler::types::ElemType::F16 };
        let d: Vec<_> = op.d_fragment().iter().map(|c| c.at(37)).collect();
        assert_eq!(d, [(17, 2), (17, 3), (25, 2), (25, 3), (17, 10), (17, 11), (25, 10), (25, 11)]);
    }

    /// The descriptor's bit fields (CUTLASS `GmmaDescriptor`): start
    /// address in bits 0–13, leading byte offset 16–29, stride byte offset
    /// 32–45, each in 16-byte units; the layout in 62–63 (0 interleave, 1
    /// the 128-byte swizzle).
    #[test]
    fn wgmma_descriptors_have_the_isa_fields() {
        let d = crate::ir::wgmma_descriptor(0x400, 1024, 128, false);
        assert_eq!(d, 0x40 | (64 << 16) | (8 << 32));
        assert_eq!(crate::ir::wgmma_descriptor_fields(d), (0x400, 1024, 128, 0));
        let d = crate::ir::wgmma_descriptor(0x420, 16, 1024, true);
        assert_eq!(d, 0x42 | (1 << 16) | (64 << 32) | (1 << 62));
        assert_eq!(crate::ir::wgmma_descriptor_fields(d), (0x420, 16, 1024, 1));
    }

    /// The 128-byte swizzle: the 16-byte chunk within a 128-byte row
    /// exclusive-or the row within 8, its own inverse, a permutation of
    /// each 1024 bytes that keeps every chunk whole.
    #[test]
    fn the_128_byte_swizzle_permutes_chunks_by_row() {
        use crate::ir::swizzle128;
        assert_eq!(swizzle128(0), 0);
        assert_eq!(swizzle128(128), 128 + 16); // row 1, chunk 0 -> chunk 1
        assert_eq!(swizzle128(7 * 128 + 7 * 16 + 6), 7 * 128 + 6); // row 7, chunk 7 -> chunk 0
        assert_eq!(swizzle128(1024 + 128), 1024 + 128 + 16); // the pattern repeats every 8 rows
        let mut seen = vec![false; 1024];
        for b in 0..1024 {
            assert_eq!(swizzle128(swizzle128(b)), b);
            assert_eq!(swizzle128(b) / 16, swizzle128(b / 16 * 16) / 16, "a chunk stays whole");
            seen[swizzle128(b) as usize] = true;
        }
        assert!(seen.iter().all(|&s| s));
    }
}
