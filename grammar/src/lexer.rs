//! Hand-written lexer feeding the lalrpop parser.
//!
//! Besides splitting text into tokens it enforces the front end's resource
//! limits, so that no later (recursive) pass can be driven into a stack
//! overflow by hostile input: bracket nesting is capped at
//! [`MAX_NESTING`] and identifiers at [`MAX_IDENT_LEN`] bytes.
//!
//! Schedule primitive names (`split`, `tile`, …) and their connective words
//! (`by`, `at`, `to`, `with`, `layout`) are keywords only inside a
//! `schedule … { … }` block, so kernels may still use them as names.

use std::fmt;

/// Deepest bracket nesting accepted (`(`, `[` and `{` together).
pub const MAX_NESTING: usize = 256;
/// Longest identifier accepted, in bytes.
pub const MAX_IDENT_LEN: usize = 255;

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Tok<'input> {
    Ident(&'input str),
    Int(i64),
    Float(f64),
    Str(&'input str),
    // keywords
    Kernel,
    Schedule,
    For,
    Import,
    Const,
    In,
    Auto,
    // schedule-only keywords
    Prim(Prim),
    By,
    To,
    At,
    With,
    Layout,
    // punctuation
    LParen,
    RParen,
    LBracket,
    RBracket,
    LBrace,
    RBrace,
    Comma,
    Semi,
    Colon,
    Dot,
    DotDot,
    Arrow,
    Eq,
    Plus,
    Minus,
    Star,
    Slash,
    Percent,
    Lt,
    Le,
    Gt,
    Ge,
    EqEq,
    Ne,
    AndAnd,
    OrOr,
    Bang,
    Question,
}

/// Schedule primitive keywords.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Prim {
    Split,
    Tile,
    Fuse,
    Reorder,
    Vectorize,
    Unroll,
    Parallel,
    Inline,
    ComputeAt,
    CacheRead,
    CacheWrite,
    Bind,
    Tensorize,
    Pipeline,
    Tune,
}

impl Prim {
    pub fn name(self) -> &'static str {
        match self {
            Prim::Split => "split",
            Prim::Tile => "tile",
            Prim::Fuse => "fuse",
            Prim::Reorder => "reorder",
            Prim::Vectorize => "vectorize",
            Prim::Unroll => "unroll",
            Prim::Parallel => "parallel",
            Prim::Inline => "inline",
            Prim::ComputeAt => "compute_at",
            Prim::CacheRead => "cache_read",
            Prim::CacheWrite => "cache_write",
            Prim::Bind => "bind",
            Prim::Tensorize => "tensorize",
            Prim::Pipeline => "pipeline",
            Prim::Tune => "tune",
        }
    }

    const ALL: [Prim; 15] = [
        Prim::Split,
        Prim::Tile,
        Prim::Fuse,
        Prim::Reorder,
        Prim::Vectorize,
        Prim::Unroll,
        Prim::Parallel,
        Prim::Inline,
        Prim::ComputeAt,
        Prim::CacheRead,
        Prim::CacheWrite,
        Prim::Bind,
        Prim::Tensorize,
        Prim::Pipeline,
        Prim::Tune,
    ];
}

impl fmt::Display for Tok<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            Tok::Ident(s) => return write!(f, "identifier `{}`", crate::truncate(s, 40)),
            Tok::Int(v) => return write!(f, "number `{v}`"),
            Tok::Float(v) => return write!(f, "number `{v}`"),
            Tok::Str(s) => return write!(f, "string \"{}\"", crate::truncate(s, 40)),
            Tok::Prim(p) => return write!(f, "`{}`", p.name()),
            Tok::Kernel => "kernel",
            Tok::Schedule => "schedule",
            Tok::For => "for",
            Tok::Import => "import",
            Tok::Const => "const",
            Tok::In => "in",
            Tok::Auto => "auto",
            Tok::By => "by",
            Tok::To => "to",
            Tok::At => "at",
            Tok::With => "with",
            Tok::Layout => "layout",
            Tok::LParen => "(",
            Tok::RParen => ")",
            Tok::LBracket => "[",
            Tok::RBracket => "]",
            Tok::LBrace => "{",
            Tok::RBrace => "}",
            Tok::Comma => ",",
            Tok::Semi => ";",
            Tok::Colon => ":",
            Tok::Dot => ".",
            Tok::DotDot => "..",
            Tok::Arrow => "->",
            Tok::Eq => "=",
            Tok::Plus => "+",
            Tok::Minus => "-",
            Tok::Star => "*",
            Tok::Slash => "/",
            Tok::Percent => "%",
            Tok::Lt => "<",
            Tok::Le => "<=",
            Tok::Gt => ">",
            Tok::Ge => ">=",
            Tok::EqEq => "==",
            Tok::Ne => "!=",
            Tok::AndAnd => "&&",
            Tok::OrOr => "||",
            Tok::Bang => "!",
            Tok::Question => "?",
        };
        write!(f, "`{s}`")
    }
}

/// A lexical error: the byte range and one line of reason.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct LexError {
    pub start: usize,
    pub end: usize,
    pub message: String,
}

