//! `texc.tune` and the tuning database from Python.
//!
//! The search is the CLI's ([`Pipeline::tune`]): the same candidates, cost
//! model, database records and head-to-head. Only measuring differs: the
//! CLI times each candidate in a worker process, `texc.tune` in this
//! process ([`InProcess`]), on the random inputs `Kernel.bench` draws —
//! every candidate's loop nests are built and checked before anything
//! compiles them, so a candidate cannot crash the interpreter, but a
//! compile that hangs would hang the call (the CLI kills such a worker).

use super::{Exec, Failure, Kernel, Request};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;
use texc_pipeline::tune::{Knobs, Measure, Measurement, TuneEvents, TuneOutcome, TuneSettings, TuneStart};
use texc_schedules::tuning::db::{Db, Record};

/// A candidate whose first timed run takes this many times the best median
/// so far stops there (as the CLI's `CUT_SHORT`).
const CUT_SHORT: f64 = 4.0;

/// Candidates compiled and timed in this process.
struct InProcess<'a> {
    request: &'a Request,
    repeat: usize,
    warmup: usize,
}

impl InProcess<'_> {
    /// Compile `knobs`' candidate and time it: the median in ms.
    fn one(&self, knobs: &Knobs, cut_at: Option<f64>) -> Result<Measurement, String> {
        let request = Request { knobs: knobs.iter().cloned().collect(), db: None, ..self.request.clone() };
        let built = request.build().map_err(Failure::message)?;
        let k =
            Kernel { request, target: "", b: built, copies: Default::default(), device_weights: Default::default() };
        let Exec::Compiled(c) = &k.b.exec else {
            return Err("the candidate did not compile to code".into());
        };
        let args = k.random_given().and_then(|g| k.run_args(g)).map_err(|e| e.to_string())?;
        let mut bufs = c.prepare(args).map_err(|e| e.to_string())?;
        for _ in 0..self.warmup {
            c.call(&mut bufs).map_err(|e| e.to_string())?;
        }
        let mut times = Vec::with_capacity(self.repeat);
        for i in 0..self.repeat {
            let t0 = Instant::now();
            c.call(&mut bufs).map_err(|e| e.to_string())?;
            let ms = t0.elapsed().as_secs_f64() * 1e3;
            if i == 0 && cut_at.is_some_and(|best| ms > best * CUT_SHORT) {
                return Ok((ms, None, true));
            }
            times.push(ms);
        }
        Ok((texc_pipeline::stats::Stats::of(&times).median, None, false))
    }
}

impl Measure for InProcess<'_> {
    fn measure(&mut self, batch: &[Knobs], cut: bool, best_ms: Option<f64>) -> Vec<Result<Measurement, String>> {
        let mut best = best_ms;
        batch
            .iter()
            .map(|knobs| {
                let m = self.one(knobs, best.filter(|_| cut));
                if let Ok((ms, _, false)) = &m {
                    best = Some(best.map_or(*ms, |b| b.min(*ms)));
                }
                m
            })
            .collect()
    }

    fn runs(&self) -> (u64, u64) {
        (self.repeat as u64, self.warmup as u64)
    }
}

/// Progress on stderr when `verbose`, as `texc tune` prints it.
struct Lines {
    verbose: bool,
}

impl TuneEvents for Lines {
    fn started(&mut self, s: &TuneStart) {
        if self.verbose {
            eprintln!(
                "tuning `{}` [{}]: {} ({} points{})",
                s.kernel,
                s.sizes.join(", "),
                s.tunables.join(", "),
                s.points,
                if s.resumed > 0 { format!(", {} measured before", s.resumed) } else { String::new() }
            );
        }
    }

    fn trial(&mut self, n: usize, knobs: &Knobs, result: &Result<f64, String>, best_ms: f64) {
        if self.verbose {
            let knobs = knobs.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(", ");
            match result {
                Ok(ms) => eprintln!("  trial {n}: {knobs}: {ms:.4} ms (best {best_ms:.4} ms)"),
                Err(e) => eprintln!("  trial {n}: {knobs}: failed: {e}"),
            }
        }
    }

    fn note(&mut self, note: &str) {
        if self.verbose {
            eprintln!("  {note}");
        }
    }

    fn searched(&mut self, _: usize) {}
}

impl Failure {
    /// The failure as one message (for a candidate that failed).
    fn message(self) -> String {
        match self {
            Failure::Input(m) | Failure::Usage(m) => m,
        }
    }
}

fn knob_dict<'py>(py: Python<'py>, knobs: &[(String, i64)]) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (k, v) in knobs {
        d.set_item(k, v)?;
    }
    Ok(d)
}

