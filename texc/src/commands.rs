//! What each subcommand does: read arguments and files, call the pipeline
//! (`texc-pipeline`, which owns every pass), print results.

use crate::args::{BenchArgs, Cli, Command, Common, RunArgs};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use texc_compiler::{Bindings, KernelRef};
use texc_grammar::Diagnostic;
use texc_pipeline::{Dump, Error, Options, Pipeline};
use texc_runtime::{write_npy, Tensor};

/// Write to stdout. A closed pipe (`texc emit ... | head`) ends texc
/// quietly, as it does other command-line tools; other write errors are
/// reported.
pub(crate) fn out(args: std::fmt::Arguments) {
    use std::io::Write;
    if let Err(e) = std::io::stdout().write_fmt(args) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("error: cannot write to stdout: {e}");
        std::process::exit(1);
    }
}

macro_rules! outln {
    ($($t:tt)*) => { out(format_args!("{}\n", format_args!($($t)*))) };
}

macro_rules! outp {
    ($($t:tt)*) => { out(format_args!($($t)*)) };
}

/// How a command ended when it failed: rendered diagnostics (exit 1) or misuse (exit 2).
enum Fail {
    Input(String),
    Usage(String),
}

impl From<Error> for Fail {
    fn from(e: Error) -> Fail {
        match e {
            Error::Input(d) => Fail::Input(texc_grammar::diagnostic::render_all(&d, &Default::default())),
            Error::Usage(m) => Fail::Usage(m),
        }
    }
}

pub fn run(cli: Cli) -> i32 {
    let result = match cli.command {
        Command::Import(a) => crate::import::import(&a).map_err(|e| match e {
            Error::Input(d) => Fail::Input(texc_grammar::diagnostic::render_all(&d, &Default::default())),
            Error::Usage(m) => Fail::Usage(m),
        }),
        Command::Quantize(q) => crate::quantize::quantize(&q).map_err(|e| match e {
            Error::Input(d) => Fail::Input(texc_grammar::diagnostic::render_all(&d, &Default::default())),
            Error::Usage(m) => Fail::Usage(m),
        }),
        Command::Check(c) => with_pipeline(&c, |pl| check(pl, &c)),
        Command::Emit { common, stage, spans: false } => with_pipeline(&common, |pl| emit(pl, &common, &stage)),
        Command::Emit { common, stage, spans: true } => with_pipeline(&common, |pl| emit_spanned(pl, &common, &stage)),
        Command::Run(r) => with_pipeline(&r.common, |pl| run_kernel(pl, &r)),
        Command::Bench(b) => with_pipeline(&b.run.common, |pl| bench(pl, &b)),
        Command::Tune(t) => with_pipeline(&t.common, |pl| crate::tune::tune(pl, &t)),
        Command::Db(d) => crate::tune::db_command(&d).map_err(|e| match e {
            Error::Input(d) => Fail::Input(texc_grammar::diagnostic::render_all(&d, &Default::default())),
            Error::Usage(m) => Fail::Usage(m),
        }),
        Command::Compile { common, output } => with_pipeline(&common, |pl| compile_aot(pl, &common, output.as_deref())),
        Command::Analyze { common, plot, as_written } => {
            with_pipeline(&common, |pl| analyze(pl, &common, plot.as_deref(), as_written))
        }
        Command::Targets => targets(),
    };
    match result {
        Ok(()) => 0,
        Err(Fail::Input(text)) => {
            eprint!("{text}");
            1
        }
        Err(Fail::Usage(msg)) => {
            eprintln!("error: {msg}");
            2
        }
    }
}

/// `texc targets`: one line per target, then the caches and cores of each
/// CPU target (where they come from: nominal, the machine, `TEXC_HOST_CACHES`).
fn targets() -> Result<(), Fail> {
    use texc_compiler::target::{self, CacheSource};
    target::host_caches().map_err(|e| Fail::Usage(e.to_string()))?;
    let width = target::all().iter().map(|t| t.name.len()).max().unwrap_or(0);
    for t in target::all() {
        let backend = t.backend().map_or("none yet", |b| b.name());
        let runs = match t.check_runs_here() {
            Ok(()) => "runs here".to_string(),
            Err(e) => {
                let e = e.to_string();
                let why = e.split_once(": ").map_or(e.as_str(), |(_, why)| why);
                why.split(';').next().unwrap_or(why).to_string()
            }
        };
        let runs = if t.backend().is_ok() { runs } else { "not built yet".to_string() };
        outln!("{:<width$} {:<10} {:>4}-bit  {}  [{runs}]", t.name, backend, t.vector_bits, t.summary);
        if let Some(c) = t.caches {
            let whence = match c.source {
                CacheSource::Nominal => "nominal: the same on every machine",
                CacheSource::Machine => "read from this machine",
                CacheSource::Fallback => "this machine's caches were unreadable: nominal caches, its cores",
                CacheSource::Env => "TEXC_HOST_CACHES",
            };
            outln!("{:<width$} caches {} ({whence})", "", c.describe());
        }
    }
    Ok(())
}

/// Build the pipeline a command asks for, run `body` on it, and render its
/// errors with its sources; `--time-passes` prints the table at the end.
fn with_pipeline(c: &Common, body: impl FnOnce(&mut Pipeline) -> Result<(), Error>) -> Result<(), Fail> {
    let mut pl = Pipeline::new(options(c)?);
    let result = body(&mut pl);
    if c.time_passes {
        eprint!("{}", pl.timing_table());
    }
    result.map_err(|e| match e {
        Error::Input(d) => Fail::Input(pl.render(&d)),
        Error::Usage(m) => Fail::Usage(m),
    })
}

fn options(c: &Common) -> Result<Options, Fail> {
    // Settings from the environment are checked once, here, like flags.
    texc_runtime::pool::threads_from_env().map_err(Fail::Usage)?;
    texc_runtime::roofline::roofline_from_env().map_err(Fail::Usage)?;
    let target = texc_pipeline::target(&c.target)?;
    // A target texc describes but cannot compile for is refused here, once, for every command.
    target.backend().map_err(|e| Fail::Usage(e.to_string()))?;
    let mut o = Options::from_env(target).map_err(Fail::Usage)?;
    if let Some(spec) = &c.dump_ir {
        o.dump = Dump::parse(spec).map_err(|e| Fail::Usage(format!("--dump-ir: {e}")))?;
    }
    o.verify |= c.verify_ir;
    o.time_passes = c.time_passes;
    // A command prepares one run: a model's weights move into its arguments.
    o.consume_weights = true;
    if c.no_cache {
        texc_codegen::cache::disable();
    }
    o.model_dims = parse_ints("--dim", &c.dim)?;
    if !c.dim.is_empty() && !texc_pipeline::is_onnx_file(&c.file) {
        return Err(Fail::Usage(
            "--dim sizes an ONNX model's symbolic dimensions; use --shape for a .tex kernel".into(),
        ));
    }
    o.rewrite = !c.no_rewrite;
    o.exact = c.exact;
    if let Some(t) = c.tolerance {
        if !(t.is_finite() && t > 0.0 && t < 1.0) {
            return Err(Fail::Usage(format!("--tolerance {t}: expected a relative error between 0 and 1, like 1e-4")));
        }
        o.tolerance = Some(t);
    }
    if let Some(m) = &c.max_memory {
        let bytes = texc_runtime::memory::parse_size(m)
            .ok_or_else(|| Fail::Usage(format!("--max-memory {m}: expected a size like 512M, 8G or 1000000")))?;
        o.max_memory = Some(bytes);
    }
    for (name, value) in parse_ints("--knob", &c.knob)? {
        if let Some((_, values)) = texc_pipeline::PIPELINE_KNOBS.iter().find(|(n, _)| *n == name) {
            if !values.contains(&value) {
                let list: Vec<String> = values.iter().map(|v| v.to_string()).collect();
                return Err(Fail::Usage(format!("--knob {name}={value}: expected one of {}", list.join(", "))));
            }
        }
        o.knobs.insert(name, value);
    }
    Ok(o)
}

