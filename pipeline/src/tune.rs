//! The tuner's search (`texc tune`): which knob values of a schedule
//! template to measure next, what the measurements teach, and what is
//! recorded. Measuring is the caller's ([`Measure`]: the CLI runs each
//! candidate in a worker process of its own, so that one that crashes or
//! hangs loses only its trial); what happens is reported as it happens
//! ([`TuneEvents`]).
//!
//! Candidate zero is the template's own choice, so the best is never
//! slower than the untuned kernel. Spaces no larger than the trial count
//! are measured whole (in a seeded order); larger ones by an evolutionary
//! search: random points first, then mutations of one knob of the fastest
//! so far. Once enough trials are measured, three candidates in four are
//! picked by the learned cost model (`texc_schedules::tuning::model`,
//! refitted after every trial): of a pool of unseen mutations and random
//! points, built in process but not compiled, the one it predicts fastest.
//! Trials already in the database for the same key are not measured again:
//! a second `tune` continues the first. Before the fastest candidate
//! replaces the schedule in force, a head-to-head times both again.
//!
//! Invariant: only knob values of the kernel's space are measured or
//! recorded; every candidate's loop nests are built (and so checked) here
//! before anything compiles them.

use super::{Error, Pipeline};
use std::collections::HashSet;
use std::time::{Duration, Instant};
use texc_compiler::tir::Program;
use texc_compiler::{Bindings, KernelRef};
use texc_grammar::Diagnostic;
use texc_runtime::SplitMix64;
use texc_schedules::ir::LoopFunc;
use texc_schedules::tuning::db::{self, Db, Measured, PlanRun, Record};
use texc_schedules::tuning::model::{self, CostModel};
use texc_schedules::tuning::space::Tunable;

/// A point of the space: a value per tunable, or `None` for the template's own choice.
type Point = Vec<Option<i64>>;

/// Knob values by name.
pub type Knobs = Vec<(String, i64)>;

/// What measuring one candidate gives: the median in ms, the e-graph's
/// plan that ran, and whether it timed one run only (cut short).
pub type Measurement = (f64, Option<PlanRun>, bool);

/// How candidates are measured.
pub trait Measure {
    /// Measure each of `batch`, in order. With `cut`, a candidate whose
    /// first run is far slower than the best median (`best_ms`, or of the
    /// batch's candidates measured before it) may stop there.
    fn measure(&mut self, batch: &[Knobs], cut: bool, best_ms: Option<f64>) -> Vec<Result<Measurement, String>>;

    /// Timed runs and warm-up runs of one measurement (recorded with it).
    fn runs(&self) -> (u64, u64);
}

/// What the search reports while it runs.
pub trait TuneEvents {
    /// The search starts: its kernel, space and budget.
    fn started(&mut self, start: &TuneStart);
    /// A trial ended: its number (from 1), knobs, time or why it failed, the best so far.
    fn trial(&mut self, n: usize, knobs: &Knobs, result: &Result<f64, String>, best_ms: f64);
    /// Something worth a line (records skipped, a head-to-head that could not be measured).
    fn note(&mut self, note: &str);
    /// The search has ended (a head-to-head may follow); `duplicates`
    /// candidates had loop nests an earlier one had and were not measured.
    fn searched(&mut self, duplicates: usize);
}

/// The search's settings (`texc tune`'s options).
#[derive(Clone, Debug)]
pub struct TuneSettings {
    pub trials: usize,
    /// Seconds.
    pub time_budget: f64,
    pub seed: u64,
    /// This process's part `I/N` of the candidates (no evolution, no head-to-head).
    pub shard: Option<(usize, usize)>,
    /// Candidates measured per batch.
    pub jobs: usize,
    /// Without the learned cost model's picks.
    pub no_model: bool,
}

/// The search about to start.
pub struct TuneStart {
    pub kernel: String,
    pub sizes: Vec<String>,
    pub tunables: Vec<String>,
    pub points: u64,
    pub resumed: usize,
}

/// What a search found.
pub struct TuneOutcome {
    pub kernel: String,
    pub sizes: Vec<String>,
    pub trials: Vec<Trial>,
    /// Seconds the search took.
    pub seconds: f64,
    /// Candidates whose loop nests an earlier one had (not measured again).
    pub duplicates: usize,
    pub head_to_head: Option<HeadToHead>,
    /// The knobs in force now (the database's best), and those that lost a head-to-head.
    pub kept: Option<Knobs>,
    pub lost: HashSet<Knobs>,
    /// Candidate zero's knobs (the default).
    pub zero: Knobs,
}

