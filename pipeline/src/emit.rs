//! `texc emit`: any stage of a kernel as text — the AST, the tensor IR, the
//! operator graph, the e-graph's plan, the loop nests, the backend's text
//! stages and MLIR — with the errors that say which stages a target or a
//! `.loops` file has. The CLI prints what this returns; the Python package
//! returns it as a string.
//!
//! Invariant: every stage is deterministic (byte-identical across runs).

use super::{Error, Pipeline};
use std::path::Path;
use texc_compiler::Bindings;
use texc_grammar::Diagnostic;

/// Every stage `emit` knows, in pipeline order.
pub const STAGES: [&str; 12] =
    ["ast", "tir", "graph", "egraph", "loops", "llvm", "asm", "clif", "vcode", "ptx", "mlir", "mlir-linalg"];

/// What to emit: a kernel of a `.tex` (or `.onnx`) file at sizes, or a `.loops` file.
pub struct EmitRequest<'a> {
    pub file: &'a Path,
    /// The kernel (`None`: the file's only or last kernel).
    pub kernel: Option<&'a str>,
    pub bindings: &'a Bindings,
    pub stage: &'a str,
}

impl Pipeline {
    /// Stage `r.stage` of `r`'s kernel as text.
    pub fn emit(&mut self, r: &EmitRequest) -> Result<String, Error> {
        let stage = r.stage;
        if !STAGES.contains(&stage) {
            return Err(Error::Usage(format!("unknown stage `{stage}`; stages: {}", STAGES.join(", "))));
        }
        if stage.starts_with("mlir") {
            return self.emit_mlir(r);
        }
        let backend_stage = !matches!(stage, "ast" | "tir" | "graph" | "egraph" | "loops");
        if stage == "loops" || backend_stage {
            self.require_compiled(&format!("`--stage {stage}`"))?;
        }
        if backend_stage && !self.text_stages().contains(&stage) {
            return Err(self.no_such_stage(stage));
        }
        if crate::is_loops_file(r.file) {
            return self.emit_loops_file(r, backend_stage);
        }
        let m = self.load(r.file)?;
        if stage == "ast" {
            return Ok(texc_grammar::print::print_ast(&self.session.module(m).ast));
        }
        let k = self.kernel(m, r.kernel)?;
        let b = r.bindings;
        Ok(match stage {
            "egraph" => self.emit_egraph(k, b)?,
            "graph" => texc_compiler::graph::print_graph(&self.specialize(k, b)?),
            "tir" => texc_compiler::print::print_program(&self.specialize(k, b)?),
            "loops" => texc_schedules::ir::print(&self.build(k, b)?.1.lowered),
            _ => {
                let (_, loops) = self.build(k, b)?;
                self.emit_text(&loops.legal, stage)?
            }
        })
    }

    /// Why the target has no text stage `stage`, naming the targets that do.
    fn no_such_stage(&self, stage: &str) -> Error {
        let printing: Vec<&str> = texc_compiler::target::all()
            .iter()
            .filter(|t| texc_codegen::backend_for(t).is_ok_and(|b| b.text_stages().contains(&stage)))
            .map(|t| t.name)
            .collect();
        if printing.is_empty() {
            Error::Usage(format!("stage `{stage}` is not built yet: it needs a later part of the compiler"))
        } else {
            let t = self.target();
            Error::Usage(format!("target `{t}` has no stage `{stage}`; targets that print it: {}", printing.join(", ")))
        }
    }

    /// A `.loops` file's stages: its loop nest, and the target's text of it.
    fn emit_loops_file(&mut self, r: &EmitRequest, backend_stage: bool) -> Result<String, Error> {
        let lf = self.load_loops(r.file)?;
        match (r.stage, &lf.legal) {
            ("loops", _) => Ok(texc_schedules::ir::print(&lf.lowered)),
            (s, Some(legal)) if backend_stage => self.emit_text(legal, s),
            _ => Err(Error::Usage(format!(
                "{}: a .loops file is already loop IR: its stages are loops and the target's ({})",
                r.file.display(),
                self.text_stages().join(", ")
            ))),
        }
    }

    /// The e-graph's report — only what `run` would do: no plan where none would be used.
    fn emit_egraph(&mut self, k: texc_compiler::KernelRef, b: &Bindings) -> Result<String, Error> {
        use std::fmt::Write;
        let t = self.target();
        let written = self.specialize(k, b)?;
        if let Some(skip) = self.rewrite_skipped(k) {
            let mut out = format!("egraph for {t}: not run: {skip}\n  what runs on {t} is the graph as written:\n");
            for line in texc_compiler::graph::print_graph(&written).lines() {
                let _ = writeln!(out, "    {line}");
            }
            return Ok(out);
        }
        let built = self.rewrite(k, b, written)?;
        let plan = built.plan.as_ref().expect("the rewrite pass makes a plan");
        Ok(texc_compiler::rewrite::print_plan(plan, t, built.kept_original.as_deref()))
    }

    /// `mlir` (the target's legalized loop nests) and `mlir-linalg` (the
    /// tensor IR that runs, before scheduling).
    fn emit_mlir(&mut self, r: &EmitRequest) -> Result<String, Error> {
        if r.stage == "mlir" {
            self.require_compiled("`--stage mlir` (the loop nests of a target's schedule)")?;
        }
        if crate::is_loops_file(r.file) {
            let lf = self.load_loops(r.file)?;
            return match (r.stage, &lf.legal) {
                ("mlir", Some(legal)) => mlir::loops(legal),
                _ => Err(Error::Usage(format!(
                    "{}: a .loops file is already loop IR: it has no tensor IR to export as linalg",
                    r.file.display()
                ))),
            };
        }
        let m = self.load(r.file)?;
        let k = self.kernel(m, r.kernel)?;
        if r.stage == "mlir" {
            let (_, loops) = self.build(k, r.bindings)?;
            mlir::loops(&loops.legal)
        } else {
            mlir::linalg(&self.program(k, r.bindings)?.runs)
        }
    }
}

/// The MLIR export, or why this build has none.
mod mlir {
    use super::{Diagnostic, Error};

    #[cfg(feature = "mlir")]
    fn fail(e: texc_mlir::MlirError) -> Error {
        Error::from(Diagnostic::error(e.to_string()))
    }

    #[cfg(feature = "mlir")]
    pub fn loops(f: &texc_schedules::LoopFunc) -> Result<String, Error> {
        texc_mlir::export_loops(f).map_err(fail)
    }

    #[cfg(feature = "mlir")]
    pub fn linalg(p: &texc_compiler::Program) -> Result<String, Error> {
        texc_mlir::export_linalg(p).map_err(fail)
    }

    #[cfg(not(feature = "mlir"))]
    fn missing() -> Error {
        Error::from(Diagnostic::error(
            "this texc was built without MLIR export: build it with `cargo build --features mlir` \
             (which needs MLIR 19: apt install libmlir-19-dev libclang-19-dev)",
        ))
    }

    #[cfg(not(feature = "mlir"))]
    pub fn loops(_: &texc_schedules::LoopFunc) -> Result<String, Error> {
        Err(missing())
    }

    #[cfg(not(feature = "mlir"))]
    pub fn linalg(_: &texc_compiler::Program) -> Result<String, Error> {
        Err(missing())
    }
}