pub(crate) fn usage(m: impl Into<String>) -> Error {
    Error::Usage(m.into())
}

/// Parse `A=1,B=2` lists (repeatable flags) into pairs; a name given twice is an error.
fn parse_pairs(flag: &str, values: &[String]) -> Result<Vec<(String, String)>, Error> {
    let mut out: Vec<(String, String)> = Vec::new();
    for v in values {
        for part in v.split(',').filter(|p| !p.trim().is_empty()) {
            let Some((n, x)) = part.split_once('=') else {
                return Err(usage(format!("{flag}: expected NAME=VALUE, found `{part}`")));
            };
            let (n, x) = (n.trim(), x.trim());
            if n.is_empty() || x.is_empty() {
                return Err(usage(format!("{flag}: expected NAME=VALUE, found `{part}`")));
            }
            if let Some((_, first)) = out.iter().find(|(m, _)| m == n) {
                return Err(usage(format!("{flag}: `{n}` is given twice (`{n}={first}` and `{n}={x}`)")));
            }
            out.push((n.to_string(), x.to_string()));
        }
    }
    Ok(out)
}

pub(crate) fn parse_ints(flag: &str, values: &[String]) -> Result<Vec<(String, i64)>, Error> {
    parse_pairs(flag, values)?
        .into_iter()
        .map(|(n, v)| match v.parse::<i64>() {
            Ok(x) => Ok((n, x)),
            Err(_) => Err(usage(format!("{flag}: `{n}={v}`: `{v}` is not an integer"))),
        })
        .collect()
}

pub(crate) fn bindings(c: &Common) -> Result<Bindings, Error> {
    let shapes = parse_ints("--shape", &c.shape)?;
    if let Some((n, v)) = shapes.iter().find(|(_, v)| *v < 0) {
        return Err(usage(format!("--shape: `{n}={v}`: a size cannot be negative")));
    }
    Ok(Bindings { shapes, consts: parse_ints("--const", &c.consts)?, input_shapes: HashMap::new() })
}

/// Load the file and pick the kernel.
pub(crate) fn kernel(pl: &mut Pipeline, c: &Common) -> Result<KernelRef, Error> {
    let m = pl.load(&c.file)?;
    pl.kernel(m, c.kernel.as_deref())
}

/// Sizes as `N=4, M=8`.
fn sizes_of(p: &texc_compiler::tir::Program) -> String {
    p.bindings.iter().map(|(n, v)| format!("{n}={v}")).collect::<Vec<_>>().join(", ")
}

/// `--kernel`, `--shape` and `--const` are misuse with a `.loops` file: it names its kernel and sizes itself.
fn no_sizes_for_loops(c: &Common) -> Result<(), Error> {
    if c.kernel.is_some() || !c.shape.is_empty() || !c.consts.is_empty() {
        return Err(usage(format!(
            "{}: a .loops file names its kernel and sizes itself (--kernel, --shape and --const do not apply)",
            c.file.display()
        )));
    }
    Ok(())
}

fn check(pl: &mut Pipeline, c: &Common) -> Result<(), Error> {
    if texc_pipeline::is_loops_file(&c.file) {
        no_sizes_for_loops(c)?;
        let lf = pl.load_loops(&c.file)?;
        let oracle = match &lf.oracle {
            Some(p) => format!("it has the parameters of kernel `{}` at [{}]", p.name, sizes_of(p)),
            None => "it has no `source` line, so no kernel to be checked against".to_string(),
        };
        outln!("ok: loop nest `{}` read: every access proven in bounds; {oracle}", lf.lowered.p.name);
        return Ok(());
    }
    let b = bindings(c)?;
    let m = pl.load(&c.file)?;
    let kernels: Vec<KernelRef> = match &c.kernel {
        Some(k) => vec![pl.kernel(m, Some(k))?],
        None => {
            (0..pl.session.module(m).kernels.len()).map(|i| KernelRef { module: m as u32, index: i as u32 }).collect()
        }
    };
    let checked = texc_pipeline::check::check(pl, &kernels, &b)?;
    // Warnings do not fail the check; they go where errors go.
    eprint!("{}", pl.render(&checked.warnings));
    outp!("{}", checked.summary());
    Ok(())
}

fn emit(pl: &mut Pipeline, c: &Common, stage: &str) -> Result<(), Error> {
    if texc_pipeline::is_loops_file(&c.file) && texc_pipeline::emit::STAGES.contains(&stage) {
        no_sizes_for_loops(c)?;
    }
    let b = bindings(c)?;
    let r = texc_pipeline::emit::EmitRequest { file: &c.file, kernel: c.kernel.as_deref(), bindings: &b, stage };
    outp!("{}", pl.emit(&r)?);
    Ok(())
}

/// Every `--output NAME=PATH` must be writable before any work starts (a
/// long run should not end in "cannot write"): the path is not a directory,
/// and what it names can be written as outputs are
/// ([`texc_runtime::atomic::check_writable`]: a file can be created beside a
/// file or new path; a FIFO or device is written through; anything else is
/// refused).
fn check_output_paths(outputs: &[(String, String)]) -> Result<(), Error> {
    for (n, path) in outputs {
        let p = Path::new(path);
        let fail = |why: String| Error::from(Diagnostic::error(format!("--output {n}={path}: {why}")));
        if p.is_dir() {
            return Err(fail(format!(
                "{path} is a directory; give a file name, like {}",
                p.join(format!("{n}.npy")).display()
            )));
        }
        texc_runtime::atomic::check_writable(p).map_err(|e| fail(e.to_string()))?;
    }
    Ok(())
}

/// `emit --stage ast --spans`: the AST with the byte span of every node.
fn emit_spanned(pl: &mut Pipeline, c: &Common, stage: &str) -> Result<(), Error> {
    if stage != "ast" {
        return Err(usage(format!("--spans shows source spans in `--stage ast`, not in `--stage {stage}`")));
    }
    let m = pl.load(&c.file)?;
    outp!("{}", texc_grammar::print::print_ast_spanned(&pl.session.module(m).ast));
    Ok(())
}

/// Tensor files and scalar values of a run, read and parsed.
/// `--input FILE.npz` and `--output FILE.npz` (no `NAME=`) stand for every
/// array the archive holds, or every output; they come back as pairs with an
/// empty name.
fn run_inputs(
    r: &RunArgs,
    budget: u64,
) -> Result<(HashMap<String, Tensor>, Vec<(String, f64)>, Vec<(String, String)>), Error> {
    let is_npz = |v: &&String| !v.contains('=') && v.ends_with(".npz");
    let split = |values: &[String]| -> (Vec<String>, Vec<String>) {
        let (npz, pairs): (Vec<&String>, Vec<&String>) = values.iter().partition(is_npz);
        (npz.into_iter().cloned().collect(), pairs.into_iter().cloned().collect())
    };
    let (input_npz, input_pairs) = split(&r.input);
    let (output_npz, output_pairs) = split(&r.output);
    let inputs = parse_pairs("--input", &input_pairs)?;
    let mut outputs = parse_pairs("--output", &output_pairs)?;
    outputs.extend(output_npz.into_iter().map(|f| (String::new(), f)));
    let mut scalars = Vec::new();
    for (n, text) in parse_pairs("--scalar", &r.scalar)? {
        let v = text.parse::<f64>().map_err(|_| usage(format!("--scalar: `{n}={text}`: `{text}` is not a number")))?;
        scalars.push((n, v));
    }
    if let Some((n, _)) = inputs.iter().find(|(n, _)| scalars.iter().any(|(m, _)| m == n)) {
        return Err(usage(format!("`{n}` is given both as --input and as --scalar")));
    }
    let mut files = HashMap::new();
    for (n, path) in &inputs {
        let t = if path.ends_with(".npz") {
            // `A=f.npz`: the array named `A` in the archive.
            let arrays = texc_runtime::read_npz_limited(Path::new(path), budget)
                .map_err(|e| Diagnostic::error(format!("input `{n}`: {e}")))?;
            let names: Vec<&str> = arrays.iter().map(|(m, _)| m.as_str()).collect();
            let note = format!("{path} holds {}", if names.is_empty() { "no arrays".into() } else { names.join(", ") });
            let found = arrays.iter().find(|(m, _)| m == n).map(|(_, t)| t.clone());
            found.ok_or_else(|| Diagnostic::error(format!("input `{n}`: {path} has no array `{n}`")).with_note(note))?
        } else {
            texc_runtime::read_npy_limited(&PathBuf::from(path), budget)
                .map_err(|e| Diagnostic::error(format!("input `{n}`: {e}")))?
        };
        files.insert(n.clone(), t);
    }
    for path in &input_npz {
        let arrays =
            texc_runtime::read_npz_limited(Path::new(path), budget).map_err(|e| Diagnostic::error(e.to_string()))?;
        for (n, t) in arrays {
            if files.contains_key(&n) || scalars.iter().any(|(m, _)| *m == n) {
                return Err(usage(format!("`{n}` is given twice (by {path} and by another --input or --scalar)")));
            }
            files.insert(n, t);
        }
    }
    Ok((files, scalars, outputs))
}

