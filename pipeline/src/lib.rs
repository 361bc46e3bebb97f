//! texc's compiler driver: the one place that knows the order of the passes.
//!
//! ```text
//! parse → resolve → specialize → rewrite → fold → schedule → lower → legalize → codegen
//! ```
//!
//! Each pass is a method of [`Pipeline`] that runs the pass's crate function
//! and then, as [`Options`] ask, prints the IR it produced to stderr, runs
//! that IR's verifier, and records its time ([`Pipeline::timings`]). The CLI
//! and the tests only call these methods: neither sequences passes itself.
//!
//! *rewrite* runs for compiled targets on kernels that have no schedule of
//! their own for the target (and when [`Options::rewrite`]); *schedule*
//! applies the kernel's `schedule` block for the target or the target's
//! default schedule; *codegen* goes through the target's backend
//! ([`texc_codegen::backend_for`]). *fold* runs for imported models on
//! compiled targets: the stages that read only the model's weights become a
//! prologue computed once ([`Pipeline::constants`]), and what runs on every
//! call takes its results as inputs.

pub mod analyze;
pub mod aot;
pub mod check;
pub mod domain;
pub mod emit;
pub mod import;
mod loops_file;
mod model;
mod options;
pub mod oracle;
mod slices;
pub mod stats;
pub mod tune;
pub mod tuning;

pub use loops_file::{is_loops_file, LoopsFile};
/// An imported model's names ([`Pipeline::model_names`]).
pub use texc_onnx::{ModelName, Role as ModelRole};

/// An ONNX model, which `load` imports.
pub fn is_onnx_file(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "onnx")
}
pub use options::{
    Dump, Options, Pass, KNOB_FORWARD, KNOB_IM2COL, KNOB_PREFETCH, KNOB_REWRITE, KNOB_WINOGRAD, PIPELINE_KNOBS,
};

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use texc_codegen::abi::CEntry;
use texc_codegen::device::Encoded;
use texc_codegen::{Compiled, GpuBackend};
use texc_compiler::interp::{self, Arg};
use texc_compiler::rewrite::{self, Plan};
use texc_compiler::target::{self, BackendKind, Target, TargetKind};
use texc_compiler::tir::{ProgramParam, TensorId};
use texc_compiler::{Bindings, KernelRef, Program, Session};
use texc_grammar::diagnostic::render_all;
use texc_grammar::{Diagnostic, Diagnostics};
use texc_runtime::Tensor;
use texc_schedules::attach::Region;
use texc_schedules::schedule::Schedules;
use texc_schedules::LoopFunc;

/// How a compilation failed: a problem in the user's input (source, sizes,
/// files: exit status 1), or in how texc was asked (exit status 2).
#[derive(Debug)]
pub enum Error {
    Input(Vec<Diagnostic>),
    Usage(String),
}

impl From<Diagnostic> for Error {
    fn from(d: Diagnostic) -> Error {
        Error::Input(vec![d])
    }
}

impl From<Diagnostics> for Error {
    fn from(d: Diagnostics) -> Error {
        Error::Input(d)
    }
}

impl From<texc_codegen::CodegenError> for Error {
    fn from(e: texc_codegen::CodegenError) -> Error {
        Error::Input(vec![Diagnostic::error(format!("code generation failed: {e}"))])
    }
}

/// The target of a name, or the one message that lists the targets (a usage error).
pub fn target(name: &str) -> Result<&'static Target, Error> {
    target::lookup(name).map_err(|e| Error::Usage(e.to_string()))
}

/// A kernel's program as written, and the one that runs (rewritten or not).
pub struct Built {
    pub written: Program,
    pub runs: Program,
    /// The e-graph's plan, when the rewrite pass ran.
    pub plan: Option<Plan>,
    /// Why the plan is not what runs, when it is not.
    pub kept_original: Option<String>,
    /// Without a plan, where the rewrite pass was turned off (`--no-rewrite`,
    /// the tuner's `rewrite=0`): the cost model's estimate of the graph as
    /// written, in ns (what the tuner's measurements calibrate).
    pub written_estimate_ns: Option<f64>,
}

impl Built {
    /// The operators of the program that runs and the cost model's estimate
    /// of it (ns, the target's nominal machine), where the e-graph chose it.
    pub fn plan_run(&self) -> Option<texc_schedules::tuning::db::PlanRun> {
        let estimated_ns = match self.plan.as_ref().filter(|p| p.extraction != "none") {
            Some(plan) if self.kept_original.is_some() => plan.original_cost,
            Some(plan) => plan.estimated_cost,
            None => self.written_estimate_ns?,
        };
        let ops = self.runs.ops.iter().map(|o| o.op.clone()).collect();
        Some(texc_schedules::tuning::db::PlanRun { ops, estimated_ns })
    }
}

/// Why the graph as written runs without the e-graph choosing a plan.
#[derive(Clone, Debug, PartialEq)]
pub enum NoRewrite {
    /// The interpreter (the oracle) runs every program as written.
    Interpreter,
    /// `--no-rewrite`.
    Disabled,
    /// A `schedule` block names the stages of the graph as written, so it pins that graph.
    OwnSchedule { kernel: String, schedule_target: String },
}

impl std::fmt::Display for NoRewrite {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match self {
            NoRewrite::Interpreter => write!(f, "the interpreter runs the program as written; it does not rewrite"),
            NoRewrite::Disabled => write!(f, "--no-rewrite: no rewriting happens"),
            NoRewrite::OwnSchedule { kernel, schedule_target } => write!(
                f,
                "kernel `{kernel}` has its own schedule for {schedule_target}, which pins the graph as written; \
                 an e-graph plan would not be used"
            ),
        }
    }
}

/// A program with its schedules and the boxes of its attached stages.
pub struct Scheduled {
    pub p: Program,
    pub schedules: Schedules,
    pub regions: Vec<Option<Region>>,
}

/// Loop nests as lowered (what `emit --stage loops` shows) and legalized (what backends compile).
pub struct Loops {
    pub lowered: LoopFunc,
    pub legal: LoopFunc,
}

/// Everything `run` and `bench` need.
pub struct Prepared {
    pub built: Built,
    /// The legal loop nests, for compiled targets.
    pub legal: Option<LoopFunc>,
    /// Arguments in the parameter order of the program as written (what the interpreter runs).
    pub args: Vec<Arg>,
    /// Arguments of the compiled loops (`built.runs`'s parameters) when they
    /// differ from `args`: those less the weights only folded stages read,
    /// plus the folded constants ([`Prepared::compiled_args`]).
    pub run_args: Option<Vec<Arg>>,
}

impl Prepared {
    /// The arguments of the compiled loops, in their parameter order.
    pub fn compiled_args(&self) -> &[Arg] {
        self.run_args.as_deref().unwrap_or(&self.args)
    }
}

/// Time spent in one pass (all its runs).
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    pub pass: Pass,
    pub runs: u32,
    pub time: Duration,
    /// Spent verifying what the pass produced.
    pub verify: Duration,
}

pub struct Pipeline {
    pub session: Session,
    pub options: Options,
    timings: Vec<Timing>,
    /// The weights of an imported ONNX model: inputs a run takes from the
    /// model unless the command line gives them.
    model_inputs: HashMap<String, Tensor>,
    /// The constant stages *fold* split off the model's program last (see [`Pipeline::constants`]).
    prologue: Option<Program>,
    /// The ONNX model `load` imported, if any.
    model: Option<model::Model>,
    /// What *codegen* compiled nest by nest (`--time-passes` prints it).
    code_notes: Vec<String>,
}

/// What passes without a verifier of their IR verify.
fn unverified() -> Result<(), std::convert::Infallible> {
    Ok(())
}

/// After a pass: record its time, dump its IR, verify it. (A free function
/// over the fields it needs, so that dumps and verifiers may borrow the session.)
fn after<E: std::fmt::Display>(
    options: &Options,
    timings: &mut Vec<Timing>,
    pass: Pass,
    started: Instant,
    dump: impl FnOnce() -> String,
    verify: impl FnOnce() -> Result<(), E>,
) -> Result<(), Error> {
    let time = started.elapsed();
    if options.dump.wants(pass) {
        eprint!("// ---- after {} ({})\n{}", pass.name(), pass.ir(), dump());
    }
    let v0 = Instant::now();
    if options.verify {
        verify().map_err(|m| {
            Diagnostic::error(format!("internal error: the {} verifier failed after {}: {m}", pass.ir(), pass.name()))
        })?;
    }
    let verify_time = v0.elapsed();
    match timings.iter_mut().find(|t| t.pass == pass) {
        Some(t) => {
            t.runs += 1;
            t.time += time;
            t.verify += verify_time;
        }
        None => timings.push(Timing { pass, runs: 1, time, verify: verify_time }),
    }
    Ok(())
}

impl Pipeline {
    pub fn new(options: Options) -> Pipeline {
        Pipeline {
            session: Session::new(),
            options,
            timings: Vec::new(),
            model_inputs: HashMap::new(),
            prologue: None,
            model: None,
            code_notes: Vec::new(),
        }
    }

