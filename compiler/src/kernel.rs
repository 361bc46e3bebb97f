//! Resolved kernels: what resolution ([`crate::resolve`]) learns about each
//! kernel, and the handles by which later passes refer to kernels.
//!
//! These types sit below both the session (which stores them per module) and
//! the resolver (which fills them), so neither imports the other's internals.

use crate::ops::{MathFn, ReduceOp};
use crate::types::{ElemType, RTy};
use std::collections::HashMap;
use texc_grammar::ast::{Dim, ExprId};
use texc_grammar::Span;

/// A kernel: module index and index among that module's kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KernelRef {
    pub module: u32,
    pub index: u32,
}

/// Index of a tensor in [`KernelInfo::tensors`].
pub type TensorSlot = u32;
/// Index of an index variable in [`KernelInfo::vars`].
pub type VarSlot = u32;

/// What a bare name refers to.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum NameRes {
    Var(VarSlot),
    /// A run-time scalar parameter (index into `KernelInfo::params`).
    Scalar(u32),
    /// A compile-time constant parameter (index into `KernelInfo::params`).
    Const(u32),
    Symbol(u32),
    /// A 0-d tensor read as a value.
    Tensor(TensorSlot),
    /// The literal `inf`.
    Inf,
}

/// What a call expression inside an element expression is.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum CallRes {
    Math(MathFn),
    /// `select(c, a, b)`: evaluates only the side it chooses.
    Select,
    Cast(ElemType),
}

/// Per-module side tables, keyed by AST expression id.
#[derive(Debug, Default)]
pub struct Facts {
    pub ty: HashMap<ExprId, RTy>,
    pub names: HashMap<ExprId, NameRes>,
    pub calls: HashMap<ExprId, CallRes>,
    pub reduces: HashMap<ExprId, (ReduceOp, Vec<VarSlot>)>,
    /// The tensor each access `T[i, ..]` reads, as *resolve* found it by
    /// name (*specialize* looks it up here, not by a scan of the kernel's
    /// tensors per access: quadratic in an imported model's layers).
    pub accesses: HashMap<ExprId, TensorSlot>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum TensorKind {
    /// Index into `KernelInfo::params`.
    Input(u32),
    /// Index into `KernelInfo::outputs`.
    Output(u32),
    Local,
}

#[derive(Clone, Debug)]
pub struct TensorInfo {
    pub name: String,
    pub elem: ElemType,
    pub rank: usize,
    pub kind: TensorKind,
    pub span: Span,
    /// Declared dimensions (inputs and outputs).
    pub dims: Vec<Dim>,
}

#[derive(Clone, Debug)]
pub enum ParamInfo {
    Tensor(TensorSlot),
    Scalar { elem: ElemType, default: Option<ExprId> },
    Const { default: Option<ExprId> },
}

#[derive(Clone, Debug)]
pub struct Param {
    pub name: String,
    pub span: Span,
    pub info: ParamInfo,
}

#[derive(Clone, Debug)]
pub struct SymbolInfo {
    pub name: String,
    pub span: Span,
    pub default: Option<ExprId>,
}

#[derive(Clone, Debug)]
pub struct VarInfo {
    pub name: String,
    pub span: Span,
    pub range: Option<(ExprId, ExprId)>,
}

/// How a callee parameter receives its value.
#[derive(Clone, Debug)]
pub enum ArgBinding {
    Tensor(TensorSlot),
    /// A caller expression, or `None` for the callee's default.
    Scalar(Option<ExprId>),
    Const(Option<ExprId>),
}

#[derive(Clone, Debug)]
pub enum Op {
    /// `T[axes] = value` (0-d when `axes` is empty).
    Def { tensor: TensorSlot, axes: Vec<VarSlot>, value: ExprId, span: Span },
    /// Composition: `results = callee(args)`; `args` follow the callee's parameter order.
    Call { callee: KernelRef, args: Vec<ArgBinding>, results: Vec<TensorSlot>, span: Span },
    /// `dst = src` for whole tensors.
    Copy { dst: TensorSlot, src: TensorSlot, span: Span },
}

#[derive(Clone, Debug)]
pub struct KernelInfo {
    pub name: String,
    pub name_span: Span,
    pub span: Span,
    pub params: Vec<Param>,
    pub outputs: Vec<TensorSlot>,
    pub tensors: Vec<TensorInfo>,
    pub symbols: Vec<SymbolInfo>,
    pub vars: Vec<VarInfo>,
    pub ops: Vec<Op>,
}

impl KernelInfo {
    /// One-line signature for messages: `relu(X: f32[4 dims])`.
    pub fn signature(&self) -> String {
        let ps: Vec<String> = self
            .params
            .iter()
            .map(|p| match &p.info {
                ParamInfo::Tensor(t) => {
                    let t = &self.tensors[*t as usize];
                    format!("{}: {}[{}]", p.name, t.elem, dims_text(t.rank))
                }
                ParamInfo::Scalar { elem, .. } => format!("{}: {elem}", p.name),
                ParamInfo::Const { .. } => format!("const {}: int", p.name),
            })
            .collect();
        format!("{}({})", self.name, ps.join(", "))
    }

