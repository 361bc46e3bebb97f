//! What each subcommand does.

use crate::args::{Cli, Command, Common, RunArgs};
use std::collections::HashMap;
use std::path::PathBuf;
use texc_compiler::interp;
use texc_compiler::{Bindings, KernelRef, Session};
use texc_grammar::{diagnostic::render_all, Diagnostic};
use texc_runtime::{read_npy, write_npy, Tensor};

const TARGETS: [&str; 7] = ["interp", "x86-avx2", "x86-avx512", "host", "cranelift", "nvptx-sm80", "nvptx-sm90"];
const CPU_TARGETS: [&str; 3] = ["x86-avx2", "x86-avx512", "host"];
const STAGES: [&str; 9] = ["ast", "tir", "graph", "egraph", "loops", "llvm", "asm", "ptx", "mlir"];

/// How a command failed: user input (exit 1) or usage / not built (exit 2).
enum Fail {
    Input(Vec<Diagnostic>),
    Usage(String),
}

impl From<Diagnostic> for Fail {
    fn from(d: Diagnostic) -> Fail {
        Fail::Input(vec![d])
    }
}

impl From<Vec<Diagnostic>> for Fail {
    fn from(d: Vec<Diagnostic>) -> Fail {
        Fail::Input(d)
    }
}

pub fn run(cli: Cli) -> i32 {
    let mut session = Session::new();
    let result = match cli.command {
        Command::Check(c) => check(&mut session, &c),
        Command::Emit { common, stage } => emit(&mut session, &common, &stage),
        Command::Run(r) => run_kernel(&mut session, &r),
        Command::Bench(_) => Err(not_built("`texc bench`", "the x86 backend")),
        Command::Tune(_) => Err(not_built("`texc tune`", "the autotuner")),
        Command::Compile { .. } => Err(not_built("`texc compile`", "the x86 backend")),
        Command::Analyze(_) => Err(not_built("`texc analyze`", "the operator graph and cost model")),
    };
    match result {
        Ok(()) => 0,
        Err(Fail::Input(diags)) => {
            eprint!("{}", render_all(&diags, &session.sources));
            1
        }
        Err(Fail::Usage(msg)) => {
            eprintln!("error: {msg}");
            2
        }
    }
}

fn not_built(what: &str, needs: &str) -> Fail {
    Fail::Usage(format!("{what} is not built yet: it needs {needs}, which texc does not have yet"))
}

fn check_target(t: &str) -> Result<(), Fail> {
    if t == "interp" {
        Ok(())
    } else if TARGETS.contains(&t) {
        Err(Fail::Usage(format!("target `{t}` is not built yet; today only `interp` runs")))
    } else {
        Err(Fail::Input(vec![
            Diagnostic::error(format!("unknown target `{t}`")).with_note(format!("targets: {}", TARGETS.join(", ")))
        ]))
    }
}

/// Parse `A=1,B=2` lists (repeatable flags) into pairs.
fn parse_pairs(flag: &str, values: &[String]) -> Result<Vec<(String, String)>, Fail> {
    let mut out = Vec::new();
    for v in values {
        for part in v.split(',').filter(|p| !p.trim().is_empty()) {
            let Some((n, x)) = part.split_once('=') else {
                return Err(Fail::Usage(format!("{flag}: expected NAME=VALUE, found `{part}`")));
            };
            let (n, x) = (n.trim(), x.trim());
            if n.is_empty() || x.is_empty() {
                return Err(Fail::Usage(format!("{flag}: expected NAME=VALUE, found `{part}`")));
            }
            out.push((n.to_string(), x.to_string()));
        }
    }
    Ok(out)
}

fn parse_ints(flag: &str, values: &[String]) -> Result<Vec<(String, i64)>, Fail> {
    parse_pairs(flag, values)?
        .into_iter()
        .map(|(n, v)| match v.parse::<i64>() {
            Ok(x) => Ok((n, x)),
            Err(_) => Err(Fail::Usage(format!("{flag}: `{n}={v}`: `{v}` is not an integer"))),
        })
        .collect()
}

fn bindings(c: &Common) -> Result<Bindings, Fail> {
    Ok(Bindings {
        shapes: parse_ints("--shape", &c.shape)?,
        consts: parse_ints("--const", &c.consts)?,
        input_shapes: HashMap::new(),
    })
}

fn load(session: &mut Session, c: &Common) -> Result<usize, Fail> {
    Ok(session.load_root(&c.file)?)
}

fn check(session: &mut Session, c: &Common) -> Result<(), Fail> {
    check_target(&c.target)?;
    let m = load(session, c)?;
    let b = bindings(c)?;
    let kernels: Vec<KernelRef> = match &c.kernel {
        Some(k) => vec![session.entry_kernel(m, Some(k))?],
        None => (0..session.module(m).kernels.len()).map(|i| KernelRef { module: m as u32, index: i as u32 }).collect(),
    };
    let mut specialized = 0;
    let mut diags = Vec::new();
    for k in &kernels {
        // Bounds and ranges need sizes: check at the sizes the source and flags give, when they give all.
        let info = session.kernel(*k);
        let own = |n: &String| info.symbol_index(n).is_some() || info.param_index(n).is_some();
        let b = Bindings {
            shapes: b.shapes.iter().filter(|(n, _)| own(n)).cloned().collect(),
            consts: b.consts.iter().filter(|(n, _)| own(n)).cloned().collect(),
            input_shapes: HashMap::new(),
        };
        let sized = info.symbols.iter().all(|s| s.default.is_some() || b.shapes.iter().any(|(n, _)| *n == s.name))
            && info.params.iter().all(|p| match &p.info {
                texc_compiler::resolve::ParamInfo::Const { default } => {
                    default.is_some() || b.consts.iter().any(|(n, _)| *n == p.name)
                }
                _ => true,
            });
        if sized {
            match texc_compiler::build_program(session, *k, &b) {
                Ok(p) => {
                    specialized += 1;
                    diags.extend(check_cpu_schedules(session, *k, &p));
                }
                Err(d) => diags.push(d),
            }
        }
    }
    if !diags.is_empty() {
        return Err(Fail::Input(diags));
    }
    println!(
        "ok: {} kernel{} checked; {} at concrete sizes (bounds proven)",
        kernels.len(),
        if kernels.len() == 1 { "" } else { "s" },
        specialized
    );
    Ok(())
}

