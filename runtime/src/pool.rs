//! A small persistent thread pool for the `parallel` loops of generated code.
//!
//! Generated code calls [`texc_parallel_for`] with a task function, a context
//! pointer and an iteration count; the range is cut into one contiguous
//! chunk per thread, the calling thread runs the first chunk, then any
//! chunk no worker has taken yet, and waits for the others. A call made
//! from inside a task (nested parallelism) runs serially, so the pool can
//! never deadlock on itself. The number of threads is the machine's
//! parallelism, or `TEXC_NUM_THREADS`, or what [`set_num_threads`] last
//! asked for.
//!
//! A model runs hundreds of parallel loops of a few microseconds each, so
//! handing work over must take less than that: the caller, once its own
//! chunk is done, polls for the others' end for [`SPIN`] before sleeping on
//! a condition variable (waking a sleeping thread takes tens of
//! microseconds; MobileNetV2 on two threads ran slower than on one). Idle
//! workers do not poll: on a machine whose cores other programs keep busy,
//! workers that polled for the next loop lost their turn to run when it
//! came (MobileNetV2 on 2 threads beside two busy processes: 13–296 ms with
//! polling workers, 13–19 ms without, 37 ms with no polling at all).

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// How long a caller polls for its workers before sleeping: longer than most
/// chunks of a model's small parallel loops, short enough not to matter
/// beside a long one.
const SPIN: Duration = Duration::from_micros(300);

/// `task(ctx, start, end)` runs iterations `start..end`.
pub type Task = unsafe extern "C" fn(*mut u8, i64, i64);

struct Job {
    task: Task,
    ctx: usize,
    start: i64,
    end: i64,
}

struct Shared {
    queue: Mutex<(Vec<Job>, usize)>, // pending jobs, jobs not yet finished
    work: Condvar,
    done: Condvar,
    /// `queue.1` as last stored under the lock, for polling without it.
    unfinished: AtomicUsize,
    /// Whether waiting threads poll: not when there are more threads than
    /// cores, where a poller would take the core a working thread needs.
    spin: AtomicBool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, (Vec<Job>, usize)> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
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
        // preempted in its chunk): offer the core between polls.
        std::thread::yield_now();
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
            queue: Mutex::new((Vec::new(), 0)),
            work: Condvar::new(),
            done: Condvar::new(),
            unfinished: AtomicUsize::new(0),
            spin: AtomicBool::new(false),
        });
        let p = Pool { shared, threads: AtomicUsize::new(1), workers: Mutex::new(0), busy: Mutex::new(()) };
        p.grow(threads);
        p
    })
}

impl Pool {
    /// Start workers until `threads` can run at once, then cut loops for `threads`.
    /// Workers are only ever added: idle ones wait on the queue at no cost.
    fn grow(&self, threads: usize) {
        let mut started = self.workers.lock().unwrap_or_else(|e| e.into_inner());
        while *started + 1 < threads {
            let s = Arc::clone(&self.shared);
            std::thread::spawn(move || worker(&s));
            *started += 1;
        }
        self.shared.spin.store(threads <= available_cores(), Ordering::Relaxed);
        self.threads.store(threads, Ordering::Release);
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

fn worker(s: &Shared) {
    IN_TASK.with(|f| f.set(true));
    loop {
        let job = {
            let mut q = s.lock();
            loop {
                if let Some(j) = q.0.pop() {
                    break j;
                }
                q = s.work.wait(q).unwrap_or_else(|e| e.into_inner());
            }
        };
        // SAFETY: the caller of `texc_parallel_for` keeps `ctx` alive until every job is done.
        unsafe { (job.task)(job.ctx as *mut u8, job.start, job.end) };
        finish_job(s);
    }
}

/// Count a job done; wake the caller when it was the last.
fn finish_job(s: &Shared) {
    let mut q = s.lock();
    q.1 -= 1;
    // Release: the job's writes are visible to a caller that sees the count drop.
    s.unfinished.store(q.1, Ordering::Release);
    if q.1 == 0 {
        s.done.notify_all();
    }
}

/// Number of threads parallel loops use.
pub fn num_threads() -> usize {
    pool().threads.load(Ordering::Acquire)
}

/// Run `task` over `0..n` on the pool.
///
/// # Safety
/// `task` must be safe to call concurrently on disjoint ranges with `ctx`.
#[no_mangle]
pub unsafe extern "C" fn texc_parallel_for(task: Task, ctx: *mut u8, n: i64) {
    let p = pool();
    let threads = p.threads.load(Ordering::Acquire);
    let nested = IN_TASK.with(|f| f.get());
    let guard = if nested || threads == 1 || n < 2 { None } else { p.busy.try_lock().ok() };
    let Some(_guard) = guard else {
        // SAFETY: forwarded from the caller.
        unsafe { task(ctx, 0, n) };
        return;
    };
    // One chunk per thread: finer chunks, which would also bound what a
    // preempted worker holds up, measured slower here (4 per thread:
    // MobileNetV2 on 2 threads 5.9–7.0 ms median, against 5.4–5.5 ms).
    let chunks = (threads as i64).min(n);
    let bounds = |c: i64| (n * c / chunks, n * (c + 1) / chunks);
    let s = &p.shared;
    {
        let mut q = s.lock();
        for c in 1..chunks {
            let (start, end) = bounds(c);
            q.0.push(Job { task, ctx: ctx as usize, start, end });
        }
        q.1 += chunks as usize - 1;
        s.unfinished.store(q.1, Ordering::Release);
    }
    s.work.notify_all();
    let (start, end) = bounds(0);
    IN_TASK.with(|f| f.set(true));
    // SAFETY: forwarded from the caller.
    unsafe { task(ctx, start, end) };
    // Then the chunks no worker has taken yet: a worker still waking up, or
    // preempted by another program, delays the loop by its chunk in hand at most.
    loop {
        // (Its own statement: the lock is released before the job runs.)
        let job = s.lock().0.pop();
        let Some(job) = job else { break };
        // SAFETY: as above; every job is a chunk of this loop.
        unsafe { (job.task)(job.ctx as *mut u8, job.start, job.end) };
        finish_job(s);
    }
    IN_TASK.with(|f| f.set(false));
    if spin_until(s, || s.unfinished.load(Ordering::Acquire) == 0) {
        return;
    }
    let mut q = s.lock();
    while q.1 > 0 {
        q = s.done.wait(q).unwrap_or_else(|e| e.into_inner());
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

    /// Every iteration runs exactly once, whoever runs its chunk (the
    /// caller takes the chunks no worker has started), for loops shorter
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
