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
        self.check_stage(r.stage)?;
        if crate::is_loops_file(r.file) {
            return self.emit_loops_file(r);
        }
        let m = self.load(r.file)?;
        self.emit_loaded(m, r.kernel, r.bindings, r.stage)
    }

    /// Stage `stage` of kernel `kernel` (`None`: the module's only or last
    /// kernel) of module `m`, which [`Pipeline::load`] or
    /// [`Pipeline::load_text`] loaded, at sizes `b`, as text.
    pub fn emit_loaded(&mut self, m: usize, kernel: Option<&str>, b: &Bindings, stage: &str) -> Result<String, Error> {
        self.check_stage(stage)?;
        if stage == "ast" {
            return Ok(texc_grammar::print::print_ast(&self.session.module(m).ast));
        }
        let k = self.kernel(m, kernel)?;
        Ok(match stage {
            "egraph" => self.emit_egraph(k, b)?,
            "graph" => texc_compiler::graph::print_graph(&self.specialize(k, b)?),
            "tir" => texc_compiler::print::print_program(&self.specialize(k, b)?),
            "loops" => texc_schedules::ir::print(&self.build(k, b)?.1.lowered),
            "mlir" => mlir::loops(&self.build(k, b)?.1.legal)?,
            "mlir-linalg" => mlir::linalg(&self.program(k, b)?.runs)?,
            _ => {
                let (_, loops) = self.build(k, b)?;
                self.emit_text(&loops.legal, stage)?
            }
        })
    }

    /// An error unless `stage` is a stage this pipeline's target has.
    fn check_stage(&self, stage: &str) -> Result<(), Error> {
        if !STAGES.contains(&stage) {
            return Err(Error::Usage(format!("unknown stage `{stage}`; stages: {}", STAGES.join(", "))));
        }
        if stage == "mlir" {
            return self.require_compiled("`--stage mlir` (the loop nests of a target's schedule)");
        }
        if stage.starts_with("mlir") {
            return Ok(());
        }
        if stage == "loops" || is_backend_stage(stage) {
            self.require_compiled(&format!("`--stage {stage}`"))?;
        }
        if is_backend_stage(stage) && !self.text_stages().contains(&stage) {
            return Err(self.no_such_stage(stage));
        }
        Ok(())
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

    /// A `.loops` file's stages: its loop nest, the target's text of it, and its MLIR.
    fn emit_loops_file(&mut self, r: &EmitRequest) -> Result<String, Error> {
        let lf = self.load_loops(r.file)?;
        match (r.stage, &lf.legal) {
            ("loops", _) => Ok(texc_schedules::ir::print(&lf.lowered)),
            ("mlir", Some(legal)) => mlir::loops(legal),
            ("mlir-linalg", _) => Err(Error::Usage(format!(
                "{}: a .loops file is already loop IR: it has no tensor IR to export as linalg",
                r.file.display()
            ))),
            (s, Some(legal)) if is_backend_stage(s) => self.emit_text(legal, s),
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
}

/// A stage the target's backend prints (not the front end's, the loop nests or MLIR).
fn is_backend_stage(stage: &str) -> bool {
    !matches!(stage, "ast" | "tir" | "graph" | "egraph" | "loops") && !stage.starts_with("mlir")
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