    pub fn symbol_index(&self, name: &str) -> Option<usize> {
        self.symbols.iter().position(|s| s.name == name)
    }

    pub fn param_index(&self, name: &str) -> Option<usize> {
        self.params.iter().position(|p| p.name == name)
    }
}

pub(crate) fn dims_text(rank: usize) -> String {
    match rank {
        0 => String::new(),
        1 => "1 dim".into(),
        n => format!("{n} dims"),
    }
}

/// Deterministic printer of resolved kernels (the dump after *resolve*):
/// each kernel's signature, then its operations with the tensors they write.
pub fn print_kernels(kernels: &[KernelInfo], name_of: &dyn Fn(KernelRef) -> String) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    for k in kernels {
        let outs: Vec<&str> = k.outputs.iter().map(|&t| k.tensors[t as usize].name.as_str()).collect();
        let _ = writeln!(out, "kernel {} -> {}", k.signature(), outs.join(", "));
        let tensor = |t: &TensorSlot| k.tensors[*t as usize].name.clone();
        for op in &k.ops {
            let _ = match op {
                Op::Def { tensor: t, axes, .. } => {
                    let axes: Vec<&str> = axes.iter().map(|&v| k.vars[v as usize].name.as_str()).collect();
                    writeln!(out, "  def {}[{}]", tensor(t), axes.join(", "))
                }
                Op::Call { callee, results, .. } => {
                    let r: Vec<String> = results.iter().map(tensor).collect();
                    writeln!(out, "  call {} = {}", r.join(", "), name_of(*callee))
                }
                Op::Copy { dst, src, .. } => writeln!(out, "  copy {} = {}", tensor(dst), tensor(src)),
            };
        }
    }
    out
}

/// A broken invariant of a resolved kernel: which kernel, and what.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("kernel `{kernel}`: {fault}")]
pub struct SessionError {
    pub kernel: String,
    pub fault: String,
}

/// Check what resolution guarantees about every resolved kernel of a
/// session: slots in range, calls with as many arguments and results as
/// their callee has parameters and outputs.
pub fn verify_session(s: &crate::Session) -> Result<(), SessionError> {
    for m in &s.modules {
        for k in &m.kernels {
            let n = k.tensors.len() as u32;
            let err = |what: &str| SessionError { kernel: k.name.clone(), fault: what.to_string() };
            if k.outputs.iter().any(|&t| t >= n) {
                return Err(err("an output slot is out of range"));
            }
            for p in &k.params {
                if matches!(p.info, ParamInfo::Tensor(t) if t >= n) {
                    return Err(err("a parameter's tensor slot is out of range"));
                }
            }
            for op in &k.ops {
                match op {
                    Op::Def { tensor, axes, .. } => {
                        if *tensor >= n || axes.iter().any(|&v| v as usize >= k.vars.len()) {
                            return Err(err("a definition's slots are out of range"));
                        }
                    }
                    Op::Copy { dst, src, .. } => {
                        if *dst >= n || *src >= n {
                            return Err(err("a copy's slots are out of range"));
                        }
                    }
                    Op::Call { callee, args, results, .. } => {
                        let c = s
                            .modules
                            .get(callee.module as usize)
                            .and_then(|cm| cm.kernels.get(callee.index as usize))
                            .ok_or_else(|| err("a call names no kernel"))?;
                        if args.len() != c.params.len() || results.len() != c.outputs.len() {
                            return Err(err(&format!("a call of `{}` does not match its signature", c.name)));
                        }
                        if results.iter().any(|&t| t >= n) {
                            return Err(err("a call's result slots are out of range"));
                        }
                    }
                }
            }
        }
    }
    Ok(())
}
