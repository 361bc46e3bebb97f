//! What a compilation is asked to do: the target, which IR to dump, whether
//! to verify, extraction and knob values. Explicit values, never read from
//! the environment behind the caller's back: [`Options::from_env`] is the
//! one place that reads `TEXC_DUMP_IR`, `TEXC_VERIFY` and `TEXC_EXTRACT`.

use std::collections::BTreeMap;
use texc_compiler::rewrite::{Accuracy, Extraction};
use texc_compiler::target::Target;

/// The passes, in the order they run (their order, as [`Pass::all`] lists them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pass {
    /// An ONNX model to `.tex` source and weights (`texc_onnx`); only for `.onnx` files.
    Import,
    /// Source text to AST, with imports (`texc_compiler::session`).
    Parse,
    /// Names, types and calls (`texc_compiler::resolve`).
    Resolve,
    /// Concrete sizes, inlined calls, tensor IR (`texc_compiler::specialize`).
    Specialize,
    /// E-graph rewriting of the operator graph (`texc_compiler::rewrite`).
    Rewrite,
    /// An imported model's constant stages split off, to run once (`texc_compiler::constants`).
    Fold,
    /// A preparation pass of the target's default schedule (`texc_schedules::prepare`), by name.
    Prepare(&'static str),
    /// The schedule block or the default schedule (`texc_schedules::{apply, strategy, attach}`).
    Schedule,
    /// Loop nests (`texc_schedules::lower`).
    Lower,
    /// GPU targets: tensor-core operations for `tensorize` (`texc_schedules::tensorize`).
    Tensorize,
    /// GPU targets: reductions over a block's threads (`texc_schedules::cross_thread`).
    CrossThread,
    /// GPU targets: software pipelines of shared-memory copies (`texc_schedules::multistage`).
    Multistage,
    /// GPU targets: shared tiles read by `ldmatrix` padded against bank conflicts (`texc_schedules::multistage`).
    PadLdmatrix,
    /// Zeros first in buffers that may be read before they are stored (`texc_schedules::zeroing`).
    Zero,
    /// CPU targets: a copy's producer stores what the copy would (`texc_schedules::forward`).
    Forward,
    /// CPU targets: a parallel loop cut into full tiles and a last one run as one launch (`texc_schedules::launches`).
    OneLaunch,
    /// Target-legal operations (`texc_schedules::legalize`).
    Legalize,
    /// CPU targets compiled by LLVM: software prefetches of inputs read in runs (`texc_schedules::prefetch`).
    Prefetch,
    /// CPU targets compiled by LLVM: loops around register blocks its unroller must not copy (`texc_schedules::keep_rolled`).
    KeepRolled,
    /// Machine code, text or objects (`texc_codegen`).
    Codegen,
}

impl Pass {
    /// Every pass, in the order they run (a target runs those its family has).
    pub fn all() -> Vec<Pass> {
        let mut out = vec![Pass::Import, Pass::Parse, Pass::Resolve, Pass::Specialize, Pass::Rewrite, Pass::Fold];
        out.extend(texc_schedules::prepare::names().into_iter().map(Pass::Prepare));
        out.extend([
            Pass::Schedule,
            Pass::Lower,
            Pass::Tensorize,
            Pass::CrossThread,
            Pass::Multistage,
            Pass::PadLdmatrix,
            Pass::Zero,
            Pass::Forward,
            Pass::OneLaunch,
            Pass::Legalize,
            Pass::Prefetch,
            Pass::KeepRolled,
            Pass::Codegen,
        ]);
        out
    }

    /// Where the pass runs among [`Pass::all`].
    fn rank(self) -> usize {
        Pass::all().iter().position(|&p| p == self).unwrap_or(usize::MAX)
    }