    pub fn target(&self) -> &'static Target {
        self.options.target
    }

    /// Render diagnostics with this pipeline's sources.
    pub fn render(&self, diags: &[Diagnostic]) -> String {
        render_all(diags, &self.session.sources)
    }

    /// The knobs of the schedule: all but the pipeline's own ([`PIPELINE_KNOBS`]).
    fn schedule_knobs(&self) -> texc_schedules::Knobs {
        let own = |k: &str| PIPELINE_KNOBS.iter().any(|(n, _)| *n == k);
        self.options.knobs.iter().filter(|(k, _)| !own(k)).map(|(k, v)| (k.clone(), *v)).collect()
    }

    /// The `--knob` values of the default schedule on `t`; an error naming its knobs otherwise.
    fn default_knobs(&self, t: &Target) -> Result<texc_schedules::knobs::DefaultKnobs, Error> {
        texc_schedules::knobs::DefaultKnobs::from_knobs(&self.schedule_knobs())
            .map_err(|m| Diagnostic::error(format!("{m}: the kernel runs the default schedule on {}", t.name)).into())
    }

    /// An error as the command line prints it.
    pub fn render_error(&self, e: Error) -> String {
        match e {
            Error::Input(d) => self.render(&d),
            Error::Usage(m) => format!("error: {m}\n"),
        }
    }

    // ------------------------------------------------------------ front end

    /// *parse* and *resolve* a file and its imports; returns the module.
    pub fn load(&mut self, path: &Path) -> Result<usize, Error> {
        if is_onnx_file(path) {
            return self.load_onnx(path);
        }
        let t0 = Instant::now();
        let m = self.session.parse_root(path)?;
        self.after_parse(m, t0)
    }

    /// *parse* and *resolve* source text (`path` locates relative imports).
    pub fn load_text(&mut self, name: &str, text: &str, path: Option<PathBuf>) -> Result<usize, Error> {
        let t0 = Instant::now();
        let m = self.session.parse_text(name, text, path)?;
        self.after_parse(m, t0)
    }

    /// The weights of the ONNX model `load` imported, by parameter name (empty otherwise).
    pub fn model_inputs(&self) -> &HashMap<String, Tensor> {
        &self.model_inputs
    }

    /// *import* an ONNX model, then *parse* and *resolve* its `.tex` text;
    /// its weights become the inputs runs take by default.
    fn load_onnx(&mut self, path: &Path) -> Result<usize, Error> {
        let t0 = Instant::now();
        // The kernel is named after the file (`resnet18.onnx`: `texc_resnet18_run`).
        let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned());
        let options = texc_onnx::Options { dims: self.options.model_dims.clone(), kernel: stem, base_dir: None };
        let shown = path.display().to_string();
        let imported = texc_onnx::import_file(path, "the model", &options)
            .map_err(|e| Diagnostic::error(format!("{shown}: {e}")))?;
        let source = imported.source.clone();
        after(&self.options, &mut self.timings, Pass::Import, t0, || source, unverified)?;
        self.model_inputs = imported.weights.into_iter().collect();
        // Diagnostics name the generated text `model.onnx.tex`. It has no path: it imports
        // only std.nn, and a kernel the rewriter generates must not import the binary model.
        // The importer checks what the text would refuse (a graph output listed twice is
        // an error naming the model); an error left in the text is the importer's.
        let m = self.load_text(&format!("{shown}.tex"), &imported.source, None).map_err(|e| match e {
            Error::Input(mut d) => {
                let hint = format!(
                    "internal error: the text imported from {shown} does not compile (see it with \
                     `texc import {shown} -o model.tex`); please report it"
                );
                d.insert(0, Diagnostic::error(hint));
                Error::Input(d)
            }
            u => u,
        })?;
        self.model = Some(model::Model { path: path.to_path_buf(), module: m, names: imported.names });
        Ok(m)
    }

    fn after_parse(&mut self, m: usize, t0: Instant) -> Result<usize, Error> {
        let s = &self.session;
        // The parser builds its arenas by construction; there is nothing to verify.
        let ast = || texc_grammar::print::print_ast(&s.module(m).ast);
        after(&self.options, &mut self.timings, Pass::Parse, t0, ast, unverified)?;
        let t0 = Instant::now();
        texc_compiler::resolve::resolve_session(&mut self.session)?;
        let s = &self.session;
        let name_of = |k: KernelRef| s.kernel(k).name.clone();
        let kernels = || texc_compiler::kernel::print_kernels(&s.module(m).kernels, &name_of);
        let verify = || texc_compiler::kernel::verify_session(s);
        after(&self.options, &mut self.timings, Pass::Resolve, t0, kernels, verify)?;
        Ok(m)
    }

    /// The kernel to compile in module `m`: `name`, or the only one.
    /// A file of several kernels and no `--kernel` is command-line misuse
    /// (the flag is missing), not a problem in the file.
    pub fn kernel(&self, m: usize, name: Option<&str>) -> Result<KernelRef, Error> {
        let module = self.session.module(m);
        if name.is_none() && module.kernels.len() > 1 {
            let names: Vec<&str> = module.kernels.iter().map(|k| k.name.as_str()).collect();
            return Err(Error::Usage(format!(
                "{}: the file defines several kernels; choose one with --kernel (kernels: {})",
                self.session.sources.file(module.ast.file).name,
                names.join(", ")
            )));
        }
        Ok(self.session.entry_kernel(m, name)?)
    }

    /// *specialize* kernel `k` to sizes.
    pub fn specialize(&mut self, k: KernelRef, b: &Bindings) -> Result<Program, Error> {
        let t0 = Instant::now();
        let mut p = texc_compiler::specialize::specialize(&self.session, k, b)?;
        // A model's kernel comes from the `.onnx` file (its text `model.onnx.tex` is
        // no file): a `.loops` file of it names the model.
        if let Some(model) = self.model.as_ref().filter(|m| m.module == k.module as usize) {
            p.source = Some(model.path.display().to_string());
        }
        after(
            &self.options,
            &mut self.timings,
            Pass::Specialize,
            t0,
            || texc_compiler::print::print_program(&p),
            || texc_compiler::verify::verify(&p),
        )?;
        Ok(p)
    }

    /// *rewrite* the operator graph of `original` (kernel `k` at sizes `b`)
    /// for the target: the plan, and the program that runs (the original
    /// when the plan is no cheaper or cannot be rewritten).
    pub fn rewrite(&mut self, k: KernelRef, b: &Bindings, original: Program) -> Result<Built, Error> {
        let t0 = Instant::now();
        let built = self.rewrite_inner(k, b, original);
        let target = self.options.target;
        let dump = || {
            let plan = built.plan.as_ref().map(|p| rewrite::print_plan(p, target, built.kept_original.as_deref()));
            format!("{}{}", plan.unwrap_or_default(), texc_compiler::print::print_program(&built.runs))
        };
        after(&self.options, &mut self.timings, Pass::Rewrite, t0, dump, || {
            texc_compiler::verify::verify(&built.runs)
        })?;
        Ok(built)
    }

    fn rewrite_inner(&self, k: KernelRef, b: &Bindings, original: Program) -> Built {
        let kept = |plan: Option<Plan>, why: &str, written: Program| Built {
            runs: written.clone(),
            written,
            plan,
            kept_original: Some(why.to_string()),
            written_estimate_ns: None,
        };
        if original.ops.iter().any(|o| o.outputs.len() > 1) {
            // The term has one node per tensor; calls with several results stay as written.
            return kept(Some(Plan::unchanged()), "calls with several results are not rewritten yet", original);
        }
        let plan = rewrite::rewrite_kernel(
            &self.session,
            k,
            &original,
            self.options.target,
            texc_schedules::strategy::performance_model(self.options.target),
            self.options.extraction,
            self.options.accuracy(),
            &self.folded_weights(),
            &self.options.calibration,
        );
        if plan.best_cost >= plan.original_cost {
            return kept(Some(plan), "no cheaper plan", original);
        }
        // The plan is a kernel in source form: it goes through the front end like any other.
        let mut s2 = Session::new();
        let name = format!("<rewritten>/{}.tex", original.name);
        let first = |d: Diagnostics| d.into_iter().next().unwrap_or_else(|| Diagnostic::error("no diagnostic"));
        let built = s2
            .parse_text(&name, &plan.source, None)
            .and_then(|m| texc_compiler::resolve::resolve_session(&mut s2).map(|()| m))
            .map_err(first)
            .and_then(|m| s2.entry_kernel(m, Some(&rewrite::rewritten_name(&original.name))))
            .and_then(|k2| texc_compiler::specialize::specialize(&s2, k2, b));
        match built {
            Ok(mut runs) => {
                // The rewritten kernel computes the kernel as written, with its
                // parameters: a `.loops` file of it names the file as written
                // (`<rewritten>/F.tex` exists nowhere), so that it can be run
                // and checked against that kernel.
                runs.source = original.source.clone();
                runs.name = original.name.clone();
                Built { written: original, runs, plan: Some(plan), kept_original: None, written_estimate_ns: None }
            }
            Err(d) => {
                let why = format!("the rewritten kernel does not compile: {}", d.render(&s2.sources));
                // Under the name the user knows (the plan is shown so too).
                let why = why.replace(&rewrite::rewritten_name(&original.name), &original.name);
                kept(Some(plan), &why, original)
            }
        }
    }

    /// The program kernel `k` runs on the target at sizes `b`: specialized,
    /// then rewritten where the target compiles code, rewriting is on and
    /// the kernel has no schedule of its own for the target.
    pub fn program(&mut self, k: KernelRef, b: &Bindings) -> Result<Built, Error> {
        let written = self.specialize(k, b)?;
        if let Some(why) = self.rewrite_skipped(k) {
            let written_estimate_ns = (why == NoRewrite::Disabled && self.options.target.is_compiled()).then(|| {
                rewrite::written_cost(
                    &written,
                    self.options.target,
                    texc_schedules::strategy::performance_model(self.options.target),
                    &self.folded_weights(),
                )
            });
            return Ok(Built { runs: written.clone(), written, plan: None, kept_original: None, written_estimate_ns });
        }
        self.rewrite(k, b, written)
    }

    /// Why kernel `k` runs as written on the target without the e-graph
    /// being asked, or `None` when the rewrite pass chooses what runs.
    /// [`Pipeline::program`] decides by this, so that commands which only
    /// describe the plan (`emit --stage egraph`, `analyze`) say what `run` does.
    pub fn rewrite_skipped(&self, k: KernelRef) -> Option<NoRewrite> {
        let t = self.options.target;
        if !t.is_compiled() {
            return Some(NoRewrite::Interpreter);
        }
        if !self.options.rewrites() {
            return Some(NoRewrite::Disabled);
        }
        texc_schedules::find_schedule(&self.session, k, t).map(|sc| NoRewrite::OwnSchedule {
            kernel: self.session.kernel(k).name.clone(),
            schedule_target: sc.block.target.name.to_string(),
        })
    }

    // ------------------------------------------------------------ back end

    /// *schedule* `p` (kernel `k`'s program) for the target.
    pub fn schedule(&mut self, k: KernelRef, mut p: Program) -> Result<Scheduled, Error> {
        self.schedule_for(Some(k), &mut p, self.options.target).map(|(schedules, regions)| Scheduled {
            p,
            schedules,
            regions,
        })
    }

    /// *schedule* with `k`'s schedule block for `t`, or `t`'s default schedule
    /// (always, when there is no kernel).
    fn schedule_for(
        &mut self,
        k: Option<KernelRef>,
        p: &mut Program,
        t: &Target,
    ) -> Result<(Schedules, Vec<Option<Region>>), Error> {
        let block = k.and_then(|k| texc_schedules::find_schedule(&self.session, k, t));
        let mut t0 = Instant::now();
        let mut schedules = match block {
            Some(sc) => texc_schedules::apply::apply(p, sc, t, &self.schedule_knobs())?,
            None => {
                let knobs = self.default_knobs(t)?;
                self.prepare_for_default(p, t, knobs)?;
                t0 = Instant::now();
                texc_schedules::strategy::schedule_prepared(p, t, knobs)
            }
        };
        let regions = texc_schedules::attach::infer(p, &mut schedules)?;
        let p: &Program = p;
        let s = &schedules;
        after(
            &self.options,
            &mut self.timings,
            Pass::Schedule,
            t0,
            || texc_schedules::schedule::print(p, s),
            || s.verify(p),
        )?;
        Ok((schedules, regions))
    }

    /// The preparation passes of `t`'s default schedule, one by one.
    fn prepare_for_default(
        &mut self,
        p: &mut Program,
        t: &Target,
        knobs: texc_schedules::knobs::DefaultKnobs,
    ) -> Result<(), Error> {
        for step in texc_schedules::prepare::steps(t) {
            let t0 = Instant::now();
            (step.run)(p, t, knobs);
            let q: &Program = p;
            let (dump, verify) = (|| texc_compiler::print::print_program(q), || texc_compiler::verify::verify(q));
            after(&self.options, &mut self.timings, Pass::Prepare(step.name), t0, dump, verify)?;
        }
        Ok(())
    }

    /// *lower* a scheduled program to loop nests.
    pub fn lower(&mut self, s: Scheduled) -> Result<LoopFunc, Error> {
        self.lower_for(s, self.options.target)
    }

    /// *lower* for target `t` (the GPU passes run for GPU targets).
    fn lower_for(&mut self, s: Scheduled, t: &Target) -> Result<LoopFunc, Error> {
        let t0 = Instant::now();
        let mut f = texc_schedules::lower::lower(s.p, &s.schedules, &s.regions);
        self.after_loops(Pass::Lower, t0, &f)?;
        // CPU targets with AMX: tile products.
        if t.gpu.is_none() && s.schedules.stages.iter().any(|ss| ss.tensorize.is_some()) {
            let t0 = Instant::now();
            texc_schedules::tensorize::tensorize(&mut f, &s.schedules)?;
            self.after_loops(Pass::Tensorize, t0, &f)?;
        }
        // GPU targets: what bound loops, tensor cores and shared memory make of the nests.
        if let Some(gpu) = t.gpu {
            let t0 = Instant::now();
            texc_schedules::tensorize::tensorize(&mut f, &s.schedules)?;
            self.after_loops(Pass::Tensorize, t0, &f)?;
            let t0 = Instant::now();
            texc_schedules::cross_thread::lower_cross_thread(&mut f, &s.schedules)?;
            self.after_loops(Pass::CrossThread, t0, &f)?;
            let t0 = Instant::now();
            texc_schedules::multistage::pipeline(&mut f, &s.schedules)?;
            self.after_loops(Pass::Multistage, t0, &f)?;
            let t0 = Instant::now();
            texc_schedules::multistage::pad_ldmatrix_rows(&mut f, gpu.shared_bytes_per_block);
            self.after_loops(Pass::PadLdmatrix, t0, &f)?;
        }
        check_emitted_size(&f)?;
        Ok(f)
    }

    /// [`after`] a loop-IR pass: dump, verify (that lowered nests are proven independent too), time.
    fn after_loops(&mut self, pass: Pass, t0: Instant, f: &LoopFunc) -> Result<(), Error> {
        self.after_nests(pass, t0, f, |f, _| texc_schedules::verify::verify_lowered(f))
    }

    /// [`after`] a pass over legal loop nests: dump, verify them legal for the target, time.
    fn after_legal(&mut self, pass: Pass, t0: Instant, f: &LoopFunc) -> Result<(), Error> {
        self.after_nests(pass, t0, f, texc_schedules::verify::verify_legal)
    }

    /// [`after`] a loop-IR pass, verified by `verify` for the pipeline's target.
    fn after_nests(
        &mut self,
        pass: Pass,
        t0: Instant,
        f: &LoopFunc,
        verify: fn(&LoopFunc, &Target) -> Result<(), texc_schedules::verify::LoopError>,
    ) -> Result<(), Error> {
        let t = self.options.target;
        after(&self.options, &mut self.timings, pass, t0, || texc_schedules::ir::print(f), || verify(f, t))
    }

    /// *zero* buffers that may be read before they are stored, *forward*
    /// copies to their producers and run a CPU loop's pieces as *one
    /// launch*, then *legalize* loop nests for the target; on LLVM's CPU
    /// targets, add *prefetch*es and mark the loops to *keep rolled*.
    pub fn legalize(&mut self, mut f: LoopFunc) -> Result<LoopFunc, Error> {
        let t0 = Instant::now();
        let t = self.options.target;
        texc_schedules::zeroing::zero_uncovered(&mut f, t.gpu.is_some());
        after(
            &self.options,
            &mut self.timings,
            Pass::Zero,
            t0,
            || texc_schedules::ir::print(&f),
            || texc_schedules::verify::verify(&f),
        )?;
        // After *zero*: the copies it proved cover their tensors still do,
        // their stores shared with their producers (whose quotients and
        // remainders of positions the proof does not read as boxes).
        if t.gpu.is_none() && self.options.knobs.get(KNOB_FORWARD) != Some(&0) {
            let t0 = Instant::now();
            texc_schedules::forward::forward_copies(&mut f, t);
            self.after_loops(Pass::Forward, t0, &f)?;
        }
        if t.gpu.is_none() {
            let t0 = Instant::now();
            texc_schedules::launches::merge_parallel_pieces(&mut f);
            after(
                &self.options,
                &mut self.timings,
                Pass::OneLaunch,
                t0,
                || texc_schedules::ir::print(&f),
                // With the independence of parallel loops: the pass's one risk.
                || texc_schedules::verify::verify_lowered(&f),
            )?;
        }
        let t0 = Instant::now();
        texc_schedules::legalize::legalize(&mut f, t);
        self.after_legal(Pass::Legalize, t0, &f)?;
        // Only where prefetches are compiled: elsewhere the pass has nothing to do.
        if t.is_compiled() && t.prefetches() && self.options.knobs.get(KNOB_PREFETCH) != Some(&0) {
            let t0 = Instant::now();
            texc_schedules::prefetch::prefetch(&mut f, t);
            self.after_legal(Pass::Prefetch, t0, &f)?;
        }
        if t.gpu.is_none() && matches!(t.backend(), Ok(BackendKind::Llvm)) {
            let t0 = Instant::now();
            texc_schedules::keep_rolled::keep_rolled(&mut f, t);
            self.after_legal(Pass::KeepRolled, t0, &f)?;
        }
        Ok(f)
    }

    /// An error unless target `t` can run loop nests `f` (its loop kinds,
    /// and on GPUs the launch rules of `texc_schedules::gpu`): the user's
    /// schedule is at fault, so the error points at kernel `k`'s block.
    pub fn check_target(&self, k: Option<KernelRef>, f: &LoopFunc, t: &Target) -> Result<(), Error> {
        let Err(why) = texc_schedules::verify::check_target(f, t) else {
            return Ok(());
        };
        let block = k.and_then(|k| texc_schedules::find_schedule(&self.session, k, t));
        Err(match block {
            Some(sc) => Diagnostic::at(sc.block.span, format!("this schedule cannot run on {t}: {why}")).into(),
            None if k.is_some() => {
                Diagnostic::error(format!("internal error: the default schedule for {t} breaks a rule: {why}")).into()
            }
            None => nests_cannot_run(t, why),
        })
    }

    /// *schedule*, *lower* and *legalize* kernel `k`'s program `p`.
    pub fn loops(&mut self, k: KernelRef, p: Program) -> Result<Loops, Error> {
        let lowered = self.lowered(k, p)?;
        let legal = self.legalize(lowered.clone())?;
        Ok(Loops { lowered, legal })
    }

    /// [`Pipeline::loops`]' legal nest alone, what a run compiles: the
    /// lowered nest is legalized in place rather than copied first (a
    /// model's loop nests held once while *zero* and *legalize* grow them;
    /// DenseNet-121's are 183 000 expressions).
    pub fn legal_loops(&mut self, k: KernelRef, p: Program) -> Result<LoopFunc, Error> {
        let lowered = self.lowered(k, p)?;
        self.legalize(lowered)
    }

    /// *schedule* and *lower* kernel `k`'s program `p`, checked against the target.
    fn lowered(&mut self, k: KernelRef, p: Program) -> Result<LoopFunc, Error> {
        let s = self.schedule(k, p)?;
        let lowered = self.lower(s)?;
        self.check_target(Some(k), &lowered, self.options.target)?;
        Ok(lowered)
    }

    /// *schedule* (the target's default schedule), *lower* and *legalize* a
    /// program that has no kernel of its own (a test's, a rewriter's).
    pub fn default_loops(&mut self, mut p: Program) -> Result<Loops, Error> {
        let (schedules, regions) = self.schedule_for(None, &mut p, self.options.target)?;
        let lowered = self.lower(Scheduled { p, schedules, regions })?;
        self.check_target(None, &lowered, self.options.target)?;
        let legal = self.legalize(lowered.clone())?;
        Ok(Loops { lowered, legal })
    }

    /// Everything up to code generation for kernel `k` at sizes `b` on a
    /// compiled target. An imported model's constant stages are folded on
    /// CPU targets (the C entry of a compiled model has no run-time scalars
    /// to fold with).
    pub fn build(&mut self, k: KernelRef, b: &Bindings) -> Result<(Built, Loops), Error> {
        let mut built = self.program(k, b)?;
        self.require_compiled("this command")?;
        // GPU code (`compile -o k.ptx`) has no place for folded constants: its
        // caller passes the weights, so nothing is folded there.
        let weights = self.folded_weights();
        self.fold(&mut built, &|n| weights.contains(n), &|_| false)?;
        let loops = self.loops(k, built.runs.clone())?;
        Ok((built, loops))
    }

    /// The weights *fold* treats as constants on this target: the model's,
    /// except on GPUs, whose compiled kernels take the weights from their caller.
    fn folded_weights(&self) -> HashSet<String> {
        match self.options.target.kind {
            TargetKind::Gpu => HashSet::new(),
            _ => self.model_inputs.keys().cloned().collect(),
        }
    }

    /// *fold*: for an imported model on a compiled target, split the stages
    /// of `built.runs` that read only constants — tensors `is_constant`
    /// names, scalars `known_scalar` names — off into a prologue
    /// ([`texc_compiler::constants`]), kept for [`Pipeline::constants`];
    /// `built.runs` becomes the program that runs on every call.
    fn fold(
        &mut self,
        built: &mut Built,
        is_constant: &dyn Fn(&str) -> bool,
        known_scalar: &dyn Fn(&str) -> bool,
    ) -> Result<(), Error> {
        self.prologue = None;
        if self.model_inputs.is_empty() || !self.options.target.is_compiled() {
            return Ok(());
        }
        let t0 = Instant::now();
        self.prepack(&mut built.runs, is_constant, known_scalar)?;
        if let Some(split) = texc_compiler::constants::split(&built.runs, is_constant, known_scalar) {
            built.runs = split.main;
            self.prologue = Some(split.prologue);
        }
        let prologue = self.prologue.as_ref();
        let runs = &built.runs;
        let dump = || {
            let pro =
                prologue.map(texc_compiler::print::print_program).unwrap_or_else(|| "// nothing to fold\n".into());
            format!("// computed once:\n{pro}// on every call:\n{}", texc_compiler::print::print_program(runs))
        };
        let verify = || {
            prologue.map_or(Ok(()), texc_compiler::verify::verify)?;
            texc_compiler::verify::verify(runs)
        };
        after(&self.options, &mut self.timings, Pass::Fold, t0, dump, verify)
    }

    /// The panels the default CPU schedule would pack constant operands
    /// into on every call, made by stages of their own that fold
    /// ([`texc_schedules::prepack`]).
    fn prepack(
        &self,
        p: &mut Program,
        is_constant: &dyn Fn(&str) -> bool,
        known_scalar: &dyn Fn(&str) -> bool,
    ) -> Result<(), Error> {
        let knobs = self.default_knobs(self.options.target)?;
        // Packed or transposed before folding, a constant operand of a product is packed once.
        if self.options.target.kind == TargetKind::Cpu {
            let weights = |name: &str| match self.model_inputs.get(name).map(|t| &t.data) {
                Some(texc_runtime::Data::I8(v)) => Some(&v[..]),
                _ => None,
            };
            let constant = texc_compiler::constants::constant_tensors(p, is_constant, known_scalar);
            let is = |marks: &[bool], t: TensorId| marks.get(t.0 as usize).copied().unwrap_or(false);
            let tops = texc_schedules::channels_last::channels_last(p, self.options.target, &|t| is(&constant, t));
            texc_schedules::dot4::pack_products(p, self.options.target, &weights);
            let constant = texc_compiler::constants::constant_tensors(p, is_constant, known_scalar);
            let (movable, wanted) = (|t| is(&constant, t), |t| tops.contains(&t));
            texc_schedules::filters_last::filters_last(p, self.options.target, &movable, &wanted);
            let constant = texc_compiler::constants::constant_tensors(p, is_constant, known_scalar);
            // Any row count: a constant's transpose costs nothing per run.
            texc_schedules::transpose::transpose_operands(p, Some(&|t: TensorId| constant[t.0 as usize]), 1);
        }
        texc_schedules::prepack::prepack_constant_operands(p, self.options.target, knobs, is_constant, known_scalar);
        Ok(())
    }

    /// *fold* as [`Pipeline::prepare`] folds for a run with the scalars at
    /// their defaults (for `analyze`): `built.runs` becomes the program that
    /// runs on every call; the prologue computed once, if anything folded.
    pub fn fold_for_analysis(&mut self, built: &mut Built) -> Result<Option<&Program>, Error> {
        let weights = self.folded_weights();
        let known: HashSet<String> =
            built.written.scalars.iter().filter(|s| s.default.is_some()).map(|s| s.name.clone()).collect();
        self.fold(built, &|n| weights.contains(n), &|n| known.contains(n))?;
        Ok(self.prologue.as_ref())
    }

    /// The constants the last *fold* split off, computed from `values` (the
    /// weights by name, copied a part at a time) and `scalars` (by name):
    /// each folded tensor by its parameter name in the program that runs.
    pub fn constants(
        &mut self,
        values: &HashMap<String, Tensor>,
        scalars: &HashMap<String, f64>,
    ) -> Result<Vec<(String, Tensor)>, Error> {
        self.compute_constants(&mut |n| values.get(n).cloned(), scalars)
    }

    /// [`Pipeline::constants`] with each weight given by `weight` (by name;
    /// it may move the tensor out of its holder when nothing else reads it).
    /// The prologue runs in parts ([`texc_compiler::constants::parts`]), so
    /// that a part's weights are freed once it has run: computing a model's
    /// constants holds its weights about once, not three times (the tensors,
    /// their buffers and the results). The parts run once, so they are
    /// compiled by Cranelift, the backend that compiles fastest.
    fn compute_constants(
        &mut self,
        weight: &mut dyn FnMut(&str) -> Option<Tensor>,
        scalars: &HashMap<String, f64>,
    ) -> Result<Vec<(String, Tensor)>, Error> {
        self.compute_constants_within(weight, scalars, CONSTANT_PART_BYTES)
    }

    /// [`Pipeline::compute_constants`] with parts (and slices of a part's
    /// output) of about `max_bytes`.
    fn compute_constants_within(
        &mut self,
        weight: &mut dyn FnMut(&str) -> Option<Tensor>,
        scalars: &HashMap<String, f64>,
        max_bytes: u64,
    ) -> Result<Vec<(String, Tensor)>, Error> {
        let Some(prologue) = self.prologue.clone() else { return Ok(Vec::new()) };
        let target = self.options.target;
        self.options.target = target::lookup("cranelift").map_err(|e| Error::Usage(e.to_string()))?;
        let mut results = Vec::new();
        let mut run = || -> Result<(), Error> {
            for part in texc_compiler::constants::parts(&prologue, max_bytes) {
                let args = part
                    .params
                    .iter()
                    .map(|q| match q {
                        ProgramParam::Tensor(t) => weight(&part.tensor(*t).name).map(Arg::Tensor),
                        ProgramParam::Scalar(s) => {
                            scalars.get(&part.scalars[*s as usize].name).map(|&v| Arg::Scalar(v))
                        }
                    })
                    .collect::<Option<Vec<Arg>>>()
                    .ok_or_else(|| {
                        Diagnostic::error("internal error: a folded stage reads a value that is not a constant")
                    })?;
                let names: Vec<String> = part.outputs.iter().map(|&t| part.tensor(t).name.clone()).collect();
                if let Some(sliced) = slices::slices(&part, max_bytes).and_then(|s| self.compile_slices(s)) {
                    let out = self.run_slices(&part, sliced, args)?;
                    results.extend(names.into_iter().zip([out]));
                    continue;
                }
                let compiled = self.default_loops(part).and_then(|l| self.compile(&l.legal))?;
                let out = compiled.run(args).map_err(|e| Diagnostic::error(e.to_string()))?;
                results.extend(names.into_iter().zip(out));
            }
            Ok(())
        };
        let outcome = run();
        self.options.target = target;
        outcome.map(|()| results)
    }

    /// Each slice compiled, or `None` where one does not compile (the part
    /// then runs whole: nothing is released before every slice can run).
    fn compile_slices(&mut self, slices: Vec<slices::Slice>) -> Option<Vec<CompiledSlice>> {
        slices
            .into_iter()
            .map(|slices::Slice { rows, program, release }| {
                let compiled = self.default_loops(program).and_then(|l| self.compile(&l.legal)).ok()?;
                compiled.runs_in_place().then_some(CompiledSlice { rows, release, compiled })
            })
            .collect()
    }

    /// The one output of constant part `part` computed slice by slice
    /// ([`slices`]) into its memory, each parameter's rows released once no
    /// later slice reads them.
    fn run_slices(&mut self, part: &Program, slices: Vec<CompiledSlice>, mut args: Vec<Arg>) -> Result<Tensor, Error> {
        let fail = |e: &dyn std::fmt::Display| Error::from(Diagnostic::error(e.to_string()));
        let decl = part.tensor(part.outputs[0]);
        let shape: Vec<usize> = decl.shape.iter().map(|&d| d as usize).collect();
        let mut out = Tensor::zeros(decl.elem, shape.clone()).map_err(|e| fail(&e))?;
        let row_bytes = out.bytes().len() / shape[0].max(1);
        for CompiledSlice { rows, release, compiled } in slices {
            let refs: Vec<texc_codegen::ArgRef> = args.iter().map(texc_codegen::ArgRef::of).collect();
            let rows_shape: Vec<usize> = [rows.len()].into_iter().chain(shape[1..].iter().copied()).collect();
            let dtype = out.dtype();
            // SAFETY: generated code writes bools as 0 or 1.
            let bytes = unsafe { &mut out.bytes_mut()[rows.start * row_bytes..rows.end * row_bytes] };
            let mut dst = [texc_codegen::TensorMut { dtype, shape: &rows_shape, bytes }];
            compiled.run_in_place(&refs, &mut dst).map_err(|e| fail(&e))?;
            drop(refs);
            for (t, free) in release {
                let Some(i) = part.params.iter().position(|q| *q == ProgramParam::Tensor(t)) else { continue };
                if let Arg::Tensor(w) = &mut args[i] {
                    let bytes = w.bytes().len() / w.shape.first().copied().unwrap_or(1).max(1);
                    w.release(0..free * bytes);
                }
            }
        }
        Ok(out)
    }

    /// The tensors a compiled model takes from its library: the weights, and
    /// the constants folded from them by the last [`Pipeline::build`].
    pub fn model_constants(&mut self) -> Result<HashMap<String, Tensor>, Error> {
        // Taken for the call (`constants` borrows the pipeline mutably), then put back.
        let inputs = std::mem::take(&mut self.model_inputs);
        let folded = self.constants(&inputs, &HashMap::new());
        self.model_inputs = inputs;
        let mut all = self.model_inputs.clone();
        all.extend(folded?);
        Ok(all)
    }

    /// An error unless the target compiles code (`what` names the command asking).
    pub fn require_compiled(&self, what: &str) -> Result<(), Error> {
        let t = self.options.target;
        t.backend().map_err(|e| Error::Usage(e.to_string()))?;
        if t.kind == TargetKind::Interp {
            let names: Vec<&str> = target::all().iter().filter(|t| t.is_compiled()).map(|t| t.name).collect();
            return Err(Error::Usage(format!(
                "{what} needs a compiled target: add --target {} (or {})",
                names[0],
                names[1..].join(", ")
            )));
        }
        Ok(())
    }

    /// Each top-level loop nest of `f` compiled alone, to be called on the
    /// buffers of `compiled` (the whole of `f`): `bench --profile` times them.
    pub fn compile_nests(&self, f: &LoopFunc, compiled: &Compiled) -> Result<Vec<texc_codegen::Part>, Error> {
        let t = self.options.target;
        Ok(compiled.parts(texc_codegen::backend_for(t)?, f, t)?)
    }

    /// A loop nest run on the loop evaluator (a `.loops` file on a target
    /// that does not compile it): what it computes, races refused.
    pub fn evaluate(
        &self,
        f: &LoopFunc,
        args: Vec<texc_compiler::interp::Arg>,
    ) -> Result<Vec<texc_runtime::Tensor>, Error> {
        texc_schedules::eval::run(f, args).map_err(|e| Error::from(texc_grammar::Diagnostic::error(e.to_string())))
    }

    /// *codegen*: JIT-compile legalized loops with the target's backend.
    pub fn compile(&mut self, f: &LoopFunc) -> Result<Compiled, Error> {
        let t = self.options.target;
        let emulate = self.options.emulate_gpu && t.kind == TargetKind::Gpu;
        if !emulate {
            t.check_runs_here().map_err(|e| Error::Usage(e.to_string()))?;
        }
        fits_target(f, t)?;
        let t0 = Instant::now();
        let backend = texc_codegen::backend_for(t)?;
        let k = match backend.gpu() {
            Some(_) if emulate => Compiled::emulated(backend, f, t)?,
            Some(_) => Compiled::on_device(backend, f, t)?,
            None => Compiled::new(backend, f, t)?,
        };
        let ms = k.compile_time.as_secs_f64() * 1e3;
        if let Some(n) = k.nests {
            let cache = match texc_codegen::cache::Cache::from_env() {
                Some(c) => format!("{} from the compile cache ({})", n.cached, c.dir().display()),
                None => "the compile cache is off".to_string(),
            };
            self.code_notes.push(format!(
                "codegen `{}`: {} loop nests, {} distinct functions, {cache}",
                f.p.name, n.nests, n.distinct
            ));
        }
        after(
            &self.options,
            &mut self.timings,
            Pass::Codegen,
            t0,
            || format!("compiled `{}` with {} in {ms:.3} ms\n", f.p.name, backend.kind().name()),
            unverified,
        )?;
        Ok(k)
    }

    /// *codegen*: a text stage of the target's backend (`emit --stage llvm`, ...).
    pub fn emit_text(&mut self, f: &LoopFunc, stage: &str) -> Result<String, Error> {
        let t = self.options.target;
        let backend = texc_codegen::backend_for(t)?;
        if !backend.text_stages().contains(&stage) {
            return Err(Error::Usage(format!(
                "the {} backend of target `{t}` prints {}, not `{stage}`",
                backend.kind().name(),
                backend.text_stages().join(", ")
            )));
        }
        fits_target(f, t)?;
        let t0 = Instant::now();
        let text = backend.emit_text(f, t, stage)?;
        after(&self.options, &mut self.timings, Pass::Codegen, t0, String::new, unverified)?;
        Ok(text)
    }

    /// The text stages the target's backend prints.
    pub fn text_stages(&self) -> Vec<&'static str> {
        texc_codegen::backend_for(self.options.target).map(|b| b.text_stages().to_vec()).unwrap_or_default()
    }

    /// *codegen*: an object file and its C header.
    pub fn emit_object(&mut self, f: &LoopFunc) -> Result<(Vec<u8>, String), Error> {
        let t = self.options.target;
        let backend = texc_codegen::backend_for(t)?;
        let t0 = Instant::now();
        fits_target(f, t)?;
        let c = CEntry::of(f);
        let object = backend.emit_object(f, t, &c)?;
        let header = texc_codegen::header::header(f, &c, t.name);
        after(&self.options, &mut self.timings, Pass::Codegen, t0, String::new, unverified)?;
        Ok((object, header))
    }

    /// *codegen*: one object per kernel and one C header declaring them all
    /// (`texc compile` of several kernels into one library).
    pub fn emit_objects(&mut self, fs: &[&LoopFunc]) -> Result<(Vec<Vec<u8>>, String), Error> {
        let t = self.options.target;
        let backend = texc_codegen::backend_for(t)?;
        let t0 = Instant::now();
        for f in fs {
            fits_target(f, t)?;
        }
        let entries: Vec<CEntry> = fs.iter().map(|f| CEntry::of(f)).collect();
        let objects = fs.iter().zip(&entries).map(|(f, c)| backend.emit_object(f, t, c)).collect::<Result<_, _>>()?;
        let parts: Vec<(&LoopFunc, &CEntry)> = fs.iter().copied().zip(&entries).collect();
        let header = texc_codegen::header::header_of_many(&parts, t.name);
        after(&self.options, &mut self.timings, Pass::Codegen, t0, String::new, unverified)?;
        Ok((objects, header))
    }

    /// The GPU backend of the target, or a usage error for a CPU target.
    fn gpu_backend(&self) -> Result<&'static dyn GpuBackend, Error> {
        let t = self.options.target;
        if t.kind != TargetKind::Gpu {
            return Err(Error::Usage(format!("target `{t}` is not a GPU: it has no device code")));
        }
        Ok(texc_codegen::gpu_backend_for(t)?)
    }

    /// *codegen* for a GPU target: one device module (PTX on NVPTX) with the
    /// kernels of every function of `fs` (the launches written as comments
    /// at its top), and the C header describing their parameters and launches.
    pub fn emit_gpu(&mut self, fs: &[&LoopFunc]) -> Result<(String, String), Error> {
        let t = self.options.target;
        let gpu = self.gpu_backend()?;
        let t0 = Instant::now();
        for f in fs {
            fits_target(f, t)?;
        }
        let module = gpu.module(fs, t)?;
        let parts: Vec<texc_codegen::header::GpuPart> = fs
            .iter()
            .zip(&module.kernels)
            .map(|(f, k)| texc_codegen::header::GpuPart { f, launches: &k.launches, kernels: &k.names })
            .collect();
        let header = texc_codegen::header::gpu_header(&parts, t.name);
        let text = format!("{}{}", module.launch_comment(fs), module.text);
        after(&self.options, &mut self.timings, Pass::Codegen, t0, String::new, unverified)?;
        Ok((text, header))
    }

    /// The file formats `texc compile -o` writes for the GPU target, by
    /// extension (`ptx`, `cubin`); the first is [`Pipeline::emit_gpu`]'s text.
    pub fn gpu_formats(&self) -> Result<&'static [&'static str], Error> {
        Ok(self.gpu_backend()?.formats())
    }

    /// *codegen*: [`Pipeline::emit_gpu`]'s text as a file of `format`, and
    /// what the device assembler said of each kernel.
    pub fn encode_gpu(&mut self, text: &str, format: &str) -> Result<Encoded, Error> {
        let gpu = self.gpu_backend()?;
        let t0 = Instant::now();
        let encoded = gpu.encode(text, self.options.target, format)?;
        after(&self.options, &mut self.timings, Pass::Codegen, t0, String::new, unverified)?;
        Ok(encoded)
    }

    // ------------------------------------------------------------ whole commands

    /// Apply every schedule block kernel `k` has for a compiled target to
    /// `p`, through legalization: the errors they have (`texc check`).
    pub fn check_schedules(&mut self, k: KernelRef, p: &Program) -> Vec<Diagnostic> {
        let mut diags = Vec::new();
        for t in target::all().iter().filter(|t| t.is_compiled()) {
            if texc_schedules::own_schedule_block(&self.session, k, t).is_none() {
                continue;
            }
            let mut q = p.clone();
            let lowered = self
                .schedule_for(Some(k), &mut q, t)
                .and_then(|(schedules, regions)| self.lower_for(Scheduled { p: q, schedules, regions }, t));
            match lowered.and_then(|f| self.check_target(Some(k), &f, t).map(|()| f)) {
                Ok(mut f) => texc_schedules::legalize::legalize(&mut f, t),
                Err(Error::Input(d)) => diags.extend(d),
                Err(Error::Usage(m)) => diags.push(Diagnostic::error(m)),
            }
        }
        diags
    }

    /// Specialize kernel `k` for a run: sizes from `b` and the input files'
    /// shapes, the loop nests for a compiled target, and the arguments
    /// (`files` by name, `scalars` by name, the rest seeded random data
    /// within the domain of the operators they feed: [`domain`]).
    /// With `check`, the interpreter runs too. A run whose memory would
    /// exceed the budget (`Options::memory_budget`) is refused before anything
    /// is allocated.
    pub fn prepare(
        &mut self,
        k: KernelRef,
        b: &Bindings,
        files: HashMap<String, Tensor>,
        scalars: &[(String, f64)],
        seed: u64,
        check: bool,
    ) -> Result<Prepared, Error> {
        let mut files: HashMap<String, Tensor> = self.kernel_names(files.into_iter().collect())?.into_iter().collect();
        let scalars = &self.kernel_names(scalars.to_vec())?;
        let info = self.session.kernel(k);
        for n in files.keys().chain(scalars.iter().map(|(n, _)| n)) {
            if info.param_index(n).is_none() {
                return Err(self.unknown_param(n, info));
            }
        }
        for (n, v) in scalars {
            let param = &info.params[info.param_index(n).expect("checked above")];
            check_scalar(n, *v, &param.info).map_err(Error::Usage)?;
        }
        let mut b = b.clone();
        let weights_shapes = self.model_inputs.iter().filter(|(n, _)| !files.contains_key(*n));
        b.input_shapes = files
            .iter()
            .chain(weights_shapes)
            .map(|(n, t)| (n.clone(), t.shape.iter().map(|&d| d as i64).collect()))
            .collect();
        let mut built = self.program(k, &b)?;
        let mut known: HashMap<String, f64> =
            built.written.scalars.iter().filter_map(|s| Some((s.name.clone(), s.default?))).collect();
        known.extend(scalars.iter().cloned());
        let weights = self.folded_weights();
        self.fold(&mut built, &|n| weights.contains(n), &|n| known.contains_key(n))?;
        self.add_weights(&mut files);
        let legal =
            if self.options.target.is_compiled() { Some(self.legal_loops(k, built.runs.clone())?) } else { None };
        let interpret = legal.is_none() || check;
        let needed = run_memory(&built.written, legal.as_ref(), interpret)
            .saturating_add(self.prologue.as_ref().map_or(0, prologue_memory));
        self.check_memory(needed)?;
        let given: Vec<String> = files.keys().cloned().collect();
        let mut args = interp::bind_args(&built.written, files, scalars, seed).map_err(Diagnostic::error)?;
        domain::into_domain(&built.written, &mut args, &given);
        // Without the interpreter, the weights move to the compiled loops'
        // arguments (`args` keeps placeholders: nothing interprets them),
        // and those only the folded stages read move to them.
        let folded = {
            let mut weight = weights_of(&built, &mut args, !interpret);
            self.compute_constants(&mut weight, &known)?
        };
        let run_args = run_args(&built, &mut args, folded, !interpret);
        Ok(Prepared { built, legal, args, run_args })
    }

    /// The model's weights added to `files` (which take precedence): moved
    /// where [`Options::consume_weights`] says so, else copied.
    fn add_weights(&mut self, files: &mut HashMap<String, Tensor>) {
        if self.options.consume_weights {
            for (n, t) in std::mem::take(&mut self.model_inputs) {
                files.entry(n).or_insert(t);
            }
        } else {
            for (n, t) in &self.model_inputs {
                files.entry(n.clone()).or_insert_with(|| t.clone());
            }
        }
    }

    /// The per-pass timing table (`--time-passes`).
    pub fn timings(&self) -> &[Timing] {
        &self.timings
    }

    pub fn timing_table(&self) -> String {
        let total: Duration = self.timings.iter().map(|t| t.time + t.verify).sum();
        let share = |d: Duration| 100.0 * d.as_secs_f64() / total.as_secs_f64().max(1e-12);
        let mut out =
            format!("{:<22} {:>5} {:>12} {:>7} {:>12}\n", "pass", "runs", "time (ms)", "share", "verify (ms)");
        let mut rows = self.timings.clone();
        rows.sort_by_key(|t| t.pass);
        for t in &rows {
            out += &format!(
                "{:<22} {:>5} {:>12.3} {:>6.1}% {:>12.3}\n",
                t.pass.name(),
                t.runs,
                t.time.as_secs_f64() * 1e3,
                share(t.time),
                t.verify.as_secs_f64() * 1e3
            );
        }
        out += &format!("{:<22} {:>5} {:>12.3}\n", "total", "", total.as_secs_f64() * 1e3);
        for n in &self.code_notes {
            out += &format!("{n}\n");
        }
        out
    }
}

