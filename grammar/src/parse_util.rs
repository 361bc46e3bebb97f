//! Helpers for grammar actions: turning index lists into binders or indices,
//! and checks that are easier to state here than in the grammar.

use crate::ast::{Ast, Binder, Expr, ExprId, Ident};
use crate::lexer::LexError;

/// One item between `[` and `]`: an expression, or `v in lo..hi`.
pub enum IndexItem {
    Expr(ExprId),
    Range(Ident, ExprId, ExprId),
}

fn user_error(span: crate::span::Span, message: impl Into<String>) -> LexError {
    LexError { start: span.start as usize, end: span.end as usize, message: message.into() }
}

/// Items on the left of a definition or after a reduction operator must be
/// variables, optionally with a range.
pub fn binders(ast: &Ast, items: Vec<IndexItem>) -> Result<Vec<Binder>, LexError> {
    items
        .into_iter()
        .map(|item| match item {
            IndexItem::Range(var, lo, hi) => Ok(Binder { var, range: Some((lo, hi)) }),
            IndexItem::Expr(e) => match ast.expr(e) {
                Expr::Name(var) => Ok(Binder { var: var.clone(), range: None }),
                _ => Err(user_error(
                    ast.span(e),
                    "expected an index variable (optionally `v in lo..hi`) here, found an expression",
                )),
            },
        })
        .collect()
}

/// Items of a tensor access are index expressions; ranges are not allowed.
pub fn indices(items: Vec<IndexItem>) -> Result<Vec<ExprId>, LexError> {
    items
        .into_iter()
        .map(|item| match item {
            IndexItem::Expr(e) => Ok(e),
            IndexItem::Range(var, _, _) => Err(user_error(
                var.span,
                "`in` ranges may only be written on the left of a definition or in a reduction",
            )),
        })
        .collect()
}

/// Join `x86`, `avx2` into `x86-avx2`; the parts must touch (no spaces).
pub fn target_name(head: Ident, tail: Vec<Ident>) -> Result<Ident, LexError> {
    let mut name = head.name.clone();
    let mut span = head.span;
    for part in tail {
        if part.span.start != span.end + 1 {
            return Err(user_error(span.to(part.span), "a target name is written without spaces, like `x86-avx2`"));
        }
        name.push('-');
        name.push_str(&part.name);
        span = span.to(part.span);
    }
    Ok(Ident { name, span })
}

/// `tile S(a, b) by (f, g) -> (ao, bo, ai, bi)`: n axes, n factors, 2n new names.
pub fn check_tile(l: usize, r: usize, axes: usize, factors: usize, new_axes: usize) -> Result<(), LexError> {
    if axes != factors || new_axes != 2 * axes {
        return Err(LexError {
            start: l,
            end: r,
            message: format!(
                "tile of {axes} axes needs {axes} factors and {} new axis names, found {factors} and {new_axes}",
                2 * axes
            ),
        });
    }
    Ok(())
}
