//! Pass file tests (in the spirit of Cranelift's filetests and LLVM's lit):
//! each `tests/passes/*.loops` or `tests/passes/*.tex` file names a pass on
//! its first line (`# pass: NAME [ARG]`), says on the comment lines after it
//! what behaviour it pins down and why, then holds the input, a line
//! `# expect:`, and the expected output. One test runs every file and
//! prints a diff for each that differs. `TEXC_BLESS=1` rewrites the
//! expected outputs instead (read the diff before committing them).
//!
//! Inputs: a `.loops` file holds a loop nest (the text `texc emit --stage
//! loops` prints); a `.tex` file holds a kernel in source form (`#` starts a
//! comment, so the header is part of it), specialized at its default sizes
//! as written (no e-graph rewriting, no tuning database).
//!
//! Passes of loop nests (`.loops`): `legalize TARGET` (integer semantics and
//! intrinsics made explicit), `simplify-indices` (index arithmetic in linear
//! form), `drop-proven-guards` (the comparisons the loop ranges decide
//! dropped, loops cut to what their guards let run), `access` (how each
//! access of a vectorized loop moves with its lanes: the analysis backends
//! read).
//!
//! Passes of kernels (`.tex`):
//! - a preparation pass of the default schedules, `NAME TARGET`
//!   (`texc_schedules::prepare::steps`: `merge-product-rows`, `one-hot-gathers`,
//!   `inline-elementwise`, `hoist-reductions`, `inline-epilogues`,
//!   `simplify-div-mod`, `fold-conditions`, `reciprocals`, `fuse-dense-reductions`, `rfactor` on
//!   CPUs; `im2col` on GPUs): the tensor IR after the passes before it in
//!   the target's list, then after the pass itself (or `unchanged`);
//! - `default-schedule TARGET`: the decisions of the target's default
//!   schedule (its schedules, as `--dump-ir schedule` prints them) and the
//!   loop nests they lower to (as `texc emit --stage loops` prints them).

use std::fmt::Write;
use texc_compiler::tir::{TExpr, TExprId, VarId};
use texc_compiler::Bindings;
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
        ["drop-proven-guards"] => {
            texc_schedules::guards::drop_proven_guards(&mut f);
            texc_schedules::verify::verify(&f).map_err(|e| e.to_string())?;
            Ok(ir::print(&f))
        }
        ["access"] => Ok(access_report(&f)),
        _ => Err(format!("unknown pass `{pass}`")),
    }
}

/// A pass of a kernel in source form (`.tex`): see the header. Errors come
/// back as printed (diagnostics rendered).
fn run_tex_pass(pass: &str, name: &str, source: &str) -> Result<String, String> {
    let words: Vec<&str> = pass.split_whitespace().collect();
    let [pass, target] = words[..] else {
        return Err(format!("error: `{pass}`: a pass of a .tex file is `NAME TARGET`\n"));
    };
    let t = texc_compiler::target::lookup(target).map_err(|e| format!("error: {e}\n"))?;
    let (mut pl, k) = texc_tests::load_text(target, name, source, None)?;
    let mut p = pl.specialize(k, &Bindings::default()).map_err(|e| texc_tests::rendered(&pl, e))?;
    if pass == "default-schedule" {
        if !t.is_compiled() {
            return Err(format!("error: {t} has no default schedule: it does not compile\n"));
        }
        if texc_schedules::find_schedule(&pl.session, k, t).is_some() {
            return Err(format!("error: the kernel has a schedule block for {t}: no default schedule runs\n"));
        }
        // The pipeline's own passes, as `texc emit --stage loops` runs them.
        let s = pl.schedule(k, p).map_err(|e| texc_tests::rendered(&pl, e))?;
        let decisions = texc_schedules::schedule::print(&s.p, &s.schedules);
        let lowered = pl.lower(s).map_err(|e| texc_tests::rendered(&pl, e))?;
        pl.check_target(Some(k), &lowered, t).map_err(|e| texc_tests::rendered(&pl, e))?;
        pl.legalize(lowered.clone()).map_err(|e| texc_tests::rendered(&pl, e))?;
        return Ok(format!("{decisions}{}", ir::print(&lowered)));
    }
    let steps = texc_schedules::prepare::steps(t);
    let Some(at) = steps.iter().position(|s| s.name == pass) else {
        let names: Vec<&str> = steps.iter().map(|s| s.name).collect();
        return Err(format!("error: unknown pass `{pass}` for {t}; its preparation passes: {}\n", names.join(", ")));
    };
    let knobs = texc_schedules::knobs::DefaultKnobs::default();
    for step in &steps[..at] {
        (step.run)(&mut p, t, knobs);
        texc_compiler::verify::verify(&p).map_err(|e| format!("error: after {}: {e}\n", step.name))?;
    }
    let before = texc_compiler::print::print_program(&p);
    (steps[at].run)(&mut p, t, knobs);
    texc_compiler::verify::verify(&p).map_err(|e| format!("error: after {pass}: {e}\n"))?;
    let after = texc_compiler::print::print_program(&p);
    let mut ran = vec!["specialize"];
    ran.extend(steps[..at].iter().map(|s| s.name));
    let mut out = format!("# before {pass} (after {}):\n{before}", ran.join(", "));
    if after == before {
        out.push_str(&format!("# after {pass}: unchanged\n"));
    } else {
        out.push_str(&format!("# after {pass}:\n{after}"));
    }
    Ok(out)
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
                Stmt::Barrier
                | Stmt::Async(_)
                | Stmt::Mma { .. }
                | Stmt::Wgmma(_)
                | Stmt::TileDot(_)
                | Stmt::WarpReduce(_)
                | Stmt::Prefetch { .. } => {}
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
    files.retain(|p| p.extension().is_some_and(|e| e == "loops" || e == "tex"));
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
        if !text.lines().nth(1).is_some_and(|l| l.starts_with("# ")) {
            failures
                .push_str(&format!("{name}: the second line must be a comment: what the file pins down, and why\n"));
            continue;
        }
        let (input, expected) = match text.find(&format!("\n{EXPECT}\n")) {
            Some(at) => (&text[..at + 1], &text[at + EXPECT.len() + 2..]),
            None => (&text[..], ""),
        };
        let got = if name.ends_with(".tex") {
            // Named as from the workspace root, so that printed IR is the same in every checkout.
            run_tex_pass(pass, &format!("tests/passes/{name}"), input).unwrap_or_else(|e| e)
        } else {
            let mut sm = SourceMap::new();
            let id = sm.add(name.clone(), input.to_string());
            match texc_schedules::text::parse(input, id) {
                Ok(parsed) => run_pass(pass, parsed.func).unwrap_or_else(|e| format!("error: {e}\n")),
                Err(d) => d.render(&sm),
            }
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