/// Every named `--output` must be an output of `p`: by its name or, for an
/// ONNX model, by its ONNX name (`191` as well as `t_191`). The outputs
/// with the kernel's names; an error listing the names there are otherwise.
fn check_output_names(
    pl: &Pipeline,
    p: &texc_compiler::tir::Program,
    outputs: &[(String, String)],
) -> Result<Vec<(String, String)>, Error> {
    let names: Vec<&str> = p.outputs.iter().map(|&o| p.tensor(o).name.as_str()).collect();
    let mut out = Vec::new();
    for (n, path) in outputs {
        let ident =
            if n.is_empty() || names.contains(&n.as_str()) { Some(n.as_str()) } else { pl.model_ident(n, true) };
        let Some(ident) = ident.filter(|i| i.is_empty() || names.contains(i)) else {
            let listed: Vec<String> = names
                .iter()
                .map(|&i| match pl.model_output_name(i) {
                    onnx if onnx != i => format!("`{onnx}` (or `{i}`)"),
                    _ => format!("`{i}`"),
                })
                .collect();
            return Err(Diagnostic::error(format!("`{n}` is not an output of kernel `{}`", p.name))
                .with_note(format!("its outputs: {}", listed.join(", ")))
                .into());
        };
        out.push((ident.to_string(), path.clone()));
    }
    Ok(out)
}

/// The names of `p`'s outputs as a run shows them: an ONNX model's as the
/// model names them (`191`, not `t_191`).
fn shown_outputs(pl: &Pipeline, p: &texc_compiler::tir::Program) -> Vec<String> {
    p.outputs.iter().map(|&o| pl.model_output_name(&p.tensor(o).name).to_string()).collect()
}

/// Write `--output` files: `.npy` for one output, `.npz` for one (`Y=f.npz`)
/// or all (`f.npz`); an archive names each array as the model does where
/// the kernel is an ONNX model's. Returns the lines that say what was written.
fn write_outputs(
    pl: &Pipeline,
    p: &texc_compiler::tir::Program,
    results: &[Tensor],
    outputs: &[(String, String)],
) -> Result<Vec<String>, Error> {
    let mut said = Vec::new();
    let fail = |e: texc_runtime::NpyError| Error::from(Diagnostic::error(e.to_string()));
    for (n, path) in outputs {
        let named: Vec<(&str, &Tensor)> = p
            .outputs
            .iter()
            .zip(results)
            .map(|(&o, t)| (p.tensor(o).name.as_str(), t))
            .filter(|(name, _)| n.is_empty() || name == n)
            .map(|(name, t)| (pl.model_output_name(name), t))
            .collect();
        if path.ends_with(".npz") {
            texc_runtime::write_npz(Path::new(path), &named).map_err(fail)?;
        } else {
            write_npy(Path::new(path), named[0].1).map_err(fail)?;
        }
        let names: Vec<String> = named.iter().map(|(name, _)| format!("`{name}`")).collect();
        said.push(format!("wrote {} to {path}", names.join(", ")));
    }
    Ok(said)
}

/// What `run` and `bench` execute: a kernel of a `.tex` file, or a loop
/// nest of a `.loops` file (run against the kernel its `source` line names).
struct Job {
    /// Parameters, outputs and sizes of the run, its FLOPs and bytes, and
    /// what `--check` interprets: the kernel as written, or the nest's oracle
    /// (without one, the nest's own declarations, which cannot be interpreted).
    p: texc_compiler::tir::Program,
    /// The legal loop nest, for compiled targets.
    legal: Option<texc_schedules::LoopFunc>,
    /// A `.loops` nest on `interp`: run by the loop evaluator.
    evaluate: Option<texc_schedules::LoopFunc>,
    /// Arguments of `p` (what the interpreter runs).
    args: Vec<texc_compiler::interp::Arg>,
    /// Arguments of `legal` when they differ from `args`: for a model, the
    /// weights its constant stages did not consume and the constants they computed.
    run_args: Option<Vec<texc_compiler::interp::Arg>>,
    /// The program that runs is a rewritten plan, not the one written.
    rewritten: bool,
    /// The e-graph's plan that runs, where it chose one.
    plan: Option<texc_schedules::tuning::db::PlanRun>,
}

impl Job {
    /// The arguments of `legal`, in its parameter order.
    fn compiled_args(&self) -> &[texc_compiler::interp::Arg] {
        self.run_args.as_deref().unwrap_or(&self.args)
    }

    /// [`Job::compiled_args`], taken (for a run that interprets nothing).
    fn take_compiled_args(&mut self) -> Vec<texc_compiler::interp::Arg> {
        self.run_args.take().unwrap_or_else(|| std::mem::take(&mut self.args))
    }
}

fn prepare_job(
    pl: &mut Pipeline,
    r: &RunArgs,
    files: HashMap<String, Tensor>,
    scalars: &[(String, f64)],
) -> Result<Job, Error> {
    let c = &r.common;
    if texc_pipeline::is_loops_file(&c.file) {
        no_sizes_for_loops(c)?;
        let lf = pl.load_loops(&c.file)?;
        let args = pl.prepare_loops(&lf, files, scalars, r.seed, r.check)?;
        let evaluate = lf.legal.is_none().then(|| lf.lowered.clone());
        let p = lf.oracle.clone().unwrap_or(lf.lowered.p);
        return Ok(Job { p, legal: lf.legal, evaluate, run_args: None, args, rewritten: false, plan: None });
    }
    let k = kernel(pl, c)?;
    let b = bindings(c)?;
    crate::tune::apply_tuned_knobs(pl, c, k, &b)?;
    let prep = pl.prepare(k, &b, files, scalars, r.seed, r.check)?;
    if let Some(why) = prep.built.kept_original.as_ref().filter(|w| *w != "no cheaper plan") {
        eprintln!("note: {why}; running the graph as written");
    }
    let rewritten = prep.built.runs.name != prep.built.written.name || prep.built.plan.is_some();
    let plan = prep.built.plan_run();
    Ok(Job {
        plan,
        p: prep.built.written,
        legal: prep.legal,
        evaluate: None,
        args: prep.args,
        run_args: prep.run_args,
        rewritten,
    })
}

/// `--emulate-gpu`: GPU kernels run on this CPU (a GPU target only).
fn set_emulation(pl: &mut Pipeline, r: &RunArgs) -> Result<(), Error> {
    let t = pl.target();
    if r.emulate_gpu && t.kind != texc_compiler::target::TargetKind::Gpu {
        return Err(usage(format!("--emulate-gpu: target `{t}` is not a GPU")));
    }
    pl.options.emulate_gpu = r.emulate_gpu;
    Ok(())
}