/// The gate before code generation, whoever made the nests (a schedule, a
/// `.loops` file, a caller of the pipeline's API): loop kinds, statements
/// and intrinsics the target lacks (a CPU's `parallel` on a GPU, whose
/// backend has no thread pool to call), then element types. The GPU
/// backends check the launch rules themselves.
fn fits_target(f: &LoopFunc, t: &Target) -> Result<(), Error> {
    if let Err(why) = texc_schedules::verify::check_constructs(f, t) {
        return Err(nests_cannot_run(t, why));
    }
    supported_elems(f, t)
}

/// Nests made outside a kernel's schedule that target `t` cannot run.
fn nests_cannot_run(t: &Target, why: impl std::fmt::Display) -> Error {
    Diagnostic::error(format!("these loop nests cannot run on {t}: {why}")).into()
}

/// Element types the target's backend cannot compile are an error at the
/// tensor's declaration, before code generation.
fn supported_elems(f: &LoopFunc, t: &Target) -> Result<(), Error> {
    let bad: Vec<Diagnostic> =
        f.p.tensors
            .iter()
            .filter_map(|d| t.unsupported_elem(d.elem).map(|why| (d, why)))
            .map(|(d, why)| Diagnostic::at(d.span, format!("`{}` is {}: {why} (target {})", d.name, d.elem, t.name)))
            .take(1)
            .collect();
    if bad.is_empty() {
        Ok(())
    } else {
        Err(Error::Input(bad))
    }
}