pub type Spanned<'a> = Result<(usize, Tok<'a>, usize), LexError>;

pub struct Lexer<'input> {
    src: &'input str,
    pos: usize,
    depth: usize,
    /// Set after `schedule`; the next `{` opens a schedule block.
    schedule_pending: bool,
    in_schedule: bool,
    failed: bool,
}

impl<'input> Lexer<'input> {
    pub fn new(src: &'input str) -> Lexer<'input> {
        Lexer { src, pos: 0, depth: 0, schedule_pending: false, in_schedule: false, failed: false }
    }

    fn err(&mut self, start: usize, end: usize, message: impl Into<String>) -> Option<Spanned<'input>> {
        self.failed = true;
        Some(Err(LexError { start, end, message: message.into() }))
    }

    fn peek_at(&self, off: usize) -> Option<u8> {
        self.src.as_bytes().get(self.pos + off).copied()
    }

    fn skip_trivia(&mut self) {
        let b = self.src.as_bytes();
        while self.pos < b.len() {
            match b[self.pos] {
                b' ' | b'\t' | b'\r' | b'\n' => self.pos += 1,
                b'#' => {
                    // A comment ends at the end of the line, however lines end.
                    while self.pos < b.len() && b[self.pos] != b'\n' && b[self.pos] != b'\r' {
                        self.pos += 1;
                    }
                }
                _ => break,
            }
        }
    }

    fn keyword(&self, word: &'input str) -> Tok<'input> {
        match word {
            "kernel" => Tok::Kernel,
            "schedule" => Tok::Schedule,
            "for" => Tok::For,
            "import" => Tok::Import,
            "const" => Tok::Const,
            "in" => Tok::In,
            "auto" => Tok::Auto,
            _ if self.in_schedule => match word {
                "by" => Tok::By,
                "to" => Tok::To,
                "at" => Tok::At,
                "with" => Tok::With,
                "layout" => Tok::Layout,
                _ => Prim::ALL.iter().find(|p| p.name() == word).map_or(Tok::Ident(word), |p| Tok::Prim(*p)),
            },
            _ => Tok::Ident(word),
        }
    }

    fn number(&mut self, start: usize) -> Option<Spanned<'input>> {
        let b = self.src.as_bytes();
        let digits = |p: &mut usize| {
            while *p < b.len() && b[*p].is_ascii_digit() {
                *p += 1;
            }
        };
        let mut p = start;
        digits(&mut p);
        let mut is_float = false;
        if p + 1 < b.len() && b[p] == b'.' && b[p + 1].is_ascii_digit() {
            is_float = true;
            p += 1;
            digits(&mut p);
        }
        if p < b.len() && (b[p] == b'e' || b[p] == b'E') {
            let mut q = p + 1;
            if q < b.len() && (b[q] == b'+' || b[q] == b'-') {
                q += 1;
            }
            if q < b.len() && b[q].is_ascii_digit() {
                is_float = true;
                p = q;
                digits(&mut p);
            } else {
                return self.err(start, q, "malformed number: exponent has no digits");
            }
        }
        if p < b.len() && (b[p].is_ascii_alphabetic() || b[p] == b'_') {
            let mut q = p;
            while q < b.len() && (b[q].is_ascii_alphanumeric() || b[q] == b'_') {
                q += 1;
            }
            return self.err(start, q, "malformed number: a number cannot run into letters");
        }
        self.pos = p;
        let text = &self.src[start..p];
        if is_float {
            match text.parse::<f64>() {
                Ok(v) if v.is_finite() => Some(Ok((start, Tok::Float(v), p))),
                _ => self.err(start, p, "number is too large for a floating-point literal"),
            }
        } else {
            match text.parse::<i64>() {
                Ok(v) => Some(Ok((start, Tok::Int(v), p))),
                Err(_) => self.err(start, p, "integer literal is too large (the limit is 2^63 - 1)"),
            }
        }
    }

    fn open(&mut self, start: usize, tok: Tok<'input>) -> Option<Spanned<'input>> {
        self.depth += 1;
        self.pos = start + 1;
        if self.depth > MAX_NESTING {
            return self.err(start, start + 1, format!("brackets nested too deeply (the limit is {MAX_NESTING})"));
        }
        Some(Ok((start, tok, start + 1)))
    }
}

impl<'input> Iterator for Lexer<'input> {
    type Item = Spanned<'input>;