fn run_kernel(pl: &mut Pipeline, r: &RunArgs) -> Result<(), Error> {
    set_emulation(pl, r)?;
    let c = &r.common;
    let t = pl.target();
    if r.check {
        pl.require_compiled("--check compares a compiled target with `interp`:")?;
    }
    let (files, scalars, outputs) = run_inputs(r, pl.options.memory_budget())?;
    check_output_paths(&outputs)?;
    let mut job = {
        let _busy = crate::progress::Activity::spinner(format!("preparing {} for {t}", c.file.display()));
        prepare_job(pl, r, files, &scalars)?
    };
    if r.check {
        reduced_precision_tolerance(pl, &job);
    }
    // Taken, not copied: a model's program is held once while it runs.
    let p = &std::mem::take(&mut job.p);
    let outputs = check_output_names(pl, p, &outputs)?;
    let sizes: Vec<String> = p.bindings.iter().map(|(n, v)| format!("{n}={v}")).collect();
    let results = match (job.legal.take(), &job.evaluate) {
        (None, Some(nest)) => {
            let _busy = crate::progress::Activity::spinner(format!("evaluating the loop nest of `{}`", p.name));
            pl.evaluate(nest, job.args.clone())?
        }
        (None, None) => crate::progress::interpret(p, job.args.clone(), &format!("interpreting `{}`", p.name))?,
        (Some(legal), _) => {
            let compiled = {
                let _busy = crate::progress::Activity::spinner(format!("compiling `{}` for {t}", p.name));
                pl.compile(&legal)?
            };
            // The loop nests are compiled: their memory goes before the run's.
            drop(legal);
            crate::heap::return_freed_memory();
            outln!("compiled `{}` for {t} in {:.3} s", p.name, compiled.compile_time.as_secs_f64());
            let _busy = crate::progress::Activity::spinner(format!("running `{}` on {t}", p.name));
            let run = if r.check {
                compiled.run_from(job.compiled_args())
            } else {
                // Nothing else reads the arguments: each is freed once copied.
                compiled.run(job.take_compiled_args())
            };
            run.map_err(|e| Diagnostic::error(e.to_string()))?
        }
    };
    outln!("ran `{}` on {t} [{}]", p.name, sizes.join(", "));
    for (name, x) in shown_outputs(pl, p).iter().zip(&results) {
        outln!("  {}", summary(name, x));
    }
    for line in write_outputs(pl, p, &results, &outputs)? {
        outln!("  {line}");
    }
    if r.check {
        let want = crate::progress::interpret(p, job.args, &format!("checking `{}` on the interpreter", p.name))?;
        let names = shown_outputs(pl, p);
        let mut bad = Vec::new();
        for ch in texc_pipeline::oracle::compare(&names, &results, &want, pl.options.tolerance) {
            outln!(
                "  check `{}` against interp: relative error {:.3e} (max |Δ| / max |exact|; tolerance {:e})",
                ch.name,
                ch.error,
                ch.tolerance
            );
            if !ch.passed() {
                bad.push(Diagnostic::error(format!(
                    "`{}` differs from the interpreter: relative error {:.3e} > {:e}",
                    ch.name, ch.error, ch.tolerance
                )));
            }
        }
        if !bad.is_empty() {
            return Err(Error::Input(bad));
        }
    }
    Ok(())
}

/// Relative error `--check` accepts of TF32 tensor cores, and of outputs
/// computed through half-precision values, when `--tolerance` is not given.
const REDUCED_TOLERANCE: f64 = 1e-2;

/// A kernel on TF32 tensor cores, or one whose values pass through f16 or
/// bf16 on the way to an f32 output, is checked against the tolerance of
/// that rounding (10 or 8 bits of mantissa), not f32's, unless
/// `--tolerance` says otherwise.
fn reduced_precision_tolerance(pl: &mut Pipeline, job: &Job) {
    if pl.options.tolerance.is_some() {
        return;
    }
    let nest = job.legal.as_ref().or(job.evaluate.as_ref());
    let why = if nest.is_some_and(texc_schedules::ir::rounds_to_tf32) {
        "TF32 tensor cores round their inputs to 10 bits of mantissa"
    } else if texc_pipeline::oracle::rounds_to_half(&job.p) {
        "values pass through f16 or bf16, which compiled code rounds after every operation and the interpreter \
         where they are stored"
    } else {
        return;
    };
    eprintln!("note: {why}: checked with tolerance {REDUCED_TOLERANCE:e} (--tolerance sets another)");
    pl.options.tolerance = Some(REDUCED_TOLERANCE);
}

/// The roofline for a target: the pool's threads, but no more than the
/// cores (more threads share them and compute no more). Returns the
/// thread count the roofline is for.
/// Compare outputs with the interpreter's: every check, and an error for each that failed.
fn check_outputs(
    pl: &Pipeline,
    p: &texc_compiler::tir::Program,
    got: &[Tensor],
    want: &[Tensor],
) -> (Vec<texc_pipeline::oracle::OutputCheck>, Vec<Diagnostic>) {
    let names = shown_outputs(pl, p);
    let checks = texc_pipeline::oracle::compare(&names, got, want, pl.options.tolerance);
    let bad = checks
        .iter()
        .filter(|ch| !ch.passed())
        .map(|ch| {
            Diagnostic::error(format!(
                "`{}` differs from the interpreter: relative error {:.3e} > {:e}",
                ch.name, ch.error, ch.tolerance
            ))
        })
        .collect();
    (checks, bad)
}

/// A tuning worker, compiled: says so on standard output and waits for a
/// line on standard input (its turn to time, on an otherwise idle machine).
/// The tuner's `go` may carry a limit in ms (`go 530.5`): a candidate
/// whose first run takes longer is measured by that run alone.
fn wait_for_turn() -> Result<Option<f64>, Error> {
    use std::io::{BufRead, Write};
    let mut stdout = std::io::stdout();
    let said = writeln!(stdout, "compiled").and_then(|()| stdout.flush());
    let mut line = String::new();
    match said.and_then(|()| std::io::stdin().lock().read_line(&mut line)) {
        Ok(n) if n > 0 => Ok(line.split_whitespace().nth(1).and_then(|l| l.parse::<f64>().ok())),
        Ok(_) => Err(Diagnostic::error("the tuner went away before this candidate's turn").into()),
        Err(e) => Err(Diagnostic::error(format!("talking to the tuner: {e}")).into()),
    }
}

/// One loop nest's line of `bench --profile`.
struct NestTime {
    nest: usize,
    label: String,
    parallel: bool,
    /// Median seconds.
    median: f64,
    /// What the nest's code executes (`texc_schedules::work`).
    work: texc_schedules::work::Work,
}

impl NestTime {
    /// Operations a second: float ones, or (`integer`, a kernel rated in
    /// operations) float and integer ones; none where the nest only moves data.
    fn rate(&self, integer: bool) -> Option<f64> {
        let ops = self.work.flops + if integer { self.work.int_ops } else { 0.0 };
        (ops > 0.0 && self.median > 0.0).then(|| ops / self.median)
    }
}