/// Loop nests whose code would exceed [`MAX_EMITTED_NODES`] are refused.
fn check_emitted_size(f: &LoopFunc) -> Result<(), Error> {
    let size = texc_schedules::ir::emitted_size(f);
    if size > MAX_EMITTED_NODES {
        return Err(Diagnostic::error(format!(
            "the loop nests of `{}` would make code generation emit {size} operations, more than {MAX_EMITTED_NODES}",
            f.p.name
        ))
        .with_note("unrolled loops and long expressions multiply code; unroll less or split the kernel")
        .into());
    }
    Ok(())
}

impl Pipeline {
    /// A run needing `needed` bytes fits the memory budget ([`Options::memory_budget`]).
    fn check_memory(&self, needed: u64) -> Result<(), Error> {
        let budget = self.options.memory_budget();
        if needed > budget {
            let what = if self.options.max_memory.is_some() {
                "the limit given by --max-memory"
            } else {
                "what this machine has available"
            };
            return Err(Diagnostic::error(format!(
                "this run needs about {} of memory, more than {what} ({})",
                texc_runtime::memory::human(needed),
                texc_runtime::memory::human(budget)
            ))
            .with_note("run at smaller sizes, or raise the limit with --max-memory")
            .into());
        }
        Ok(())
    }
}

