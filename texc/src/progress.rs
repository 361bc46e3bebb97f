//! Signs of life on stderr for work that can take more than a moment:
//! interpreting, compiling, running, bench repetitions.
//!
//! An [`Activity`] draws nothing for its first [`DELAY`] (quick commands
//! print exactly what they always did), and nothing at all unless stderr is
//! a terminal: piped or redirected output, tests and scripts see no progress
//! noise. It is cleared when dropped, so results printed afterwards start on
//! a clean line. Work is counted by the caller (the interpreter exposes an
//! atomic counter, [`texc_compiler::interp::Progress`]); a thread polls it,
//! so the counting side costs one relaxed atomic add per few thousand
//! elements.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::sync::mpsc::{channel, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;
use texc_compiler::interp::{Arg, Progress};
use texc_compiler::tir::Program;
use texc_pipeline::Error;
use texc_runtime::Tensor;

/// How long work runs before it gets a progress display.
pub const DELAY: Duration = Duration::from_millis(800);

/// Work to do and done, polled by the display thread.
type Poll = Box<dyn Fn() -> (u64, u64) + Send>;

/// A progress display for as long as it lives (see the module documentation).
pub struct Activity {
    stop: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Activity {
    /// A spinner with elapsed time, for work of unknown length.
    pub fn spinner(msg: impl Into<String>) -> Activity {
        Activity::start(msg.into(), None)
    }

    /// A bar that follows `poll() = (done, total)`.
    pub fn counted(msg: impl Into<String>, poll: impl Fn() -> (u64, u64) + Send + 'static) -> Activity {
        Activity::start(msg.into(), Some(Box::new(poll)))
    }

    fn start(msg: String, poll: Option<Poll>) -> Activity {
        if !std::io::stderr().is_terminal() {
            return Activity { stop: None, thread: None };
        }
        let (stop, stopped) = channel::<()>();
        let thread = std::thread::spawn(move || {
            // Finished (or gone) within the delay: nothing is ever drawn.
            if stopped.recv_timeout(DELAY) != Err(RecvTimeoutError::Timeout) {
                return;
            }
            let bar = match &poll {
                Some(_) => ProgressBar::with_draw_target(Some(1), ProgressDrawTarget::hidden()).with_style(
                    ProgressStyle::with_template("{spinner} {msg} [{elapsed}] {wide_bar} {percent}% (eta {eta})")
                        .expect("a valid template"),
                ),
                None => ProgressBar::with_draw_target(None, ProgressDrawTarget::hidden())
                    .with_style(ProgressStyle::with_template("{spinner} {msg} [{elapsed}]").expect("a valid template")),
            };
            bar.set_message(msg);
            let update = || {
                if let Some(poll) = &poll {
                    let (done, total) = poll();
                    bar.set_length(total.max(1));
                    bar.set_position(done.min(total));
                }
            };
            // Drawn from here on, with its first numbers already set.
            update();
            bar.set_draw_target(ProgressDrawTarget::stderr());
            bar.enable_steady_tick(Duration::from_millis(100));
            while stopped.recv_timeout(Duration::from_millis(100)) == Err(RecvTimeoutError::Timeout) {
                update();
            }
            bar.finish_and_clear();
        });
        Activity { stop: Some(stop), thread: Some(thread) }
    }
}

impl Drop for Activity {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Run a program on the interpreter with a progress bar.
pub fn interpret(p: &Program, args: Vec<Arg>, what: &str) -> Result<Vec<Tensor>, Error> {
    let progress = Arc::new(Progress::default());
    let watched = Arc::clone(&progress);
    let _bar = Activity::counted(what, move || (watched.done(), watched.total()));
    texc_pipeline::interpret_with_progress(p, args, &progress)
}

/// `warmup` untimed calls of `call`, then `repeat` timed ones (their times
/// in seconds), with a bar over all of them.
pub fn timed_runs(warmup: usize, repeat: usize, mut call: impl FnMut()) -> Vec<f64> {
    use std::sync::atomic::{AtomicU64, Ordering};
    let done = Arc::new(AtomicU64::new(0));
    let watched = Arc::clone(&done);
    let total = (warmup + repeat) as u64;
    let _bar = Activity::counted(format!("{warmup} warm-up and {repeat} timed runs"), move || {
        (watched.load(Ordering::Relaxed), total)
    });
    for _ in 0..warmup {
        call();
        done.fetch_add(1, Ordering::Relaxed);
    }
    (0..repeat)
        .map(|_| {
            let start = std::time::Instant::now();
            call();
            let t = start.elapsed().as_secs_f64();
            done.fetch_add(1, Ordering::Relaxed);
            t
        })
        .collect()
}
