//! One top-level loop nest of a CPU kernel as a kernel of its own, in a
//! canonical form: what backends compile nest by nest (a model's hundreds
//! of nests become small independent functions, compiled in parallel,
//! deduplicated and cached by their content).
//!
//! [`extract`] copies the nest into a fresh [`LoopFunc`] whose tensors,
//! loop variables and expressions are numbered in order of first
//! appearance and whose names and source spans are erased. So two nests
//! that differ only in which buffers they touch (the many same-shaped
//! layers of a ResNet) extract to equal functions: [`Nest::key`] — the
//! whole extracted function, printed with `Debug` — is the same, and one
//! compiled function serves both, called with different buffers
//! ([`Nest::tensors`] maps its tensors back to the whole kernel's).
//!
//! Invariants: the extracted function reads and writes exactly what the
//! nest reads and writes (its tensors are parameters: those the nest
//! stores to are outputs, the rest inputs; its `Alloc`ated buffers stay
//! locals); it keeps every scalar of the kernel, numbered as before, and
//! its loops' marks for the backend (`rolled`, part of the key). Nests
//! with GPU statements are not extracted (GPU kernels launch whole).

use crate::ir::{LoopFunc, Stmt};
use std::collections::{BTreeSet, HashMap};
use texc_compiler::tir::{Program, ProgramParam, TExpr, TExprId, TensorId, TensorRole, VarDecl, VarId};
use texc_grammar::Span;

/// A top-level nest as a kernel of its own.
pub struct Nest {
    /// The nest in canonical form, named `name` (see [`Nest::key`]).
    pub func: LoopFunc,
    /// The whole kernel's tensor behind each tensor of `func`, by id.
    pub tensors: Vec<TensorId>,
    /// Everything that decides the nest's code: equal keys, equal code.
    pub key: String,
}

/// The nest `s` of `f` in canonical form (see the module comment), named
/// `name` (which is not part of the key); `None` for nests with GPU
/// statements.
pub fn extract(f: &LoopFunc, s: &Stmt, name: &str) -> Option<Nest> {
    let mut x = Extractor {
        f,
        p: Program::default(),
        vars: HashMap::new(),
        new_vars: Vec::new(),
        tensors: Vec::new(),
        tmap: HashMap::new(),
        exprs: HashMap::new(),
        stored: BTreeSet::new(),
        local: BTreeSet::new(),
    };
    let body = vec![x.stmt(s)?];
    let Extractor { mut p, vars, new_vars, tensors, stored, local, .. } = x;
    let rolled = f.rolled.iter().filter_map(|v| vars.get(v).copied()).collect();
    p.tensors = tensors
        .iter()
        .enumerate()
        .map(|(i, &t)| {
            let d = f.p.tensor(t);
            let id = TensorId(i as u32);
            let role = if local.contains(&id) {
                TensorRole::Temp
            } else if stored.contains(&id) {
                TensorRole::Output
            } else {
                TensorRole::Input
            };
            texc_compiler::tir::TensorDecl {
                name: format!("t{i}"),
                elem: d.elem,
                shape: d.shape.clone(),
                role,
                span: Span::default(),
            }
        })
        .collect();
    let ids = (0..tensors.len() as u32).map(TensorId);
    p.params = ids
        .clone()
        .filter(|t| p.tensors[t.0 as usize].role == TensorRole::Input)
        .map(ProgramParam::Tensor)
        .chain((0..f.p.scalars.len() as u32).map(ProgramParam::Scalar))
        .collect();
    p.outputs = ids.filter(|t| p.tensors[t.0 as usize].role == TensorRole::Output).collect();
    p.scalars =
        f.p.scalars.iter().map(|s| texc_compiler::tir::ScalarDecl { name: String::new(), ..s.clone() }).collect();
    let func = LoopFunc { p, vars: new_vars, body, shared: BTreeSet::new(), registers: BTreeSet::new(), rolled };
    let key = format!("{:?}|{:?}|{:?}|{:?}", func.p.tensors, func.p.scalars, func.p.params, func.p.outputs)
        + &format!("|{:?}|{:?}|{:?}|{:?}|{:?}", func.p.exprs, func.p.tys, func.vars, func.body, func.rolled);
    let mut func = func;
    func.p.name = name.to_string();
    Some(Nest { func, tensors, key })
}

struct Extractor<'a> {
    f: &'a LoopFunc,
    p: Program,
    vars: HashMap<VarId, VarId>,
    new_vars: Vec<VarDecl>,
    tensors: Vec<TensorId>,
    tmap: HashMap<TensorId, TensorId>,
    exprs: HashMap<TExprId, TExprId>,
    stored: BTreeSet<TensorId>,
    local: BTreeSet<TensorId>,
}