/// Most expression nodes the loop nests of one kernel may ask code
/// generation to emit (unrolled copies counted): a bound on compile time
/// and code size, far above what real kernels need.
pub const MAX_EMITTED_NODES: u64 = 1 << 22;

/// Bytes a run allocates: its arguments (and the copy each call takes), its
/// outputs, the compiled kernel's buffers, and — when the interpreter runs —
/// its 8-byte cells for every tensor.
fn run_memory(written: &Program, compiled: Option<&LoopFunc>, interpret: bool) -> u64 {
    let bytes = |d: &texc_compiler::tir::TensorDecl| (d.len().max(0) as u64).saturating_mul(d.elem.size() as u64);
    let sum = |ts: &mut dyn Iterator<Item = u64>| ts.fold(0u64, u64::saturating_add);
    let inputs = sum(&mut written.input_tensors().map(|t| bytes(written.tensor(t))));
    let outputs = sum(&mut written.outputs.iter().map(|&t| bytes(written.tensor(t))));
    let mut total = inputs.saturating_mul(2).saturating_add(outputs);
    if let Some(f) = compiled {
        let temps = texc_schedules::memory_plan::plan(f).arena_bytes;
        total = total.saturating_add(inputs).saturating_add(outputs.saturating_mul(2)).saturating_add(temps);
    }
    if interpret {
        let cells = sum(&mut written.tensors.iter().map(|d| (d.len().max(0) as u64).saturating_mul(8)));
        total = total.saturating_add(cells).saturating_add(outputs);
    }
    total
}

