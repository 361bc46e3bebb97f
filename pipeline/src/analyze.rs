//! `texc analyze`: what a kernel's plan costs before it runs — each
//! operator's FLOPs and traffic against the target's roofline, the work a
//! model's fold pass does once, the graph's sizes (parameters, peak memory)
//! and the memory plan of the compiled loop nests. The CLI prints it.

use super::{Built, Error, Pipeline};
use texc_compiler::cost::Counts;
use texc_compiler::graph::Summary;
use texc_compiler::target::TargetKind;
use texc_compiler::tir::Program;
use texc_compiler::{Bindings, KernelRef};
use texc_runtime::roofline::Roofline;
use texc_schedules::memory_plan::MemoryPlan;

/// The machine a target's figures are measured against.
#[derive(Clone, Copy, Debug)]
pub struct Machine {
    pub roofline: Roofline,
    /// Where the roofline comes from (`nominal` for a GPU's data sheet).
    pub source: &'static str,
    /// Threads the CPU roofline is for (1 for a GPU).
    pub threads: usize,
}

/// What [`Pipeline::analyze`] finds.
pub struct Analysis {
    /// The program analyzed: the plan that runs, or the graph as written.
    pub program: Program,
    /// The sizes it was specialized to.
    pub bindings: Vec<(String, i64)>,
    /// Which plan this is, and why that one runs.
    pub plan: String,
    pub machine: Machine,
    /// Each operator's work and traffic, run one by one.
    pub ops: Vec<(String, Counts)>,
    /// The whole program's work.
    pub total: Counts,
    /// A model's weight-only stages, which a run computes once (the fold pass).
    pub folded: Option<Program>,
    pub summary: Summary,
    /// The compiled loop nests' temporaries in one arena (CPU targets, the
    /// plan that runs only).
    pub memory_plan: Option<MemoryPlan>,
}

impl Pipeline {
    /// The roofline the target's figures are measured against: this CPU's
    /// at the pool's threads, or a GPU's data sheet.
    pub fn machine(&self) -> Machine {
        let t = self.options.target;
        if t.kind == TargetKind::Gpu {
            let n = t.nominal;
            let roofline = Roofline { peak_gflops: n.peak_gflops, bandwidth_gbs: n.bandwidth_gbs };
            return Machine { roofline, source: "nominal", threads: 1 };
        }
        let threads = texc_runtime::pool::num_threads().min(texc_runtime::pool::available_cores());
        let lanes = t.lanes(texc_compiler::types::ElemType::F32) as usize;
        let (roofline, source) = texc_runtime::roofline::roofline(t.name, lanes, threads);
        Machine { roofline, source, threads }
    }

    /// Kernel `k` at sizes `b`: the plan `run` would run, or the graph as
    /// written (`as_written`).
    pub fn analyze(&mut self, k: KernelRef, b: &Bindings, as_written: bool) -> Result<Analysis, Error> {
        self.require_compiled("`texc analyze` needs the machine of a target:")?;
        let built = self.program(k, b)?;
        let folded = if as_written { None } else { self.folded_stages(&built)? };
        let rewritten = built.plan.is_some() && built.kept_original.is_none();
        let plan = self.analyzed_plan(k, &built, as_written);
        let program = if as_written || !rewritten { built.written.clone() } else { built.runs.clone() };
        let mut summary = texc_compiler::graph::summary(&program);
        if !self.model_inputs().is_empty() {
            // A model says which inputs are weights: its initializers, whatever reads them.
            let named = |t: &texc_compiler::tir::TensorId| self.model_inputs().contains_key(&program.tensor(*t).name);
            summary.weights = program.input_tensors().filter(named).collect();
            summary.parameters = summary.weights.iter().map(|&t| program.tensor(t).len()).sum();
        }
        let memory_plan = if as_written || self.options.target.kind == TargetKind::Gpu {
            None
        } else {
            let loops = self.loops(k, built.runs.clone())?;
            Some(texc_schedules::memory_plan::plan(&loops.legal))
        };
        Ok(Analysis {
            ops: texc_compiler::graph::op_costs(&program),
            total: texc_compiler::cost::count(&program),
            bindings: built.written.bindings.clone(),
            machine: self.machine(),
            program,
            plan,
            folded,
            summary,
            memory_plan,
        })
    }

    /// A model's weight-only stages of `built`, which the fold pass computes once.
    fn folded_stages(&mut self, built: &Built) -> Result<Option<Program>, Error> {
        let mut copy = Built {
            written: built.written.clone(),
            runs: built.runs.clone(),
            plan: None,
            kept_original: None,
            written_estimate_ns: None,
        };
        Ok(self.fold_for_analysis(&mut copy)?.cloned())
    }

    /// Which plan `analyze` describes, and why that one runs.
    fn analyzed_plan(&self, k: KernelRef, built: &Built, as_written: bool) -> String {
        let t = self.target();
        let ops = |p: &Program| {
            let names: Vec<&str> = p.ops.iter().map(|o| o.op.as_str()).collect();
            let list = if names.len() <= 6 { format!(": {}", names.join(", ")) } else { String::new() };
            format!("{} operator{}{list}", names.len(), if names.len() == 1 { "" } else { "s" })
        };
        let rewritten = built.plan.is_some() && built.kept_original.is_none();
        if as_written {
            let runs = if rewritten {
                format!("on {t} the e-graph's plan runs instead ({}; analyzed without --as-written)", ops(&built.runs))
            } else {
                format!("it is also the plan that runs on {t}")
            };
            return format!("plan: the graph as written, {} (--as-written); {runs}", ops(&built.written));
        }
        if rewritten {
            return format!(
                "plan that runs on {t}: the e-graph's rewrite, {} (as written: {}; see --as-written)",
                ops(&built.runs),
                ops(&built.written)
            );
        }
        let why = match (self.rewrite_skipped(k), &built.kept_original) {
            (Some(skip), _) => skip.to_string(),
            (None, Some(kept)) => format!("the e-graph kept it: {kept}"),
            (None, None) => "the e-graph kept it".to_string(),
        };
        format!("plan that runs on {t}: the graph as written, {} ({why})", ops(&built.written))
    }
}