/// `bench --profile`: each top-level loop nest of `f` compiled alone and
/// timed in program order on the whole kernel's buffers, `--warmup` and
/// `--repeat` rounds of all of them; slowest first.
fn profile_nests(
    pl: &Pipeline,
    f: &texc_schedules::LoopFunc,
    compiled: &texc_codegen::Compiled,
    bufs: &mut texc_codegen::Buffers,
    a: &BenchArgs,
) -> Result<Vec<NestTime>, Error> {
    let parts = {
        let _busy = crate::progress::Activity::spinner(format!(
            "compiling the {} loop nests of `{}` one by one",
            f.body.len(),
            f.p.name
        ));
        pl.compile_nests(f, compiled)?
    };
    let mut times = vec![Vec::with_capacity(a.repeat); parts.len()];
    let _ = crate::progress::timed_runs(a.warmup, a.repeat, || {
        for (part, ts) in parts.iter().zip(times.iter_mut()) {
            let start = std::time::Instant::now();
            part.call(bufs);
            ts.push(start.elapsed().as_secs_f64());
        }
    });
    let mut rows: Vec<NestTime> = parts
        .into_iter()
        .zip(times)
        .enumerate()
        .map(|(nest, (part, ts))| {
            // The warm-up rounds are timed too; only the last `repeat` count.
            let ts = &ts[ts.len() - a.repeat..];
            let median = crate::report::Stats::of(ts).median;
            let work = texc_schedules::work::executed(f, &f.body[nest]);
            NestTime { nest, label: part.label, parallel: part.parallel, median, work }
        })
        .collect();
    rows.sort_by(|x, y| y.median.total_cmp(&x.median).then(x.nest.cmp(&y.nest)));
    Ok(rows)
}

/// The table of `bench --profile`: slowest nest first, with its share of
/// the nests' sum and the rate its code executes at (G`op`/s, and its
/// share of the `peak`), blank for nests that compute nothing (copies).
fn print_profile(rows: &[NestTime], repeat: usize, (op, integer, peak): (&str, bool, f64)) {
    let total: f64 = rows.iter().map(|r| r.median).sum();
    outln!(
        "  profile   {} loop nests, each timed alone (median of {repeat} runs): {:.4} ms in all; G{op}/s executed by each nest's code",
        rows.len(),
        total * 1e3
    );
    outln!(
        "            {:>10}  {:>6}  {:>8}  {:>5}  {:>5}  loop nest (what it writes)",
        "ms",
        "share",
        format!("G{op}/s"),
        "peak",
        "nest"
    );
    for r in rows {
        let share = if total > 0.0 { 100.0 * r.median / total } else { 0.0 };
        let par = if r.parallel { "  [parallel]" } else { "" };
        let (rate, of_peak) = match r.rate(integer) {
            Some(x) => (format!("{:.2}", x / 1e9), format!("{:.0}%", 100.0 * x / 1e9 / peak)),
            None => (String::new(), String::new()),
        };
        outln!(
            "            {:>10.4}  {share:>5.1}%  {rate:>8}  {of_peak:>5}  {:>5}  {}{par}",
            r.median * 1e3,
            format!("#{}", r.nest),
            r.label
        );
    }
}

