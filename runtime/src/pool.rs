//! A small persistent thread pool for the `parallel` loops of generated code.
//!
//! Generated code calls [`texc_parallel_for`] with a task function, a context
//! pointer and an iteration count; the range is cut into one contiguous
//! slot per thread, which its thread claims a block at a time from the
//! front; a thread done with its own slot claims the others' unclaimed
//! blocks from their backs, and the caller waits for the blocks in other
//! hands. A call made from inside a task (nested parallelism) runs
//! serially, so the pool can never deadlock on itself. The number of
//! threads is the machine's parallelism, or `TEXC_NUM_THREADS`, or what
//! [`set_num_threads`] last asked for.
//!
//! A model runs hundreds of parallel loops of a few microseconds each, so
//! handing work over must take less than that: the caller, once its own
//! slot is done, polls for the others' end for [`SPIN`] before sleeping on
//! a condition variable (waking a sleeping thread takes tens of
//! microseconds; MobileNetV2 on two threads ran slower than on one). Idle
//! workers poll for the next loop as long, so that a worker still waking
//! up does not leave its slot to the caller (MobileNetV2 on 2 threads,
//! median of 8 alternated batches: 4.50 → 4.34 ms). Every poll offers the
//! core to other threads, and stops when one took it. On a machine whose
//! cores other programs keep busy, a polling worker takes blocks it is then
//! preempted in, and the loop waits for it (MobileNetV2 on 2 threads beside
//! two busy processes: batches of 28–44 ms): a caller that waited long for
//! its workers ([`STALLED`]) while they polled, [`STALLS_TO_CALM`] times
//! within any [`STALL_WINDOW`], stops them polling for a while ([`CALM`]),
//! which keeps such batches at 7.8–9.0 ms. One stall alone is not
//! contention: a virtual machine's core is sometimes taken for a
//! millisecond by its host, and calming on that made every loop of the next
//! half second wake a sleeping worker (UNet on 2 threads, x86-avx2, Zen 4
//! under KVM, 2000 runs: 6 000–17 000 context switches, median 0.82–1.02
//! ms; with three stalls, 100–300 and 0.78–0.80 ms).

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// How long a caller polls for its workers before sleeping: longer than most
/// shares of a model's small parallel loops, short enough not to matter
/// beside a long one.
const SPIN: Duration = Duration::from_micros(300);

/// A caller that waits this long for its workers after its own share (and
/// longer than those took) ran on a contended machine: workers stop polling for [`CALM`]. (MobileNetV2
/// on 2 threads beside two busy processes: batches of 28–44 ms with workers
/// that always poll, 7.8–9.0 ms with this, 7.9–8.6 without polling workers.)
const STALLED: Duration = Duration::from_millis(1);
const CALM: Duration = Duration::from_millis(500);

/// Stalled loops that calm the workers when they fall within
/// [`STALL_WINDOW`] of the first: on a contended machine most loops stall
/// (the first three within milliseconds); on a quiet virtual machine a
/// stall comes every second or so, alone.
const STALLS_TO_CALM: u32 = 3;
const STALL_WINDOW: Duration = Duration::from_millis(100);

/// A yield that returns later than this ran another thread: the core is
/// contended, and polling would take time from work.
const YIELDED: Duration = Duration::from_micros(20);

/// `task(ctx, start, end)` runs iterations `start..end`.
pub type Task = unsafe extern "C" fn(*mut u8, i64, i64);

/// A parallel loop while it runs: its range cut into one slot per thread,
/// each claimed a block at a time — by its owner from the front, by a
/// thread that ran out of its own work from the back. A thread the host
/// deschedules (a virtual machine's vCPU taken for a millisecond, another
/// program on the core) then holds the loop up by the block in its hands,
/// not by the rest of its share: the others take that. Without such a
/// thread (and with even slots) every slot is run whole, in order, by its
/// owner — the caller slot 0, the `i`th worker slot `i` — so consecutive loops cut alike find their
/// rows in the cache of the thread that wrote them.
/// MEASURED (Zen 3, 2 vCPUs under KVM, 2 threads, means of 200 runs, eight
/// alternated rounds, against one chunk per thread taken whole): RegNetX-
/// 400MF 7.01 → 6.41 ms, MobileNetV2 4.98 → 4.67; beside a process that
/// takes one vCPU for 2 ms every 20 ms (`SCHED_FIFO`), 8.32 → 8.03 and
/// 5.99 → 5.94; six rounds of 40 over eight more models, 0.80–1.04 of the
/// time (DenseNet-121 47.2 → 37.8 ms, GoogLeNet 17.0 → 17.4).
struct Loop {
    task: Task,
    ctx: usize,
    n: i64,
    /// Iterations per unit of the slots' ranges: 1 unless the loop has more
    /// iterations than a slot's `u32` bounds can count.
    unit: i64,
    /// Each slot's unclaimed units, `lo | hi << 32`.
    slots: Box<[Padded<AtomicU64>]>,
    /// Units a claim takes (the last of a slot may take fewer).
    block: u32,
    /// Iterations not yet run; the thread that runs the last wakes the caller.
    unfinished: Padded<AtomicI64>,
}