impl Pipeline {
    /// Search the knob values of kernel `k` at sizes `b`, measuring with
    /// `measure`, recording every measurement in `db`, and reporting to
    /// `events`; the kernel's records already in `db` count as trials.
    pub fn tune(
        &mut self,
        (k, b): (KernelRef, &Bindings),
        db: &Db,
        settings: &TuneSettings,
        measure: &mut dyn Measure,
        events: &mut dyn TuneEvents,
    ) -> Result<TuneOutcome, Error> {
        let written = self.specialize(k, b)?;
        let ts = self.tunables(k);
        if ts.is_empty() {
            let why = "its schedule has no tunables (`?t` factors or `tune t in [...]`)";
            let t = self.target();
            return Err(
                Diagnostic::error(format!("kernel `{}` has nothing to tune on {t}: {why}", written.name)).into()
            );
        }
        // The template itself must apply (its errors are the user's to fix first).
        self.build(k, b)?;
        let key = self.tuning_key(k, &written);
        let cannot =
            |e: std::io::Error| Error::from(Diagnostic::error(format!("tuning database {}: {e}", db.path.display())));
        let mut trials: Vec<Trial> = Vec::new();
        // Records outside the kernel's space are never trials: a record claiming
        // `ti=3` 13425 times faster than the default is not crowned.
        let mine = self.kernel_records(db, k, &written)?;
        if let Some(note) = mine.invalid.note(&format!(" of `{}` in {}", written.name, db.path.display())) {
            events.note(&format!("tuning database: {note}"));
        }
        for r in mine.records.into_iter().filter(|r| r.measured.duel.is_none()) {
            trials.push(Trial { knobs: r.knobs, result: Ok(r.time_ms), at: 0.0, from_db: true, predicted: None });
        }
        let resumed = trials.len();
        let mut rng = SplitMix64::new(settings.seed);
        let size = texc_schedules::tuning::space::size(&ts);
        // Sharded, the stream cannot depend on measurements (other shards make
        // them): a large space is then sampled at random instead of evolved.
        let mut queue: Vec<Point> = if size <= settings.trials as u64 {
            all_points(&ts, &mut rng)
        } else if settings.shard.is_some() {
            sample_points(&ts, settings.trials, &mut rng)
        } else {
            vec![point_zero(&ts)]
        };
        let evolutionary = size > settings.trials as u64 && settings.shard.is_none();
        if let Some((i, n)) = settings.shard {
            queue.truncate(settings.trials);
            queue = queue.into_iter().enumerate().filter(|(p, _)| p % n == i).map(|(_, q)| q).collect();
        }
        let trial_limit = if settings.shard.is_some() { queue.len() + trials.len() } else { settings.trials };
        let mut seen: HashSet<Vec<(String, i64)>> = trials.iter().map(|t| t.knobs.clone()).collect();
        let knob_names: Vec<String> = ts.iter().map(|t| t.name.clone()).collect();
        // The cost model learns from every measured trial, those of earlier runs included.
        let mut model = CostModel::new();
        if evolutionary {
            for t in &trials {
                if let (Ok(ms), Ok(nest)) = (&t.result, build_nest(self, k, b, &t.knobs)) {
                    model.observe(model::features(&nest, &t.knobs, &knob_names), *ms);
                }
            }
            model.fit();
        }
        let sizes: Vec<String> = written.bindings.iter().map(|(n, v)| format!("{n}={v}")).collect();
        events.started(&TuneStart {
            kernel: written.name.clone(),
            sizes: sizes.clone(),
            tunables: knob_names.clone(),
            points: size,
            resumed,
        });
        let started = Instant::now();
        let mut misses = 0;
        let mut duplicates = 0;
        let mut nests: HashSet<String> = HashSet::new();
        let jobs = settings.jobs.max(1);
        let mut exhausted = false;
        while !exhausted
            && trials.len() < trial_limit
            && started.elapsed().as_secs_f64() < settings.time_budget
            && misses < 200
        {
            // A batch of candidates, each built here first: an illegal one is
            // rejected before any worker compiles it, and one whose loop nests
            // another already had is not measured again.
            let mut batch: Vec<Candidate> = Vec::new();
            while batch.len() < jobs.min(trial_limit - trials.len()) && misses < 200 {
                // Three picks in four from the cost model once it has learned
                // enough; the fourth explores as the model-free search does.
                let by_model =
                    (evolutionary && !settings.no_model && queue.is_empty() && !rng.next_u64().is_multiple_of(4))
                        .then(|| model_pick(self, (k, b), &model, &trials, &ts, (&seen, &nests), &mut rng))
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
                let features = match build_nest(self, k, b, &knobs) {
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
            let mut measured = measure.measure(&built, true, best_ms).into_iter();
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
                    db.append(&record(self, measure.runs(), about, &knobs, (ms, plan, one_run), None))
                        .map_err(cannot)?;
                }
                let best = trials
                    .iter()
                    .filter_map(|t| t.result.as_ref().ok().copied())
                    .chain(result.as_ref().ok().copied())
                    .fold(f64::INFINITY, f64::min);
                events.trial(trials.len() + 1, &knobs, &result, best);
                trials.push(Trial { knobs, result, at, from_db: false, predicted });
            }
        }
        let seconds = started.elapsed().as_secs_f64();
        events.searched(duplicates);
        // Sharded, the other shards' trials are not here: `db merge` joins them
        // and a later unsharded `tune` holds the head-to-head.
        let head_to_head = match settings.shard {
            Some(_) => None,
            None => head_to_head(self, (measure, events), (k, &key, written.name.as_str()), &trials, db, &written)?,
        };
        let mine = self.kernel_records(db, k, &written)?;
        Ok(TuneOutcome {
            kernel: written.name.clone(),
            sizes,
            zero: knobs_of(&ts, &point_zero(&ts)),
            lost: db::losers(&mine.records),
            kept: mine.best().map(|r| r.knobs),
            trials,
            seconds,
            duplicates,
            head_to_head,
        })
    }
}