fn bench(pl: &mut Pipeline, a: &BenchArgs) -> Result<(), Error> {
    use crate::report::{Json, Limit, Stats};
    if a.run.emulate_gpu {
        return Err(usage(
            "--emulate-gpu: `bench` times code on its target; the CPU emulation's times say nothing about a GPU \
             (use `run --emulate-gpu --check` to check GPU kernels)",
        ));
    }
    let t = pl.target();
    pl.require_compiled("`texc bench` times compiled code:")?;
    const MAX_RUNS: usize = 1_000_000;
    if a.repeat == 0 || a.repeat > MAX_RUNS {
        return Err(usage(format!("--repeat {}: expected 1 to {MAX_RUNS} timed runs", a.repeat)));
    }
    if a.warmup > MAX_RUNS {
        return Err(usage(format!("--warmup {}: expected at most {MAX_RUNS} runs", a.warmup)));
    }
    if let Some(n) = a.threads {
        texc_runtime::pool::set_num_threads(n).map_err(|e| usage(format!("--threads {n}: {e}")))?;
    }
    if a.run.check {
        pl.require_compiled("--check compares a compiled target with `interp`:")?;
    }
    // FLOPs and bytes are those of the program as written (a rewritten plan,
    // e.g. Winograd, is credited with the work it replaces: effective rates).
    let (files, scalars, outputs) = run_inputs(&a.run, pl.options.memory_budget())?;
    check_output_paths(&outputs)?;
    let mut job = prepare_job(pl, &a.run, files, &scalars)?;
    // The arguments the compiled code reads (weights, as folded): with the
    // arena, the memory a model's run needs by its plan.
    let argument_bytes: usize = job
        .compiled_args()
        .iter()
        .map(|arg| match arg {
            texc_compiler::interp::Arg::Tensor(t) => t.bytes().len(),
            texc_compiler::interp::Arg::Scalar(_) => 0,
        })
        .sum();
    // Without `--check` nothing reads the arguments after they are copied
    // into the run's buffers: each is freed as it is copied (a model's
    // weights held once, not twice).
    let owned_args = (!a.run.check).then(|| job.take_compiled_args());
    let p = &job.p;
    let outputs = check_output_names(pl, p, &outputs)?;
    let compiled = {
        let _busy = crate::progress::Activity::spinner(format!("compiling `{}` for {t}", p.name));
        pl.compile(job.legal.as_ref().expect("a compiled target"))?
    };
    crate::heap::return_freed_memory();
    // Before its buffers (on a GPU, its device memory) exist: the batch's
    // other workers wait here too.
    let limit_ms = if a.wait_to_time { wait_for_turn()? } else { None };
    let bufs = match owned_args {
        Some(args) => compiled.prepare(args),
        None => compiled.prepare_from(job.compiled_args()),
    };
    let mut bufs = bufs.map_err(|e| Diagnostic::error(e.to_string()))?;
    // One call first: a kernel that cannot run (a GPU launch refused) fails here, before timing.
    let first = std::time::Instant::now();
    compiled.call(&mut bufs)?;
    let first = first.elapsed().as_secs_f64();
    // A candidate far slower than the tuner's best is timed no further:
    // its warm-up and runs would take the tuning budget (a 2048³ product
    // at 7 s a run, against 0.18 s).
    let cut_short = limit_ms.is_some_and(|l| first * 1e3 > l);
    let (warmup, repeat) = if cut_short { (0, 1) } else { (a.warmup, a.repeat) };
    let mut failed = None;
    let times = match cut_short {
        true => vec![first],
        false => crate::progress::timed_runs(a.warmup, a.repeat, || {
            if let Err(e) = compiled.call(&mut bufs) {
                failed.get_or_insert(e);
            }
        }),
    };
    if let Some(e) = failed {
        return Err(e.into());
    }
    let st = Stats::of(&times);
    // What the timed runs left in the outputs is what is checked and written:
    // a kernel that is wrong when called again is caught too.
    let results = compiled.outputs(&bufs)?;
    let profile = match a.profile {
        true => Some(profile_nests(pl, job.legal.as_ref().expect("a compiled target"), &compiled, &mut bufs, a)?),
        false => None,
    };
    let counts = texc_compiler::cost::count(p);
    // A kernel of integer arithmetic mostly (a quantized product with its
    // float requantization) is rated in operations, integer and float,
    // against the target's 8-bit product peak (`Target::int8_speedup` times the f32 one).
    let integer = counts.int_ops > counts.flops;
    let counts = match integer {
        true => texc_compiler::cost::Counts { flops: counts.int_ops + counts.flops, ..counts },
        false => counts,
    };
    let (op, int8) = if integer { ("OP", t.int8_speedup()) } else { ("FLOP", 1.0) };
    let pool_threads = texc_runtime::pool::num_threads();
    let m = pl.machine();
    let (mut roof, mut source, threads) = (m.roofline, m.source, m.threads);
    roof.peak_gflops *= int8;
    let gflops = counts.flops / st.median / 1e9;
    let gbs = counts.bytes / st.median / 1e9;
    let mut notes = Vec::new();
    let beats = |r: &texc_runtime::roofline::Roofline| gflops > r.peak_gflops || gbs > r.bandwidth_gbs;
    if beats(&roof) && matches!(source, "cached" | "measured") {
        // The machine numbers are measured on a machine others share: a low
        // measurement is found out by a kernel that beats it, and measured again.
        let lanes = t.lanes(texc_compiler::types::ElemType::F32) as usize;
        notes.push(format!(
            "`{}` ran faster than the {source} roofline ({:.1} G{op}/s, {:.1} GB/s): measured it again",
            p.name, roof.peak_gflops, roof.bandwidth_gbs
        ));
        // The cache holds the f32 peak: the 8-bit rate is derived from it, never stored.
        let f32_roof = texc_runtime::roofline::Roofline { peak_gflops: roof.peak_gflops / int8, ..roof };
        roof = texc_runtime::roofline::remeasure(t.name, lanes, threads, f32_roof);
        roof.peak_gflops *= int8;
        source = "re-measured now";
    }
    // Each nest of `--profile` is rated by what its code executes, against
    // the machine's peak, not one a rewritten plan's credited rate raised.
    let machine_peak = roof.peak_gflops;
    // Still beaten: the bound does not hold for this kernel (its data stays in
    // cache, or a rewritten plan does less work than it is credited with); it
    // is reported against what it achieved, never above 100 %.
    if gflops > roof.peak_gflops {
        notes.push(format!(
            "{gflops:.1} G{op}/s is above the {source} peak {:.1} G{op}/s{}; the peak is taken as {gflops:.1}",
            roof.peak_gflops,
            if job.rewritten {
                " (rates count the FLOPs of the program as written; a rewritten plan may do fewer)"
            } else {
                ""
            }
        ));
        roof.peak_gflops = gflops;
    }
    if gbs > roof.bandwidth_gbs {
        notes.push(format!(
            "{gbs:.1} GB/s is above the {source} memory bandwidth {:.1} GB/s (its {:.2} MB stay in cache); the bandwidth is taken as {gbs:.1}",
            roof.bandwidth_gbs,
            counts.bytes / 1e6
        ));
        roof.bandwidth_gbs = gbs;
    }
    let limit = Limit::of(counts.flops, counts.intensity(), roof.ridge());
    let unit = if integer && limit == Limit::Compute { "GOP/s" } else { limit.unit() };
    let (achieved, bound) = match limit {
        Limit::Memory => (gbs, roof.bandwidth_gbs),
        Limit::Compute => (gflops, roof.peak_gflops),
    };
    let percent = 100.0 * achieved / bound;
    let check = if a.run.check {
        reduced_precision_tolerance(pl, &job);
        let want =
            crate::progress::interpret(p, job.args.clone(), &format!("checking `{}` on the interpreter", p.name))?;
        Some(check_outputs(pl, p, &results, &want))
    } else {
        None
    };
    let wrote = write_outputs(pl, p, &results, &outputs)?;
    for n in &notes {
        eprintln!("note: {n}");
    }
    let sizes: Vec<(String, i64)> = p.bindings.clone();
    if a.json {
        let ms = |x: f64| Json::Num(x * 1e3);
        let j = Json::obj([
            ("kernel", Json::str(&p.name)),
            ("target", Json::str(t.name)),
            ("sizes", Json::obj(sizes.iter().map(|(n, v)| (n.clone(), Json::Num(*v as f64))))),
            ("threads", Json::Num(pool_threads as f64)),
            ("roofline_threads", Json::Num(threads as f64)),
            ("compile_s", Json::Num(compiled.compile_time.as_secs_f64())),
            (
                "memory",
                Json::obj([
                    ("argument_bytes", Json::Num(argument_bytes as f64)),
                    ("arena_bytes", Json::Num(compiled.arena_bytes() as f64)),
                ]),
            ),
            ("runs", Json::Num(repeat as f64)),
            ("warmup", Json::Num(warmup as f64)),
            ("time_ms", Json::obj(st.fields().map(|(n, v)| (n, ms(v))))),
            ("flops", Json::Num(if integer { counts.flops - counts.int_ops } else { counts.flops })),
            ("int_ops", Json::Num(counts.int_ops)),
            ("integer", Json::Bool(integer)),
            ("bytes", Json::Num(counts.bytes)),
            ("intensity", Json::Num(counts.intensity())),
            ("gflops", Json::Num(gflops)),
            ("gbs", Json::Num(gbs)),
            ("percent_of_peak", Json::Num(100.0 * gflops / roof.peak_gflops)),
            ("percent_of_bandwidth", Json::Num(100.0 * gbs / roof.bandwidth_gbs)),
            (
                "machine",
                Json::obj([
                    ("peak_gflops", Json::Num(roof.peak_gflops)),
                    ("bandwidth_gbs", Json::Num(roof.bandwidth_gbs)),
                    ("ridge", Json::Num(roof.ridge())),
                    ("source", Json::str(source)),
                ]),
            ),
            (
                "bound",
                Json::obj([
                    ("limit", Json::str(limit.name())),
                    ("value", Json::Num(bound)),
                    ("unit", Json::str(unit)),
                    ("percent", Json::Num(percent)),
                ]),
            ),
            (
                "check",
                match &check {
                    None => Json::Null,
                    Some((checks, _)) => Json::Arr(
                        checks
                            .iter()
                            .map(|c| {
                                Json::obj([
                                    ("output", Json::str(&c.name)),
                                    ("error", Json::Num(c.error)),
                                    ("tolerance", Json::Num(c.tolerance)),
                                    ("passed", Json::Bool(c.passed())),
                                ])
                            })
                            .collect(),
                    ),
                },
            ),
            ("written", Json::Arr(outputs.iter().map(|(_, path)| Json::str(path.as_str())).collect())),
            (
                "profile",
                profile.as_ref().map_or(Json::Null, |rows| {
                    Json::Arr(
                        rows.iter()
                            .map(|r| {
                                Json::obj([
                                    ("nest", Json::Num(r.nest as f64)),
                                    ("label", Json::str(&r.label)),
                                    ("parallel", Json::Bool(r.parallel)),
                                    ("median_ms", Json::Num(r.median * 1e3)),
                                    ("flops", Json::Num(r.work.flops)),
                                    ("int_ops", Json::Num(r.work.int_ops)),
                                    ("gops", r.rate(integer).map_or(Json::Null, |x| Json::Num(x / 1e9))),
                                ])
                            })
                            .collect(),
                    )
                }),
            ),
            ("notes", Json::Arr(notes.iter().map(|n| Json::str(n.as_str())).collect())),
            (
                "plan",
                job.plan.as_ref().map_or(Json::Null, |p| {
                    Json::obj([
                        ("ops", Json::Arr(p.ops.iter().map(|o| Json::str(o.as_str())).collect())),
                        ("estimated_ns", Json::Num(p.estimated_ns)),
                    ])
                }),
            ),
        ]);
        outln!("{j}");
    } else {
        let sizes: Vec<String> = sizes.iter().map(|(n, v)| format!("{n}={v}")).collect();
        let s = |n: usize| if n == 1 { "" } else { "s" };
        let cores = texc_runtime::pool::available_cores();
        let shared = if pool_threads > cores { format!(" sharing {cores} core{}", s(cores)) } else { String::new() };
        outln!("bench `{}` on {t} [{}], {pool_threads} thread{}{shared}", p.name, sizes.join(", "), s(pool_threads));
        outln!("  compile   {:.4} s", compiled.compile_time.as_secs_f64());
        outln!(
            "  time      {:.4} ms median of {} runs; mean {:.4} ± {:.4} (std dev), min {:.4}, p90 {:.4}, p99 {:.4}, max {:.4}",
            st.median * 1e3,
            times.len(),
            st.mean * 1e3,
            st.std_dev * 1e3,
            st.min * 1e3,
            st.p90 * 1e3,
            st.p99 * 1e3,
            st.max * 1e3
        );
        outln!(
            "  compute   {gflops:.2} G{op}/s ({:.4} G{op}{}), {:.1}% of peak {:.1} G{op}/s",
            counts.flops / 1e9,
            if integer { ", integer" } else { "" },
            100.0 * gflops / roof.peak_gflops,
            roof.peak_gflops
        );
        outln!(
            "  memory    {gbs:.2} GB/s ({:.2} MB compulsory), {:.1}% of {:.1} GB/s",
            counts.bytes / 1e6,
            100.0 * gbs / roof.bandwidth_gbs,
            roof.bandwidth_gbs
        );
        outln!(
            "  roofline  {percent:.1}% of the {} bound {bound:.1} {} ({}-bound at {:.2} {op}/byte; ridge {:.2}; machine numbers {source}, {threads} thread{})",
            limit.name(),
            unit,
            limit.name(),
            counts.intensity(),
            roof.ridge(),
            s(threads)
        );
        if let Some((checks, _)) = &check {
            for ch in checks {
                outln!(
                    "  check `{}` against interp: relative error {:.3e} (max |Δ| / max |exact|; tolerance {:e})",
                    ch.name,
                    ch.error,
                    ch.tolerance
                );
            }
        }
        for line in &wrote {
            outln!("  {line}");
        }
        if let Some(rows) = &profile {
            print_profile(rows, a.repeat, (op, integer, machine_peak));
        }
    }
    match check {
        Some((_, bad)) if !bad.is_empty() => Err(Error::Input(bad)),
        _ => Ok(()),
    }
}

