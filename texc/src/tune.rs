//! `texc tune` and `texc db`: searching a schedule template's knob values,
//! and the tuning database they are recorded in.
//!
//! Each candidate is measured by a worker process (`texc bench --json`
//! with the candidate's `--knob`s), so that a candidate that crashes, hangs
//! past `--trial-timeout` or is rejected loses only its own trial. Workers
//! come in batches of `--jobs`: they compile at once, then time one at a
//! time, so that the measuring process has the machine to itself. Candidate
//! zero is the template's own choice, so the best is never slower than the
//! untuned kernel. Spaces no larger than `--trials` are measured whole (in
//! a seeded order); larger ones by an evolutionary search: random points
//! first, then mutations of one knob of the fastest so far. Once enough
//! trials are measured, three candidates in four are picked by the learned
//! cost model (`texc_schedules::tuning::model`, refitted after every
//! trial): of a pool of unseen mutations and random points, built in
//! process but not compiled, the one it predicts fastest. Trials already
//! in the database for the same key are not measured again: a second `tune`
//! continues the first.

use crate::args::{Common, DbArgs, TuneArgs};
use crate::commands::{bindings, kernel, out, usage};
use std::collections::{BTreeMap, HashSet};
use std::io::IsTerminal;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use texc_compiler::{Bindings, KernelRef};
use texc_grammar::Diagnostic;
use texc_pipeline::{Error, Pipeline};
use texc_runtime::SplitMix64;
use texc_schedules::ir::LoopFunc;
use texc_schedules::tuning::db::{self, Db, Measured, PlanRun, Record};
use texc_schedules::tuning::model::{self, CostModel};
use texc_schedules::tuning::space::Tunable;

macro_rules! outln {
    ($($t:tt)*) => { out(format_args!("{}\n", format_args!($($t)*))) };
}

/// The database a command uses: `--db`, else the default path.
pub fn database(c: &Common) -> Db {
    Db::new(c.db.clone().unwrap_or_else(Db::default_path))
}

/// A point of the space: a value per tunable, or `None` for the template's own choice.
type Point = Vec<Option<i64>>;

/// Knob values by name.
type Knobs = Vec<(String, i64)>;

/// The knobs a point sets, by name (as records read back from the database have them).
fn knobs_of(ts: &[Tunable], p: &Point) -> Vec<(String, i64)> {
    let mut k: Vec<(String, i64)> = ts.iter().zip(p).filter_map(|(t, v)| v.map(|v| (t.name.clone(), v))).collect();
    k.sort();
    k
}

fn show_knobs(k: &[(String, i64)]) -> String {
    if k.is_empty() {
        "(no knobs: the schedule's own values)".into()
    } else {
        k.iter().map(|(n, v)| format!("{n}={v}")).collect::<Vec<_>>().join(", ")
    }
}

/// Candidate zero: each `tune` list's first value; unlisted tunables as the template leaves them.
fn point_zero(ts: &[Tunable]) -> Point {
    ts.iter().map(|t| if t.listed { Some(t.candidates[0]) } else { None }).collect()
}

fn random_point(ts: &[Tunable], rng: &mut SplitMix64) -> Point {
    ts.iter().map(|t| Some(t.candidates[(rng.next_u64() % t.candidates.len() as u64) as usize])).collect()
}

fn mutate(ts: &[Tunable], p: &Point, rng: &mut SplitMix64) -> Point {
    let mut q = p.clone();
    let i = (rng.next_u64() % ts.len() as u64) as usize;
    q[i] = Some(ts[i].candidates[(rng.next_u64() % ts[i].candidates.len() as u64) as usize]);
    q
}

/// Every point of a space small enough to enumerate, candidate zero first, the rest in a seeded order.
fn all_points(ts: &[Tunable], rng: &mut SplitMix64) -> Vec<Point> {
    let mut pts: Vec<Point> = vec![Vec::new()];
    for t in ts {
        pts = pts
            .into_iter()
            .flat_map(|p| t.candidates.iter().map(move |&v| [p.clone(), vec![Some(v)]].concat()))
            .collect();
    }
    for i in (1..pts.len()).rev() {
        pts.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
    }
    let zero = point_zero(ts);
    pts.retain(|p| knobs_of(ts, p) != knobs_of(ts, &zero));
    pts.insert(0, zero);
    pts
}

fn first_line(text: &str) -> String {
    text.lines().find(|l| !l.trim().is_empty()).unwrap_or("no message").trim().to_string()
}

/// `I/N` with `I < N`.
fn parse_shard(text: &str) -> Option<(usize, usize)> {
    let (i, n) = text.split_once('/')?;
    let (i, n) = (i.trim().parse::<usize>().ok()?, n.trim().parse::<usize>().ok()?);
    (i < n && n <= 100_000).then_some((i, n))
}

/// Candidate zero, then distinct random points: `count` in all (or the whole space, if smaller).
fn sample_points(ts: &[Tunable], count: usize, rng: &mut SplitMix64) -> Vec<Point> {
    let mut pts = vec![point_zero(ts)];
    let mut seen: HashSet<Vec<(String, i64)>> = pts.iter().map(|p| knobs_of(ts, p)).collect();
    let mut misses = 0;
    while pts.len() < count && misses < 10_000 {
        let p = random_point(ts, rng);
        if seen.insert(knobs_of(ts, &p)) {
            pts.push(p);
            misses = 0;
        } else {
            misses += 1;
        }
    }
    pts
}

