//! `texc check`: what can be verified about a file's kernels, with their
//! sizes or without them, and a summary that says exactly what was.
//!
//! Per kernel:
//! - *bounds for all sizes* ([`texc_compiler::symbolic`]): each index is
//!   proven in bounds for every size, out of bounds for every size (an
//!   error), in bounds only under a condition on the sizes (a warning that
//!   names it), or left to the check at concrete sizes (guarded or not
//!   affine);
//! - *element types*: a tensor of a type that a target the kernel is
//!   scheduled for (or `--target`) cannot run is an error at its declaration;
//! - *at concrete sizes*, when the source and the flags give every size:
//!   specialization, which proves every access in bounds there, and every
//!   schedule block for a compiled target applied through legalization;
//! - *schedules*: every block, for every target it names (`interp` and GPU
//!   targets included), validated against the kernel's structure
//!   ([`texc_schedules::validate`]) — at sample sizes when the real ones
//!   are not known, where only what does not depend on sizes is checked.

use crate::{Error, Pipeline};
use texc_compiler::kernel::ParamInfo;
use texc_compiler::target::Target;
use texc_compiler::{symbolic, Bindings, KernelRef, Program};
use texc_grammar::Diagnostic;

/// Sample sizes for kernels checked without their sizes: shape symbols
/// with no value take the first of these at which the kernel specializes.
const SAMPLE_SIZES: [i64; 3] = [8, 32, 128];

/// What `texc check` verified.
#[derive(Debug, Default)]
pub struct Checked {
    pub kernels: Vec<String>,
    /// Kernels specialized at concrete sizes (every access proven in bounds there).
    pub at_sizes: Vec<String>,
    pub proven: usize,
    pub conditional: usize,
    pub undecided: usize,
    /// Conditions under which conditional accesses are in bounds (distinct).
    pub conditions: Vec<String>,
    /// `kernel for target` of every schedule block validated.
    pub schedules: Vec<String>,
    /// Kernels whose schedule blocks could not be validated, with why.
    pub unvalidated: Vec<String>,
    pub warnings: Vec<Diagnostic>,
}