/// A value alone in its pair of cache lines (x86's prefetcher fetches lines
/// in pairs): a slot's bounds, which its owner's claims change without
/// contending with the other owners', and the count of iterations left,
/// which every block changes without evicting what the claims read.
#[repr(align(128))]
struct Padded<T>(T);

/// Claims per slot in a loop whose slots are long enough: enough that a
/// descheduled owner leaves most of its share to the others, few enough
/// that the claims cost nothing beside the blocks.
const BLOCKS_PER_SLOT: i64 = 8;

impl Loop {
    fn new(task: Task, ctx: *mut u8, n: i64, threads: usize) -> Loop {
        // (n ≥ 1: a loop of fewer than two iterations runs on its caller.)
        let unit = (n - 1) / u32::MAX as i64 + 1;
        let units = (n - 1) / unit + 1;
        let slots = (threads as i64).min(units);
        let bound = |c: i64| (units * c / slots) as u64;
        let block = (units / slots / BLOCKS_PER_SLOT).max(1) as u32;
        Loop {
            task,
            ctx: ctx as usize,
            n,
            unit,
            slots: (0..slots).map(|c| Padded(AtomicU64::new(bound(c) | bound(c + 1) << 32))).collect(),
            block,
            unfinished: Padded(AtomicI64::new(n)),
        }
    }

    /// Claim a block of `slot`'s units, from its front or its back.
    fn claim(&self, slot: usize, front: bool) -> Option<(u32, u32)> {
        let word = &self.slots[slot].0;
        let mut cur = word.load(Ordering::Acquire);
        loop {
            let (lo, hi) = (cur as u32, (cur >> 32) as u32);
            if lo >= hi {
                return None;
            }
            let take = self.block.min(hi - lo);
            let (claimed, left) =
                if front { ((lo, lo + take), (lo + take, hi)) } else { ((hi - take, hi), (lo, hi - take)) };
            let next = left.0 as u64 | (left.1 as u64) << 32;
            match word.compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Some(claimed),
                Err(seen) => cur = seen,
            }
        }
    }

    /// The iterations of the units `lo..hi` (the last unit may be short).
    fn range(&self, (lo, hi): (u32, u32)) -> (i64, i64) {
        (lo as i64 * self.unit, (hi as i64).saturating_mul(self.unit).min(self.n))
    }

    /// Run the units `lo..hi`; whether they were the loop's last.
    fn run(&self, units: (u32, u32)) -> bool {
        let (start, end) = self.range(units);
        // SAFETY: the caller of `texc_parallel_for` keeps `ctx` alive until
        // every iteration has run, and each claim hands out distinct units.
        unsafe { (self.task)(self.ctx as *mut u8, start, end) };
        // Release: the block's writes are visible to a caller that sees the count reach zero.
        self.unfinished.0.fetch_sub(end - start, Ordering::AcqRel) == end - start
    }

    /// Run slot `own` from its front, then the other slots' unclaimed units
    /// from their backs; whether this thread ran the loop's last iterations.
    fn work(&self, own: usize) -> bool {
        let mut last = false;
        while let Some(block) = self.claim(own, true) {
            last |= self.run(block);
        }
        let k = self.slots.len();
        for other in (1..k).map(|d| (own + d) % k) {
            while let Some(block) = self.claim(other, false) {
                last |= self.run(block);
            }
        }
        last
    }
}