    fn next(&mut self) -> Option<Spanned<'input>> {
        if self.failed {
            return None;
        }
        self.skip_trivia();
        let start = self.pos;
        let b = self.src.as_bytes();
        let c = *b.get(start)?;
        if c.is_ascii_alphabetic() || c == b'_' {
            let mut p = start;
            while p < b.len() && (b[p].is_ascii_alphanumeric() || b[p] == b'_') {
                p += 1;
            }
            self.pos = p;
            if p - start > MAX_IDENT_LEN {
                return self.err(
                    start,
                    p,
                    format!("identifier is {} bytes long; the limit is {MAX_IDENT_LEN}", p - start),
                );
            }
            let tok = self.keyword(&self.src[start..p]);
            if tok == Tok::Schedule {
                self.schedule_pending = true;
            }
            return Some(Ok((start, tok, p)));
        }
        if c.is_ascii_digit() {
            return self.number(start);
        }
        if c == b'"' {
            let mut p = start + 1;
            while p < b.len() && b[p] != b'"' && b[p] != b'\n' && b[p] != b'\r' {
                p += 1;
            }
            if p >= b.len() || b[p] != b'"' {
                return self.err(start, p, "unterminated string literal");
            }
            self.pos = p + 1;
            return Some(Ok((start, Tok::Str(&self.src[start + 1..p]), p + 1)));
        }
        let two = |a: u8, b2: u8| c == a && self.peek_at(1) == Some(b2);
        let (tok, len) = if two(b'.', b'.') {
            (Tok::DotDot, 2)
        } else if two(b'-', b'>') {
            (Tok::Arrow, 2)
        } else if two(b'<', b'=') {
            (Tok::Le, 2)
        } else if two(b'>', b'=') {
            (Tok::Ge, 2)
        } else if two(b'=', b'=') {
            (Tok::EqEq, 2)
        } else if two(b'!', b'=') {
            (Tok::Ne, 2)
        } else if two(b'&', b'&') {
            (Tok::AndAnd, 2)
        } else if two(b'|', b'|') {
            (Tok::OrOr, 2)
        } else {
            let t = match c {
                b'(' => return self.open(start, Tok::LParen),
                b'[' => return self.open(start, Tok::LBracket),
                b'{' => {
                    if self.schedule_pending {
                        self.schedule_pending = false;
                        self.in_schedule = true;
                    }
                    return self.open(start, Tok::LBrace);
                }
                b')' => Tok::RParen,
                b']' => Tok::RBracket,
                b'}' => {
                    self.in_schedule = false;
                    Tok::RBrace
                }
                b',' => Tok::Comma,
                b';' => {
                    // `schedule k for t = auto;` has no block.
                    self.schedule_pending = false;
                    Tok::Semi
                }
                b':' => Tok::Colon,
                b'.' => Tok::Dot,
                b'=' => Tok::Eq,
                b'+' => Tok::Plus,
                b'-' => Tok::Minus,
                b'*' => Tok::Star,
                b'/' => Tok::Slash,
                b'%' => Tok::Percent,
                b'<' => Tok::Lt,
                b'>' => Tok::Gt,
                b'!' => Tok::Bang,
                b'?' => Tok::Question,
                _ => {
                    let ch = self.src[start..].chars().next().unwrap_or('?');
                    let end = start + ch.len_utf8();
                    return self.err(start, end, format!("unexpected character `{}`", ch.escape_debug()));
                }
            };
            (t, 1)
        };
        if matches!(tok, Tok::RParen | Tok::RBracket | Tok::RBrace) {
            self.depth = self.depth.saturating_sub(1);
        }
        self.pos = start + len;
        Some(Ok((start, tok, start + len)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(s: &str) -> Vec<Tok<'_>> {
        Lexer::new(s).map(|t| t.expect("lexes").1).collect()
    }

    #[test]
    fn ranges_are_not_floats() {
        assert_eq!(toks("0..H"), vec![Tok::Int(0), Tok::DotDot, Tok::Ident("H")]);
        assert_eq!(toks("1.5 1e-5 2E3 7"), vec![Tok::Float(1.5), Tok::Float(1e-5), Tok::Float(2e3), Tok::Int(7)]);
    }

    #[test]
    fn primitive_names_are_keywords_only_in_schedules() {
        assert_eq!(toks("split by"), vec![Tok::Ident("split"), Tok::Ident("by")]);
        let t = toks("schedule k for x { split C.i by 4 -> (a, b); } split");
        assert!(t.contains(&Tok::Prim(Prim::Split)) && t.contains(&Tok::By));
        assert_eq!(t.last(), Some(&Tok::Ident("split")));
        // `= auto;` has no block: the next brace is an ordinary one.
        let t = toks("schedule k for x = auto; kernel f() -> Y: f32 { split }");
        assert_eq!(t[t.len() - 2], Tok::Ident("split"));
    }

    #[test]
    fn comments_and_operators() {
        assert_eq!(
            toks("a<=b # c && d\n&& !e != f"),
            vec![
                Tok::Ident("a"),
                Tok::Le,
                Tok::Ident("b"),
                Tok::AndAnd,
                Tok::Bang,
                Tok::Ident("e"),
                Tok::Ne,
                Tok::Ident("f")
            ]
        );
    }

    #[test]
    fn limits_and_malformed_input_are_errors() {
        let deep = "(".repeat(MAX_NESTING + 1);
        let e = Lexer::new(&deep).find_map(Result::err).expect("too deep");
        assert_eq!(e.start, MAX_NESTING);
        let errs = ["1e", "12abc", "99999999999999999999", "\"open", "a ^ b", "x\u{e9}"];
        for s in errs {
            assert!(Lexer::new(s).any(|t| t.is_err()), "{s:?} should not lex");
        }
        // Lexing stops after the first error.
        let mut l = Lexer::new("@ a b");
        assert!(l.next().expect("one").is_err());
        assert!(l.next().is_none());
    }
}
