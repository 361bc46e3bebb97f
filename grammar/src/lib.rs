//! texc front end: `.tex` source text to an arena AST with spans.
//!
//! Pipeline position: first. [`parse`] runs the hand-written [`lexer`] and the
//! lalrpop grammar, then checks expression depth so that every later pass may
//! recurse over expressions without risking a stack overflow.

pub mod ast;
pub mod diagnostic;
pub mod lexer;
mod parse_util;
pub mod print;
pub mod span;

#[allow(clippy::all, unused_parens, unused_imports, clippy::pedantic)]
mod parser {
    include!(concat!(env!("OUT_DIR"), "/parser.rs"));
}

pub use ast::Ast;
pub use diagnostic::{Diagnostic, Diagnostics};
pub use span::{FileId, SourceMap, Span};

use lalrpop_util::ParseError;
use lexer::{LexError, Lexer, Tok};

/// Deepest expression tree accepted (operators, not only brackets, count).
pub const MAX_EXPR_DEPTH: usize = 512;

/// Shorten a string for a message (identifiers may be long).
pub fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(max).collect();
        t.push('…');
        t
    }
}

/// Parse one file. On failure returns the first syntax error.
pub fn parse(file: FileId, text: &str) -> Result<Ast, Diagnostic> {
    let mut ast = Ast { file, ..Ast::default() };
    let items =
        parser::FileParser::new().parse(file, &mut ast, Lexer::new(text)).map_err(|e| parse_error(file, text, e))?;
    ast.items = items;
    check_depth(&ast)?;
    Ok(ast)
}

/// Parse a lone expression (used for `--const`/`--shape` values and tests).
pub fn parse_expr(file: FileId, text: &str) -> Result<(Ast, ast::ExprId), Diagnostic> {
    let mut ast = Ast { file, ..Ast::default() };
    let e =
        parser::ExprParser::new().parse(file, &mut ast, Lexer::new(text)).map_err(|e| parse_error(file, text, e))?;
    check_depth(&ast)?;
    Ok((ast, e))
}

fn check_depth(ast: &Ast) -> Result<(), Diagnostic> {
    // Children precede parents in the arena, so one forward pass suffices.
    let mut depth = vec![0usize; ast.exprs.len()];
    for (i, e) in ast.exprs.iter().enumerate() {
        let d = 1 + e.children().iter().map(|c| depth[c.index()]).max().unwrap_or(0);
        if d > MAX_EXPR_DEPTH {
            return Err(Diagnostic::at(
                ast.expr_spans[i],
                format!("expression nested too deeply (the limit is {MAX_EXPR_DEPTH} levels)"),
            ));
        }
        depth[i] = d;
    }
    Ok(())
}

fn describe_expected(expected: &[String]) -> String {
    let shown: Vec<String> = expected.iter().take(8).map(|s| pretty_terminal(s)).collect();
    let more = if expected.len() > 8 { ", …" } else { "" };
    match shown.len() {
        0 => String::new(),
        1 => format!("; expected {}", shown[0]),
        _ => format!("; expected one of {}{more}", shown.join(", ")),
    }
}

fn pretty_terminal(t: &str) -> String {
    match t {
        "\"ident\"" => "an identifier".into(),
        "\"int\"" => "an integer".into(),
        "\"float\"" => "a number".into(),
        "\"string\"" => "a string".into(),
        _ => format!("`{}`", t.trim_matches('"')),
    }
}

fn parse_error(file: FileId, text: &str, e: ParseError<usize, Tok<'_>, LexError>) -> Diagnostic {
    let span = |a: usize, b: usize| Span::new(file, a, b);
    match e {
        ParseError::InvalidToken { location } => Diagnostic::at(span(location, location + 1), "invalid token"),
        ParseError::UnrecognizedEof { location, expected } => {
            let at = location.min(text.len());
            Diagnostic::at(span(at, at), format!("unexpected end of file{}", describe_expected(&expected)))
        }
        ParseError::UnrecognizedToken { token: (l, tok, r), expected } => {
            Diagnostic::at(span(l, r), format!("unexpected {tok}{}", describe_expected(&expected)))
        }
        ParseError::ExtraToken { token: (l, tok, r) } => Diagnostic::at(span(l, r), format!("unexpected {tok}")),
        ParseError::User { error } => Diagnostic::at(span(error.start, error.end), error.message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_expression_has_a_span_inside_its_file() {
        let src =
            "kernel f(A: f32[N = 4], const p: int = 1) -> B: f32[N] {\n  B[i] = sum[k in 0..p](A[i] * 2.0) + -1;\n}\n";
        let ast = parse(FileId(0), src).expect("parses");
        assert_eq!(ast.exprs.len(), ast.expr_spans.len());
        for s in &ast.expr_spans {
            assert!(s.start < s.end && s.end as usize <= src.len());
        }
        let printed = print::print_ast_spanned(&ast);
        assert!(printed.contains("(sum@"), "{printed}");
        assert!(printed.contains("k in 0@"), "{printed}");
    }

    #[test]
    fn syntax_errors_point_at_the_token() {
        let src = "kernel f() -> Y: f32 { Y = 1 +; }";
        let d = parse(FileId(0), src).expect_err("bad");
        let (span, _) = d.primary.expect("spanned");
        assert_eq!(&src[span.range()], ";");
        assert!(d.message.starts_with("unexpected `;`"), "{}", d.message);
    }

    #[test]
    fn schedules_parse_into_the_ast() {
        let src = "kernel f(A: f32[N]) -> B: f32[N] { B[i] = A[i]; }
schedule f for x86-avx2 {
    split B.i by ?t -> (io, ii);
    tune t in [8, 16];
    cache_read A for B at B.io in shared layout (ii / 4, ii % 4) -> Al;
    cache_write B at B.io -> Bl;
    bind B.io to block.x;
    tensorize B(ii) with mma_m16n8k16_f16f32;
    compute_at Al B.io;
    inline Al;
    fuse B(io, ii) -> f;
    reorder B(ii, io);
    vectorize B.ii; unroll B.ii; parallel B.io;
}
schedule f for nvptx-sm90 = auto;";
        let ast = parse(FileId(0), src).expect("parses");
        let text = print::print_ast_spanned(&ast);
        for want in
            ["split B@", "?t@", "tune t@", "layout (", "in shared@", "bind B@", "tensorize", "auto", "nvptx-sm90@"]
        {
            assert!(text.contains(want), "missing {want} in\n{text}");
        }
    }
}
