//! `.loops` files: a loop nest written or edited as text
//! ([`texc_schedules::text`]) and run like a kernel.
//!
//! The file's `source` line names the `.tex` file whose kernel (the one
//! named by its `func` line, specialized to the sizes on that line) is the
//! oracle: its parameters must be the nest's exactly, so the same arguments
//! feed both and `--check` compares the nest with the interpreter's exact
//! result of the kernel as written. A nest without `source` runs, but cannot
//! be checked. On `interp` the nest runs on the loop evaluator; on compiled
//! targets it is legalized and compiled like a scheduled kernel.

use super::{Error, Pipeline};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use texc_compiler::interp::{self, Arg};
use texc_compiler::tir::{Program, ProgramParam, TensorDecl};
use texc_compiler::Bindings;
use texc_grammar::span::Span;
use texc_grammar::Diagnostic;
use texc_runtime::Tensor;
use texc_schedules::gpu::Site;
use texc_schedules::LoopFunc;

/// A loaded `.loops` file.
pub struct LoopsFile {
    /// The nest as written.
    pub lowered: LoopFunc,
    /// Legalized for a compiled target.
    pub legal: Option<LoopFunc>,
    /// The kernel named by the `source` line at the nest's sizes, as written.
    pub oracle: Option<Program>,
}

/// Whether `path` names a `.loops` file (by its extension).
pub fn is_loops_file(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "loops")
}

impl Pipeline {
    /// Read, parse and check a `.loops` file; load its oracle; legalize it
    /// for a compiled target.
    pub fn load_loops(&mut self, path: &Path) -> Result<LoopsFile, Error> {
        let bytes = texc_compiler::session::read_source(path)
            .map_err(|e| Diagnostic::error(format!("cannot read `{}`: {e}", path.display())))?;
        let text = String::from_utf8(bytes).map_err(|e| {
            Diagnostic::error(format!(
                "`{}` is not valid UTF-8 (byte {})",
                path.display(),
                e.utf8_error().valid_up_to()
            ))
        })?;
        let file = self.session.sources.add(path.display().to_string(), text.clone());
        let parsed = texc_schedules::text::parse(&text, file)?;
        super::check_emitted_size(&parsed.func)?;
        let oracle = match &parsed.source {
            Some((src, span)) => Some(self.oracle(path, src, *span, &parsed.func)?),
            None => None,
        };
        let t = self.options.target;
        let legal = if t.is_compiled() {
            if let Err(e) = texc_schedules::verify::check_target(&parsed.func, t) {
                let f = &parsed.func;
                let msg = format!("these loop nests cannot run on {t}: {e}");
                return Err(match e.at {
                    Some(Site::Loop(v)) => Diagnostic::at(parsed.loop_spans[v as usize], msg),
                    Some(Site::Tensor(x)) => Diagnostic::at(f.p.tensor(x).span, msg),
                    Some(Site::Expr(x)) => Diagnostic::at(f.p.span(x), msg),
                    None => Diagnostic::error(msg),
                }
                .into());
            }
            Some(self.legalize(parsed.func.clone())?)
        } else {
            None
        };
        Ok(LoopsFile { lowered: parsed.func, legal, oracle })
    }

    /// The kernel the nest claims to implement, specialized to its sizes,
    /// with the nest's parameters exactly.
    fn oracle(&mut self, loops_path: &Path, src: &str, span: Span, f: &LoopFunc) -> Result<Program, Error> {
        let path = resolve_source(loops_path, src);
        let m = self.load(&path).map_err(|e| match e {
            Error::Input(mut d) => {
                d.push(Diagnostic::at(span, "in the source file this loop nest names"));
                Error::Input(d)
            }
            u => u,
        })?;
        let k = self
            .session
            .entry_kernel(m, Some(&f.p.name))
            .map_err(|d| Diagnostic::at(span, format!("`{src}` defines no kernel `{}`: {}", f.p.name, d.message)))?;
        let info = self.session.kernel(k);
        let mut b = Bindings::default();
        for (name, v) in &f.p.bindings {
            if info.symbol_index(name).is_some() {
                b.shapes.push((name.clone(), *v));
            } else {
                b.consts.push((name.clone(), *v));
            }
        }
        let p = self.specialize(k, &b)?;
        same_signature(&p, &f.p).map_err(|why| {
            Diagnostic::at(
                span,
                format!("this loop nest does not have the parameters of kernel `{}` in `{src}`", p.name),
            )
            .with_note(why)
        })?;
        Ok(p)
    }