/// The outcome as `texc.tune` returns it.
fn outcome<'py>(py: Python<'py>, o: &TuneOutcome, db: &Db) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("kernel", &o.kernel)?;
    d.set_item("sizes", o.sizes.clone())?;
    let trials = PyList::empty(py);
    for t in &o.trials {
        let row = PyDict::new(py);
        row.set_item("knobs", knob_dict(py, &t.knobs)?)?;
        match &t.result {
            Ok(ms) => row.set_item("ms", ms)?,
            Err(e) => row.set_item("error", e)?,
        }
        row.set_item("from_db", t.from_db)?;
        trials.append(row)?;
    }
    d.set_item("trials", trials)?;
    let zero = o.trials.iter().find(|t| t.knobs == o.zero).and_then(|t| t.result.clone().ok());
    d.set_item("default_ms", zero)?;
    let best =
        o.trials.iter().filter_map(|t| t.result.as_ref().ok().map(|ms| (ms, t))).min_by(|a, b| a.0.total_cmp(b.0));
    d.set_item("best_ms", best.map(|(ms, _)| *ms))?;
    d.set_item("knobs", o.kept.as_ref().map(|k| knob_dict(py, k)).transpose()?)?;
    d.set_item("seconds", o.seconds)?;
    d.set_item("db", db.path.clone())?;
    Ok(d)
}

/// Search the knob values of a kernel's schedule template and record every
/// measurement in the tuning database (`db`, else texc's default one);
/// `texc.compile(..., db=...)` then compiles with the best. Returns
/// `kernel`, `sizes`, `trials` (each `knobs` with `ms` or `error`),
/// `default_ms`, `best_ms`, `knobs` (those in force now), `seconds`, `db`.
#[pyfunction]
#[pyo3(signature = (source_or_path, kernel = None, target = "host", shapes = None, consts = None, db = None,
                    trials = 32, time_budget = 60.0, seed = 0, repeat = 20, warmup = 3, verbose = false))]
#[allow(clippy::too_many_arguments)] // Python's keyword arguments
pub(crate) fn tune<'py>(
    py: Python<'py>,
    source_or_path: &Bound<'py, PyAny>,
    kernel: Option<String>,
    target: &str,
    shapes: Option<BTreeMap<String, i64>>,
    consts: Option<BTreeMap<String, i64>>,
    db: Option<PathBuf>,
    trials: usize,
    time_budget: f64,
    seed: u64,
    repeat: usize,
    warmup: usize,
    verbose: bool,
) -> PyResult<Bound<'py, PyDict>> {
    if !(1..=100_000).contains(&trials) {
        return Err(PyValueError::new_err(format!("trials={trials}: expected 1 to 100000")));
    }
    if !(time_budget > 0.0 && time_budget.is_finite()) {
        return Err(PyValueError::new_err(format!("time_budget={time_budget}: expected seconds above 0")));
    }
    if !(1..=100_000).contains(&repeat) || warmup > 100_000 {
        return Err(PyValueError::new_err(format!(
            "repeat={repeat}, warmup={warmup}: expected 1 to 100000 timed runs"
        )));
    }
    let request = Request::of(source_or_path, kernel, target, shapes, consts, None)?;
    let db = Db::new(db.unwrap_or_else(Db::default_path));
    let settings = TuneSettings { trials, time_budget, seed, shard: None, jobs: 1, no_model: false };
    let found = py.detach(|| -> Result<TuneOutcome, Failure> {
        let (mut pl, m) = request.load()?;
        pl.require_compiled("texc.tune measures compiled code:").map_err(|e| Failure::of(&pl, e))?;
        pl.target().check_runs_here().map_err(|e| Failure::Usage(format!("texc.tune measures on the target: {e}")))?;
        let k = pl.kernel(m, request.kernel.as_deref()).map_err(|e| Failure::of(&pl, e))?;
        let mut measure = InProcess { request: &request, repeat, warmup };
        pl.tune((k, &request.bindings), &db, &settings, &mut measure, &mut Lines { verbose })
            .map_err(|e| Failure::of(&pl, e))
    });
    outcome(py, &found.map_err(Failure::into_py)?, &db)
}

/// The tuning database's records (`path`, else texc's default database):
/// each a dict of `kernel`, `target`, `machine`, `kernel_hash`, `knobs`,
/// `time_ms`, `texc_version`, `unix_time`. Invalid lines are left out.
#[pyfunction]
#[pyo3(signature = (path = None))]
pub(crate) fn db(py: Python<'_>, path: Option<PathBuf>) -> PyResult<Bound<'_, PyList>> {
    let db = Db::new(path.unwrap_or_else(Db::default_path));
    let loaded =
        db.load().map_err(|e| super::TexcError::new_err(format!("tuning database {}: {e}", db.path.display())))?;
    let out = PyList::empty(py);
    for r in &loaded.records {
        out.append(record(py, r)?)?;
    }
    Ok(out)
}

fn record<'py>(py: Python<'py>, r: &Record) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("kernel", &r.kernel)?;
    d.set_item("target", &r.key.target)?;
    d.set_item("machine", &r.key.machine)?;
    d.set_item("kernel_hash", &r.key.kernel_hash)?;
    d.set_item("knobs", knob_dict(py, &r.knobs)?)?;
    d.set_item("time_ms", r.time_ms)?;
    d.set_item("texc_version", &r.texc_version)?;
    d.set_item("unix_time", r.unix_time)?;
    Ok(d)
}

/// The database `tune` and `db` use when given none: `TEXC_TUNING_DB`,
/// else `$XDG_CACHE_HOME/texc/tuning.jsonl`, else `~/.cache/texc/tuning.jsonl`.
#[pyfunction]
pub(crate) fn default_db() -> PathBuf {
    Db::default_path()
}