/// The knobs a point sets, by name (as records read back from the database have them).
fn knobs_of(ts: &[Tunable], p: &Point) -> Vec<(String, i64)> {
    let mut k: Vec<(String, i64)> = ts.iter().zip(p).filter_map(|(t, v)| v.map(|v| (t.name.clone(), v))).collect();
    k.sort();
    k
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

/// A candidate of a batch: its knobs, its loop nests' features (or why it
/// was rejected before compiling), and the model's prediction if it picked it.
struct Candidate {
    knobs: Knobs,
    features: Result<Vec<f64>, String>,
    pub predicted: Option<f64>,
}

/// One measured (or failed) candidate.
pub struct Trial {
    pub knobs: Vec<(String, i64)>,
    /// Median ms, or why it failed.
    pub result: Result<f64, String>,
    /// Seconds since tuning started when it ended (0 for records read from the database).
    pub at: f64,
    pub from_db: bool,
    /// The cost model's predicted log time, when the model chose this candidate.
    pub predicted: Option<f64>,
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

/// Alternating rounds of the head-to-head that confirms a tuning's winner.
const HEAD_TO_HEAD_ROUNDS: usize = 3;

/// How much faster a challenger must be to replace the schedule in force:
/// less is within what two runs of one schedule differ by here, and the
/// schedule in force (the default, at first) is the one already trusted.
const HEAD_TO_HEAD_MARGIN: f64 = 0.02;

/// A head-to-head's two sides: knobs and the median of their rounds, winner first.
pub struct HeadToHead {
    pub winner: (Knobs, f64),
    pub loser: (Knobs, f64),
    pub rounds: u64,
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
    (measure, events): (&mut dyn Measure, &mut dyn TuneEvents),
    about: About,
    trials: &[Trial],
    db: &Db,
    written: &Program,
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
        for (&i, m) in order.iter().zip(measure.measure(&batch, false, None)) {
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
        events.note("the head-to-head of the fastest candidate with the schedule in force could not be measured");
        return Ok(None);
    };
    let rounds = times[0].len().min(times[1].len()) as u64;
    let [p0, p1] = plans;
    let [s0, s1] = sides;
    let id = db::Duel::fresh_id();
    let challenger_won = new < kept * (1.0 - HEAD_TO_HEAD_MARGIN);
    let duel = |won: bool| db::Duel { id: id.clone(), rounds, won };
    let first = record(pl, measure.runs(), about, &s0, (kept, p0, false), Some(duel(!challenger_won)));
    let second = Record {
        unix_time: first.unix_time,
        ..record(pl, measure.runs(), about, &s1, (new, p1, false), Some(duel(challenger_won)))
    };
    db.append(&first).map_err(cannot)?;
    db.append(&second).map_err(cannot)?;
    let (winner, loser) = if challenger_won { ((s1, new), (s0, kept)) } else { ((s0, kept), (s1, new)) };
    Ok(Some(HeadToHead { winner, loser, rounds }))
}

/// The database record of one measurement (`duel`: one side of a head-to-head).
fn record(
    pl: &Pipeline,
    runs: (u64, u64),
    about: About,
    knobs: &Knobs,
    m: Measurement,
    duel: Option<db::Duel>,
) -> Record {
    let (k, key, name) = about;
    Record {
        key: key.clone(),
        kernel: name.to_string(),
        texc_version: crate::tuning::TEXC_VERSION.to_string(),
        knobs: knobs.clone(),
        space: Some(texc_schedules::tuning::space::table(&pl.tunables(k))),
        schedule: pl.instantiate(k, knobs).unwrap_or_default(),
        time_ms: m.0,
        measured: Measured {
            runs: if m.2 { 1 } else { runs.0 },
            warmup: if m.2 { 0 } else { runs.1 },
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