struct Shared {
    /// The latest loop posted.
    current: Mutex<Option<Arc<Loop>>>,
    work: Condvar,
    done: Condvar,
    /// The number of loops posted so far: changed under the lock of
    /// `current` (with it), read without it by polling workers.
    posted: AtomicU64,
    /// Workers waiting on `work`, and callers waiting on `done`, both
    /// changed under the lock of `current`: a notification is a system call even
    /// when nobody waits, and most loops find every thread polling
    /// (MnasNet 0.5 on two threads runs 65 loops in about 1.6 ms).
    sleeping: AtomicUsize,
    waiting: AtomicUsize,
    /// Whether waiting threads poll: not when there are more threads than
    /// cores, where a poller would take the core a working thread needs.
    spin: AtomicBool,
    /// Idle workers poll for the next loop only after this time (ns since
    /// `epoch`): a loop whose caller waited long for a worker ran on a
    /// contended machine, where a polling worker takes blocks it is then
    /// preempted in.
    workers_poll_after: AtomicU64,
    /// When the latest stalled loops ended (ns since `epoch`), fewer than
    /// [`STALLS_TO_CALM`], none older than [`STALL_WINDOW`] at the last one.
    recent_stalls: Mutex<Vec<u64>>,
    epoch: Instant,
}

impl Shared {
    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    fn lock(&self) -> MutexGuard<'_, Option<Arc<Loop>>> {
        self.current.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Count a stalled loop; the workers stop polling for [`CALM`] at the
    /// [`STALLS_TO_CALM`]th within any [`STALL_WINDOW`].
    fn stalled(&self) {
        let now = self.now_ns();
        let window = STALL_WINDOW.as_nanos() as u64;
        let mut recent = self.recent_stalls.lock().unwrap_or_else(|e| e.into_inner());
        recent.retain(|&t| now.saturating_sub(t) < window);
        if recent.len() + 1 >= STALLS_TO_CALM as usize {
            self.workers_poll_after.store(now + CALM.as_nanos() as u64, Ordering::Relaxed);
            recent.clear();
        } else {
            recent.push(now);
        }
    }
}

/// Poll `ready` for up to [`SPIN`] (when `s` polls at all); whether it became true.
fn spin_until(s: &Shared, ready: impl Fn() -> bool) -> bool {
    if !s.spin.load(Ordering::Relaxed) {
        return ready();
    }
    let t0 = Instant::now();
    loop {
        for _ in 0..64 {
            if ready() {
                return true;
            }
            std::hint::spin_loop();
        }
        if t0.elapsed() >= SPIN {
            return ready();
        }
        // On a machine shared with other work, a thread that only polls
        // would keep a core from a thread that has work (one of ours
        // preempted in its block): offer the core between polls, and stop
        // polling once another thread took it (the yield came back late).
        let before = Instant::now();
        std::thread::yield_now();
        if before.elapsed() >= YIELDED {
            return ready();
        }
    }
}

struct Pool {
    shared: Arc<Shared>,
    /// Threads a parallel loop is cut for ([`set_num_threads`] changes it).
    threads: AtomicUsize,
    /// Worker threads started so far; never fewer than `threads - 1`.
    workers: Mutex<usize>,
    /// One parallel region at a time; nested or concurrent callers run serially.
    busy: Mutex<()>,
}

thread_local! {
    static IN_TASK: Cell<bool> = const { Cell::new(false) };
    /// The thread count of this thread's calls inside [`with_threads`] (0: the pool's).
    static CALL_THREADS: Cell<usize> = const { Cell::new(0) };
}

/// Run `f` with its parallel loops (those this thread starts) cut for `n`
/// threads instead of the process's count: a thread count per call. An
/// error if `n` is not from 1 to [`MAX_THREADS`].
pub fn with_threads<R>(n: usize, f: impl FnOnce() -> R) -> Result<R, String> {
    // Restored on the way out, a panic included, so that calls nest.
    struct Restore(usize);
    impl Drop for Restore {
        fn drop(&mut self) {
            CALL_THREADS.with(|c| c.set(self.0));
        }
    }
    if n == 0 {
        return Err(format!("expected a thread count from 1 to {MAX_THREADS}"));
    }
    let _restore = Restore(set_call_threads(n)?);
    Ok(f())
}

/// Cut the parallel loops this thread starts from now on for `n` threads
/// (0: the process's count again); returns the previous setting. For
/// callers that cannot wrap the calls in [`with_threads`] (the Python
/// package's `with texc.threads(n):`). An error if `n` is above [`MAX_THREADS`].
pub fn set_call_threads(n: usize) -> Result<usize, String> {
    if n > MAX_THREADS {
        return Err(format!("expected a thread count from 1 to {MAX_THREADS}"));
    }
    if n > 0 {
        pool().start_workers(n);
    }
    Ok(CALL_THREADS.with(|c| c.replace(n)))
}