/// Bytes the fold prologue adds to a run: the tensors it computes (its
/// results, which the run keeps as inputs, and its temporaries), twice for
/// the copies its compiled code takes.
fn prologue_memory(prologue: &Program) -> u64 {
    let computed: HashSet<TensorId> = prologue.stages.iter().map(|st| st.tensor).collect();
    computed
        .into_iter()
        .map(|t| prologue.tensor(t))
        .map(|d| (d.len().max(0) as u64).saturating_mul(d.elem.size() as u64).saturating_mul(2))
        .fold(0u64, u64::saturating_add)
}

/// A `--scalar` value must suit its parameter: integers integral and in
/// range, bools 0 or 1, and never a tensor.
fn check_scalar(name: &str, v: f64, info: &texc_compiler::kernel::ParamInfo) -> Result<(), String> {
    use texc_compiler::kernel::ParamInfo;
    let elem = match info {
        ParamInfo::Scalar { elem, .. } => *elem,
        ParamInfo::Tensor(_) => {
            return Err(format!("--scalar {name}: `{name}` is a tensor; give it with --input {name}=FILE.npy"))
        }
        ParamInfo::Const { .. } => {
            return Err(format!("--scalar {name}: `{name}` is a compile-time constant; give it with --const"))
        }
    };
    match elem.integer_range() {
        Some((lo, hi)) if v.fract() != 0.0 || !v.is_finite() || v < lo || v > hi => {
            Err(format!("--scalar {name}={v}: `{name}` is {elem}, which holds the integers {lo} to {hi}"))
        }
        _ => Ok(()),
    }
}