/// The worker process that compiles and times one candidate: `texc bench
/// --json` with its knobs (`gate`: it waits, compiled, for its turn to time).
fn worker(a: &TuneArgs, knobs: &[(String, i64)], gate: bool) -> Result<std::process::Child, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find texc itself: {e}"))?;
    let c = &a.common;
    let mut cmd = Command::new(exe);
    cmd.arg("bench").arg(&c.file).args(["--target", &c.target, "--json", "--no-db"]);
    cmd.args(["--repeat", &a.repeat.to_string(), "--warmup", &a.warmup.to_string()]);
    if let Some(k) = &c.kernel {
        cmd.args(["--kernel", k]);
    }
    for s in &c.shape {
        cmd.args(["--shape", s]);
    }
    for s in &c.consts {
        cmd.args(["--const", s]);
    }
    if !knobs.is_empty() {
        cmd.args(["--knob", &knobs.iter().map(|(n, v)| format!("{n}={v}")).collect::<Vec<_>>().join(",")]);
    }
    if gate {
        cmd.arg("--wait-to-time");
    }
    let stdin = if gate { Stdio::piped() } else { Stdio::null() };
    cmd.stdin(stdin).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().map_err(|e| e.to_string())
}

/// A running worker: its process, and its output read by threads (so that
/// a full pipe never stalls it). `ready` gets one message when it has
/// compiled (or its output ended).
struct Running {
    child: std::process::Child,
    stdout: std::thread::JoinHandle<Vec<u8>>,
    stderr: std::thread::JoinHandle<Vec<u8>>,
}

fn start(
    a: &TuneArgs,
    knobs: &[(String, i64)],
    gate: bool,
    ready: std::sync::mpsc::Sender<usize>,
    id: usize,
) -> Result<Running, String> {
    use std::io::{BufRead, Read};
    let mut child = worker(a, knobs, gate)?;
    let out = child.stdout.take().expect("piped");
    let err = child.stderr.take().expect("piped");
    let stdout = std::thread::spawn(move || {
        let mut r = std::io::BufReader::new(out);
        let mut first = Vec::new();
        let _ = r.read_until(b'\n', &mut first);
        let said = first == b"compiled\n";
        let _ = ready.send(id);
        let mut rest = if said { Vec::new() } else { first };
        let _ = r.read_to_end(&mut rest);
        rest
    });
    let stderr = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = std::io::BufReader::new(err).read_to_end(&mut v);
        v
    });
    Ok(Running { child, stdout, stderr })
}

/// What a worker measured: the median in ms, the e-graph's plan that ran,
/// and whether it timed one run only (its first, past [`CUT_SHORT`]).
type Measurement = (f64, Option<PlanRun>, bool);

/// A candidate whose first run takes this many times the best median so far
/// is measured by that run alone: the worst candidates of a 2048³ product
/// take 7 s a run, and their warm-up and timed runs spent a 30 s budget on
/// 2 trials (10 with this).
const CUT_SHORT: f64 = 4.0;

/// Wait for `r` to end, at most until `deadline`: what it measured, or why it failed.
fn finish(mut r: Running, deadline: Instant, timeout: f64) -> Result<Measurement, String> {
    loop {
        match r.child.try_wait().map_err(|e| e.to_string())? {
            Some(_) => break,
            None if Instant::now() > deadline => {
                let _ = r.child.kill();
                let _ = r.child.wait();
                return Err(format!("killed after {timeout} s"));
            }
            None => std::thread::sleep(Duration::from_millis(5)),
        }
    }
    let status = r.child.wait().map_err(|e| e.to_string())?;
    let (out, err) = (r.stdout.join().unwrap_or_default(), r.stderr.join().unwrap_or_default());
    if !status.success() {
        let err = String::from_utf8_lossy(&err);
        let first = err.lines().find(|l| !l.trim().is_empty()).unwrap_or("no message");
        return Err(match status.code() {
            Some(code) => format!("rejected (exit {code}): {first}"),
            None => "the worker crashed".to_string(),
        });
    }
    let v: serde_json::Value = serde_json::from_slice(&out).map_err(|e| format!("unreadable worker output: {e}"))?;
    let ms = v.pointer("/time_ms/median").and_then(|x| x.as_f64()).ok_or("no median in the worker output")?;
    let one_run =
        v.get("warmup").and_then(|x| x.as_u64()) == Some(0) && v.get("runs").and_then(|x| x.as_u64()) == Some(1);
    Ok((ms, v.get("plan").and_then(PlanRun::from_json), one_run))
}

/// Measure a batch of candidates: their workers compile at once, then
/// time one at a time, each alone on the machine (the others wait,
/// compiled). Each phase of a worker may take `--trial-timeout` seconds;
/// a worker that crashes, hangs or is rejected loses only its own trial.
/// With `cut`, a worker whose first run takes [`CUT_SHORT`] times the best
/// median (`best_ms`, or of the batch's candidates timed before it) stops there.
fn measure_batch(a: &TuneArgs, batch: &[Knobs], cut: bool, best_ms: Option<f64>) -> Vec<Result<Measurement, String>> {
    let mut best_ms = best_ms;
    let gate = batch.len() > 1;
    let (tx, rx) = std::sync::mpsc::channel();
    let mut running: Vec<Option<Result<Running, String>>> =
        batch.iter().enumerate().map(|(id, k)| Some(start(a, k, gate, tx.clone(), id))).collect();
    drop(tx);
    let mut ready = HashSet::new();
    if gate {
        // All compiled (or failed) before any is timed; one still compiling
        // after `--trial-timeout` seconds is killed.
        let deadline = Instant::now() + Duration::from_secs_f64(a.trial_timeout);
        let waiting = running.iter().filter(|r| matches!(r, Some(Ok(_)))).count();
        while ready.len() < waiting {
            match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(id) => ready.insert(id),
                Err(_) => break,
            };
        }
        // Before any is timed: the timing has the machine to itself.
        for (id, r) in running.iter_mut().enumerate() {
            if let Some(Ok(w)) = r.as_mut().filter(|_| !ready.contains(&id)) {
                let _ = w.child.kill();
                let _ = w.child.wait();
                *r = Some(Err(format!("killed after {} s compiling", a.trial_timeout)));
            }
        }
    }
    let mut out = Vec::new();
    for r in running.iter_mut() {
        out.push(match r.take().expect("each once") {
            Err(e) => Err(e),
            Ok(mut w) => {
                if let Some(stdin) = w.child.stdin.as_mut() {
                    use std::io::Write;
                    let go = match best_ms.filter(|_| cut) {
                        Some(b) => format!("go {}\n", b * CUT_SHORT),
                        None => "go\n".to_string(),
                    };
                    let _ = stdin.write_all(go.as_bytes()).and_then(|()| stdin.flush());
                }
                let m = finish(w, Instant::now() + Duration::from_secs_f64(a.trial_timeout), a.trial_timeout);
                if let Ok((ms, ..)) = &m {
                    best_ms = Some(best_ms.map_or(*ms, |b| b.min(*ms)));
                }
                m
            }
        });
    }
    out
}

