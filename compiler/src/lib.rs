//! texc semantics: from parsed files to a checked, specialized tensor IR, and
//! the reference interpreter that runs it.
//!
//! Pipeline: [`session`] loads files and imports → [`resolve`] checks names
//! and types (shape-agnostic) → [`specialize`] binds sizes, inlines calls and
//! lowers to [`tir`] (with [`bounds`] proving every access in range) →
//! [`verify`] (debug builds or `TEXC_VERIFY=1`) → [`interp`].
//! `TEXC_DUMP_IR=1` prints the IR after each pass to stderr.

pub mod bounds;
pub mod cost;
pub mod graph;
pub mod interp;
pub mod print;
pub mod recognize;
pub mod resolve;
pub mod rewrite;
pub mod session;
pub mod specialize;
pub mod tir;
pub mod types;
pub mod verify;

pub use session::{KernelRef, Session};
pub use specialize::Bindings;
pub use tir::Program;

use texc_grammar::Diagnostic;

fn env_flag(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| !v.is_empty() && v != "0")
}

/// Specialize a kernel and run the TIR checks (verifier, IR dump) around it.
pub fn build_program(s: &Session, k: KernelRef, b: &Bindings) -> Result<Program, Diagnostic> {
    let p = specialize::specialize(s, k, b)?;
    if env_flag("TEXC_DUMP_IR") {
        eprintln!("// ---- after specialize (tir)\n{}", print::print_program(&p));
    }
    if cfg!(debug_assertions) || env_flag("TEXC_VERIFY") {
        verify::verify(&p)
            .map_err(|m| Diagnostic::error(format!("internal error: TIR verifier failed after specialize: {m}")))?;
    }
    Ok(p)
}

/// A kernel after graph rewriting: the plan and the program it lowers to.
pub struct Rewritten {
    pub plan: rewrite::Plan,
    pub program: Program,
    /// Why the plan was not used, if it was not.
    pub kept_original: Option<String>,
}

/// The `import`s and signature of kernel `k`, as source text, for a
/// generated kernel that replaces it.
fn kernel_header(s: &Session, k: KernelRef) -> String {
    let m = s.module(k.module as usize);
    let ast = m.ast.kernels().nth(k.index as usize).expect("kernel exists");
    let mut h = String::from("import std.nn;\n");
    if let Some(path) = &m.path {
        h.push_str(&format!("import \"{}\";\n", path.display()));
    }
    let params: Vec<&str> = ast.params.iter().map(|p| s.sources.snippet(p.span)).collect();
    let outs: Vec<&str> = ast.outputs.iter().map(|o| s.sources.snippet(o.span)).collect();
    let outs = if outs.len() == 1 { outs[0].to_string() } else { format!("({})", outs.join(", ")) };
    h.push_str(&format!("kernel {}({}) -> {} {{\n", ast.name.name, params.join(", "), outs));
    h
}

/// Specialize kernel `k`, rewrite its operator graph for `target`, and
/// specialize the chosen plan. When the plan is no cheaper, or the
/// generated kernel fails to compile, the original program is kept.
pub fn build_rewritten(s: &Session, k: KernelRef, b: &Bindings, target: &str) -> Result<Rewritten, Diagnostic> {
    let extraction = rewrite::Extraction::from_env().map_err(Diagnostic::error)?;
    build_rewritten_with(s, k, b, target, extraction)
}

/// [`build_rewritten`] with the extraction given instead of read from `TEXC_EXTRACT`.
pub fn build_rewritten_with(
    s: &Session,
    k: KernelRef,
    b: &Bindings,
    target: &str,
    extraction: rewrite::Extraction,
) -> Result<Rewritten, Diagnostic> {
    let original = build_program(s, k, b)?;
    if original.ops.iter().any(|o| o.outputs.len() > 1) {
        // The term has one node per tensor; calls with several results stay as written.
        let plan = rewrite::Plan::unchanged();
        return Ok(Rewritten {
            plan,
            program: original,
            kept_original: Some("calls with several results are not rewritten yet".into()),
        });
    }
    let header = kernel_header(s, k);
    let source_of = |i: usize| s.sources.snippet(original.ops[i].span).to_string();
    let mut plan = rewrite::rewrite(&original, target, &header, &source_of, extraction);
    let m = s.module(k.module as usize);
    if let Some(path) = &m.path {
        let shown = &s.sources.file(m.ast.file).name;
        plan.display_source =
            plan.source.replace(&format!("import \"{}\";", path.display()), &format!("import \"{shown}\";"));
    }
    if plan.best_cost >= plan.original_cost {
        return Ok(Rewritten { plan, program: original, kept_original: Some("no cheaper plan".into()) });
    }
    let mut s2 = Session::new();
    let name = format!("<rewritten>/{}.tex", original.name);
    let built = s2
        .load_text(&name, &plan.source, None)
        .map_err(|d| d.into_iter().next().unwrap_or_else(|| Diagnostic::error("no diagnostic")))
        .and_then(|m| s2.entry_kernel(m, Some(&original.name)))
        .and_then(|k2| build_program(&s2, k2, b));
    match built {
        Ok(program) => Ok(Rewritten { plan, program, kept_original: None }),
        Err(d) => {
            let why = format!("the rewritten kernel does not compile: {}", d.render(&s2.sources));
            Ok(Rewritten { plan, program: original, kept_original: Some(why) })
        }
    }
}