impl Extractor<'_> {
    fn tensor(&mut self, t: TensorId) -> TensorId {
        let next = TensorId(self.tensors.len() as u32);
        *self.tmap.entry(t).or_insert_with(|| {
            self.tensors.push(t);
            next
        })
    }

    fn var(&mut self, v: VarId) -> VarId {
        let next = self.new_vars.len() as VarId;
        let f = self.f;
        *self.vars.entry(v).or_insert_with(|| {
            // Names are not part of the code; extents are.
            self.new_vars.push(VarDecl { name: format!("v{next}"), extent: f.vars[v as usize].extent });
            next
        })
    }

    fn expr(&mut self, e: TExprId) -> TExprId {
        if let Some(&n) = self.exprs.get(&e) {
            return n;
        }
        let old = self.f.p.expr(e).clone();
        let new = match old {
            TExpr::Int(_) | TExpr::Float(_) | TExpr::Scalar(_) => old,
            TExpr::Var(v) => TExpr::Var(self.var(v)),
            TExpr::Load(t, idx) => {
                let t = self.tensor(t);
                TExpr::Load(t, idx.into_iter().map(|i| self.expr(i)).collect())
            }
            TExpr::Unary(op, a) => TExpr::Unary(op, self.expr(a)),
            TExpr::Binary(op, a, b) => {
                let a = self.expr(a);
                TExpr::Binary(op, a, self.expr(b))
            }
            TExpr::Select(c, a, b) => {
                let c = self.expr(c);
                let a = self.expr(a);
                TExpr::Select(c, a, self.expr(b))
            }
            TExpr::Math(m, args) => TExpr::Math(m, args.into_iter().map(|i| self.expr(i)).collect()),
            TExpr::Intrinsic(m, args) => TExpr::Intrinsic(m, args.into_iter().map(|i| self.expr(i)).collect()),
            TExpr::Cast(a) => TExpr::Cast(self.expr(a)),
            TExpr::Reduce(op, vs, a) => {
                let vs = vs.into_iter().map(|v| self.var(v)).collect();
                TExpr::Reduce(op, vs, self.expr(a))
            }
        };
        let id = TExprId(self.p.exprs.len() as u32);
        self.p.exprs.push(new);
        self.p.tys.push(self.f.p.ty(e));
        self.p.spans.push(Span::default());
        self.exprs.insert(e, id);
        id
    }

    fn stmts(&mut self, body: &[Stmt]) -> Option<Vec<Stmt>> {
        body.iter().map(|s| self.stmt(s)).collect()
    }

    fn stmt(&mut self, s: &Stmt) -> Option<Stmt> {
        Some(match s {
            Stmt::For { var, lo, extent, kind, body } => {
                if kind.is_gpu() || matches!(kind, crate::ir::ForKind::Async) {
                    return None;
                }
                let var = self.var(*var);
                Stmt::For { var, lo: *lo, extent: *extent, kind: *kind, body: self.stmts(body)? }
            }
            Stmt::If { cond, then } => {
                let cond = self.expr(*cond);
                Stmt::If { cond, then: self.stmts(then)? }
            }
            Stmt::Alloc { tensor, body } => {
                if self.f.shared.contains(tensor) || self.f.registers.contains(tensor) {
                    return None;
                }
                let tensor = self.tensor(*tensor);
                self.local.insert(tensor);
                Stmt::Alloc { tensor, body: self.stmts(body)? }
            }
            Stmt::Store { tensor, indices, value } => {
                let tensor = self.tensor(*tensor);
                self.stored.insert(tensor);
                let indices = indices.iter().map(|&i| self.expr(i)).collect();
                Stmt::Store { tensor, indices, value: self.expr(*value) }
            }
            Stmt::Mma { .. }
            | Stmt::Wgmma(_)
            | Stmt::TileDot(_)
            | Stmt::Barrier
            | Stmt::Async(_)
            | Stmt::WarpReduce(_) => return None,
            // A prefetched tensor is read by the nest too: a parameter (an
            // input, unless the nest stores to it) like any other.
            Stmt::Prefetch { tensor, offset } => {
                Stmt::Prefetch { tensor: self.tensor(*tensor), offset: self.expr(*offset) }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::extract;

    /// Two nests equal up to their buffers share a key, unless one of their
    /// loops is kept `rolled`: the mark is carried through the renumbering
    /// of loop variables and decides the code.
    #[test]
    fn marks_follow_the_nest_into_its_key() {
        let text = "func f [N=4]
  input A: f32[4]
  output B: f32[4]
  output C: f32[4]
  for i in 0..4 rolled:
    B[i] = A[i]
  for j in 0..4:
    C[j] = A[j]
";
        let f = crate::text::parse(text, texc_grammar::FileId(0)).expect("parses").func;
        let [one, two] = [&f.body[0], &f.body[1]].map(|s| extract(&f, s, "n").expect("a CPU nest"));
        assert_eq!(one.func.rolled.iter().copied().collect::<Vec<_>>(), [0], "`i`, renumbered");
        assert!(two.func.rolled.is_empty());
        assert_ne!(one.key, two.key);
        let mut unmarked = f.clone();
        unmarked.rolled.clear();
        assert_eq!(extract(&unmarked, &unmarked.body[0], "n").expect("a CPU nest").key, two.key);
    }
}