/// A candidate of a batch: its knobs, its loop nests' features (or why it
/// was rejected before compiling), and the model's prediction if it picked it.
struct Candidate {
    knobs: Knobs,
    features: Result<Vec<f64>, String>,
    predicted: Option<f64>,
}

struct Trial {
    knobs: Vec<(String, i64)>,
    /// Median ms, or why it failed.
    result: Result<f64, String>,
    /// Seconds since tuning started when it ended (0 for records read from the database).
    at: f64,
    from_db: bool,
    /// The cost model's predicted log time, when the model chose this candidate.
    predicted: Option<f64>,
}

/// The loop nest of `k` built with `knobs` (the pipeline's knobs are
/// restored after), or why it cannot be built.
fn build_nest(pl: &mut Pipeline, k: KernelRef, b: &Bindings, knobs: &[(String, i64)]) -> Result<LoopFunc, String> {
    pl.options.knobs = knobs.iter().cloned().collect();
    let built = pl.build(k, b).map(|(_, loops)| loops.legal);
    pl.options.knobs.clear();
    built.map_err(|e| first_line(&pl.render_error(e)))
}

/// Candidates the model ranks per pick: mutations of the fastest and random points.
const MODEL_POOL: usize = 24;

/// The candidate the cost model predicts fastest among a pool of unseen
/// mutations of the four fastest trials and random points (whose loop
/// nests differ from every nest measured: `nests`), with its
/// predicted log time; `None` when the model is not fitted or no pool
/// candidate builds.
fn model_pick(
    pl: &mut Pipeline,
    (k, b): (KernelRef, &Bindings),
    model: &CostModel,
    trials: &[Trial],
    ts: &[Tunable],
    (seen, nests): (&HashSet<Knobs>, &HashSet<String>),
    rng: &mut SplitMix64,
) -> Option<(Point, f64)> {
    let names: Vec<String> = ts.iter().map(|t| t.name.clone()).collect();
    let mut pool: Vec<(Point, Vec<f64>)> = Vec::new();
    let mut proposed: HashSet<Knobs> = HashSet::new();
    // Building is in process but not free (a whole model takes a while):
    // the pool stops growing after a second once it has a few candidates.
    let started = Instant::now();
    for _ in 0..4 * MODEL_POOL {
        if pool.len() >= MODEL_POOL || pool.len() >= 4 && started.elapsed() > Duration::from_secs(1) {
            break;
        }
        let p = if rng.next_u64().is_multiple_of(4) {
            random_point(ts, rng)
        } else {
            mutation_of_fastest(trials, ts, rng)?
        };
        let knobs = knobs_of(ts, &p);
        if seen.contains(&knobs) || !proposed.insert(knobs.clone()) {
            continue;
        }
        match build_nest(pl, k, b, &knobs) {
            Ok(nest) if !nests.contains(&db::stable_hash(texc_schedules::ir::print(&nest).as_bytes())) => {
                pool.push((p, model::features(&nest, &knobs, &names)))
            }
            _ => {}
        }
    }
    let rows: Vec<Vec<f64>> = pool.iter().map(|(_, f)| f.clone()).collect();
    let predicted = model.predict(&rows)?;
    let best = (0..pool.len()).min_by(|&i, &j| predicted[i].total_cmp(&predicted[j]))?;
    Some((pool.swap_remove(best).0, predicted[best]))
}

/// A one-knob mutation of one of the four fastest trials (`None` before any
/// succeeded). The knobs the parent leaves to the template (candidate zero
/// leaves them all) stay so: the mutation is the parent's neighbour, not a
/// point with every other knob at its first candidate (the default
/// schedule's `kslice=64, cols=64, rows=2, ...`).
fn mutation_of_fastest(trials: &[Trial], ts: &[Tunable], rng: &mut SplitMix64) -> Option<Point> {
    let mut ok: Vec<(&Trial, f64)> = trials.iter().filter_map(|t| t.result.as_ref().ok().map(|&ms| (t, ms))).collect();
    if ok.is_empty() {
        return None;
    }
    ok.sort_by(|a, b| a.1.total_cmp(&b.1));
    let parent = ok[(rng.next_u64() % ok.len().min(4) as u64) as usize].0;
    let p: Point = ts.iter().map(|t| parent.knobs.iter().find(|(n, _)| *n == t.name).map(|(_, v)| *v)).collect();
    Some(mutate(ts, &p, rng))
}

