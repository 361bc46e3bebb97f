//! Pass file tests (in the spirit of Cranelift's filetests and LLVM's lit):
//! each `tests/passes/*.loops` file names a pass on its first line
//! (`# pass: NAME [ARG]`), then holds the input loop nest, a line
//! `# expect:`, and the expected output. One test runs every file and
//! prints a diff for each that differs. `TEXC_BLESS=1` rewrites the
//! expected outputs instead (read the diff before committing them).
//!
//! Passes: `legalize TARGET` (integer semantics and intrinsics made
//! explicit), `simplify-indices` (index arithmetic in linear form),
//! `access TARGET-LANES` (how each access of a vectorized loop moves with
//! its lanes: the analysis backends read).

use std::fmt::Write;
use texc_compiler::tir::{TExpr, TExprId, VarId};
use texc_grammar::span::SourceMap;
use texc_schedules::analysis::{self, Access};
use texc_schedules::ir::{self, ForKind, LoopFunc, Stmt};

const EXPECT: &str = "# expect:";

fn run_pass(pass: &str, mut f: LoopFunc) -> Result<String, String> {
    let words: Vec<&str> = pass.split_whitespace().collect();
    match words[..] {
        ["legalize", target] => {
            let t = texc_compiler::target::lookup(target).map_err(|e| e.to_string())?;
            texc_schedules::legalize::legalize(&mut f, t);
            texc_schedules::verify::verify_legal(&f, t).map_err(|e| e.to_string())?;
            Ok(ir::print(&f))
        }
        ["simplify-indices"] => {
            texc_schedules::index::simplify_indices(&mut f);
            texc_schedules::verify::verify(&f).map_err(|e| e.to_string())?;
            Ok(ir::print(&f))
        }
        ["access"] => Ok(access_report(&f)),
        _ => Err(format!("unknown pass `{pass}`")),
    }
}

/// One line per load and store inside a vectorized loop: its access pattern.
fn access_report(f: &LoopFunc) -> String {
    fn loads(f: &LoopFunc, e: TExprId, out: &mut Vec<TExprId>) {
        if matches!(f.p.expr(e), TExpr::Load(..)) {
            out.push(e);
        }
        for c in f.p.children(e) {
            loads(f, c, out);
        }
    }
    fn walk(f: &LoopFunc, body: &[Stmt], vector: Option<(VarId, i64, i64)>, out: &mut String) {
        for s in body {
            match s {
                Stmt::For { var, lo, extent, kind, body } => {
                    let v = if *kind == ForKind::Vectorized { Some((*var, *lo, *extent)) } else { vector };
                    walk(f, body, v, out)
                }
                Stmt::Alloc { body, .. } | Stmt::If { then: body, .. } => walk(f, body, vector, out),
                Stmt::Barrier | Stmt::Async(_) | Stmt::Mma { .. } | Stmt::WarpReduce(_) => {}
                Stmt::Store { tensor, indices, value } => {
                    let Some((var, base, lanes)) = vector else { continue };
                    let mut ls = Vec::new();
                    loads(f, *value, &mut ls);
                    let lane_var = &f.vars[var as usize].name;
                    for l in ls {
                        let TExpr::Load(t, idx) = f.p.expr(l) else { unreachable!() };
                        let _ = writeln!(
                            out,
                            "{lane_var} ({lanes} lanes): load {}: {}",
                            ir::expr(f, l),
                            pattern(f, *t, idx, var, base, lanes)
                        );
                    }
                    let name = &f.p.tensor(*tensor).name;
                    let idx: Vec<String> = indices.iter().map(|&i| ir::expr(f, i)).collect();
                    let _ = writeln!(
                        out,
                        "{lane_var} ({lanes} lanes): store {name}[{}]: {}",
                        idx.join(", "),
                        pattern(f, *tensor, indices, var, base, lanes)
                    );
                }
            }
        }
    }
    fn pattern(
        f: &LoopFunc,
        t: texc_compiler::tir::TensorId,
        idx: &[TExprId],
        var: VarId,
        base: i64,
        lanes: i64,
    ) -> String {
        match analysis::access(f, t, idx, var) {
            Access::Uniform => "uniform".into(),
            Access::Contiguous => "contiguous".into(),
            Access::Strided(k) => format!("strided by {k}"),
            Access::Gather => match analysis::lane_offsets(f, t, idx, var, base, lanes as usize) {
                Some(o) => format!("gather at constant offsets {o:?}"),
                None => "gather".into(),
            },
        }
    }
    let mut out = String::new();
    walk(f, &f.body, None, &mut out);
    out
}

#[test]
fn pass_files() {
    let dir = texc_tests::root().join("tests/passes");
    let mut files: Vec<_> = std::fs::read_dir(&dir).expect("tests/passes").map(|e| e.expect("entry").path()).collect();
    files.retain(|p| p.extension().is_some_and(|e| e == "loops"));
    files.sort();
    assert!(files.len() >= 4, "pass files in {}", dir.display());
    let bless = std::env::var_os("TEXC_BLESS").is_some();
    let mut failures = String::new();
    for path in &files {
        let name = path.file_name().expect("name").to_string_lossy().to_string();
        let text = std::fs::read_to_string(path).expect("read");
        let pass = text.lines().next().and_then(|l| l.strip_prefix("# pass:")).map(str::trim);
        let Some(pass) = pass else {
            failures.push_str(&format!("{name}: the first line must be `# pass: NAME`\n"));
            continue;
        };
        let (input, expected) = match text.find(&format!("\n{EXPECT}\n")) {
            Some(at) => (&text[..at + 1], &text[at + EXPECT.len() + 2..]),
            None => (&text[..], ""),
        };
        let mut sm = SourceMap::new();
        let id = sm.add(name.clone(), input.to_string());
        let got = match texc_schedules::text::parse(input, id) {
            Ok(parsed) => run_pass(pass, parsed.func).unwrap_or_else(|e| format!("error: {e}\n")),
            Err(d) => d.render(&sm),
        };
        if got == expected {
            continue;
        }
        if bless {
            std::fs::write(path, format!("{input}{EXPECT}\n{got}")).expect("write");
            continue;
        }
        let diff = similar::TextDiff::from_lines(expected, got.as_str());
        failures.push_str(&format!("{name} ({pass}):\n{}\n", diff.unified_diff().header("expected", "got")));
    }
    assert!(failures.is_empty(), "pass files differ (TEXC_BLESS=1 rewrites them):\n{failures}");
}
