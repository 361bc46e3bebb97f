//! What the pipeline knows for tuning: a kernel's schedule template for the
//! target, its search space, the key its tuning records are filed under,
//! and the best record of that key.
//!
//! The key hashes the kernel's specialized program as written (so a change
//! of formatting or comments keeps it, a change of sizes or code does not),
//! the schedule template's text and texc's version: a record is only ever
//! applied to the computation and template it was measured with.

use super::{Error, Pipeline};
use texc_compiler::target::Target;
use texc_compiler::tir::Program;
use texc_compiler::KernelRef;
use texc_schedules::tuning::db::{self, stable_hash, this_machine, Db, KernelRecords, Key, Record};
use texc_schedules::tuning::space::{self, Tunable};

impl Pipeline {
    /// The schedule block kernel `k` uses on the target, with its text.
    fn template(&self, k: KernelRef) -> Option<texc_schedules::ScheduleSrc<'_>> {
        texc_schedules::find_schedule(&self.session, k, self.options.target)
    }

    /// The tunables of kernel `k` on the target: its schedule template's, or
    /// without a template the default schedule's knobs
    /// ([`DefaultKnobs`](texc_schedules::knobs::DefaultKnobs)); none on the interpreter.
    pub fn tunables(&self, k: KernelRef) -> Vec<Tunable> {
        if !self.options.target.is_compiled() {
            return Vec::new();
        }
        match self.template(k) {
            Some(src) => space::tunables(src),
            // The e-graph's choices too: the plan as written, without Winograd,
            // with only one Winograd tile, without im2col, measured rather
            // than trusted to the cost model.
            None => {
                let family = texc_schedules::strategy::lookup(self.options.target).family();
                let target = self.options.target;
                // A prefetch knob only where prefetches are compiled, a
                // forward knob only on CPUs (where the pass runs): elsewhere
                // each would be a candidate that changes nothing.
                let cpu = target.gpu.is_none();
                let pipeline = crate::PIPELINE_KNOBS.into_iter().filter(move |(name, _)| match *name {
                    crate::KNOB_PREFETCH => target.prefetches(),
                    crate::KNOB_FORWARD => cpu,
                    _ => true,
                });
                texc_schedules::knobs::space_on(family, target).into_iter().chain(pipeline)
            }
            .map(|(name, values)| Tunable { name: name.to_string(), candidates: values.to_vec(), listed: false })
            .collect(),
        }
    }

    /// The schedule with `knobs`: the template with them substituted, as
    /// `.tex` schedule text; for the default schedule, the `--knob` that sets them.
    pub fn instantiate(&self, k: KernelRef, knobs: &[(String, i64)]) -> Option<String> {
        match self.template(k) {
            Some(src) => Some(space::instantiate(src, &self.session.sources, knobs)),
            None if knobs.is_empty() => Some("# the default schedule".to_string()),
            None => {
                let list: Vec<String> = knobs.iter().map(|(n, v)| format!("{n}={v}")).collect();
                Some(format!("# the default schedule with --knob {}", list.join(",")))
            }
        }
    }

    /// The key of kernel `k`'s tuning records, `written` being its specialized program.
    pub fn tuning_key(&self, k: KernelRef, written: &Program) -> Key {
        let template =
            self.template(k).map(|src| space::instantiate(src, &self.session.sources, &[])).unwrap_or_default();
        let text =
            format!("{}\n{template}\ntexc {}", texc_compiler::print::print_program(written), env!("CARGO_PKG_VERSION"));
        Key {
            target: self.options.target.name.to_string(),
            machine: machine_of(&self.options.target),
            kernel_hash: stable_hash(text.as_bytes()),
        }
    }

    /// The records in `db` of kernel `k` at the sizes of `written`, checked
    /// against its tunables ([`db::for_kernel`]): what `run`, `bench`,
    /// `compile` and `tune` read. None when its template has no tunables.
    pub fn kernel_records(&self, db: &Db, k: KernelRef, written: &Program) -> Result<KernelRecords, Error> {
        let ts = self.tunables(k);
        if ts.is_empty() {
            return Ok(KernelRecords::default());
        }
        let key = self.tuning_key(k, written);
        let loaded = db.load().map_err(|e| {
            Error::Input(vec![texc_grammar::Diagnostic::error(format!(
                "cannot read the tuning database {}: {e}",
                db.path.display()
            ))])
        })?;
        Ok(db::for_kernel(&loaded, &key, &space::table(&ts)))
    }

    /// Before kernel `k` is compiled at sizes `b`: take its best record's
    /// knobs from `db` when no knobs are set, else correct the e-graph's cost
    /// model by what `db` measured on this machine ([`calibration`]). Not
    /// both: a record's knobs were measured with the plan the model as it is
    /// chose for them (`tune` does not correct it), which a corrected model
    /// may not choose again — the knobs would then run on a plan they were
    /// not measured with. What `texc run`, `bench` and `compile` do unless
    /// given `--no-db`; the result says what changed, for the caller to report.
    pub fn use_tuning_db(&mut self, db: &Db, k: KernelRef, b: &texc_compiler::Bindings) -> Result<TuningUse, Error> {
        if !self.options.target.is_compiled() || !db.path.exists() {
            return Ok(TuningUse::default());
        }
        if !self.options.knobs.is_empty() || self.tunables(k).is_empty() {
            return self.use_calibration(db);
        }
        let written = self.specialize(k, b)?;
        let mine = self.kernel_records(db, k, &written)?;
        let skipped = mine.invalid.note(&format!(" of `{}` in {}", written.name, db.path.display()));
        let Some(record) = mine.best() else {
            return Ok(TuningUse { skipped, ..self.use_calibration(db)? });
        };
        self.options.knobs = record.knobs.iter().cloned().collect();
        Ok(TuningUse { knobs_of: Some(record), skipped, calibrated_ops: Vec::new() })
    }

    /// The cost model's corrections from `db` ([`calibration`]).
    fn use_calibration(&mut self, db: &Db) -> Result<TuningUse, Error> {
        let loaded = db.load().map_err(|e| {
            Error::Input(vec![texc_grammar::Diagnostic::error(format!(
                "cannot read the tuning database {}: {e}",
                db.path.display()
            ))])
        })?;
        let target = self.options.target;
        let cal = calibration(&loaded.records, target.name, &machine_of(target));
        let mut ops: Vec<String> = cal.samples.iter().map(|s| s.op.clone()).collect();
        ops.sort_unstable();
        ops.dedup();
        self.options.calibration = cal;
        Ok(TuningUse { calibrated_ops: ops, ..TuningUse::default() })
    }
}