/// Most threads `TEXC_NUM_THREADS` may ask for.
pub const MAX_THREADS: usize = 1024;

/// The thread count `TEXC_NUM_THREADS` asks for, if set; an error if it is
/// not a number from 1 to [`MAX_THREADS`] (callers report it; the pool then
/// uses the machine's parallelism).
pub fn threads_from_env() -> Result<Option<usize>, String> {
    match std::env::var("TEXC_NUM_THREADS") {
        Err(_) => Ok(None),
        Ok(v) => match v.trim().parse::<usize>() {
            Ok(n) if (1..=MAX_THREADS).contains(&n) => Ok(Some(n)),
            _ => Err(format!("TEXC_NUM_THREADS={v}: expected a thread count from 1 to {MAX_THREADS}")),
        },
    }
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| {
        let threads = threads_from_env().ok().flatten().unwrap_or_else(available_cores);
        let shared = Arc::new(Shared {
            current: Mutex::new(None),
            work: Condvar::new(),
            done: Condvar::new(),
            posted: AtomicU64::new(0),
            sleeping: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
            spin: AtomicBool::new(false),
            workers_poll_after: AtomicU64::new(0),
            recent_stalls: Mutex::new(Vec::new()),
            epoch: Instant::now(),
        });
        let p = Pool { shared, threads: AtomicUsize::new(1), workers: Mutex::new(0), busy: Mutex::new(()) };
        p.grow(threads);
        p
    })
}

impl Pool {
    /// Start workers until `threads` can run at once, then cut loops for `threads`.
    /// Workers are only ever added: idle ones wait for the next loop at no cost.
    fn grow(&self, threads: usize) {
        self.start_workers(threads);
        self.shared.spin.store(threads <= available_cores(), Ordering::Relaxed);
        self.threads.store(threads, Ordering::Release);
    }

    /// Workers enough for loops cut for `threads` (with the caller's thread).
    fn start_workers(&self, threads: usize) {
        let mut started = self.workers.lock().unwrap_or_else(|e| e.into_inner());
        while *started + 1 < threads {
            let s = Arc::clone(&self.shared);
            let id = *started + 1;
            std::thread::spawn(move || worker(&s, id));
            *started = id;
        }
    }
}

/// Use `n` threads for parallel loops from now on (`texc bench --threads`);
/// an error if `n` is not from 1 to [`MAX_THREADS`]. More threads than cores
/// is allowed (they share the cores).
pub fn set_num_threads(n: usize) -> Result<(), String> {
    if !(1..=MAX_THREADS).contains(&n) {
        return Err(format!("expected a thread count from 1 to {MAX_THREADS}"));
    }
    pool().grow(n);
    Ok(())
}

/// The cores this process may run on: more threads than this share them.
pub fn available_cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The `id`th worker (from 1): it owns slot `id` of the loops cut for more
/// threads than that, and joins no other.
fn worker(s: &Shared, id: usize) {
    IN_TASK.with(|f| f.set(true));
    let mut seen = 0;
    loop {
        // The next loop of a model often starts microseconds after the last
        // one ended: a worker polls for it a while before sleeping, so that
        // its slot is not left to the others while it wakes up.
        if s.now_ns() >= s.workers_poll_after.load(Ordering::Relaxed) {
            spin_until(s, || s.posted.load(Ordering::Acquire) != seen);
        }
        let job = {
            let mut q = s.lock();
            while s.posted.load(Ordering::Relaxed) == seen {
                s.sleeping.fetch_add(1, Ordering::Relaxed);
                q = s.work.wait(q).unwrap_or_else(|e| e.into_inner());
                s.sleeping.fetch_sub(1, Ordering::Relaxed);
            }
            seen = s.posted.load(Ordering::Relaxed);
            q.clone()
        };
        // A loop cut for fewer threads needs nothing of this worker; one
        // already run (the worker woke late) has nothing left to claim.
        let Some(job) = job else { continue };
        if id < job.slots.len() && job.work(id) {
            finished(s);
        }
    }
}

/// Wake the caller waiting for the loop whose last iterations just ran.
fn finished(s: &Shared) {
    // Under the lock: a caller that saw iterations left under it is waiting by now.
    let _q = s.lock();
    if s.waiting.load(Ordering::Relaxed) > 0 {
        s.done.notify_all();
    }
}

