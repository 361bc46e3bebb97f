//! `texc tune` and `texc db`: the tuner's measurements and its report,
//! and the tuning database's commands. The search itself is the
//! pipeline's (`texc_pipeline::tune`); here each candidate it asks for is
//! measured by a worker process (`texc bench --json` with the candidate's
//! `--knob`s), so that a candidate that crashes, hangs past
//! `--trial-timeout` or is rejected loses only its own trial. Workers come
//! in batches of `--jobs`: they compile at once, then time one at a time,
//! so that the measuring process has the machine to itself.

use crate::args::{Common, DbArgs, TuneArgs};
use crate::commands::{bindings, kernel, out, usage};
use std::collections::{BTreeMap, HashSet};
use std::io::IsTerminal;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use texc_compiler::{Bindings, KernelRef};
use texc_grammar::Diagnostic;
use texc_pipeline::tune::{Knobs, Measure, Measurement, Trial, TuneEvents, TuneOutcome, TuneSettings, TuneStart};
use texc_pipeline::{Error, Pipeline};
use texc_schedules::tuning::db::{self, Db, PlanRun, Record};
use texc_schedules::tuning::model;

macro_rules! outln {
    ($($t:tt)*) => { out(format_args!("{}\n", format_args!($($t)*))) };
}

/// The database a command uses: `--db`, else the default path.
pub fn database(c: &Common) -> Db {
    Db::new(c.db.clone().unwrap_or_else(Db::default_path))
}

fn show_knobs(k: &[(String, i64)]) -> String {
    if k.is_empty() {
        "(no knobs: the schedule's own values)".into()
    } else {
        k.iter().map(|(n, v)| format!("{n}={v}")).collect::<Vec<_>>().join(", ")
    }
}

/// `I/N` with `I < N`.
fn parse_shard(text: &str) -> Option<(usize, usize)> {
    let (i, n) = text.split_once('/')?;
    let (i, n) = (i.trim().parse::<usize>().ok()?, n.trim().parse::<usize>().ok()?);
    (i < n && n <= 100_000).then_some((i, n))
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
    let db = database(c);
    let settings = TuneSettings {
        trials: a.trials,
        time_budget: a.time_budget,
        seed: a.seed,
        shard,
        jobs: a.jobs.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())).max(1),
        no_model: a.no_model,
    };
    let mut workers = Workers(a);
    let mut shown = Shown { a, target: pl.target().name, bar: None };
    let outcome = pl.tune((k, &b), &db, &settings, &mut workers, &mut shown)?;
    report(pl, a, k, &outcome, &db)
}

/// Candidates measured by worker processes ([`measure_batch`]).
struct Workers<'a>(&'a TuneArgs);

impl Measure for Workers<'_> {
    fn measure(&mut self, batch: &[Knobs], cut: bool, best_ms: Option<f64>) -> Vec<Result<Measurement, String>> {
        measure_batch(self.0, batch, cut, best_ms)
    }

    fn runs(&self) -> (u64, u64) {
        (self.0.repeat as u64, self.0.warmup as u64)
    }
}

/// The search shown on stderr: a line per trial, under a progress bar on a terminal.
struct Shown<'a> {
    a: &'a TuneArgs,
    target: &'static str,
    bar: Option<indicatif::ProgressBar>,
}

impl TuneEvents for Shown<'_> {
    fn started(&mut self, s: &TuneStart) {
        let a = self.a;
        eprintln!(
            "tuning `{}` on {} [{}]: {} tunables ({}), {} points, up to {} trials and {} s{}",
            s.kernel,
            self.target,
            s.sizes.join(", "),
            s.tunables.len(),
            s.tunables.join(", "),
            s.points,
            a.trials,
            a.time_budget,
            if s.resumed > 0 { format!("; {} trials from the database", s.resumed) } else { String::new() }
        );
        self.bar = std::io::stderr().is_terminal().then(|| {
            let pb = indicatif::ProgressBar::new(a.trials as u64);
            pb.set_style(
                indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} trials, {msg} [{elapsed} eta {eta}]")
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            pb.set_position(s.resumed.min(a.trials) as u64);
            pb
        });
    }

    fn trial(&mut self, n: usize, knobs: &Knobs, result: &Result<f64, String>, best: f64) {
        let line = match result {
            Ok(ms) => format!("trial {n}: {}: {ms:.4} ms (best {best:.4} ms)", show_knobs(knobs)),
            Err(why) => format!("trial {n}: {}: {why}", show_knobs(knobs)),
        };
        match &self.bar {
            Some(pb) => {
                pb.inc(1);
                pb.set_message(format!("best {best:.4} ms"));
                pb.println(line);
            }
            None => eprintln!("{line}"),
        }
    }

    fn note(&mut self, note: &str) {
        eprintln!("note: {note}");
    }

    fn searched(&mut self, duplicates: usize) {
        if let Some(pb) = self.bar.take() {
            pb.finish_and_clear();
        }
        if duplicates > 0 {
            eprintln!("{duplicates} candidates gave loop nests an earlier one had, and were not measured again");
        }
    }
}

fn report(pl: &Pipeline, a: &TuneArgs, k: KernelRef, o: &TuneOutcome, db: &Db) -> Result<(), Error> {
    let t = pl.target();
    let (name, sizes, trials, seconds) = (&o.kernel, &o.sizes, &o.trials, o.seconds);
    let (h2h, kept, lost) = (&o.head_to_head, o.kept.clone(), &o.lost);
    let measured = trials.iter().filter(|t| !t.from_db).count();
    let failed = trials.iter().filter(|t| t.result.is_err()).count();
    let zero_knobs = &o.zero;
    let default = trials.iter().find(|t| t.knobs == *zero_knobs).and_then(|t| t.result.as_ref().ok().copied());
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
        Some(d) => outln!("  default   {:>10.4} ms  {}", d, show_knobs(zero_knobs)),
        None => outln!("  default   (not measured)  {}", show_knobs(zero_knobs)),
    }
    let speedup = default.map(|d| format!("  {:.2}× the default", d / best_ms)).unwrap_or_default();
    outln!("  best      {:>10.4} ms  {}{speedup}", best_ms, show_knobs(&best.knobs));
    let kept = kept.unwrap_or_else(|| best.knobs.clone());
    if let Some(h) = h2h {
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