/// Apply every CPU `schedule` block of a kernel, to report illegal primitives.
fn check_cpu_schedules(session: &Session, k: KernelRef, p: &texc_compiler::Program) -> Vec<Diagnostic> {
    CPU_TARGETS
        .iter()
        .filter_map(|t| texc_schedules::find_schedule(session, k, t).map(|sc| (t, sc)))
        .filter_map(|(t, sc)| texc_schedules::schedule_and_lower(p.clone(), t, Some(sc)).err())
        .collect()
}

fn emit(session: &mut Session, c: &Common, stage: &str) -> Result<(), Fail> {
    if !STAGES.contains(&stage) {
        return Err(Fail::Usage(format!("unknown stage `{stage}`; stages: {}", STAGES.join(", "))));
    }
    if stage == "loops" {
        if !CPU_TARGETS.contains(&c.target.as_str()) {
            return Err(Fail::Usage(format!(
                "`--stage loops` shows the loop nests for a CPU target; add --target x86-avx2 (or {})",
                CPU_TARGETS[1..].join(", ")
            )));
        }
    } else {
        check_target(&c.target)?;
    }
    let m = load(session, c)?;
    match stage {
        "ast" => print!("{}", texc_grammar::print::print_ast(&session.module(m).ast)),
        "tir" => {
            let k = session.entry_kernel(m, c.kernel.as_deref())?;
            let p = texc_compiler::build_program(session, k, &bindings(c)?)?;
            print!("{}", texc_compiler::print::print_program(&p));
        }
        "loops" => {
            let k = session.entry_kernel(m, c.kernel.as_deref())?;
            let p = texc_compiler::build_program(session, k, &bindings(c)?)?;
            let sched = texc_schedules::find_schedule(session, k, &c.target);
            let f = texc_schedules::schedule_and_lower(p, &c.target, sched)?;
            print!("{}", texc_schedules::ir::print(&f));
        }
        other => return Err(not_built(&format!("stage `{other}`"), "a later part of the compiler")),
    }
    Ok(())
}

fn run_kernel(session: &mut Session, r: &RunArgs) -> Result<(), Fail> {
    let c = &r.common;
    check_target(&c.target)?;
    if r.check {
        return Err(Fail::Usage(
            "--check compares a compiled target with `interp`; no compiled target is built yet".into(),
        ));
    }
    let inputs = parse_pairs("--input", &r.input)?;
    let outputs = parse_pairs("--output", &r.output)?;
    let scalars = parse_pairs("--scalar", &r.scalar)?;
    let m = load(session, c)?;
    let k = session.entry_kernel(m, c.kernel.as_deref())?;
    let info = session.kernel(k);
    let kname = info.name.clone();
    let is_param = |n: &str| info.param_index(n).is_some();
    for (n, _) in inputs.iter().chain(&scalars) {
        if !is_param(n) {
            return Err(Diagnostic::error(format!("`{n}` is not a parameter of kernel `{kname}`")).into());
        }
    }
    let mut files: HashMap<String, Tensor> = HashMap::new();
    for (n, path) in &inputs {
        let t = read_npy(&PathBuf::from(path)).map_err(|e| Diagnostic::error(format!("input `{n}`: {e}")))?;
        files.insert(n.clone(), t);
    }
    let mut b = bindings(c)?;
    b.input_shapes = files.iter().map(|(n, t)| (n.clone(), t.shape.iter().map(|&d| d as i64).collect())).collect();
    let p = texc_compiler::build_program(session, k, &b)?;
    for (n, _) in &outputs {
        if !p.outputs.iter().any(|&o| p.tensor(o).name == *n) {
            return Err(Diagnostic::error(format!("`{n}` is not an output of kernel `{kname}`")).into());
        }
    }
    let mut scalar_values = Vec::new();
    for (n, text) in &scalars {
        let v = text
            .parse::<f64>()
            .map_err(|_| Fail::Usage(format!("--scalar: `{n}={text}`: `{text}` is not a number")))?;
        scalar_values.push((n.clone(), v));
    }
    let args = interp::bind_args(&p, files, &scalar_values, r.seed).map_err(Diagnostic::error)?;
    let results = interp::run(&p, args).map_err(|e| Diagnostic::error(e.to_string()))?;
    let sizes: Vec<String> = p.bindings.iter().map(|(n, v)| format!("{n}={v}")).collect();
    println!("ran `{}` on interp [{}]", p.name, sizes.join(", "));
    for (&o, t) in p.outputs.iter().zip(&results) {
        println!("  {}", summary(&p.tensor(o).name, t));
    }
    for (n, path) in &outputs {
        let i = p.outputs.iter().position(|&o| p.tensor(o).name == *n).expect("checked above");
        write_npy(&PathBuf::from(path), &results[i]).map_err(|e| Diagnostic::error(e.to_string()))?;
        println!("  wrote `{n}` to {path}");
    }
    Ok(())
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