impl Checked {
    /// The summary `texc check` prints: one line per kind of check.
    pub fn summary(&self) -> String {
        let n = self.kernels.len();
        // Overloads share a name: list it once, with how many there are.
        let mut names: Vec<(String, usize)> = Vec::new();
        for k in &self.kernels {
            match names.iter_mut().find(|(x, _)| x == k) {
                Some((_, c)) => *c += 1,
                None => names.push((k.clone(), 1)),
            }
        }
        let names: Vec<String> =
            names.into_iter().map(|(k, c)| if c == 1 { k } else { format!("{k} ({c} overloads)") }).collect();
        let mut out = format!("ok: {n} kernel{} checked: {}\n", plural(n), names.join(", "));
        let mut bounds = format!("  bounds for all sizes: {} ind{} proven in bounds", self.proven, ices(self.proven));
        if self.conditional > 0 {
            bounds += &format!(
                "; {} valid only when {}",
                self.conditional,
                if self.conditions.is_empty() { "sizes agree".to_string() } else { self.conditions.join(" and ") }
            );
        }
        if self.undecided > 0 {
            bounds += &format!(
                "; {} ind{} guarded or not affine, proven only at concrete sizes",
                self.undecided,
                ices(self.undecided)
            );
        }
        out += &bounds;
        out.push('\n');
        out += &if self.at_sizes.is_empty() {
            "  at concrete sizes: none (give --shape for every shape symbol to prove every access there)\n".to_string()
        } else {
            format!(
                "  at concrete sizes: {} of {n} kernel{} specialized, every access proven in bounds ({})\n",
                self.at_sizes.len(),
                plural(n),
                self.at_sizes.join(", ")
            )
        };
        out += &if self.schedules.is_empty() {
            "  schedules: none written\n".to_string()
        } else {
            format!(
                "  schedules: {} block{} validated ({})\n",
                self.schedules.len(),
                plural(self.schedules.len()),
                self.schedules.join(", ")
            )
        };
        for u in &self.unvalidated {
            out += &format!("  schedules not validated: {u}\n");
        }
        out
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

fn ices(n: usize) -> &'static str {
    if n == 1 {
        "ex"
    } else {
        "ices"
    }
}

/// Whether every size of kernel `k` is known from the source and `b`.
fn sized(pl: &Pipeline, k: KernelRef, b: &Bindings) -> bool {
    let info = pl.session.kernel(k);
    info.symbols.iter().all(|s| s.default.is_some() || b.shapes.iter().any(|(n, _)| *n == s.name))
        && info.params.iter().all(|p| match &p.info {
            ParamInfo::Const { default } => default.is_some() || b.consts.iter().any(|(n, _)| *n == p.name),
            _ => true,
        })
}

/// `b` restricted to kernel `k`'s own symbols and constants.
fn own_bindings(pl: &Pipeline, k: KernelRef, b: &Bindings) -> Bindings {
    let info = pl.session.kernel(k);
    let own = |n: &String| info.symbol_index(n).is_some() || info.param_index(n).is_some();
    Bindings {
        shapes: b.shapes.iter().filter(|(n, _)| own(n)).cloned().collect(),
        consts: b.consts.iter().filter(|(n, _)| own(n)).cloned().collect(),
        input_shapes: Default::default(),
    }
}

/// `b` completed with sample sizes: every symbol without a value or default
/// gets `sample`, every constant without one 1.
fn sample_bindings(pl: &Pipeline, k: KernelRef, b: &Bindings, sample: i64) -> Bindings {
    let info = pl.session.kernel(k);
    let mut out = b.clone();
    for s in &info.symbols {
        if s.default.is_none() && !b.shapes.iter().any(|(n, _)| *n == s.name) {
            out.shapes.push((s.name.clone(), sample));
        }
    }
    for p in &info.params {
        if matches!(p.info, ParamInfo::Const { default: None }) && !b.consts.iter().any(|(n, _)| *n == p.name) {
            out.consts.push((p.name.clone(), 1));
        }
    }
    out
}

/// Check `kernels` (at the sizes `b` gives where it gives all). Errors come
/// back as `Error::Input` (warnings found with them included); on success,
/// what was verified, with the warnings.
pub fn check(pl: &mut Pipeline, kernels: &[KernelRef], b: &Bindings) -> Result<Checked, Error> {
    let mut c = Checked::default();
    let mut diags: Vec<Diagnostic> = Vec::new();
    for &k in kernels {
        let name = pl.session.kernel(k).name.clone();
        c.kernels.push(name.clone());
        let report = symbolic::check_kernel(&pl.session, k);
        c.proven += report.proven;
        c.conditional += report.conditional;
        c.undecided += report.undecided;
        for cond in &report.conditions {
            if !c.conditions.iter().any(|x| x == cond.text()) {
                c.conditions.push(cond.text().to_string());
            }
        }
        c.warnings.extend(report.warnings);
        let bounds_failed = !report.errors.is_empty();
        diags.extend(report.errors);
        let mut targets: Vec<&'static Target> =
            texc_schedules::validate::blocks(&pl.session, k).iter().map(|(t, _)| *t).collect();
        let has_blocks = !targets.is_empty();
        if pl.target().is_compiled() {
            targets.push(pl.target());
        }
        diags.extend(elem_type_errors(pl, k, &targets));
        if bounds_failed {
            // The same accesses would fail again at any sizes.
            continue;
        }
        let own = own_bindings(pl, k, b);
        let structure: Result<Program, String> = if sized(pl, k, &own) {
            match pl.specialize(k, &own) {
                Ok(p) => {
                    c.at_sizes.push(name.clone());
                    diags.extend(pl.check_schedules(k, &p));
                    Ok(p)
                }
                Err(Error::Input(d)) => {
                    diags.extend(d);
                    continue;
                }
                Err(e) => return Err(e),
            }
        } else {
            let mut last = String::new();
            let mut found = None;
            for sample in SAMPLE_SIZES {
                let sb = sample_bindings(pl, k, &own, sample);
                match texc_compiler::specialize::specialize_structure(&pl.session, k, &sb) {
                    Ok(p) => {
                        found = Some(p);
                        break;
                    }
                    Err(d) => last = d.message,
                }
            }
            found.ok_or(last)
        };
        match structure {
            Ok(p) => {
                for (t, src) in &texc_schedules::validate::blocks(&pl.session, k) {
                    match texc_schedules::validate::validate(&p, *src, t) {
                        Ok(()) => c.schedules.push(format!("{name} for {}", t.name)),
                        Err(d) => diags.push(d),
                    }
                }
            }
            Err(why) if has_blocks => {
                c.unvalidated.push(format!("`{name}` does not specialize at sample sizes ({why}); give --shape"))
            }
            Err(_) => {}
        }
    }
    // A problem found by two checks (a schedule block applied at sizes, and validated) is shown once.
    let mut seen: Vec<(String, Option<texc_grammar::Span>)> = Vec::new();
    diags.retain(|d| {
        let key = (d.message.clone(), d.primary.as_ref().map(|(s, _)| *s));
        let fresh = !seen.contains(&key);
        seen.push(key);
        fresh
    });
    if !diags.is_empty() {
        // A warning about a place an error already points at says less than the error.
        let at = |d: &Diagnostic| d.primary.as_ref().map(|(s, _)| *s);
        let errors: Vec<_> = diags.iter().map(at).collect();
        diags.extend(std::mem::take(&mut c.warnings).into_iter().filter(|w| !errors.contains(&at(w))));
        return Err(Error::Input(diags));
    }
    Ok(c)
}

/// Tensors of kernel `k` whose element type one of `targets` cannot run:
/// an error at the tensor's declaration, per tensor and target.
fn elem_type_errors(pl: &Pipeline, k: KernelRef, targets: &[&'static Target]) -> Vec<Diagnostic> {
    let info = pl.session.kernel(k);
    let mut out = Vec::new();
    let mut done: Vec<&str> = Vec::new();
    for t in targets {
        if done.contains(&t.name) {
            continue;
        }
        done.push(t.name);
        for ti in &info.tensors {
            if let Some(why) = t.unsupported_elem(ti.elem) {
                out.push(
                    Diagnostic::at(
                        ti.span,
                        format!("`{}` is {}, which target `{}` cannot run", ti.name, ti.elem, t.name),
                    )
                    .with_note(format!("{why}; use f32 or f16, or another target")),
                );
            }
        }
    }
    out
}
