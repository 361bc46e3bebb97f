//! `cargo fuzz run loops_races`: race-introducing mutations of printed loop
//! nests (issue 35). Each input picks a nest — a default schedule of a
//! small kernel, for x86-avx2 or nvptx-sm90 — and edits it: a loop made
//! `parallel`, `vectorized`, serial or bound to a thread or block
//! dimension; an index moved, scaled, divided, reduced modulo a constant or
//! given another loop's variable; a guard added; a local's initial store
//! dropped. Whatever the `.loops` reader (and, for GPU nests, the launch
//! rules) accepts must be race-free and compute the same everywhere:
//! - the loop-IR evaluator runs it without reporting a race;
//! - x86-avx2 (where this CPU runs it) and Cranelift, or the CPU emulation
//!   of the GPU kernels, compute what the evaluator computes (1e-2
//!   relative, as edits make ill-conditioned sums; a backend may refuse
//!   with an error what it cannot build).
//!
//! Never a panic, hang or memory blow-up either.
#![no_main]

use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use std::path::Path;
use std::sync::OnceLock;
use texc_grammar::span::SourceMap;
use texc_pipeline::{Options, Pipeline};

/// Kernels and sizes of the nests edited: small, odd, with reductions,
/// attached stages, padding and fused loops.
const KERNELS: [(&str, Option<&str>, &str); 6] = [
    ("examples/matmul.tex", None, "M=13,K=7,N=19"),
    ("examples/softmax.tex", None, "N=5,D=21"),
    ("examples/conv2d.tex", None, "N=1,C=3,H=9,W=7,K=5"),
    ("examples/norms.tex", Some("ln"), "N=6,D=17"),
    ("examples/depthwise.tex", None, "N=1,C=3,H=7,W=6"),
    ("examples/pooling.tex", None, "N=1,C=3,H=9,W=8"),
];

const TARGETS: [&str; 2] = ["x86-avx2", "nvptx-sm90"];

fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// The printed nests to edit, with the target each is for.
fn bases() -> &'static [(String, &'static str)] {
    static BASES: OnceLock<Vec<(String, &'static str)>> = OnceLock::new();
    BASES.get_or_init(|| {
        let mut out = Vec::new();
        for target in TARGETS {
            for (file, kernel, sizes) in KERNELS {
                let Some(text) = printed(file, kernel, sizes, target) else { continue };
                out.push((text, target));
            }
        }
        assert!(!out.is_empty(), "no nest to edit");
        out
    })
}

fn pipeline(target: &str) -> Pipeline {
    let t = texc_compiler::target::lookup(target).expect("registered");
    let mut o = Options::new(t);
    o.emulate_gpu = t.gpu.is_some();
    Pipeline::new(o)
}

/// The default nest of `kernel` in `file` at `sizes`, printed without its `source` line.
fn printed(file: &str, kernel: Option<&str>, sizes: &str, target: &str) -> Option<String> {
    let mut pl = pipeline(target);
    let path = root().join(file);
    let text = std::fs::read_to_string(&path).ok()?;
    let m = pl.load_text(file, &text, Some(path)).ok()?;
    let k = pl.kernel(m, kernel).ok()?;
    let mut b = texc_compiler::Bindings::default();
    for kv in sizes.split(',') {
        let (n, v) = kv.split_once('=')?;
        b.shapes.push((n.to_string(), v.parse().ok()?));
    }
    let p = pl.specialize(k, &b).ok()?;
    let loops = pl.loops(k, p).ok()?;
    let text = texc_schedules::ir::print(&loops.lowered);
    Some(text.lines().filter(|l| !l.trim_start().starts_with("source ")).map(|l| format!("{l}\n")).collect())
}

const KINDS: [&str; 9] =
    ["", " parallel", " vectorized", " unrolled", " thread.x", " thread.y", " block.x", " block.y", " parallel"];

/// One edit of the nest's lines.
fn edit(u: &mut Unstructured, lines: &mut Vec<String>) -> Result<()> {
    let loops: Vec<usize> = (0..lines.len()).filter(|&i| lines[i].trim_start().starts_with("for ")).collect();
    let stores: Vec<usize> = (0..lines.len()).filter(|&i| lines[i].contains(" = ")).collect();
    let var_of = |l: &str| l.trim_start().trim_start_matches("for ").split(' ').next().unwrap_or("").to_string();
    match u.int_in_range(0..=6)? {
        0 | 1 if !loops.is_empty() => {
            let i = loops[u.choose_index(loops.len())?];
            let line = lines[i].trim_end_matches(':');
            let head = match line.rfind("..") {
                Some(at) => line[..at].to_string() + &line[at..].split(' ').next().unwrap_or("").to_string(),
                None => line.to_string(),
            };
            lines[i] = format!("{head}{}:", u.choose(&KINDS)?);
        }
        2 | 3 if !stores.is_empty() => {
            let i = stores[u.choose_index(stores.len())?];
            let brackets: Vec<usize> = lines[i].match_indices(']').map(|(at, _)| at).collect();
            if let Some(&at) = brackets.get(u.choose_index(brackets.len().max(1))?) {
                let c = u.int_in_range(1..=9)?;
                let what = match u.int_in_range(0..=4)? {
                    0 => format!(" + {c}"),
                    1 => format!(" - {c}"),
                    2 => format!(" * {c}"),
                    3 => format!(" / {c}"),
                    _ => format!(" % {c}"),
                };
                lines[i].insert_str(at, &what);
            }
        }
        4 if !stores.is_empty() && !loops.is_empty() => {
            let i = stores[u.choose_index(stores.len())?];
            let a = var_of(&lines[loops[u.choose_index(loops.len())?]]);
            let b = var_of(&lines[loops[u.choose_index(loops.len())?]]);
            if !a.is_empty() && !b.is_empty() {
                lines[i] = lines[i].replacen(&a, &b, 1);
            }
        }
        5 if !stores.is_empty() && !loops.is_empty() => {
            // A guard on one loop variable around a store.
            let i = stores[u.choose_index(stores.len())?];
            let v = var_of(&lines[loops[u.choose_index(loops.len())?]]);
            let indent = lines[i].len() - lines[i].trim_start().len();
            let op = u.choose(&["<", ">=", "=="])?;
            let c = u.int_in_range(0..=8)?;
            let store = format!("  {}", lines[i]);
            lines[i] = format!("{}if {v} % 3 {op} {c}:", " ".repeat(indent));
            lines.insert(i + 1, store);
        }
        _ if !stores.is_empty() => {
            // Drop a store (a local's initial value, an init nest's body).
            let i = stores[u.choose_index(stores.len())?];
            lines.remove(i);
        }
        _ => {}
    }
    Ok(())
}

fn parse(text: &str) -> Option<texc_schedules::LoopFunc> {
    let mut sm = SourceMap::new();
    let id = sm.add("fuzz.loops", text.to_string());
    texc_schedules::text::parse(text, id).ok().map(|p| p.func)
}

fn run(data: &[u8]) -> Result<()> {
    let mut u = Unstructured::new(data);
    let (base, target) = u.choose(bases())?;
    let mut lines: Vec<String> = base.lines().map(String::from).collect();
    for _ in 0..u.int_in_range(1..=4)? {
        edit(&mut u, &mut lines)?;
    }
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    let Some(f) = parse(&text) else { return Ok(()) };
    let t = texc_compiler::target::lookup(target).expect("registered");
    // Loop kinds the target lacks (a block loop in a CPU nest) and, on GPUs, the launch rules.
    if texc_schedules::verify::check_target(&f, t).is_err() {
        return Ok(());
    }
    // Small enough to evaluate and run quickly.
    if texc_schedules::ir::emitted_size(&f) > 200_000 {
        return Ok(());
    }
    let args = || texc_compiler::interp::bind_args(&f.p, Default::default(), &[], 7).expect("binds");
    let want = match texc_schedules::eval::run(&f, args()) {
        Ok(w) => w,
        Err(texc_schedules::eval::EvalError::Race(r)) => panic!("accepted, yet {r}\n{text}"),
        // An output or temporary read before any store: not this target's concern.
        Err(_) => return Ok(()),
    };
    let runs: Vec<&str> = if t.gpu.is_some() { vec![target] } else { vec!["x86-avx2", "cranelift"] };
    for name in runs {
        let tt = texc_compiler::target::lookup(name).expect("registered");
        if tt.gpu.is_none() && tt.check_runs_here().is_err() {
            continue;
        }
        let mut pl = pipeline(name);
        let Ok(legal) = pl.legalize(f.clone()) else { continue };
        let Ok(code) = pl.compile(&legal) else { continue };
        let got = code.run(args()).unwrap_or_else(|e| panic!("{name}: {e}\n{text}"));
        for (g, w) in got.iter().zip(&want) {
            // Edits make ill-conditioned sums (a variance of differences that cancel), which f32 code
            // and the evaluator's f64 round apart by far more than 1e-5; a lost update or a stale
            // read is off by the values themselves. Where either side has a NaN, nothing is judged.
            let nan = |t: &texc_runtime::Tensor| t.to_f64().iter().any(|x| x.is_nan());
            if nan(g) || nan(w) {
                continue;
            }
            let err = texc_pipeline::oracle::rel_error(g, w);
            assert!(err <= 1e-2, "{name}: error {err:e} against the evaluator\n{text}");
        }
    }
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let _ = run(data);
});
