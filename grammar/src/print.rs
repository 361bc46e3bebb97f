//! Deterministic printer for the AST (`texc emit --stage ast`).
//!
//! One item per block, one statement or primitive per line, expressions as
//! S-expressions. [`print_ast_spanned`] also shows every node's byte span as
//! `@start..end`, pinning down source positions as well as structure
//! (`texc emit --stage ast --spans`); [`print_ast`] leaves them out.

use crate::ast::*;
use crate::span::Span;
use std::fmt::Write;

/// The AST without byte spans.
pub fn print_ast(ast: &Ast) -> String {
    print_items(ast, false)
}

/// The AST with every node's byte span.
pub fn print_ast_spanned(ast: &Ast) -> String {
    print_items(ast, true)
}

fn print_items(ast: &Ast, spans: bool) -> String {
    let mut p = Printer { ast, out: String::new(), spans };
    for item in &ast.items {
        p.item(item);
    }
    p.out
}

/// Print one expression as an S-expression (spans omitted).
pub fn print_expr(ast: &Ast, e: ExprId) -> String {
    let mut p = Printer { ast, out: String::new(), spans: false };
    p.expr(e, false);
    p.out
}

struct Printer<'a> {
    ast: &'a Ast,
    out: String,
    spans: bool,
}

impl Printer<'_> {
    fn sp(&self, s: Span) -> String {
        if self.spans {
            format!("@{}..{}", s.start, s.end)
        } else {
            String::new()
        }
    }

    /// A line of output; the blank a missing span leaves at its end is dropped.
    fn line(&mut self, indent: usize, text: &str) {
        let _ = writeln!(self.out, "{}{}", "  ".repeat(indent), text.trim_end());
    }

    fn ident(&self, i: &Ident) -> String {
        format!("{}{}", i.name, self.sp(i.span))
    }

    fn e(&self, e: ExprId) -> String {
        let mut p = Printer { ast: self.ast, out: String::new(), spans: self.spans };
        p.expr(e, self.spans);
        p.out
    }

    fn expr(&mut self, e: ExprId, spans: bool) {
        let s = if spans { self.sp(self.ast.span(e)) } else { String::new() };
        match self.ast.expr(e).clone() {
            Expr::Int(v) => {
                let _ = write!(self.out, "{v}{s}");
            }
            Expr::Float(v) => {
                let _ = write!(self.out, "{v:?}{s}");
            }
            Expr::Name(n) => {
                let _ = write!(self.out, "{}{s}", n.name);
            }
            Expr::Access { tensor, indices } => {
                let _ = write!(self.out, "(access{s} {}", tensor.name);
                for i in indices {
                    self.out.push(' ');
                    self.expr(i, spans);
                }
                self.out.push(')');
            }
            Expr::Call { func, args } => {
                let _ = write!(self.out, "(call{s} {}", func.name);
                for a in args {
                    self.out.push(' ');
                    if let Some(n) = &a.name {
                        let _ = write!(self.out, "{}=", n.name);
                    }
                    self.expr(a.value, spans);
                }
                self.out.push(')');
            }
            Expr::Reduce { op, binders, body } => {
                let _ = write!(self.out, "({}{s} [", op.name);
                for (i, b) in binders.iter().enumerate() {
                    if i > 0 {
                        self.out.push(' ');
                    }
                    self.binder(b, spans);
                }
                self.out.push_str("] ");
                self.expr(body, spans);
                self.out.push(')');
            }
            Expr::Unary { op, arg } => {
                let o = match op {
                    UnOp::Neg => "neg",
                    UnOp::Not => "not",
                };
                let _ = write!(self.out, "({o}{s} ");
                self.expr(arg, spans);
                self.out.push(')');
            }
            Expr::Binary { op, lhs, rhs } => {
                let _ = write!(self.out, "({}{s} ", op.symbol());
                self.expr(lhs, spans);
                self.out.push(' ');
                self.expr(rhs, spans);
                self.out.push(')');
            }
        }
    }

    fn binder(&mut self, b: &Binder, spans: bool) {
        self.out.push_str(&b.var.name);
        if let Some((lo, hi)) = b.range {
            self.out.push_str(" in ");
            self.expr(lo, spans);
            self.out.push_str("..");
            self.expr(hi, spans);
        }
    }

    fn dims(&self, dims: &[Dim]) -> String {
        let parts: Vec<String> = dims
            .iter()
            .map(|d| match d.default {
                Some(def) => format!("{} = {}", self.e(d.expr), self.e(def)),
                None => self.e(d.expr),
            })
            .collect();
        format!("[{}]", parts.join(", "))
    }

    fn item(&mut self, item: &Item) {
        match item {
            Item::Import(i) => {
                let what = match &i.path {
                    ImportPath::Module(parts) => parts.iter().map(|p| p.name.as_str()).collect::<Vec<_>>().join("."),
                    ImportPath::File { path, .. } => format!("{path:?}"),
                };
                self.line(0, &format!("import {what} {}", self.sp(i.span)));
            }
            Item::Kernel(k) => self.kernel(k),
            Item::Schedule(s) => self.schedule(s),
        }
    }

    fn kernel(&mut self, k: &Kernel) {
        self.line(0, &format!("kernel {} {}", self.ident(&k.name), self.sp(k.span)));
        for p in &k.params {
            let text = match &p.kind {
                ParamKind::Tensor { elem, dims } => {
                    format!("tensor {}: {}{}", self.ident(&p.name), elem.name, self.dims(dims))
                }
                ParamKind::Scalar { elem, default } => {
                    let d = default.map(|d| format!(" = {}", self.e(d))).unwrap_or_default();
                    format!("scalar {}: {}{d}", self.ident(&p.name), elem.name)
                }
                ParamKind::Const { ty, default } => {
                    let d = default.map(|d| format!(" = {}", self.e(d))).unwrap_or_default();
                    format!("const {}: {}{d}", self.ident(&p.name), ty.name)
                }
            };
            self.line(1, &format!("param {text} {}", self.sp(p.span)));
        }
        for o in &k.outputs {
            let text =
                format!("output {}: {}{} {}", self.ident(&o.name), o.elem.name, self.dims(&o.dims), self.sp(o.span));
            self.line(1, &text);
        }
        for s in &k.body {
            let text = match s {
                Stmt::Def { tensor, axes, value, span } => {
                    let mut p = Printer { ast: self.ast, out: String::new(), spans: self.spans };
                    for (i, b) in axes.iter().enumerate() {
                        if i > 0 {
                            p.out.push_str(", ");
                        }
                        p.binder(b, self.spans);
                    }
                    format!("def {}[{}] = {} {}", self.ident(tensor), p.out, self.e(*value), self.sp(*span))
                }
                Stmt::Assign { targets, value, span } => {
                    let t: Vec<String> = targets.iter().map(|t| self.ident(t)).collect();
                    format!("assign ({}) = {} {}", t.join(", "), self.e(*value), self.sp(*span))
                }
            };
            self.line(1, &text);
        }
    }

    fn axis(&self, a: &AxisRef) -> String {
        format!("{}.{}", self.ident(&a.stage), self.ident(&a.axis))
    }

    fn names(&self, v: &[Ident]) -> String {
        v.iter().map(|i| self.ident(i)).collect::<Vec<_>>().join(", ")
    }

    fn factor(&self, f: &Factor) -> String {
        match f {
            Factor::Const(v, s) => format!("{v}{}", self.sp(*s)),
            Factor::Tunable(i) => format!("?{}{}", i.name, self.sp(i.span)),
        }
    }

    fn schedule(&mut self, s: &Schedule) {
        self.line(0, &format!("schedule {} for {} {}", self.ident(&s.kernel), self.ident(&s.target), self.sp(s.span)));
        let prims = match &s.body {
            ScheduleBody::Auto => {
                self.line(1, "auto");
                return;
            }
            ScheduleBody::Primitives(p) => p,
        };
        for p in prims {
            let text = match &p.kind {
                PrimKind::Split { axis, factor, outer, inner } => {
                    format!(
                        "split {} by {} -> ({}, {})",
                        self.axis(axis),
                        self.factor(factor),
                        self.ident(outer),
                        self.ident(inner)
                    )
                }
                PrimKind::Tile { stage, axes, factors, new_axes } => {
                    let f: Vec<String> = factors.iter().map(|f| self.factor(f)).collect();
                    format!(
                        "tile {}({}) by ({}) -> ({})",
                        self.ident(stage),
                        self.names(axes),
                        f.join(", "),
                        self.names(new_axes)
                    )
                }
                PrimKind::Fuse { stage, axes, fused } => {
                    format!("fuse {}({}) -> {}", self.ident(stage), self.names(axes), self.ident(fused))
                }
                PrimKind::Reorder { stage, axes } => {
                    format!("reorder {}({})", self.ident(stage), self.names(axes))
                }
                PrimKind::Vectorize(a) => format!("vectorize {}", self.axis(a)),
                PrimKind::Unroll(a) => format!("unroll {}", self.axis(a)),
                PrimKind::Parallel(a) => format!("parallel {}", self.axis(a)),
                PrimKind::Inline { stage } => format!("inline {}", self.ident(stage)),
                PrimKind::ComputeAt { stage, at } => {
                    format!("compute_at {} {}", self.ident(stage), self.axis(at))
                }
                PrimKind::CacheRead { tensor, consumer, at, scope, layout, name } => {
                    let scope = scope.as_ref().map(|s| format!(" in {}", self.ident(s))).unwrap_or_default();
                    let layout = layout
                        .as_ref()
                        .map(|l| format!(" layout ({})", l.iter().map(|e| self.e(*e)).collect::<Vec<_>>().join(", ")))
                        .unwrap_or_default();
                    format!(
                        "cache_read {} for {} at {}{scope}{layout} -> {}",
                        self.ident(tensor),
                        self.ident(consumer),
                        self.axis(at),
                        self.ident(name)
                    )
                }
                PrimKind::CacheWrite { stage, at, scope, name } => {
                    let scope = scope.as_ref().map(|s| format!(" in {}", self.ident(s))).unwrap_or_default();
                    format!("cache_write {} at {}{scope} -> {}", self.ident(stage), self.axis(at), self.ident(name))
                }
                PrimKind::Bind { axis, unit, dim } => {
                    format!("bind {} to {}.{}", self.axis(axis), self.ident(unit), self.ident(dim))
                }
                PrimKind::Tensorize { stage, axes, intrinsic } => {
                    format!("tensorize {}({}) with {}", self.ident(stage), self.names(axes), self.ident(intrinsic))
                }
                PrimKind::Pipeline { axis, stages } => {
                    format!("pipeline {} by {}", self.axis(axis), self.factor(stages))
                }
                PrimKind::Tune { name, values } => {
                    let v: Vec<String> = values.iter().map(|(v, s)| format!("{v}{}", self.sp(*s))).collect();
                    format!("tune {} in [{}]", self.ident(name), v.join(", "))
                }
            };
            self.line(1, &format!("{text} {}", self.sp(p.span)));
        }
    }
}