pub fn tune(pl: &mut Pipeline, a: &TuneArgs) -> Result<(), Error> {
    let c = &a.common;
    pl.require_compiled("`texc tune` measures compiled code:")?;
    pl.target().check_runs_here().map_err(|e| usage(format!("`texc tune` measures on the target: {e}")))?;
    if texc_pipeline::is_loops_file(&c.file) {
        return Err(usage("`texc tune` tunes a kernel's schedule template: give the .tex file"));
    }
    if a.trials == 0 || a.trials > 100_000 {
        return Err(usage(format!("--trials {}: expected 1 to 100000", a.trials)));
    }
    if !(a.time_budget > 0.0 && a.trial_timeout > 0.0) {
        return Err(usage("--time-budget and --trial-timeout must be positive"));
    }
    if a.repeat == 0 {
        return Err(usage("--repeat must be at least 1"));
    }
    if !c.knob.is_empty() {
        return Err(usage("`texc tune` chooses the knobs: --knob does not apply"));
    }
    let shard = match &a.shard {
        None => None,
        Some(text) => Some(parse_shard(text).ok_or_else(|| {
            usage(format!("--shard {text}: expected I/N with 0 <= I < N <= 100000, like `--shard 0/4`"))
        })?),
    };
    let k: KernelRef = kernel(pl, c)?;
    let b: Bindings = bindings(c)?;
    let written = pl.specialize(k, &b)?;
    let ts = pl.tunables(k);
    let t = pl.target();
    if ts.is_empty() {
        let why = "its schedule has no tunables (`?t` factors or `tune t in [...]`)";
        return Err(Diagnostic::error(format!("kernel `{}` has nothing to tune on {t}: {why}", written.name)).into());
    }
    // The template itself must apply (its errors are the user's to fix first).
    pl.build(k, &b)?;
    let key = pl.tuning_key(k, &written);
    let db = database(c);
    let cannot =
        |e: std::io::Error| Error::from(Diagnostic::error(format!("tuning database {}: {e}", db.path.display())));
    let mut trials: Vec<Trial> = Vec::new();
    // Records outside the kernel's space are never trials: a record claiming
    // `ti=3` 13425 times faster than the default is not crowned.
    let mine = pl.kernel_records(&db, k, &written)?;
    note_invalid(&mine, &written.name, &db);
    for r in mine.records.into_iter().filter(|r| r.measured.duel.is_none()) {
        trials.push(Trial { knobs: r.knobs, result: Ok(r.time_ms), at: 0.0, from_db: true, predicted: None });
    }
    let resumed = trials.len();
    let mut rng = SplitMix64::new(a.seed);
    let size = texc_schedules::tuning::space::size(&ts);
    // Sharded, the stream cannot depend on measurements (other shards make
    // them): a large space is then sampled at random instead of evolved.
    let mut queue: Vec<Point> = if size <= a.trials as u64 {
        all_points(&ts, &mut rng)
    } else if shard.is_some() {
        sample_points(&ts, a.trials, &mut rng)
    } else {
        vec![point_zero(&ts)]
    };
    let evolutionary = size > a.trials as u64 && shard.is_none();
    if let Some((i, n)) = shard {
        queue.truncate(a.trials);
        queue = queue.into_iter().enumerate().filter(|(p, _)| p % n == i).map(|(_, q)| q).collect();
    }
    let trial_limit = if shard.is_some() { queue.len() + trials.len() } else { a.trials };
    let mut seen: HashSet<Vec<(String, i64)>> = trials.iter().map(|t| t.knobs.clone()).collect();
    let names: Vec<&str> = ts.iter().map(|t| t.name.as_str()).collect();
    let knob_names: Vec<String> = ts.iter().map(|t| t.name.clone()).collect();
    // The cost model learns from every measured trial, those of earlier runs included.
    let mut model = CostModel::new();
    if evolutionary {
        for t in &trials {
            if let (Ok(ms), Ok(nest)) = (&t.result, build_nest(pl, k, &b, &t.knobs)) {
                model.observe(model::features(&nest, &t.knobs, &knob_names), *ms);
            }
        }
        model.fit();
    }
    let sizes: Vec<String> = written.bindings.iter().map(|(n, v)| format!("{n}={v}")).collect();
    let tty = std::io::stderr().is_terminal();
    eprintln!(
        "tuning `{}` on {t} [{}]: {} tunables ({}), {size} points, up to {} trials and {} s{}",
        written.name,
        sizes.join(", "),
        ts.len(),
        names.join(", "),
        a.trials,
        a.time_budget,
        if resumed > 0 { format!("; {resumed} trials from the database") } else { String::new() }
    );
    let bar = tty.then(|| {
        let pb = indicatif::ProgressBar::new(a.trials as u64);
        pb.set_style(
            indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} trials, {msg} [{elapsed} eta {eta}]")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        pb.set_position(resumed.min(a.trials) as u64);
        pb
    });
    let started = Instant::now();
    let mut misses = 0;
    let mut duplicates = 0;
    let mut nests: HashSet<String> = HashSet::new();
    let jobs = a.jobs.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())).max(1);
    let mut exhausted = false;
    while !exhausted && trials.len() < trial_limit && started.elapsed().as_secs_f64() < a.time_budget && misses < 200 {
        // A batch of candidates, each built here first: an illegal one is
        // rejected before any worker compiles it, and one whose loop nests
        // another already had is not measured again.
        let mut batch: Vec<Candidate> = Vec::new();
        while batch.len() < jobs.min(trial_limit - trials.len()) && misses < 200 {
            // Three picks in four from the cost model once it has learned
            // enough; the fourth explores as the model-free search does.
            let by_model = (evolutionary && !a.no_model && queue.is_empty() && !rng.next_u64().is_multiple_of(4))
                .then(|| model_pick(pl, (k, &b), &model, &trials, &ts, (&seen, &nests), &mut rng))
                .flatten();
            let (point, predicted) = match by_model {
                Some((p, y)) => (p, Some(y)),
                None => match next_point(&mut queue, evolutionary, &trials, &ts, &mut rng) {
                    Some(p) => (p, None),
                    None => {
                        exhausted = true;
                        break;
                    }
                },
            };
            let knobs = knobs_of(&ts, &point);
            if !seen.insert(knobs.clone()) {
                misses += 1;
                continue;
            }
            let features = match build_nest(pl, k, &b, &knobs) {
                Err(e) => Err(format!("rejected before compiling: {e}")),
                Ok(nest) if !nests.insert(db::stable_hash(texc_schedules::ir::print(&nest).as_bytes())) => {
                    duplicates += 1;
                    misses += 1;
                    continue;
                }
                Ok(nest) => Ok(model::features(&nest, &knobs, &knob_names)),
            };
            misses = 0;
            batch.push(Candidate { knobs, features, predicted });
        }
        let built: Vec<Knobs> = batch.iter().filter(|c| c.features.is_ok()).map(|c| c.knobs.clone()).collect();
        let best_ms = trials.iter().filter_map(|t| t.result.as_ref().ok().copied()).reduce(f64::min);
        let mut measured = measure_batch(a, &built, true, best_ms).into_iter();
        for Candidate { knobs, features, predicted } in batch {
            let (result, plan) = match features {
                Err(e) => (Err(e), None),
                Ok(f) => match measured.next().expect("one result per built candidate") {
                    Ok((ms, plan, one_run)) => {
                        model.observe(f, ms);
                        if evolutionary {
                            model.fit();
                        }
                        (Ok(ms), Some((plan, one_run)))
                    }
                    Err(e) => (Err(e), None),
                },
            };
            let at = started.elapsed().as_secs_f64();
            if let Ok(ms) = result {
                let about = (k, &key, written.name.as_str());
                let (plan, one_run) = plan.expect("measured");
                db.append(&record(pl, a, about, &knobs, (ms, plan, one_run), None)).map_err(cannot)?;
            }
            let best = trials
                .iter()
                .filter_map(|t| t.result.as_ref().ok().copied())
                .chain(result.as_ref().ok().copied())
                .fold(f64::INFINITY, f64::min);
            let line = match &result {
                Ok(ms) => format!("trial {}: {}: {ms:.4} ms (best {best:.4} ms)", trials.len() + 1, show_knobs(&knobs)),
                Err(why) => format!("trial {}: {}: {why}", trials.len() + 1, show_knobs(&knobs)),
            };
            match &bar {
                Some(pb) => {
                    pb.inc(1);
                    pb.set_message(format!("best {best:.4} ms"));
                    pb.println(line);
                }
                None => eprintln!("{line}"),
            }
            trials.push(Trial { knobs, result, at, from_db: false, predicted });
        }
    }
    if let Some(pb) = bar {
        pb.finish_and_clear();
    }
    if duplicates > 0 {
        eprintln!("{duplicates} candidates gave loop nests an earlier one had, and were not measured again");
    }
    let seconds = started.elapsed().as_secs_f64();
    // Sharded, the other shards' trials are not here: `db merge` joins them
    // and a later unsharded `tune` holds the head-to-head.
    let h2h = match shard {
        Some(_) => None,
        None => head_to_head(pl, a, (k, &key, written.name.as_str()), &trials, &db, &written)?,
    };
    let mine = pl.kernel_records(&db, k, &written)?;
    let lost = db::losers(&mine.records);
    let kept = mine.best().map(|r| r.knobs);
    report(pl, a, k, &written.name, &sizes, &trials, seconds, &db, (h2h, kept, lost))
}