/// Run a program on the interpreter.
/// Bytes of weights and results a part of the prologue holds at most
/// (unless one weight's component is larger): the constants are computed
/// in a few parts, each compiled on its own.
const CONSTANT_PART_BYTES: u64 = 32 << 20;

/// A slice of a constant part ([`slices::Slice`]) with its program compiled.
struct CompiledSlice {
    rows: std::ops::Range<usize>,
    release: Vec<(TensorId, usize)>,
    compiled: Compiled,
}

/// The weights of `built.written` in `args` (its parameters' values) by
/// name, for [`Pipeline::compute_constants`]: with `take`, a weight the
/// program that runs does not read moves out (a placeholder stays), any
/// other is copied.
fn weights_of<'a>(built: &'a Built, args: &'a mut [Arg], take: bool) -> impl FnMut(&str) -> Option<Tensor> + 'a {
    let w = &built.written;
    let index: HashMap<&str, usize> = w.params.iter().enumerate().map(|(i, q)| (param_name(w, q), i)).collect();
    let runs = &built.runs;
    let read_by_runs: HashSet<&str> = runs.params.iter().map(|q| param_name(runs, q)).collect();
    move |name| match &mut args[*index.get(name)?] {
        Arg::Tensor(t) if take && !read_by_runs.contains(name) => Some(std::mem::replace(t, placeholder())),
        Arg::Tensor(t) => Some(t.clone()),
        Arg::Scalar(_) => None,
    }
}

/// The name of a parameter of `p`.
fn param_name<'a>(p: &'a Program, q: &ProgramParam) -> &'a str {
    match q {
        ProgramParam::Tensor(t) => p.tensor(*t).name.as_str(),
        ProgramParam::Scalar(s) => p.scalars[*s as usize].name.as_str(),
    }
}

/// What stays in place of an argument moved elsewhere (nothing reads it).
fn placeholder() -> Tensor {
    Tensor { shape: vec![0], data: texc_runtime::Data::F32(Vec::new()) }
}