/// `texc compile FILE -o out.o|out.so`: an object or shared library with
/// `int texc_<kernel>_run(...)` for each kernel compiled (`--kernel a,b`, or
/// every kernel of the file), and `out.h` declaring them.
/// The legal loop nests `texc compile` puts in one object: the kernels of
/// a `.tex` file (`--kernel a,b`, or all), or a `.loops` file's nest.
fn kernels_to_compile(pl: &mut Pipeline, c: &Common) -> Result<Vec<texc_schedules::LoopFunc>, Error> {
    if texc_pipeline::is_loops_file(&c.file) {
        no_sizes_for_loops(c)?;
        let lf = pl.load_loops(&c.file)?;
        return Ok(vec![lf.legal.expect("a compiled target")]);
    }
    let fail = |e: String| Error::from(Diagnostic::error(e));
    let m = pl.load(&c.file)?;
    let names: Vec<String> = match &c.kernel {
        Some(list) => list.split(',').map(|n| n.trim().to_string()).collect(),
        None => pl.session.module(m).kernels.iter().map(|k| k.name.clone()).collect(),
    };
    if names.iter().any(|n| n.is_empty()) {
        let list = c.kernel.as_deref().unwrap_or("");
        return Err(usage(format!("--kernel {list}: expected kernel names separated by commas, like `--kernel a,b`")));
    }
    if let Some(n) = names.iter().enumerate().find_map(|(i, n)| names[..i].contains(n).then_some(n)) {
        return Err(usage(format!("--kernel: `{n}` is given twice")));
    }
    let kernels = names.iter().map(|n| pl.kernel(m, Some(n))).collect::<Result<Vec<_>, _>>()?;
    let all = bindings(c)?;
    if let [k] = kernels[..] {
        crate::tune::apply_tuned_knobs(pl, c, k, &all)?;
    }
    let mut funcs = Vec::new();
    for &k in &kernels {
        let b = if kernels.len() == 1 {
            all.clone()
        } else {
            // Each kernel takes the sizes of its own symbols and constants.
            let info = pl.session.kernel(k);
            let own = |n: &String| info.symbol_index(n).is_some() || info.param_index(n).is_some();
            Bindings {
                shapes: all.shapes.iter().filter(|(n, _)| own(n)).cloned().collect(),
                consts: all.consts.iter().filter(|(n, _)| own(n)).cloned().collect(),
                input_shapes: HashMap::new(),
            }
        };
        funcs.push(pl.build(k, &b)?.1.legal);
    }
    if kernels.len() > 1 {
        let used = |n: &String| {
            kernels.iter().any(|&k| {
                let info = pl.session.kernel(k);
                info.symbol_index(n).is_some() || info.param_index(n).is_some()
            })
        };
        if let Some((n, _)) = all.shapes.iter().chain(&all.consts).find(|(n, _)| !used(n)) {
            return Err(fail(format!("`{n}` is not a size or constant of any of the kernels {}", names.join(", "))));
        }
    }
    Ok(funcs)
}

fn compile_aot(pl: &mut Pipeline, c: &Common, output: Option<&Path>) -> Result<(), Error> {
    let Some(out) = output else {
        return Err(usage("`texc compile` needs `-o out.o` or `-o out.so` (`-o out.ptx` or `-o out.cubin` for GPUs)"));
    };
    pl.require_compiled("`texc compile`")?;
    // What the output's name asks for is checked before anything compiles.
    pl.check_library_path(out)?;
    let funcs = kernels_to_compile(pl, c)?;
    let written = pl.write_library(&funcs, out)?;
    for note in &written.notes {
        outln!("{note}");
    }
    if pl.target().kind == texc_compiler::target::TargetKind::Gpu {
        outln!("wrote {} and {}", out.display(), written.header.display());
    } else {
        let entries: Vec<String> = funcs.iter().map(|f| format!("int texc_{}_run(...)", f.p.name)).collect();
        outln!("wrote {} and {} ({})", out.display(), written.header.display(), entries.join(", "));
    }
    Ok(())
}

fn analyze(pl: &mut Pipeline, c: &Common, plot: Option<&Path>, as_written: bool) -> Result<(), Error> {
    let t = pl.target();
    pl.require_compiled("`texc analyze` needs the machine of a target:")?;
    if let Some(path) = plot {
        if path.extension().and_then(|e| e.to_str()) != Some("svg") {
            return Err(usage(format!("--plot {}: the plot is an .svg file", path.display())));
        }
    }
    let k = kernel(pl, c)?;
    let a = pl.analyze(k, &bindings(c)?, as_written)?;
    let (p, roof) = (&a.program, a.machine.roofline);
    let sizes: Vec<String> = a.bindings.iter().map(|(n, v)| format!("{n}={v}")).collect();
    outln!("analyze `{}` for {t} [{}]", p.name, sizes.join(", "));
    outln!("  {}", a.plan);
    let whose = match t.kind {
        texc_compiler::target::TargetKind::Gpu => "the GPU's data sheet".to_string(),
        _ => {
            let threads = a.machine.threads;
            format!("{threads} thread{}, {}", if threads == 1 { "" } else { "s" }, a.machine.source)
        }
    };
    outln!(
        "  machine: {:.1} GFLOP/s peak, {:.1} GB/s, ridge {:.2} FLOP/byte ({whose})",
        roof.peak_gflops,
        roof.bandwidth_gbs,
        roof.ridge(),
    );
    outln!(
        "  {:<36} {:>12} {:>12} {:>9} {:>8} {:>12}",
        "operator",
        "MFLOP",
        "KB moved",
        "FLOP/B",
        "bound",
        "roofline µs"
    );
    let mut total_us = 0.0;
    for (label, cnt) in &a.ops {
        let us = (cnt.flops / (roof.peak_gflops * 1e3)).max(cnt.bytes / (roof.bandwidth_gbs * 1e3));
        total_us += us;
        let bound = if cnt.intensity() < roof.ridge() { "memory" } else { "compute" };
        outln!(
            "  {:<36} {:>12.3} {:>12.1} {:>9.2} {:>8} {:>12.2}",
            label,
            cnt.flops / 1e6,
            cnt.bytes / 1e3,
            cnt.intensity(),
            bound,
            us
        );
    }
    let all = a.total;
    let moved: f64 = a.ops.iter().map(|(_, c)| c.bytes).sum();
    outln!(
        "  {:<36} {:>12.3} {:>12.1} {:>9.2} {:>8} {:>12.2}",
        "total (operators run one by one)",
        all.flops / 1e6,
        moved / 1e3,
        all.flops / moved.max(1.0),
        "",
        total_us
    );
    if let Some(pro) = &a.folded {
        let once = texc_compiler::cost::count(pro);
        let (flops, bytes) = ((all.flops - once.flops).max(0.0), (moved - once.bytes).max(0.0));
        let us = (flops / (roof.peak_gflops * 1e3)).max(bytes / (roof.bandwidth_gbs * 1e3));
        outln!(
            "  {:<36} {:>12.3} {:>12.1} {:>9} {:>8} {:>12}   ({} on the weights: the fold pass computes {} once)",
            "  of which folded",
            once.flops / 1e6,
            once.bytes / 1e3,
            "",
            "",
            "",
            if pro.stages.len() == 1 { "1 stage".to_string() } else { format!("{} stages", pro.stages.len()) },
            if pro.stages.len() == 1 { "it" } else { "them" },
        );
        outln!(
            "  {:<36} {:>12.3} {:>12.1} {:>9.2} {:>8} {:>12.2}",
            "total per call (without them)",
            flops / 1e6,
            bytes / 1e3,
            flops / bytes.max(1.0),
            "",
            us
        );
    }
    print_summary(p, &a.summary);
    if let Some(plan) = &a.memory_plan {
        if plan.slots.is_empty() {
            outln!("    memory plan  the compiled loop nests have no temporaries");
        } else {
            outln!(
            "    memory plan  {} temporaries of the compiled loop nests in one arena of {} bytes, against {} bytes for a buffer each ({:.0} %)",
            plan.slots.len(),
            thousands(plan.arena_bytes.min(i64::MAX as u64) as i64),
            thousands(plan.sum_bytes.min(i64::MAX as u64) as i64),
            100.0 * plan.arena_bytes as f64 / plan.sum_bytes.max(1) as f64
            );
        }
    }
    if let Some(path) = plot {
        texc_runtime::atomic::write(path, roofline_svg(&p.name, &roof, &a.ops).as_bytes())
            .map_err(|e| Error::from(Diagnostic::error(format!("cannot write {}: {e}", path.display()))))?;
        outln!("  wrote {}", path.display());
    }
    Ok(())
}