/// Number of threads the parallel loops this thread starts use.
pub fn num_threads() -> usize {
    match CALL_THREADS.with(|c| c.get()) {
        0 => pool().threads.load(Ordering::Acquire),
        n => n,
    }
}

/// Run `task` over `0..n` on the pool.
///
/// # Safety
/// `task` must be safe to call concurrently on disjoint ranges with `ctx`.
#[no_mangle]
pub unsafe extern "C" fn texc_parallel_for(task: Task, ctx: *mut u8, n: i64) {
    let p = pool();
    let threads = num_threads();
    let nested = IN_TASK.with(|f| f.get());
    let guard = if nested || threads == 1 || n < 2 { None } else { p.busy.try_lock().ok() };
    let Some(_guard) = guard else {
        // SAFETY: forwarded from the caller.
        unsafe { task(ctx, 0, n) };
        return;
    };
    let job = Arc::new(Loop::new(task, ctx, n, threads));
    let s = &p.shared;
    // A worker that found no new loop under the lock counted itself
    // sleeping before it released the lock to wait: read under the lock,
    // after the loop is posted, no sleeper is missed.
    let sleepers = {
        let mut q = s.lock();
        *q = Some(Arc::clone(&job));
        s.posted.fetch_add(1, Ordering::Release);
        s.sleeping.load(Ordering::Relaxed)
    };
    if sleepers > 0 {
        s.work.notify_all();
    }
    // Workers that were calm slept, and waking one may take a millisecond on
    // a virtual machine: that wait says nothing of contention, and counting
    // it would renew their calm for as long as loops run.
    let polling = s.now_ns() >= s.workers_poll_after.load(Ordering::Relaxed);
    let began = Instant::now();
    IN_TASK.with(|f| f.set(true));
    // Its own slot, then what the workers have not claimed yet: a worker
    // still waking up, or descheduled, delays the loop by its block in hand at most.
    job.work(0);
    IN_TASK.with(|f| f.set(false));
    let own_done = Instant::now();
    let all_run = || job.unfinished.0.load(Ordering::Acquire) == 0;
    if !spin_until(s, all_run) {
        let mut q = s.lock();
        while !all_run() {
            s.waiting.fetch_add(1, Ordering::Relaxed);
            q = s.done.wait(q).unwrap_or_else(|e| e.into_inner());
            s.waiting.fetch_sub(1, Ordering::Relaxed);
        }
    }
    // Longer than the caller's own share took too: not a slot that is merely larger.
    let waited = own_done.elapsed();
    if polling && waited >= STALLED && waited >= own_done - began {
        s.stalled();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    /// Marks each iteration of the loop it is given as run once more.
    unsafe extern "C" fn mark(ctx: *mut u8, start: i64, end: i64) {
        // SAFETY: `ctx` is the test's counter slice, one per iteration.
        let counts = unsafe { &*(ctx as *const Vec<AtomicU32>) };
        for i in start..end {
            counts[i as usize].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Records the chunk it is given.
    unsafe extern "C" fn record(ctx: *mut u8, start: i64, end: i64) {
        // SAFETY: `ctx` is the test's list of chunks.
        let chunks = unsafe { &*(ctx as *const Mutex<Vec<(i64, i64)>>) };
        chunks.lock().expect("lock").push((start, end));
    }

    /// The chunks of a loop of `n` run inside `with_threads(threads)`, in order.
    fn chunks_with(threads: usize, n: i64) -> Vec<(i64, i64)> {
        let chunks = Mutex::new(Vec::new());
        // SAFETY: the task only appends to the list behind its lock.
        with_threads(threads, || unsafe { texc_parallel_for(record, &chunks as *const _ as *mut u8, n) })
            .expect("a valid count");
        let mut c = chunks.into_inner().expect("lock");
        c.sort();
        c
    }

    /// Whether sorted `chunks` cover `0..n` once each, in order.
    fn tiles(chunks: &[(i64, i64)], n: i64) -> bool {
        chunks.iter().try_fold(0, |at, &(a, b)| (a == at && a < b).then_some(b)) == Some(n)
    }

    /// Claims from the front and from the back of a slot hand out its
    /// units once each, blocks of an eighth of a slot, and a loop of more
    /// iterations than a slot's bounds can count is cut in units of several.
    #[test]
    fn claims_split_each_slot_once() {
        unsafe extern "C" fn nothing(_: *mut u8, _: i64, _: i64) {}
        let l = Loop::new(nothing, std::ptr::null_mut(), 100, 3);
        assert_eq!((l.slots.len(), l.block, l.unit), (3, 4, 1));
        let (mut claimed, mut front) = (Vec::new(), true);
        while let Some(c) = l.claim(1, front) {
            claimed.push((c.0 as i64, c.1 as i64));
            front = !front;
        }
        claimed.sort();
        assert_eq!(claimed.first().map(|c| c.0), Some(33));
        assert!(tiles(&claimed.iter().map(|&(a, b)| (a - 33, b - 33)).collect::<Vec<_>>(), 33), "{claimed:?}");
        let n = 3 << 32;
        let l = Loop::new(nothing, std::ptr::null_mut(), n, 2);
        assert_eq!(l.unit, 4);
        let mut ranges = Vec::new();
        for slot in 0..2 {
            while let Some(units) = l.claim(slot, true) {
                ranges.push(l.range(units));
            }
        }
        assert!(tiles(&ranges, n) && ranges.len() == 16, "{ranges:?}");
    }

    /// The blocks of a loop, and which thread ran each.
    struct Ran {
        blocks: Mutex<Vec<(i64, i64, std::thread::ThreadId)>>,
        caller: std::thread::ThreadId,
        /// Iterations the caller has run.
        by_caller: AtomicI64,
        gave_up: AtomicBool,
    }

    /// Records its block. On a worker (a worker the host descheduled), it
    /// first waits — up to seconds — until the caller has run every other
    /// iteration of the loop of 32, which only the caller's claims of the
    /// worker's blocks can make happen.
    unsafe extern "C" fn held_up_on_workers(ctx: *mut u8, start: i64, end: i64) {
        // SAFETY: `ctx` is the test's `Ran`.
        let ran = unsafe { &*(ctx as *const Ran) };
        let me = std::thread::current().id();
        if me == ran.caller {
            ran.by_caller.fetch_add(end - start, Ordering::AcqRel);
        } else {
            let t0 = Instant::now();
            while ran.by_caller.load(Ordering::Acquire) < 32 - (end - start) {
                if t0.elapsed() > Duration::from_secs(5) {
                    ran.gave_up.store(true, Ordering::Relaxed);
                    break;
                }
                std::thread::yield_now();
            }
        }
        ran.blocks.lock().expect("lock").push((start, end, me));
    }

    /// A worker held up in its first block leaves the rest of its slot to
    /// the caller, which runs it meanwhile: the loop waits for one block,
    /// not for the worker's share.
    #[test]
    fn a_held_up_worker_leaves_the_rest_of_its_slot() {
        // (Its loops are not stalls, but it runs apart from the tests of the calm.)
        let _one = CALM_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        let (t0, mut joined) = (Instant::now(), 0);
        while joined < 3 && t0.elapsed() < Duration::from_secs(20) {
            let ran = Ran {
                blocks: Mutex::new(Vec::new()),
                caller: std::thread::current().id(),
                by_caller: AtomicI64::new(0),
                gave_up: AtomicBool::new(false),
            };
            // SAFETY: the task only touches the test's `Ran`.
            with_threads(2, || unsafe { texc_parallel_for(held_up_on_workers, &ran as *const Ran as *mut u8, 32) })
                .expect("a valid count");
            assert!(!ran.gave_up.load(Ordering::Relaxed), "the caller left the held-up worker's blocks");
            let mut blocks = ran.blocks.into_inner().expect("lock");
            // Slots of 16, blocks of 2: the worker's first block, and no more.
            let by_workers: Vec<_> = blocks.iter().filter(|b| b.2 != ran.caller).collect();
            assert!(by_workers.len() <= 1 && by_workers.iter().all(|b| b.1 - b.0 <= 2), "{blocks:?}");
            joined += by_workers.len();
            blocks.sort_by_key(|b| b.0);
            let spans: Vec<(i64, i64)> = blocks.iter().map(|b| (b.0, b.1)).collect();
            assert!(tiles(&spans, 32), "{spans:?}");
        }
        // (Another test may hold the pool throughout: then every loop ran on its caller.)
        if joined == 0 {
            eprintln!("skipped: no worker joined a loop in {:?}", t0.elapsed());
        }
    }

    /// A loop is cut for the call's thread count, whatever the process's,
    /// and the process's count is back after the call.
    #[test]
    fn a_call_chooses_its_thread_count() {
        let _one = CALM_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        set_num_threads(2).expect("threads");
        assert_eq!(chunks_with(1, 64), vec![(0, 64)]);
        // Blocks of 2 of three slots, none across a slot's bounds; or the
        // loop whole on the caller, when another test holds the pool.
        let three = chunks_with(3, 64);
        assert!(three == vec![(0, 64)] || tiles(&three, 64), "{three:?}");
        let within = |&(a, b): &(i64, i64)| [0, 21, 42, 64].windows(2).any(|w| w[0] <= a && b <= w[1]);
        assert!(three == vec![(0, 64)] || three.iter().all(|c| within(c) && c.1 - c.0 <= 2), "{three:?}");
        assert_eq!(num_threads(), 2);
        assert_eq!(with_threads(5, num_threads), Ok(5));
        assert!(with_threads(0, || ()).is_err() && with_threads(MAX_THREADS + 1, || ()).is_err());
    }

    struct SlowCtx {
        caller: std::thread::ThreadId,
        by_worker: AtomicBool,
    }

    /// Sleeps in every chunk but the first, noting whether a worker ran one.
    unsafe extern "C" fn slow_worker_chunk(ctx: *mut u8, start: i64, _end: i64) {
        // SAFETY: `ctx` is the test's `SlowCtx`.
        let ctx = unsafe { &*(ctx as *const SlowCtx) };
        if start > 0 {
            std::thread::sleep(Duration::from_millis(3));
            if std::thread::current().id() != ctx.caller {
                ctx.by_worker.store(true, Ordering::Relaxed);
            }
        }
    }

    /// The tests that set or check the workers' calm run one at a time: one's
    /// stalled loop renews the calm that the other checks is not renewed.
    static CALM_TESTS: Mutex<()> = Mutex::new(());

    /// Forget the stalls counted so far and any calm (under `CALM_TESTS`).
    fn reset_calm(s: &Shared) {
        s.workers_poll_after.store(0, Ordering::Relaxed);
        s.recent_stalls.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    /// Loops whose caller waits long for a worker's chunk (a worker
    /// preempted, here asleep), several in a short while, stop idle workers
    /// polling for a while.
    #[test]
    fn stalled_loops_calm_the_workers() {
        let _one = CALM_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        set_num_threads(2).expect("threads");
        let s = &pool().shared;
        reset_calm(s);
        // (Serially while another test holds the pool; a worker may also be slow to wake.)
        let (t0, mut by_worker) = (Instant::now(), 0);
        while t0.elapsed() < Duration::from_secs(20) {
            let ctx = SlowCtx { caller: std::thread::current().id(), by_worker: AtomicBool::new(false) };
            // SAFETY: the task only reads the caller's id and sets its flag.
            unsafe { texc_parallel_for(slow_worker_chunk, &ctx as *const SlowCtx as *mut u8, 2) };
            by_worker += ctx.by_worker.load(Ordering::Relaxed) as u32;
            if by_worker > 0 && s.workers_poll_after.load(Ordering::Relaxed) > s.now_ns() {
                reset_calm(s);
                return;
            }
        }
        panic!("the workers never calmed in 20 s of stalled loops ({by_worker} taken by a worker)");
    }

    /// One stall alone (a virtual machine's core taken by its host for a
    /// moment) leaves the workers polling; stalls older than the window do
    /// not count; three within it calm them.
    #[test]
    fn one_stall_does_not_calm_the_workers() {
        let _one = CALM_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        let s = &pool().shared;
        let window = STALL_WINDOW.as_nanos() as u64;
        // (A pool younger than two windows has no time long past.)
        while s.now_ns() < 2 * window {
            std::thread::sleep(STALL_WINDOW);
        }
        // Other tests' loops run serially meanwhile (for a moment): none counts a stall.
        let _busy = pool().busy.lock().unwrap_or_else(|e| e.into_inner());
        reset_calm(s);
        let long_ago = s.now_ns() - 2 * window;
        s.recent_stalls.lock().expect("lock").extend(std::iter::repeat_n(long_ago, STALLS_TO_CALM as usize - 1));
        s.stalled();
        assert_eq!(s.recent_stalls.lock().expect("lock").len(), 1, "old stalls forgotten");
        assert!(s.workers_poll_after.load(Ordering::Relaxed) <= s.now_ns(), "calmed by one stall");
        for _ in 1..STALLS_TO_CALM {
            s.stalled();
        }
        assert!(s.workers_poll_after.load(Ordering::Relaxed) > s.now_ns(), "not calmed by {STALLS_TO_CALM} stalls");
        assert!(s.recent_stalls.lock().expect("lock").is_empty(), "counted afresh after a calm");
        reset_calm(s);
    }

    /// A long wait for workers that were calm (asleep: waking one may be what
    /// took long) does not renew their calm, which would otherwise last for good.
    #[test]
    fn a_wait_while_calm_does_not_renew_it() {
        let _one = CALM_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        set_num_threads(2).expect("threads");
        let s = &pool().shared;
        // Calm until `until`; no loop sets a later time before then (its workers are not polling).
        let until = s.now_ns().max(s.workers_poll_after.load(Ordering::Relaxed)) + 300_000_000;
        s.workers_poll_after.store(until, Ordering::Relaxed);
        let t0 = Instant::now();
        while s.now_ns() + 50_000_000 < until {
            let ctx = SlowCtx { caller: std::thread::current().id(), by_worker: AtomicBool::new(false) };
            // SAFETY: the task only reads the caller's id and sets its flag.
            unsafe { texc_parallel_for(slow_worker_chunk, &ctx as *const SlowCtx as *mut u8, 2) };
            if ctx.by_worker.load(Ordering::Relaxed) {
                assert_eq!(s.workers_poll_after.load(Ordering::Relaxed), until, "calm renewed");
                return;
            }
        }
        // Another test held the pool throughout, or no worker woke in time: nothing to check.
        eprintln!("skipped: no worker took a chunk in {:?}", t0.elapsed());
    }

    /// What [`waits_for_the_second_chunk`] shares between the chunks.
    struct Handoff {
        second_started: AtomicBool,
        gave_up: AtomicBool,
        /// Whether the loop was cut in two (not run serially because another
        /// test's loop held the pool).
        cut: AtomicBool,
    }

    /// The first chunk of a two-chunk loop waits (up to seconds) for the
    /// second to start, which only another thread can do while it waits.
    unsafe extern "C" fn waits_for_the_second_chunk(ctx: *mut u8, start: i64, end: i64) {
        // SAFETY: `ctx` is the test's `Handoff`.
        let h = unsafe { &*(ctx as *const Handoff) };
        if start == 1 {
            h.second_started.store(true, Ordering::Release);
        } else if end == 1 {
            h.cut.store(true, Ordering::Relaxed);
            let t0 = Instant::now();
            while !h.second_started.load(Ordering::Acquire) {
                if t0.elapsed() > Duration::from_secs(5) {
                    h.gave_up.store(true, Ordering::Relaxed);
                    return;
                }
                std::thread::yield_now();
            }
        }
    }

    /// A worker asleep when a loop starts (it waited longer than it polls)
    /// is woken for it: the loop's callers only signal threads that sleep,
    /// and a sleeper must never be missed.
    #[test]
    fn sleeping_workers_wake_for_the_next_loop() {
        let mut cut = 0;
        for _ in 0..100 {
            std::thread::sleep(SPIN * 4);
            let h = Handoff {
                second_started: AtomicBool::new(false),
                gave_up: AtomicBool::new(false),
                cut: AtomicBool::new(false),
            };
            // SAFETY: the task only touches the shared flags.
            with_threads(2, || unsafe {
                texc_parallel_for(waits_for_the_second_chunk, &h as *const Handoff as *mut u8, 2)
            })
            .expect("a valid count");
            assert!(!h.gave_up.load(Ordering::Relaxed), "no worker ran the second chunk");
            cut += h.cut.load(Ordering::Relaxed) as usize;
            if cut == 5 {
                break;
            }
        }
        assert!(cut > 0, "every loop ran serially");
    }

    /// Every iteration runs exactly once, whoever runs its block (a thread
    /// done with its slot takes the blocks no other has claimed), for loops shorter
    /// and longer than the thread count, many times over (workers asleep,
    /// waking, or busy).
    #[test]
    fn each_iteration_runs_once() {
        set_num_threads(3).expect("threads");
        for n in [1i64, 2, 3, 5, 64, 1000] {
            for _ in 0..200 {
                let counts: Vec<AtomicU32> = (0..n).map(|_| AtomicU32::new(0)).collect();
                // SAFETY: `mark` touches only its own iterations' counters.
                unsafe { texc_parallel_for(mark, &counts as *const Vec<AtomicU32> as *mut u8, n) };
                assert!(counts.iter().all(|c| c.load(Ordering::Relaxed) == 1), "n = {n}");
            }
        }
    }
}