    /// Arguments for a run of `lf`: `files` and `scalars` by name, the rest
    /// seeded random data in the domain of the oracle's operators. The
    /// memory budget is checked first, as for kernels.
    pub fn prepare_loops(
        &self,
        lf: &LoopsFile,
        files: HashMap<String, Tensor>,
        scalars: &[(String, f64)],
        seed: u64,
        check: bool,
    ) -> Result<Vec<Arg>, Error> {
        if check && lf.oracle.is_none() {
            return Err(Error::Usage(
                "--check needs the loop nest's `source` line: the .tex file whose kernel is the oracle".into(),
            ));
        }
        let p = lf.oracle.as_ref().unwrap_or(&lf.lowered.p);
        // An ONNX model's names (`input.1`) name its parameters here too, and
        // its weights are the arguments the command line does not give.
        let mut files: HashMap<String, Tensor> = self.kernel_names(files.into_iter().collect())?.into_iter().collect();
        let scalars = &self.kernel_names(scalars.to_vec())?;
        if lf.oracle.is_some() {
            for (n, t) in self.model_inputs() {
                files.entry(n.clone()).or_insert_with(|| t.clone());
            }
        }
        for n in files.keys().chain(scalars.iter().map(|(n, _)| n)) {
            let known = p.params.iter().any(|q| match q {
                ProgramParam::Tensor(t) => p.tensor(*t).name == *n,
                ProgramParam::Scalar(s) => p.scalars[*s as usize].name == *n,
            });
            if !known {
                return Err(Diagnostic::error(format!("`{n}` is not a parameter of `{}`", p.name)).into());
            }
        }
        let compiled = lf.legal.as_ref().unwrap_or(&lf.lowered);
        let needed = super::run_memory(p, Some(compiled), check || lf.legal.is_none());
        self.check_memory(needed)?;
        let given: Vec<String> = files.keys().cloned().collect();
        let mut args = interp::bind_args(p, files, scalars, seed).map_err(Diagnostic::error)?;
        super::domain::into_domain(p, &mut args, &given);
        Ok(args)
    }
}

/// `src` as the `source` line names it: relative to the current directory
/// when it exists there, else to the `.loops` file's directory.
fn resolve_source(loops_path: &Path, src: &str) -> PathBuf {
    let direct = PathBuf::from(src);
    if direct.is_absolute() || direct.exists() {
        return direct;
    }
    loops_path.parent().map(|d| d.join(src)).filter(|p| p.exists()).unwrap_or(direct)
}

fn describe(d: &TensorDecl) -> String {
    let dims: Vec<String> = d.shape.iter().map(|x| x.to_string()).collect();
    format!("`{}`: {}[{}]", d.name, d.elem, dims.join(", "))
}

/// Parameters (in order, with types and shapes) and outputs of `a` and `b` agree.
fn same_signature(a: &Program, b: &Program) -> Result<(), String> {
    let param = |p: &Program, q: &ProgramParam| match q {
        ProgramParam::Tensor(t) => format!("input {}", describe(p.tensor(*t))),
        ProgramParam::Scalar(s) => format!("scalar `{}`: {}", p.scalars[*s as usize].name, p.scalars[*s as usize].elem),
    };
    let ins = |p: &Program| p.params.iter().map(|q| param(p, q)).collect::<Vec<_>>();
    let outs = |p: &Program| p.outputs.iter().map(|&t| format!("output {}", describe(p.tensor(t)))).collect::<Vec<_>>();
    for (want, got) in [(ins(a), ins(b)), (outs(a), outs(b))] {
        if want != got {
            return Err(format!("the kernel has {}; the loop nest has {}", list(&want), list(&got)));
        }
    }
    Ok(())
}

fn list(xs: &[String]) -> String {
    if xs.is_empty() {
        "none".into()
    } else {
        xs.join(", ")
    }
}