/// `1,234,567`
fn thousands(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    if n < 0 {
        format!("-{out}")
    } else {
        out
    }
}

/// The kernel's sizing figures under the operator table.
fn print_summary(p: &texc_compiler::tir::Program, s: &texc_compiler::graph::Summary) {
    let names = |ts: &[texc_compiler::tir::TensorId], sizes: bool| {
        let mut list: Vec<String> = ts
            .iter()
            .take(10)
            .map(|&t| {
                let d = p.tensor(t);
                if sizes {
                    format!("{} {}", d.name, thousands(d.len()))
                } else {
                    d.name.clone()
                }
            })
            .collect();
        if ts.len() > 10 {
            list.push(format!("and {} more", ts.len() - 10));
        }
        list.join(", ")
    };
    outln!("  kernel:");
    outln!("    FLOPs        {} ({:.3} MFLOP)", thousands(s.flops.round() as i64), s.flops / 1e6);
    if s.weights.is_empty() {
        outln!("    parameters   0 (no input is used only as weights of std.nn layers)");
    } else {
        outln!("    parameters   {} ({})", thousands(s.parameters), names(&s.weights, true));
    }
    outln!("    bytes moved  {:.1} KB (operators run one by one)", s.bytes_moved / 1e3);
    let when = match s.peak_op {
        Some(i) => {
            let outs: Vec<&str> = p.ops[i].outputs.iter().map(|&t| p.tensor(t).name.as_str()).collect();
            format!(" while `{} = {}` runs", outs.join(", "), p.ops[i].op)
        }
        None => String::new(),
    };
    outln!(
        "    peak memory  {} bytes ({:.1} KB){when}: {}",
        thousands(s.peak_bytes.min(i64::MAX as u64) as i64),
        s.peak_bytes as f64 / 1e3,
        names(&s.peak_live, false)
    );
}

/// A log-log roofline chart with one point per operator.
fn roofline_svg(
    name: &str,
    roof: &texc_runtime::roofline::Roofline,
    ops: &[(String, texc_compiler::cost::Counts)],
) -> String {
    let (w, h, ml, mb, mt, mr) = (720.0, 460.0, 70.0, 50.0, 30.0, 200.0);
    let (x0, x1) = (-2.0f64, 4.0f64); // log10 FLOP/byte
    let y1 = (roof.peak_gflops * 3.0).log10().ceil();
    let y0 = y1 - 5.0; // log10 GFLOP/s
    let px = |i: f64| ml + (i.log10().clamp(x0, x1) - x0) / (x1 - x0) * (w - ml - mr);
    let py = |g: f64| h - mb - (g.max(1e-9).log10().clamp(y0, y1) - y0) / (y1 - y0) * (h - mb - mt);
    let mut s = format!("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"11\">\n");
    s += &format!(
        "<text x=\"{ml}\" y=\"18\" font-size=\"13\">roofline of {name}: {:.1} GFLOP/s, {:.1} GB/s</text>\n",
        roof.peak_gflops, roof.bandwidth_gbs
    );
    s += &format!(
        "<rect x=\"{ml}\" y=\"{mt}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#888\"/>\n",
        w - ml - mr,
        h - mb - mt
    );
    for e in x0 as i32..=x1 as i32 {
        let x = px(10f64.powi(e));
        s += &format!("<text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">1e{e}</text>\n", h - mb + 16.0);
    }
    for e in y0 as i32..=y1 as i32 {
        let y = py(10f64.powi(e));
        s += &format!("<text x=\"{:.1}\" y=\"{y:.1}\" text-anchor=\"end\">1e{e}</text>\n", ml - 6.0);
    }
    s += &format!(
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">operational intensity (FLOP/byte)</text>\n",
        (ml + w - mr) / 2.0,
        h - 10.0
    );
    s += &format!(
        "<text x=\"16\" y=\"{:.1}\" transform=\"rotate(-90 16 {:.1})\" text-anchor=\"middle\">GFLOP/s</text>\n",
        (mt + h - mb) / 2.0,
        (mt + h - mb) / 2.0
    );
    // The roof: bandwidth slope up to the ridge, then the peak.
    let pts: Vec<String> = (0..=120)
        .map(|i| {
            let oi = 10f64.powf(x0 + (x1 - x0) * i as f64 / 120.0);
            format!("{:.1},{:.1}", px(oi), py((oi * roof.bandwidth_gbs).min(roof.peak_gflops)))
        })
        .collect();
    s += &format!("<polyline points=\"{}\" fill=\"none\" stroke=\"#c33\" stroke-width=\"2\"/>\n", pts.join(" "));
    for (i, (label, c)) in ops.iter().enumerate() {
        let oi = c.intensity().clamp(1e-3, 1e5);
        let g = (oi * roof.bandwidth_gbs).min(roof.peak_gflops);
        let (x, y) = (px(oi), py(g));
        s += &format!(
            "<circle cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"4\" fill=\"#36c\"/><text x=\"{:.1}\" y=\"{:.1}\">{}</text>\n",
            x + 6.0,
            y - 6.0 + 12.0 * (i % 2) as f64,
            i
        );
        s += &format!(
            "<text x=\"{:.1}\" y=\"{:.1}\">{i}: {}</text>\n",
            w - mr + 10.0,
            mt + 14.0 * (i + 1) as f64,
            label.replace('&', "&amp;").replace('<', "&lt;")
        );
    }
    s += "</svg>\n";
    s
}

fn summary(name: &str, t: &Tensor) -> String {
    let v = t.to_f64();
    let dims: Vec<String> = t.shape.iter().map(|d| d.to_string()).collect();
    let head = format!("{name}: {}[{}]", t.dtype(), dims.join(", "));
    if v.is_empty() {
        return format!("{head}  (empty)");
    }
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    let first: Vec<String> = v.iter().take(4).map(|x| format!("{x:.6}")).collect();
    format!(
        "{head}  min {min:.6}  max {max:.6}  mean {mean:.6}  first [{}{}]",
        first.join(", "),
        if v.len() > 4 { ", …" } else { "" }
    )
}