/// The arguments of `built.runs` in its parameter order, when constants were
/// folded (`None`: `args` themselves): those of the program as written
/// (`args`, in its order) by name, and the `folded` constants.
fn run_args(built: &Built, args: &mut [Arg], folded: Vec<(String, Tensor)>, take: bool) -> Option<Vec<Arg>> {
    if folded.is_empty() {
        return None;
    }
    let w = &built.written;
    let mut written: HashMap<&str, &mut Arg> = w.params.iter().map(|q| param_name(w, q)).zip(args.iter_mut()).collect();
    let mut folded: HashMap<String, Tensor> = folded.into_iter().collect();
    let r = &built.runs;
    let run = r
        .params
        .iter()
        .map(|q| {
            let name = param_name(r, q);
            match folded.remove(name) {
                Some(t) => Arg::Tensor(t),
                None => {
                    let a = written.get_mut(name).expect("the program that runs keeps its parameters' names");
                    match a {
                        Arg::Tensor(t) if take => Arg::Tensor(std::mem::replace(t, placeholder())),
                        _ => (**a).clone(),
                    }
                }
            }
        })
        .collect::<Vec<Arg>>();
    if take {
        // What is left are weights only the folded stages read: no longer needed.
        drop(written);
        for a in args.iter_mut() {
            if let Arg::Tensor(t) = a {
                *t = placeholder();
            }
        }
    }
    Some(run)
}

/// `p` on the reference interpreter.
pub fn interpret(p: &Program, args: Vec<Arg>) -> Result<Vec<Tensor>, Error> {
    interp::run(p, args).map_err(|e| Diagnostic::error(e.to_string()).into())
}

/// [`interpret`], counting the elements computed in `progress` (which a
/// progress bar may read from another thread).
pub fn interpret_with_progress(p: &Program, args: Vec<Arg>, progress: &interp::Progress) -> Result<Vec<Tensor>, Error> {
    interp::run_with_progress(p, args, progress).map_err(|e| Diagnostic::error(e.to_string()).into())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The prologue's results and temporaries count towards a run's memory
    /// (twice: the compiled code's copies); the constants it reads do not.
    #[test]
    fn prologue_memory_counts_what_the_prologue_computes() {
        let src = "kernel k(X: f32[5, 7], W: f32[7, 3]) -> Y: f32[5, 3] {\n    \
                   Wt[j, i] = W[i, j] * 2.0;\n    Y[i, j] = sum[k](X[i, k] * Wt[j, k]);\n}\n";
        let mut pl = Pipeline::new(Options::new(target::lookup("interp").expect("registered")));
        let m = pl.load_text("k.tex", src, None).expect("loads");
        let k = pl.kernel(m, None).expect("one kernel");
        let built = pl.program(k, &Bindings::default()).expect("specializes");
        let split = texc_compiler::constants::split(&built.written, &|n| n == "W", &|_| false).expect("Wt folds");
        assert_eq!(prologue_memory(&split.prologue), 2 * 7 * 3 * 4);
    }

    /// The prologue's parts: connected stages stay together (`U` and `V`
    /// share `B`), each stage and each weight is in one part, and parts are
    /// batched up to the byte bound.
    #[test]
    fn constant_parts_hold_connected_stages_and_each_weight_once() {
        let src = "kernel k(X: f32[4], A: f32[4], B: f32[4], C: f32[4]) -> Y: f32[4] {\n    \
                   T[i] = A[i] * 2.0;\n    U[i] = B[i] + 1.0;\n    V[i] = B[i] * C[i];\n    \
                   Y[i] = X[i] + T[i] + U[i] + V[i];\n}\n";
        let mut pl = Pipeline::new(Options::new(target::lookup("interp").expect("registered")));
        let m = pl.load_text("k.tex", src, None).expect("loads");
        let k = pl.kernel(m, None).expect("one kernel");
        let built = pl.program(k, &Bindings::default()).expect("specializes");
        let weights = |n: &str| matches!(n, "A" | "B" | "C");
        let split = texc_compiler::constants::split(&built.written, &weights, &|_| false).expect("T, U, V fold");
        let pro = &split.prologue;
        let names =
            |p: &Program, ts: Vec<TensorId>| ts.into_iter().map(|t| p.tensor(t).name.clone()).collect::<Vec<_>>();
        let stages = |p: &Program| names(p, p.stages.iter().map(|st| st.tensor).collect());
        let params = |p: &Program| {
            names(
                p,
                p.params.iter().filter_map(|q| if let ProgramParam::Tensor(t) = q { Some(*t) } else { None }).collect(),
            )
        };
        let parts = texc_compiler::constants::parts(pro, 0);
        assert_eq!(parts.iter().map(stages).collect::<Vec<_>>(), [vec!["T"], vec!["U", "V"]]);
        assert_eq!(parts.iter().map(params).collect::<Vec<_>>(), [vec!["A"], vec!["B", "C"]]);
        for (part, outputs) in parts.iter().zip([1, 2]) {
            assert_eq!(part.outputs.len(), outputs);
            texc_compiler::verify::verify(part).expect("a part is a program");
        }
        let one = texc_compiler::constants::parts(pro, u64::MAX);
        assert_eq!(one.iter().map(stages).collect::<Vec<_>>(), [stages(pro)]);
        assert_eq!(one[0].outputs, pro.outputs);
    }

    /// Kernel `src` (its only one) specialized, and split with its parameter
    /// `W` a constant: the pipeline and the split.
    fn folding_w(src: &str) -> (Pipeline, texc_compiler::constants::Split) {
        let mut pl = Pipeline::new(Options::new(target::lookup("interp").expect("registered")));
        let m = pl.load_text("k.tex", src, None).expect("loads");
        let k = pl.kernel(m, None).expect("one kernel");
        let built = pl.program(k, &Bindings::default()).expect("specializes");
        let split = texc_compiler::constants::split(&built.written, &|n| n == "W", &|_| false).expect("W folds");
        (pl, split)
    }

    /// A constant computed in slices of its rows, its weight's rows released
    /// as the slices pass them, is the constant computed whole, bit for bit.
    #[test]
    fn constants_computed_in_slices_are_the_constants_computed_whole() {
        // `Wt` reads `W` through a transposing temporary, so the rows a slice
        // reads are followed through it; 37 rows do not divide the slices.
        let src = "kernel k(X: f32[3, 40], W: f32[37, 40]) -> Y: f32[3, 37] {\n    \
                   T[j, i] = W[i, j] * 2.0;\n    Wt[i, j] = T[j, i] + 1.0;\n    \
                   Y[b, i] = sum[k](X[b, k] * Wt[i, k]);\n}\n";
        let (mut pl, split) = folding_w(src);
        let parts = texc_compiler::constants::parts(&split.prologue, u64::MAX);
        let [part] = &parts[..] else { panic!("one part: {}", parts.len()) };
        let cut = slices::slices(part, 1024).expect("37 × 40 floats are more than 1 KiB");
        assert_eq!(cut.first().map(|s| s.rows.start), Some(0));
        assert!(cut.windows(2).all(|w| w[0].rows.end == w[1].rows.start) && cut.len() > 2);
        assert_eq!(cut.last().map(|s| s.rows.end), Some(37));
        // Each slice reads its own rows of `W`: after it, the rows before the
        // next slice's are free; after the last, all of them.
        for (s, next) in cut.iter().zip(cut.iter().skip(1).map(|n| n.rows.start).chain([37])) {
            assert_eq!(s.release.iter().map(|r| r.1).collect::<Vec<_>>(), [next]);
            texc_compiler::verify::verify(&s.program).expect("a slice is a program");
        }
        let w = Tensor {
            shape: vec![37, 40],
            data: texc_runtime::Data::F32((0..37 * 40).map(|i| (i as f32).sin()).collect()),
        };
        pl.prologue = Some(split.prologue);
        let mut whole_w = Some(w.clone());
        let whole = pl.compute_constants_within(&mut |_| whole_w.take(), &HashMap::new(), u64::MAX).expect("runs");
        let mut sliced_w = Some(w);
        let sliced = pl.compute_constants_within(&mut |_| sliced_w.take(), &HashMap::new(), 1024).expect("runs");
        assert_eq!(whole.len(), 1);
        assert_eq!(whole[0].1.bytes(), sliced[0].1.bytes());
        assert_eq!(whole[0].1.shape, [37, 40]);
    }

    /// Parts that slices would not compute as the whole does stay whole: a
    /// reduction before the output (each slice would recompute it), an
    /// output of one axis (its rows are its lanes).
    #[test]
    fn constants_with_reductions_or_one_axis_are_not_sliced() {
        for (src, why) in [
            (
                "kernel k(X: f32[3, 40], W: f32[37, 40]) -> Y: f32[3, 37] {\n    \
                 S[i] = sum[k](W[i, k]);\n    Wn[i, j] = W[i, j] / S[i];\n    \
                 Y[b, i] = sum[k](X[b, k] * Wn[i, k]);\n}\n",
                "a reduction",
            ),
            (
                "kernel k(X: f32[3, 999], W: f32[999]) -> Y: f32[3, 999] {\n    \
                 V[i] = W[i] * 2.0;\n    Y[b, i] = X[b, i] * V[i];\n}\n",
                "one axis",
            ),
        ] {
            let (_, split) = folding_w(src);
            let parts = texc_compiler::constants::parts(&split.prologue, u64::MAX);
            assert_eq!(parts.len(), 1, "{why}");
            assert!(slices::slices(&parts[0], 64).is_none(), "{why}");
        }
    }
}