/// Alternating rounds of the head-to-head that confirms a tuning's winner.
const HEAD_TO_HEAD_ROUNDS: usize = 3;

/// How much faster a challenger must be to replace the schedule in force:
/// less is within what two runs of one schedule differ by here, and the
/// schedule in force (the default, at first) is the one already trusted.
const HEAD_TO_HEAD_MARGIN: f64 = 0.02;

/// A head-to-head's two sides: knobs and the median of their rounds, winner first.
struct HeadToHead {
    winner: (Knobs, f64),
    loser: (Knobs, f64),
    rounds: u64,
}

/// The kernel a record is about: its reference, key and name.
type About<'a> = (KernelRef, &'a db::Key, &'a str);

/// Each trial is one measurement, and on a shared machine the fastest of
/// many is often the luckiest: before a search's fastest candidate replaces
/// the schedule in force — the winner of the key's latest head-to-head, else
/// candidate zero, the default — both are timed again in alternating rounds
/// (each a worker of its own, the order swapped each round), and the medians
/// of their rounds decide: the challenger must be [`HEAD_TO_HEAD_MARGIN`]
/// faster, else the schedule in force stays. Both sides
/// are recorded under one id, the winner marked; the database then takes
/// that winner as its best ([`db::best_of`]). A candidate that lost a
/// head-to-head does not challenge again; none is held when the fastest of
/// the others is the schedule in force.
fn head_to_head(
    pl: &mut Pipeline,
    a: &TuneArgs,
    about: About,
    trials: &[Trial],
    db: &Db,
    written: &texc_compiler::tir::Program,
) -> Result<Option<HeadToHead>, Error> {
    let (k, _, _) = about;
    let cannot =
        |e: std::io::Error| Error::from(Diagnostic::error(format!("tuning database {}: {e}", db.path.display())));
    let mine = pl.kernel_records(db, k, written)?.records;
    let lost = db::losers(&mine);
    let ts = pl.tunables(k);
    let in_force = db::best_of(mine.iter().filter(|r| r.measured.duel.is_some()).cloned())
        .map_or_else(|| knobs_of(&ts, &point_zero(&ts)), |r| r.knobs);
    let challenger = trials
        .iter()
        .filter(|t| !lost.contains(&t.knobs))
        .filter_map(|t| t.result.as_ref().ok().map(|&ms| (&t.knobs, ms)))
        .min_by(|x, y| x.1.total_cmp(&y.1));
    let Some((challenger, _)) = challenger.filter(|(c, _)| **c != in_force) else {
        return Ok(None);
    };
    let sides = [in_force, challenger.clone()];
    let mut times: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    let mut plans: [Option<PlanRun>; 2] = [None, None];
    for round in 0..HEAD_TO_HEAD_ROUNDS {
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        let batch: Vec<Knobs> = order.iter().map(|&i| sides[i].clone()).collect();
        for (&i, m) in order.iter().zip(measure_batch(a, &batch, false, None)) {
            if let Ok((ms, plan, _)) = m {
                times[i].push(ms);
                plans[i] = plan.or(plans[i].take());
            }
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied()
    };
    let (Some(kept), Some(new)) = (median(&mut times[0]), median(&mut times[1])) else {
        eprintln!("note: the head-to-head of the fastest candidate with the schedule in force could not be measured");
        return Ok(None);
    };
    let rounds = times[0].len().min(times[1].len()) as u64;
    let [p0, p1] = plans;
    let [s0, s1] = sides;
    let id = db::Duel::fresh_id();
    let challenger_won = new < kept * (1.0 - HEAD_TO_HEAD_MARGIN);
    let duel = |won: bool| db::Duel { id: id.clone(), rounds, won };
    let first = record(pl, a, about, &s0, (kept, p0, false), Some(duel(!challenger_won)));
    let second = Record {
        unix_time: first.unix_time,
        ..record(pl, a, about, &s1, (new, p1, false), Some(duel(challenger_won)))
    };
    db.append(&first).map_err(cannot)?;
    db.append(&second).map_err(cannot)?;
    let (winner, loser) = if challenger_won { ((s1, new), (s0, kept)) } else { ((s0, kept), (s1, new)) };
    Ok(Some(HeadToHead { winner, loser, rounds }))
}

/// The database record of one measurement (`duel`: one side of a head-to-head).
fn record(pl: &Pipeline, a: &TuneArgs, about: About, knobs: &Knobs, m: Measurement, duel: Option<db::Duel>) -> Record {
    let (k, key, name) = about;
    Record {
        key: key.clone(),
        kernel: name.to_string(),
        texc_version: texc_pipeline::tuning::TEXC_VERSION.to_string(),
        knobs: knobs.clone(),
        space: Some(texc_schedules::tuning::space::table(&pl.tunables(k))),
        schedule: pl.instantiate(k, knobs).unwrap_or_default(),
        time_ms: m.0,
        measured: Measured {
            runs: if m.2 { 1 } else { a.repeat as u64 },
            warmup: if m.2 { 0 } else { a.warmup as u64 },
            threads: texc_runtime::pool::num_threads() as u64,
            duel,
        },
        unix_time: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        plan: m.1,
    }
}

/// The next candidate: the queue's (enumeration, or candidate zero first),
/// then for large spaces random points and mutations of the fastest.
fn next_point(
    queue: &mut Vec<Point>,
    evolutionary: bool,
    trials: &[Trial],
    ts: &[Tunable],
    rng: &mut SplitMix64,
) -> Option<Point> {
    if !queue.is_empty() {
        return Some(queue.remove(0));
    }
    if !evolutionary {
        return None;
    }
    // A quarter of the trials explore; the rest refine the four fastest.
    if rng.next_u64().is_multiple_of(4) {
        return Some(random_point(ts, rng));
    }
    mutation_of_fastest(trials, ts, rng).or_else(|| Some(random_point(ts, rng)))
}

#[allow(clippy::too_many_arguments)]
fn report(
    pl: &Pipeline,
    a: &TuneArgs,
    k: KernelRef,
    name: &str,
    sizes: &[String],
    trials: &[Trial],
    seconds: f64,
    db: &Db,
    (h2h, kept, lost): (Option<HeadToHead>, Option<Knobs>, HashSet<Knobs>),
) -> Result<(), Error> {
    let t = pl.target();
    let measured = trials.iter().filter(|t| !t.from_db).count();
    let failed = trials.iter().filter(|t| t.result.is_err()).count();
    let zero_knobs = knobs_of(&pl.tunables(k), &point_zero(&pl.tunables(k)));
    let default = trials.iter().find(|t| t.knobs == zero_knobs).and_then(|t| t.result.as_ref().ok().copied());
    // The fastest trial that has not lost a head-to-head (a lucky one that did is not the best).
    let fastest = |with_losers: bool| {
        trials
            .iter()
            .filter(|t| with_losers || !lost.contains(&t.knobs))
            .filter_map(|t| t.result.as_ref().ok().map(|&ms| (t, ms)))
            .min_by(|a, b| a.1.total_cmp(&b.1))
    };
    let best = fastest(false).or_else(|| fastest(true));
    outln!(
        "tuned `{name}` on {t} [{}]: {} trials ({measured} measured now in {seconds:.1} s, {} from the database, {failed} rejected or failed)",
        sizes.join(", "),
        trials.len(),
        trials.len() - measured
    );
    let Some((best, best_ms)) = best else {
        return Err(Diagnostic::error(format!("no candidate of `{name}` could be measured")).into());
    };
    match default {
        Some(d) => outln!("  default   {:>10.4} ms  {}", d, show_knobs(&zero_knobs)),
        None => outln!("  default   (not measured)  {}", show_knobs(&zero_knobs)),
    }
    let speedup = default.map(|d| format!("  {:.2}× the default", d / best_ms)).unwrap_or_default();
    outln!("  best      {:>10.4} ms  {}{speedup}", best_ms, show_knobs(&best.knobs));
    let kept = kept.unwrap_or_else(|| best.knobs.clone());
    if let Some(h) = &h2h {
        outln!(
            "  head-to-head over {} alternating rounds: {:.4} ms {} against {:.4} ms {}: the first is kept",
            h.rounds,
            h.winner.1,
            show_knobs(&h.winner.0),
            h.loser.1,
            show_knobs(&h.loser.0)
        );
    } else if kept != best.knobs {
        outln!("  kept      {} (the winner of the latest head-to-head)", show_knobs(&kept));
    }
    let now: Vec<&Trial> = trials.iter().filter(|t| !t.from_db && t.result.is_ok()).collect();
    if let Some(first) = now.iter().find(|t| t.result.as_ref().is_ok_and(|&ms| best_ms / ms >= 0.9)) {
        outln!("  90 % of the best (within 1.11× its time) reached at {:.1} s of tuning", first.at);
    }
    let chosen: Vec<(f64, f64)> =
        now.iter().filter_map(|t| Some((t.predicted?, t.result.as_ref().ok()?.ln()))).collect();
    if !chosen.is_empty() {
        let (p, m): (Vec<f64>, Vec<f64>) = chosen.iter().copied().unzip();
        outln!(
            "  cost model: chose {} of the {} trials measured now; rank correlation of predicted and measured times {:.2}",
            chosen.len(),
            now.len(),
            model::spearman(&p, &m)
        );
    }
    outln!("  recorded in {}", db.path.display());
    if let Some(path) = &a.plot {
        let svg = progress_svg(name, t.name, trials);
        texc_runtime::atomic::write(path, svg.as_bytes())
            .map_err(|e| Error::from(Diagnostic::error(format!("cannot write {}: {e}", path.display()))))?;
        outln!("  plotted in {}", path.display());
    }
    if a.emit_schedule {
        outln!("{}", pl.instantiate(k, &kept).unwrap_or_default());
    }
    Ok(())
}

/// `texc db ACTION`.
pub fn db_command(a: &DbArgs) -> Result<(), Error> {
    let db = Db::new(a.db.clone().unwrap_or_else(Db::default_path));
    let cannot =
        |p: &std::path::Path, e: std::io::Error| Error::from(Diagnostic::error(format!("{}: {e}", p.display())));
    match a.action.as_str() {
        "list" | "show" => {
            let l = db.load().map_err(|e| cannot(&db.path, e))?;
            let mut groups: BTreeMap<(String, String, String), Vec<&Record>> = BTreeMap::new();
            for r in &l.records {
                if a.action == "show" && !a.args.is_empty() && !a.args.contains(&r.kernel) {
                    continue;
                }
                groups.entry((r.kernel.clone(), r.key.target.clone(), r.key.kernel_hash.clone())).or_default().push(r);
            }
            let mut also = Vec::new();
            if !l.invalid.is_empty() {
                also.push(format!("{} invalid records skipped (the first: {})", l.invalid.len(), l.invalid[0].reason));
            }
            if l.skipped > 0 {
                also.push(format!("{} damaged lines skipped", l.skipped));
            }
            outln!(
                "{}: {} records{}",
                db.path.display(),
                l.records.len(),
                also.iter().map(|a| format!(", {a}")).collect::<String>()
            );
            for ((kernel, target, hash), rs) in &groups {
                let best = db::best_of(rs.iter().map(|r| (*r).clone())).expect("a group has records");
                let rounds = rs.iter().filter(|r| r.measured.duel.is_some()).count();
                outln!(
                    "  {kernel} on {target} [{hash}]: {} trials{}, best {:.4} ms with {}",
                    rs.len() - rounds,
                    if rounds > 0 { format!(" and {rounds} head-to-head measurements") } else { String::new() },
                    best.time_ms,
                    show_knobs(&best.knobs)
                );
                if a.action == "show" {
                    outln!("    machine {}, texc {}", best.key.machine, best.texc_version);
                    for line in best.schedule.lines() {
                        outln!("    {line}");
                    }
                }
            }
            Ok(())
        }
        "merge" => {
            let Some(out_path) = &a.output else { return Err(usage("`texc db merge A B ... -o OUT`")) };
            if a.args.is_empty() {
                return Err(usage("`texc db merge A B ... -o OUT`: name the databases to merge"));
            }
            let mut loaded = Vec::new();
            for p in &a.args {
                let path = std::path::PathBuf::from(p);
                if !path.is_file() {
                    return Err(Diagnostic::error(format!("{p}: no such database")).into());
                }
                loaded.push(Db::new(&path).load().map_err(|e| cannot(&path, e))?);
            }
            let (merged, dropped) = db::merge(&loaded);
            let n = merged.len();
            Db::new(out_path).rewrite(merged).map_err(|e| cannot(out_path, e))?;
            outln!("wrote {} ({n} records from {} databases)", out_path.display(), a.args.len());
            if let Some(note) = dropped.note(" (not merged)") {
                eprintln!("note: tuning database: {note}");
            }
            Ok(())
        }
        "prune" => {
            let l = db.load().map_err(|e| cannot(&db.path, e))?;
            let before = l.records.len() + l.invalid.len();
            let current = a.other_versions.then_some(texc_pipeline::tuning::TEXC_VERSION);
            let (kept, dropped) = db::prune(l, current);
            let n = kept.len();
            db.rewrite(kept).map_err(|e| cannot(&db.path, e))?;
            outln!("{}: kept {n} of {before} records (the best of each kernel)", db.path.display());
            if let Some(note) = dropped.note(" (dropped)") {
                eprintln!("note: tuning database: {note}");
            }
            Ok(())
        }
        other => Err(usage(format!("unknown `texc db` action `{other}`; actions: list, show, merge, prune"))),
    }
}

/// Before a run, bench or compile: the tuning database's knobs or
/// corrections for kernel `k` ([`Pipeline::use_tuning_db`]), said on stderr.
pub fn apply_tuned_knobs(pl: &mut Pipeline, c: &Common, k: KernelRef, b: &Bindings) -> Result<(), Error> {
    if c.no_db {
        return Ok(());
    }
    let db = database(c);
    let used = pl.use_tuning_db(&db, k, b)?;
    if let Some(note) = &used.skipped {
        eprintln!("note: tuning database: {note}");
    }
    if let Some(r) = &used.knobs_of {
        eprintln!(
            "note: using tuned knobs {} of `{}` ({:.4} ms when tuned) from {} (--no-db to ignore)",
            show_knobs(&r.knobs),
            r.kernel,
            r.time_ms,
            db.path.display()
        );
    } else if !used.calibrated_ops.is_empty() {
        eprintln!(
            "note: the e-graph's cost model is corrected by {} plans measured by `texc tune` ({}) from {} (--no-db to ignore)",
            pl.options.calibration.samples.len(),
            used.calibrated_ops.join(", "),
            db.path.display()
        );
    }
    Ok(())
}

/// One line on stderr when records of the kernel were skipped as invalid.
fn note_invalid(mine: &db::KernelRecords, kernel: &str, db: &Db) {
    if let Some(note) = mine.invalid.note(&format!(" of `{kernel}` in {}", db.path.display())) {
        eprintln!("note: tuning database: {note}");
    }
}

/// The best time so far after each trial, as an SVG line (failed trials keep the line flat).
fn progress_svg(kernel: &str, target: &str, trials: &[Trial]) -> String {
    let mut best = f64::INFINITY;
    let pts: Vec<(usize, f64)> = trials
        .iter()
        .enumerate()
        .filter_map(|(i, t)| {
            if let Ok(ms) = t.result {
                best = best.min(ms);
            }
            best.is_finite().then_some((i + 1, best))
        })
        .collect();
    let (w, h, ml, mb, mt, mr) = (640.0, 400.0, 70.0, 50.0, 30.0, 20.0);
    let n = trials.len().max(2) as f64;
    let hi = pts.iter().map(|p| p.1).fold(0.0, f64::max).max(1e-9) * 1.05;
    let lo = pts.iter().map(|p| p.1).fold(f64::INFINITY, f64::min).min(hi) * 0.95;
    let px = |i: f64| ml + (i - 1.0) / (n - 1.0) * (w - ml - mr);
    let py = |ms: f64| h - mb - (ms - lo) / (hi - lo).max(1e-12) * (h - mb - mt);
    let mut s = format!("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"11\">\n");
    s += &format!("<text x=\"{ml}\" y=\"18\" font-size=\"13\">tuning {kernel} on {target}: best time so far</text>\n");
    s += &format!(
        "<rect x=\"{ml}\" y=\"{mt}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#888\"/>\n",
        w - ml - mr,
        h - mb - mt
    );
    for k in 0..=4 {
        let ms = lo + (hi - lo) * k as f64 / 4.0;
        s += &format!("<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{ms:.3}</text>\n", ml - 6.0, py(ms));
    }
    s += &format!(
        "<text x=\"{ml}\" y=\"{:.1}\">1</text><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>\n",
        h - mb + 16.0,
        w - mr,
        h - mb + 16.0,
        trials.len()
    );
    s += &format!("<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">trial</text>\n", (ml + w - mr) / 2.0, h - 10.0);
    s += &format!(
        "<text x=\"16\" y=\"{0:.1}\" transform=\"rotate(-90 16 {0:.1})\" text-anchor=\"middle\">ms</text>\n",
        (mt + h - mb) / 2.0
    );
    let line: Vec<String> = pts.iter().map(|&(i, ms)| format!("{:.1},{:.1}", px(i as f64), py(ms))).collect();
    s += &format!("<polyline points=\"{}\" fill=\"none\" stroke=\"#36c\" stroke-width=\"2\"/>\n", line.join(" "));
    s += "</svg>\n";
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Mutations of candidate zero (no knobs set) set exactly one knob, and
    /// those of a trial with knobs keep all but one of them.
    #[test]
    fn mutations_are_neighbours_of_their_parent() {
        let ts: Vec<Tunable> = [("rows", vec![2, 6, 8]), ("kslice", vec![64, 256, 512]), ("cols", vec![64, 128, 256])]
            .into_iter()
            .map(|(n, c)| Tunable { name: n.to_string(), candidates: c, listed: false })
            .collect();
        let trial = |knobs: Vec<(String, i64)>, ms: f64| Trial {
            knobs,
            result: Ok(ms),
            at: 0.0,
            from_db: false,
            predicted: None,
        };
        let mut rng = SplitMix64::new(7);
        let zero = [trial(Vec::new(), 1.0)];
        for _ in 0..50 {
            let p = mutation_of_fastest(&zero, &ts, &mut rng).expect("a parent");
            assert_eq!(knobs_of(&ts, &p).len(), 1, "{p:?}");
        }
        let set = vec![("cols".to_string(), 64), ("kslice".to_string(), 512), ("rows".to_string(), 8)];
        let parent = [trial(set.clone(), 1.0)];
        for _ in 0..50 {
            let k = knobs_of(&ts, &mutation_of_fastest(&parent, &ts, &mut rng).expect("a parent"));
            assert_eq!(k.len(), 3);
            assert!(k.iter().filter(|kv| !set.contains(kv)).count() <= 1, "{k:?}");
        }
    }
}