    pub fn name(self) -> &'static str {
        match self {
            Pass::Import => "import",
            Pass::Parse => "parse",
            Pass::Resolve => "resolve",
            Pass::Specialize => "specialize",
            Pass::Rewrite => "rewrite",
            Pass::Fold => "fold",
            Pass::Prepare(name) => name,
            Pass::Schedule => "schedule",
            Pass::Lower => "lower",
            Pass::Tensorize => "tensorize",
            Pass::Forward => "forward",
            Pass::CrossThread => "cross-thread",
            Pass::Multistage => "multistage",
            Pass::PadLdmatrix => "pad-ldmatrix",
            Pass::Legalize => "legalize",
            Pass::Prefetch => "prefetch",
            Pass::KeepRolled => "keep-rolled",
            Pass::Zero => "zero",
            Pass::OneLaunch => "one-launch",
            Pass::Codegen => "codegen",
        }
    }

    /// The IR the pass produces (for dump headers).
    pub fn ir(self) -> &'static str {
        match self {
            Pass::Import => "tex",
            Pass::Parse => "ast",
            Pass::Resolve => "kernels",
            Pass::Specialize | Pass::Rewrite | Pass::Fold | Pass::Prepare(_) => "tir",
            Pass::Schedule => "schedules",
            Pass::Lower
            | Pass::Tensorize
            | Pass::Forward
            | Pass::CrossThread
            | Pass::Multistage
            | Pass::PadLdmatrix
            | Pass::Zero
            | Pass::OneLaunch
            | Pass::Legalize
            | Pass::Prefetch
            | Pass::KeepRolled => "loops",
            Pass::Codegen => "code",
        }
    }

    pub fn from_name(s: &str) -> Option<Pass> {
        Pass::all().into_iter().find(|p| p.name() == s)
    }
}

impl PartialOrd for Pass {
    fn partial_cmp(&self, o: &Pass) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}

impl Ord for Pass {
    fn cmp(&self, o: &Pass) -> std::cmp::Ordering {
        self.rank().cmp(&o.rank())
    }
}

/// Which passes print their IR to stderr.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Dump {
    #[default]
    Nothing,
    All,
    After(Vec<Pass>),
}

impl Dump {
    /// `1`/`all`: every pass; a comma-separated list of pass names; `0` or empty: none.
    pub fn parse(spec: &str) -> Result<Dump, String> {
        match spec.trim() {
            "" | "0" => Ok(Dump::Nothing),
            "1" | "all" => Ok(Dump::All),
            list => list
                .split(',')
                .map(|n| {
                    let n = n.trim();
                    Pass::from_name(n).ok_or_else(|| {
                        let names: Vec<&str> = Pass::all().iter().map(|p| p.name()).collect();
                        format!("no pass `{n}` to dump; passes: {}, or `all`", names.join(", "))
                    })
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Dump::After),
        }
    }

    pub fn wants(&self, p: Pass) -> bool {
        match self {
            Dump::Nothing => false,
            Dump::All => true,
            Dump::After(list) => list.contains(&p),
        }
    }
}

/// Knobs of the pipeline itself, which the autotuner sets like schedule
/// knobs: `rewrite=0` runs the graph as written (as `--no-rewrite`),
/// `winograd=0` leaves Winograd out of the rewrites (as `--exact`),
/// `winograd=2`, `3` or `4` allows only F(2×2, 3×3) (vectors along the
/// tiles), F(2×2, 3×3) with vectors along the filters, or F(4×4, 3×3); `im2col=0`
/// leaves im2col out; `prefetch=0` leaves out the software prefetches of
/// `texc_schedules::prefetch` (CPU targets compiled by LLVM). `1` (or no
/// knob) lets the cost model choose; `forward=0` leaves copies' producers
/// storing their own tensors (`texc_schedules::forward`, CPU targets).
pub const KNOB_REWRITE: &str = "rewrite";
pub const KNOB_WINOGRAD: &str = "winograd";
pub const KNOB_IM2COL: &str = "im2col";
pub const KNOB_PREFETCH: &str = "prefetch";
pub const KNOB_FORWARD: &str = "forward";

/// The pipeline's knobs with the values each takes.
pub const PIPELINE_KNOBS: [(&str, &[i64]); 5] = [
    (KNOB_REWRITE, &[1, 0]),
    (KNOB_WINOGRAD, &[1, 0, 2, 3, 4]),
    (KNOB_IM2COL, &[1, 0]),
    (KNOB_PREFETCH, &[1, 0]),
    (KNOB_FORWARD, &[1, 0]),
];

#[derive(Clone, Debug)]
pub struct Options {
    /// [`Pipeline::prepare`](crate::Pipeline::prepare) moves a model's
    /// weights into the arguments instead of copying them (a command that
    /// prepares one run: the weights are then held once, not twice).
    pub consume_weights: bool,
    pub target: &'static Target,
    pub dump: Dump,
    /// Run the verifier of each IR after the pass that produced it.
    pub verify: bool,
    /// Record per-pass times (see `Pipeline::timings`).
    pub time_passes: bool,
    pub extraction: Extraction,
    /// Values of schedule tunables (`?t`), by name.
    pub knobs: BTreeMap<String, i64>,
    /// E-graph rewriting for compiled targets (kernels without a schedule of their own).
    pub rewrite: bool,
    /// Most memory a run may allocate (bytes); `None`: what the machine has available.
    pub max_memory: Option<u64>,
    /// Relative error accepted on float outputs (`--tolerance`): by `--check`,
    /// and by the rewriter when it weighs approximate rewrites. `None`: the
    /// table of [`crate::oracle::tolerance`].
    pub tolerance: Option<f64>,
    /// Forbid rewrites whose rounding error grows beyond the computation as
    /// written (`--exact`: no Winograd).
    pub exact: bool,
    /// Run GPU targets' kernels on this CPU (`--emulate-gpu`): each launch's
    /// blocks on the thread pool, each block's threads in order.
    pub emulate_gpu: bool,
    /// Sizes of an ONNX model's symbolic input dimensions (`--dim batch=1`).
    pub model_dims: Vec<(String, i64)>,
    /// Corrections of the e-graph's cost model measured by `texc tune`
    /// (`crate::tuning::calibration`); empty: the model as it is.
    pub calibration: texc_compiler::rewrite::Calibration,
}

impl Options {
    /// The memory budget of a run in bytes: `max_memory`, else what is available now.
    pub fn memory_budget(&self) -> u64 {
        self.max_memory.or_else(texc_runtime::memory::available).unwrap_or(u64::MAX)
    }