/// What [`Pipeline::use_tuning_db`] took from the database.
#[derive(Clone, Debug, Default)]
pub struct TuningUse {
    /// The record whose knobs the kernel now compiles with.
    pub knobs_of: Option<Record>,
    /// The operators whose estimates measured plans now correct (with the
    /// number of samples in `Options::calibration`).
    pub calibrated_ops: Vec<String>,
    /// Records of the kernel skipped as invalid, in one line.
    pub skipped: Option<String>,
}

/// The machine `target`'s records are measured on: the GPU's name and SM
/// for a GPU target (its host CPU does not set a kernel's speed), else this
/// CPU's model and feature flags — and for a target whose default schedule
/// is sized by the machine's caches (`host`), those caches and cores: two
/// machines, or two `TEXC_HOST_CACHES`, that give it different blocking
/// keep records apart.
pub fn machine_of(target: &Target) -> String {
    if target.gpu.is_none() {
        return match target.caches {
            Some(c) if c.source != texc_compiler::target::CacheSource::Nominal => {
                format!("{} / caches {}", this_machine(), c.describe())
            }
            _ => this_machine(),
        };
    }
    match texc_runtime::cuda::device() {
        Ok(d) => format!("{} / sm_{}", d.name, d.sm),
        // No GPU: nothing can be measured, and no record was measured here.
        Err(_) => "no GPU".to_string(),
    }
}

/// The version records are written with.
pub const TEXC_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The cost model's corrections that `records` measured on `machine` for
/// `target` (this version of texc's): for each kernel tuned with at least
/// two plans that are a single operator each (a convolution direct, by
/// Winograd, by im2col: the `winograd`/`im2col` knobs), the fastest time of
/// each plan over the model's estimate of it, relative to the geometric
/// mean of that ratio over the kernel's plans (the machine's speed cancels:
/// what remains is which form the model over- or underrates).
pub fn calibration(records: &[Record], target: &str, machine: &str) -> texc_compiler::rewrite::Calibration {
    use std::collections::BTreeMap;
    use texc_compiler::rewrite::{Calibration, CalibrationSample};
    let mut fastest: BTreeMap<(&str, &str), (f64, f64)> = BTreeMap::new();
    for r in records {
        let mine = r.key.target == target && r.key.machine == machine && r.texc_version == TEXC_VERSION;
        let Some(plan) = r.plan.as_ref().filter(|p| mine && p.ops.len() == 1 && r.time_ms > 0.0) else { continue };
        let e =
            fastest.entry((r.key.kernel_hash.as_str(), plan.ops[0].as_str())).or_insert((r.time_ms, plan.estimated_ns));
        if r.time_ms < e.0 {
            *e = (r.time_ms, plan.estimated_ns);
        }
    }
    let mut by_kernel: BTreeMap<&str, Vec<(&str, f64, f64)>> = BTreeMap::new();
    for ((kernel, op), (ms, est)) in fastest {
        by_kernel.entry(kernel).or_default().push((op, est, (ms * 1e6 / est).ln()));
    }
    let mut samples = Vec::new();
    for plans in by_kernel.values().filter(|p| p.len() >= 2) {
        let mean = plans.iter().map(|p| p.2).sum::<f64>() / plans.len() as f64;
        for &(op, estimated_ns, log_ratio) in plans {
            samples.push(CalibrationSample { op: op.to_string(), estimated_ns, factor: (log_ratio - mean).exp() });
        }
    }
    Calibration { samples }
}