    /// What the rewriter may trade for speed: the f32 tolerance, and whether approximate rewrites are allowed.
    pub fn accuracy(&self) -> Accuracy {
        let f32_tolerance = crate::oracle::tolerance(texc_runtime::DType::F32);
        let winograd = self.knobs.get(KNOB_WINOGRAD).copied();
        Accuracy {
            tolerance: self.tolerance.unwrap_or(f32_tolerance),
            approximate: !self.exact && winograd != Some(0),
            winograd: winograd.and_then(texc_compiler::rewrite::WinogradForm::from_knob),
            im2col: self.knobs.get(KNOB_IM2COL) != Some(&0),
        }
    }

    /// Whether the e-graph rewrites: `--no-rewrite`, or the knob `rewrite=0`, turn it off.
    pub fn rewrites(&self) -> bool {
        self.rewrite && self.knobs.get(KNOB_REWRITE) != Some(&0)
    }

    /// Defaults: no dump, verification in debug builds, greedy extraction, rewriting on.
    pub fn new(target: &'static Target) -> Options {
        Options {
            target,
            dump: Dump::Nothing,
            verify: cfg!(debug_assertions),
            time_passes: false,
            extraction: Extraction::Greedy,
            knobs: BTreeMap::new(),
            rewrite: true,
            max_memory: None,
            tolerance: None,
            exact: false,
            emulate_gpu: false,
            model_dims: Vec::new(),
            calibration: Default::default(),
            consume_weights: false,
        }
    }

    /// [`Options::new`] adjusted by `TEXC_DUMP_IR` (see [`Dump::parse`]),
    /// `TEXC_VERIFY=1|0` (on or off; the default is on in debug builds) and `TEXC_EXTRACT=greedy|ilp`.
    pub fn from_env(target: &'static Target) -> Result<Options, String> {
        let mut o = Options::new(target);
        if let Ok(v) = std::env::var("TEXC_DUMP_IR") {
            o.dump = Dump::parse(&v).map_err(|e| format!("TEXC_DUMP_IR={v}: {e}"))?;
        }
        if let Ok(v) = std::env::var("TEXC_VERIFY") {
            o.verify = !v.is_empty() && v != "0";
        }
        if let Ok(v) = std::env::var("TEXC_EXTRACT") {
            o.extraction = Extraction::from_name(&v).map_err(|e| format!("TEXC_EXTRACT={v}: {e}"))?;
        }
        Ok(o)
    }
}
