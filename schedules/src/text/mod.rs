//! The loop IR as text: the format `texc emit --stage loops` prints
//! ([`crate::ir::print`]), read back into a [`LoopFunc`].
//!
//! A `.loops` file is a header line `func NAME [SYM=V, ...]`, declaration
//! lines (`source "FILE"`, `input`, `scalar`, `output`, `temp`), then the
//! statements: `for v in LO..HI [parallel|vectorized|unrolled] [rolled]:`, `if COND:`,
//! `local T: ELEM[DIMS]:` and stores `T[i, ...] = VALUE`. Nesting is by
//! indentation, two spaces per level; blank lines and lines starting with
//! `#` are ignored. Each line is parsed by the pest grammar `loops.pest`;
//! this module builds the program and does the typing the printer leaves
//! implicit: integer literals without a suffix are `index`, float and typed
//! integer literals carry their type (`0.5f32`, `3i32`), `T(x)` for an
//! element type `T` (or `index`) is a conversion, `/` is float division on
//! floats and floor division on integers, operands of a binary operator
//! have one type. Names resolve innermost first: loop variables in scope,
//! scalars, then tensors (a 0-d tensor is read by its bare name).
//!
//! Invariants of the result: every name is bound, every expression is
//! typed as the printer would print it, so that `print(parse(text)) ==
//! text` for everything the printer writes; and every access is proven in
//! bounds by [`safety`] before the function is returned, because a loop
//! nest edited by hand reaches machine code that does not check indices.
//! Errors are [`Diagnostic`]s spanned in the `.loops` file.

pub mod safety;

use crate::ir::{AsyncStep, ForKind, GpuDim, LoopFunc, Major, MmaOp, SmemMatrix, Stmt, Tile, Wgmma, WgmmaOp};
use pest::iterators::{Pair, Pairs};
use pest::Parser;
use texc_compiler::ops::{BinOp, Intrinsic, MathFn, ReduceOp, UnOp};
use texc_compiler::tir::{
    Program, ProgramParam, ScalarDecl, TExpr, TExprId, TensorDecl, TensorId, TensorRole, Ty, VarDecl, VarId,
};
use texc_compiler::types::ElemType;
use texc_grammar::diagnostic::Diagnostic;
use texc_grammar::span::{FileId, Span};

#[derive(pest_derive::Parser)]
#[grammar = "text/loops.pest"]
struct LineParser;

/// A parsed `.loops` file.
#[derive(Debug)]
pub struct Parsed {
    pub func: LoopFunc,
    /// The line of each loop, by loop variable (for errors about a loop).
    pub loop_spans: Vec<Span>,
    /// The `source` line: the `.tex` file whose kernel is the oracle, and where it was named.
    pub source: Option<(String, Span)>,
}

type R<T> = Result<T, Diagnostic>;

/// Loops longer than this, or nests of more iterations, are refused (as the
/// language refuses statements beyond 2^40 iterations).
pub const MAX_ITERATIONS: i64 = 1 << 40;

/// Parse a `.loops` file (`file` is its id in the session's source map).
pub fn parse(text: &str, file: FileId) -> R<Parsed> {
    let lines = split_lines(text);
    let mut b = Builder {
        file,
        p: Program::default(),
        vars: Vec::new(),
        scope: Vec::new(),
        tensors: Vec::new(),
        depth: Vec::new(),
        block_bytes: 0,
        shared: Default::default(),
        registers: Default::default(),
        rolled: Default::default(),
        loop_spans: Vec::new(),
    };
    let mut at = 0;
    let first = lines
        .iter()
        .position(|l| !l.blank)
        .ok_or_else(|| Diagnostic::at(Span::new(file, 0, 0), "empty `.loops` file: expected `func NAME [SIZES]`"))?;
    at = at.max(first);
    let header = &lines[at];
    let pair = b.line(header)?;
    if pair.as_rule() != Rule::header || header.indent != 0 {
        return Err(b.err(header.start, header.end, "expected `func NAME [SIZES]`, not indented, on the first line"));
    }
    b.header(pair, header)?;
    at += 1;
    let mut source = None;
    // Declarations, then statements, all one level deep.
    while let Some(l) = lines.get(at) {
        if l.blank {
            at += 1;
            continue;
        }
        if l.indent != 2 {
            return Err(b.err(l.start, l.body, "expected a declaration or statement indented by two spaces"));
        }
        let pair = b.line(l)?;
        let offset = l.body;
        match pair.as_rule() {
            Rule::source => {
                let s = pair.into_inner().nth(1).expect("string");
                let span = b.span(offset, &s);
                if source.is_some() {
                    return Err(Diagnostic::at(span, "a second `source` line"));
                }
                source =
                    Some((unescape(s.as_str()).ok_or_else(|| Diagnostic::at(span, "bad escape in string"))?, span));
            }
            Rule::input | Rule::output | Rule::temp => b.tensor_decl(pair, offset)?,
            Rule::scalar => b.scalar_decl(pair, offset)?,
            _ => break,
        }
        at += 1;
    }
    let body = b.block(&lines, &mut at, 1, 1)?;
    if let Some(l) = lines.get(at) {
        return Err(b.err(l.start, l.end, "unexpected line after the loop nest"));
    }
    b.p.source = source.as_ref().map(|(s, _): &(String, Span)| s.clone());
    let loop_spans = std::mem::take(&mut b.loop_spans);
    let f = LoopFunc { p: b.p, vars: b.vars, body, shared: b.shared, registers: b.registers, rolled: b.rolled };
    crate::verify::verify(&f).map_err(|e| Diagnostic::at(Span::new(file, 0, 0), format!("invalid loop nest: {e}")))?;
    safety::check(&f)?;
    crate::independence::check_loops(&f).map_err(|c| {
        Diagnostic::at(loop_spans[c.var as usize], c.message(&f))
            .with_note("make the loop serial, or give each iteration elements of its own")
    })?;
    Ok(Parsed { func: f, loop_spans, source })
}

struct Line {
    /// Byte offsets: the line, its first non-blank character, its end (without the newline).
    start: usize,
    body: usize,
    end: usize,
    indent: usize,
    blank: bool,
    text: String,
}

fn split_lines(text: &str) -> Vec<Line> {
    let mut out = Vec::new();
    let mut start = 0;
    let bytes = text.as_bytes();
    let mut i = 0;
    while i <= bytes.len() {
        if i == bytes.len() || bytes[i] == b'\n' || bytes[i] == b'\r' {
            let end = i;
            let raw = &text[start..end];
            let indent = raw.len() - raw.trim_start_matches(' ').len();
            let content = raw[indent..].trim_end();
            let blank = content.is_empty() || content.starts_with('#');
            if i < bytes.len() || start < end {
                out.push(Line { start, body: start + indent, end, indent, blank, text: content.to_string() });
            }
            if i + 1 < bytes.len() && bytes[i] == b'\r' && bytes[i + 1] == b'\n' {
                i += 1;
            }
            start = i + 1;
        }
        i += 1;
    }
    out
}

/// A string literal as the printer writes it (Rust's `{:?}`), without its quotes.
fn unescape(quoted: &str) -> Option<String> {
    let inner = &quoted[1..quoted.len() - 1];
    let mut out = String::new();
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next()? {
            '\\' => out.push('\\'),
            '"' => out.push('"'),
            '\'' => out.push('\''),
            'n' => out.push('\n'),
            'r' => out.push('\r'),
            't' => out.push('\t'),
            '0' => out.push('\0'),
            'u' => {
                let rest: String = chars.by_ref().take_while(|&c| c != '}').collect();
                let hex = rest.strip_prefix('{')?;
                out.push(char::from_u32(u32::from_str_radix(hex, 16).ok()?)?);
            }
            _ => return None,
        }
    }
    Some(out)
}

struct Builder {
    file: FileId,
    p: Program,
    vars: Vec<VarDecl>,
    /// Loop variables in scope, innermost last: name, id, lowest and highest value.
    scope: Vec<(String, VarId)>,
    /// Tensors in scope (declared ones, then `local`s of enclosing blocks).
    tensors: Vec<TensorId>,
    /// Depth of each expression tree, by id.
    depth: Vec<u32>,
    /// Bytes of the GPU block buffers (`shared`, `registers`) enclosing the current line.
    block_bytes: i64,
    /// Buffers declared `shared` (a GPU block's).
    shared: std::collections::BTreeSet<TensorId>,
    /// Buffers declared `registers` (a GPU block's, an element per thread).
    registers: std::collections::BTreeSet<TensorId>,
    /// Loops written `rolled`.
    rolled: std::collections::BTreeSet<VarId>,
    /// The line of each loop, by variable.
    loop_spans: Vec<Span>,
}

/// Deepest expression (and deepest nesting of brackets on a line) read:
/// every later pass walks expressions recursively.
pub const MAX_EXPR_DEPTH: u32 = 200;

fn elem_of(s: &str) -> ElemType {
    ElemType::from_name(s).expect("the grammar admits element type names only")
}

impl Builder {
    fn err(&self, start: usize, end: usize, msg: impl Into<String>) -> Diagnostic {
        Diagnostic::at(Span::new(self.file, start, end.max(start)), msg)
    }

    fn span(&self, offset: usize, pair: &Pair<Rule>) -> Span {
        let s = pair.as_span();
        Span::new(self.file, offset + s.start(), offset + s.end())
    }

    fn line<'t>(&self, l: &'t Line) -> R<Pair<'t, Rule>> {
        // The grammar recurses per bracket: bound the nesting before parsing.
        let mut open = 0u32;
        for (i, c) in l.text.char_indices() {
            match c {
                '(' | '[' => open += 1,
                ')' | ']' => open = open.saturating_sub(1),
                _ => {}
            }
            if open > MAX_EXPR_DEPTH {
                return Err(self.err(
                    l.body + i,
                    l.body + i + 1,
                    format!("brackets nested more than {MAX_EXPR_DEPTH} deep"),
                ));
            }
        }
        let mut pairs: Pairs<'t, Rule> = LineParser::parse(Rule::line, &l.text).map_err(|e| {
            let (s, t) = match e.location {
                pest::error::InputLocation::Pos(p) => (p, p + 1),
                pest::error::InputLocation::Span(s) => s,
            };
            let what = match &e.variant {
                pest::error::ErrorVariant::ParsingError { positives, .. } if !positives.is_empty() => {
                    let mut names: Vec<String> = Vec::new();
                    for n in positives.iter().map(|r| rule_name(*r)) {
                        if !names.contains(&n) {
                            names.push(n);
                        }
                    }
                    // An expression may start with a name: saying both is noise.
                    if names.iter().any(|n| n == "an expression") {
                        names.retain(|n| n != "a name");
                    }
                    format!("syntax error: expected {}", names.join(" or "))
                }
                _ => "syntax error".to_string(),
            };
            self.err(l.body + s, (l.body + t).min(l.end.max(l.body + s)), what)
        })?;
        Ok(pairs.next().expect("a line"))
    }

    fn header(&mut self, pair: Pair<Rule>, l: &Line) -> R<()> {
        let mut it = pair.into_inner();
        it.next(); // `func`
        self.p.name = it.next().expect("name").as_str().to_string();
        for b in it {
            let mut kv = b.into_inner();
            let name = kv.next().expect("name");
            let v = kv.next().expect("value");
            let value =
                v.as_str().parse::<i64>().map_err(|_| Diagnostic::at(self.span(l.body, &v), "size out of range"))?;
            self.p.bindings.push((name.as_str().to_string(), value));
        }
        Ok(())
    }

    fn decl(&mut self, pair: Pair<Rule>, offset: usize, role: TensorRole) -> R<TensorId> {
        let span = self.span(offset, &pair);
        let mut it = pair.into_inner();
        let name = it.next().expect("name").as_str().to_string();
        let elem = elem_of(it.next().expect("elem").as_str());
        let mut shape = Vec::new();
        let mut elems: i64 = 1;
        for d in it.next().expect("dims").into_inner() {
            let ds = self.span(offset, &d);
            let n = d
                .as_str()
                .parse::<i64>()
                .ok()
                .filter(|&n| n >= 0)
                .ok_or_else(|| Diagnostic::at(ds, "a dimension must be a non-negative integer"))?;
            elems = elems
                .checked_mul(n)
                .filter(|&e| e <= MAX_ITERATIONS)
                .ok_or_else(|| Diagnostic::at(ds, format!("`{name}` has more than 2^40 elements")))?;
            shape.push(n);
        }
        if let Some(&t) = self.tensors.iter().rev().find(|&&t| self.p.tensor(t).name == name) {
            return Err(Diagnostic::at(span, format!("`{name}` is declared twice"))
                .with_secondary(self.p.tensor(t).span, "first declared here"));
        }
        self.p.tensors.push(TensorDecl { name, elem, shape, role, span });
        let t = TensorId(self.p.tensors.len() as u32 - 1);
        self.tensors.push(t);
        Ok(t)
    }

    fn tensor_decl(&mut self, pair: Pair<Rule>, offset: usize) -> R<()> {
        let role = match pair.as_rule() {
            Rule::input => TensorRole::Input,
            Rule::output => TensorRole::Output,
            _ => TensorRole::Temp,
        };
        let d = pair.into_inner().nth(1).expect("decl");
        let t = self.decl(d, offset, role)?;
        match role {
            TensorRole::Input => self.p.params.push(ProgramParam::Tensor(t)),
            TensorRole::Output => self.p.outputs.push(t),
            TensorRole::Temp => {}
        }
        Ok(())
    }

    fn scalar_decl(&mut self, pair: Pair<Rule>, offset: usize) -> R<()> {
        let span = self.span(offset, &pair);
        let mut it = pair.into_inner();
        it.next(); // `scalar`
        let name = it.next().expect("name").as_str().to_string();
        let elem = elem_of(it.next().expect("elem").as_str());
        let default = it.next().map(|d| d.as_str().parse::<f64>().expect("the grammar admits numbers"));
        if self.p.scalars.iter().any(|s| s.name == name) {
            return Err(Diagnostic::at(span, format!("scalar `{name}` is declared twice")));
        }
        self.p.scalars.push(ScalarDecl { name, elem, default });
        self.p.params.push(ProgramParam::Scalar(self.p.scalars.len() as u32 - 1));
        Ok(())
    }

    /// Statements indented `depth` levels, from `lines[*at]` on.
    /// (`trips`: iterations of the enclosing loops, kept ≤ [`MAX_ITERATIONS`].)
    fn block(&mut self, lines: &[Line], at: &mut usize, depth: usize, trips: i64) -> R<Vec<Stmt>> {
        let mut out = Vec::new();
        while let Some(l) = lines.get(*at) {
            if l.blank {
                *at += 1;
                continue;
            }
            if l.indent < 2 * depth {
                break;
            }
            if l.indent != 2 * depth {
                return Err(self.err(l.start, l.body, format!("expected {} spaces of indentation", 2 * depth)));
            }
            *at += 1;
            let pair = self.line(l)?;
            let offset = l.body;
            let span = self.span(offset, &pair);
            match pair.as_rule() {
                Rule::for_loop => {
                    let mut it = pair.into_inner();
                    it.next(); // `for`
                    let name = it.next().expect("var").as_str().to_string();
                    it.next(); // `in`
                    let (lo_p, hi_p) = (it.next().expect("lo"), it.next().expect("hi"));
                    let bound =
                        |p: &Pair<Rule>| {
                            p.as_str().parse::<i64>().ok().filter(|v| v.abs() <= MAX_ITERATIONS).ok_or_else(|| {
                                Diagnostic::at(self.span(offset, p), "a loop bound must lie within ±2^40")
                            })
                        };
                    let (lo, hi) = (bound(&lo_p)?, bound(&hi_p)?);
                    if hi < lo {
                        return Err(Diagnostic::at(
                            span,
                            format!("empty range {lo}..{hi}: the end is below the start"),
                        ));
                    }
                    let mut kind = ForKind::Serial;
                    let mut rolled = false;
                    for k in it {
                        if k.as_rule() == Rule::rolled {
                            rolled = true;
                        } else {
                            kind = for_kind(k);
                        }
                    }
                    if rolled && !matches!(kind, ForKind::Serial | ForKind::Parallel) {
                        let why =
                            format!("only a serial or parallel loop is kept `rolled`; this one is{}", kind.name());
                        return Err(Diagnostic::at(span, why));
                    }
                    // Index simplification assumes a variable ranges over 0..extent.
                    if lo < 0 {
                        return Err(Diagnostic::at(span, "a loop must start at 0 or above"));
                    }
                    let trips = trips
                        .checked_mul(hi - lo)
                        .filter(|&t| t <= MAX_ITERATIONS)
                        .ok_or_else(|| Diagnostic::at(span, "this loop nest runs more than 2^40 iterations"))?;
                    self.vars.push(VarDecl { name: name.clone(), extent: hi });
                    self.loop_spans.push(span);
                    let var = self.vars.len() as VarId - 1;
                    if rolled {
                        self.rolled.insert(var);
                    }
                    self.scope.push((name, var));
                    let body = self.body(lines, at, depth, span, trips)?;
                    self.scope.pop();
                    out.push(Stmt::For { var, lo, extent: hi - lo, kind, body });
                }
                Rule::guard => {
                    let e = pair.into_inner().nth(1).expect("condition");
                    let cond = self.expr(e, offset)?;
                    if self.p.ty(cond) != Ty::Elem(ElemType::Bool) {
                        return Err(Diagnostic::at(self.p.span(cond), "an `if` condition must be a bool"));
                    }
                    let then = self.body(lines, at, depth, span, trips)?;
                    out.push(Stmt::If { cond, then });
                }
                Rule::barrier => out.push(Stmt::Barrier),
                Rule::async_step => {
                    let step = pair.into_inner().nth(1).expect("step");
                    out.push(Stmt::Async(match step.as_rule() {
                        Rule::async_wait => {
                            let n = step.into_inner().next().expect("count");
                            let groups = n.as_str().parse::<i64>().ok().filter(|g| (0..=7).contains(g));
                            AsyncStep::Wait(groups.ok_or_else(|| {
                                Diagnostic::at(self.span(offset, &n), "`async wait` takes 0 to 7 groups")
                            })?)
                        }
                        _ => AsyncStep::Commit,
                    }));
                }
                Rule::mma => out.push(self.mma(pair, offset)?),
                Rule::wgmma => out.push(self.wgmma(pair, offset)?),
                Rule::tile_dot => out.push(self.tile_dot(pair, offset)?),
                Rule::warp_reduce => out.push(self.warp_reduce(pair, offset)?),
                Rule::prefetch => out.push(self.prefetch(pair, offset)?),
                Rule::local => {
                    let mut it = pair.into_inner();
                    let scope = it.next().expect("keyword").as_rule();
                    let d = it.next().expect("decl");
                    let tensor = self.decl(d, offset, TensorRole::Temp)?;
                    // A `local` may take what an attached buffer may (where
                    // a frame's buffers would pass the stack's share the
                    // backends take some from the heap: `LoopFunc::heap_locals`);
                    // a GPU block's buffers, nested ones together, what
                    // the stack may.
                    let t = self.p.tensor(tensor);
                    let bytes = t.len().saturating_mul(t.elem.size() as i64);
                    let block = scope != Rule::kw_local;
                    let live = if block { self.block_bytes.saturating_add(bytes) } else { bytes };
                    let limit = if block { crate::attach::MAX_STACK_BYTES } else { crate::attach::MAX_LOCAL_BYTES };
                    if live > limit {
                        return Err(Diagnostic::at(
                            span,
                            format!("local buffers here take {live} bytes, more than {limit}"),
                        ));
                    }
                    if block {
                        self.block_bytes = live;
                    }
                    match scope {
                        Rule::kw_shared => self.shared.insert(tensor),
                        Rule::kw_registers => self.registers.insert(tensor),
                        _ => false,
                    };
                    let body = self.body(lines, at, depth, span, trips)?;
                    if block {
                        self.block_bytes -= bytes;
                    }
                    self.tensors.retain(|&t| t != tensor);
                    out.push(Stmt::Alloc { tensor, body });
                }
                Rule::store => out.push(self.store(pair, offset)?),
                _ => return Err(Diagnostic::at(span, "declarations come before the first statement")),
            }
        }
        Ok(out)
    }

    fn body(&mut self, lines: &[Line], at: &mut usize, depth: usize, head: Span, trips: i64) -> R<Vec<Stmt>> {
        let body = self.block(lines, at, depth + 1, trips)?;
        if body.is_empty() {
            return Err(Diagnostic::at(head, "expected an indented body after this line"));
        }
        Ok(body)
    }

    fn tensor_named(&self, name: &str) -> Option<TensorId> {
        self.tensors.iter().rev().copied().find(|&t| self.p.tensor(t).name == name)
    }

    fn store(&mut self, pair: Pair<Rule>, offset: usize) -> R<Stmt> {
        let mut it = pair.into_inner();
        let name_p = it.next().expect("name");
        let span = self.span(offset, &name_p);
        let tensor = self
            .tensor_named(name_p.as_str())
            .ok_or_else(|| Diagnostic::at(span, format!("unknown tensor `{}`", name_p.as_str())))?;
        let decl = self.p.tensor(tensor);
        if decl.role == TensorRole::Input {
            return Err(Diagnostic::at(
                span,
                format!("`{}` is an input: a kernel does not write its inputs", decl.name),
            ));
        }
        let mut parts: Vec<Pair<Rule>> = it.collect();
        let value_p = parts.pop().expect("value");
        let mut indices = Vec::new();
        for i in parts {
            indices.push(self.index(i, offset)?);
        }
        self.check_rank(tensor, indices.len(), span)?;
        let value = self.expr(value_p, offset)?;
        let want = Ty::Elem(self.p.tensor(tensor).elem);
        if self.p.ty(value) != want {
            return Err(Diagnostic::at(
                self.p.span(value),
                format!(
                    "the stored value has type {}, but `{}` holds {want}",
                    self.p.ty(value),
                    self.p.tensor(tensor).name
                ),
            ));
        }
        Ok(Stmt::Store { tensor, indices, value })
    }

    /// `warp_reduce OP BUF by LANES` (the rules of `crate::gpu` check the rest).
    fn warp_reduce(&mut self, pair: Pair<Rule>, offset: usize) -> R<Stmt> {
        let mut it = pair.into_inner();
        it.next(); // `warp_reduce`
        let op = ReduceOp::from_name(it.next().expect("op").as_str()).expect("the grammar lists the ops");
        let name_p = it.next().expect("buffer");
        let span = self.span(offset, &name_p);
        let tensor = self
            .tensor_named(name_p.as_str())
            .ok_or_else(|| Diagnostic::at(span, format!("unknown tensor `{}`", name_p.as_str())))?;
        if !self.registers.contains(&tensor) {
            return Err(Diagnostic::at(span, format!("`{}` is not a buffer declared `registers`", name_p.as_str())));
        }
        it.next(); // `by`
        let lanes_p = it.next().expect("lanes");
        let lanes = lanes_p.as_str().parse::<i64>().ok().filter(|l| [2, 4, 8, 16, 32].contains(l));
        let lanes = lanes.ok_or_else(|| {
            Diagnostic::at(self.span(offset, &lanes_p), "a warp reduction is by 2, 4, 8, 16 or 32 lanes")
        })?;
        Ok(Stmt::WarpReduce(crate::ir::WarpReduce { tensor, lanes, op }))
    }

    /// `prefetch T at OFFSET`: the element's offset is an index.
    fn prefetch(&mut self, pair: Pair<Rule>, offset: usize) -> R<Stmt> {
        let mut it = pair.into_inner();
        it.next(); // `prefetch`
        let name_p = it.next().expect("tensor");
        let span = self.span(offset, &name_p);
        let tensor = self
            .tensor_named(name_p.as_str())
            .ok_or_else(|| Diagnostic::at(span, format!("unknown tensor `{}`", name_p.as_str())))?;
        it.next(); // `at`
        let at = self.expr(it.next().expect("offset"), offset)?;
        if self.p.ty(at) != Ty::Index {
            return Err(Diagnostic::at(self.p.span(at), "a prefetch's element offset must be an index"));
        }
        Ok(Stmt::Prefetch { tensor, offset: at })
    }

    /// `mma OP C[..] @ (r, c) += A[..] @ (r, c) * B[..] @ (r, c)`.
    fn mma(&mut self, pair: Pair<Rule>, offset: usize) -> R<Stmt> {
        let mut it = pair.into_inner();
        it.next(); // `mma`
        let op_p = it.next().expect("op");
        let op = MmaOp::ALL.into_iter().find(|o| o.name() == op_p.as_str()).expect("the grammar lists the ops");
        let (ab, acc) = op.types();
        let c = self.tile(it.next().expect("c"), offset, acc, true)?;
        let a = self.tile(it.next().expect("a"), offset, ab, false)?;
        let b = self.tile(it.next().expect("b"), offset, ab, false)?;
        Ok(Stmt::Mma { op, c, a, b })
    }

    /// `amx_dpbusd MxNxK C[..] @ (r, c) += A[..] @ (r, c) * B[..] @ (r, c)` (`=`: from zero)
    /// (the block's rules are the verifier's).
    fn tile_dot(&mut self, pair: Pair<Rule>, offset: usize) -> R<Stmt> {
        let mut it = pair.into_inner();
        it.next(); // `amx_dpbusd`
        let shape_p = it.next().expect("shape");
        let dims: Vec<i64> = shape_p.clone().into_inner().map(|d| d.as_str().parse::<i64>().unwrap_or(-1)).collect();
        let [m, n, k] = dims[..] else { unreachable!("the grammar has three extents") };
        if [m, n, k].iter().any(|&x| x < 1) {
            return Err(Diagnostic::at(self.span(offset, &shape_p), "a tile product's extents are positive"));
        }
        let i32t = ElemType::I32;
        let c = self.tile(it.next().expect("c"), offset, i32t, true)?;
        let zero = it.next().expect("assignment").as_str() == "=";
        let a = self.tile(it.next().expect("a"), offset, i32t, false)?;
        let b = self.tile(it.next().expect("b"), offset, i32t, false)?;
        Ok(Stmt::TileDot(Box::new(crate::ir::TileDot { c, a, b, m, n, k, zero })))
    }

    /// `wgmma m64nNk16.AB.f32 C[..] @ (r, c) += A[..] desc(lbo L, sbo S) * B[..] desc(..)`.
    fn wgmma(&mut self, pair: Pair<Rule>, offset: usize) -> R<Stmt> {
        let mut it = pair.into_inner();
        it.next(); // `wgmma`
        let op_p = it.next().expect("op");
        let name = op_p.as_str();
        let (n, ab) = name["m64n".len()..].split_once("k16.").expect("the grammar's form");
        let op =
            WgmmaOp::parse_schedule_name(&format!("wgmma_m64n{n}k16_{}", ab.replace('.', ""))).ok_or_else(|| {
                Diagnostic::at(self.span(offset, &op_p), "a `wgmma` is m64nNk16 with N a multiple of 8 from 8 to 256")
            })?;
        let c = self.tile(it.next().expect("c"), offset, ElemType::F32, true)?;
        let a = self.smem_matrix(it.next().expect("a"), offset, op.ab)?;
        let b = self.smem_matrix(it.next().expect("b"), offset, op.ab)?;
        Ok(Stmt::Wgmma(Box::new(Wgmma { op, c, a, b })))
    }

    /// `A[..] desc(lbo L, sbo S)` (K-major) or `desc(mn-major, lbo L, sbo S)`,
    /// either with `swizzle 128, ` before `lbo`:
    /// a `wgmma` operand in shared memory.
    fn smem_matrix(&mut self, pair: Pair<Rule>, offset: usize, elem: ElemType) -> R<SmemMatrix> {
        let mut parts: Vec<Pair<Rule>> = pair.into_inner().collect();
        let sbo_p = parts.pop().expect("sbo");
        let lbo_p = parts.pop().expect("lbo");
        let swizzled = parts.last().is_some_and(|p| p.as_rule() == Rule::swizzle128);
        if swizzled {
            parts.pop();
        }
        let major = if parts.last().is_some_and(|p| p.as_rule() == Rule::mn_major) {
            parts.pop();
            Major::Mn
        } else {
            Major::K
        };
        let name_p = parts.remove(0);
        let span = self.span(offset, &name_p);
        let tensor = self
            .tensor_named(name_p.as_str())
            .ok_or_else(|| Diagnostic::at(span, format!("unknown tensor `{}`", name_p.as_str())))?;
        let decl = self.p.tensor(tensor);
        if decl.elem != elem {
            return Err(Diagnostic::at(
                span,
                format!("this `wgmma` takes {elem} here, but `{}` holds {}", decl.name, decl.elem),
            ));
        }
        let mut origin = Vec::new();
        for i in parts {
            origin.push(self.index(i, offset)?);
        }
        self.check_rank(tensor, origin.len(), span)?;
        let bytes = |p: &Pair<Rule>| -> R<i64> {
            p.as_str().parse::<i64>().ok().filter(|b| b % 16 == 0 && (0..1 << 18).contains(b)).ok_or_else(|| {
                Diagnostic::at(self.span(offset, p), "a descriptor's byte offset is a multiple of 16 below 2^18")
            })
        };
        Ok(SmemMatrix { tensor, origin, major, lbo: bytes(&lbo_p)?, sbo: bytes(&sbo_p)?, swizzled })
    }

    fn tile(&mut self, pair: Pair<Rule>, offset: usize, elem: ElemType, written: bool) -> R<Tile> {
        let mut parts: Vec<Pair<Rule>> = pair.into_inner().collect();
        let cols_p = parts.pop().expect("cols");
        let rows_p = parts.pop().expect("rows");
        let name_p = parts.remove(0);
        let span = self.span(offset, &name_p);
        let tensor = self
            .tensor_named(name_p.as_str())
            .ok_or_else(|| Diagnostic::at(span, format!("unknown tensor `{}`", name_p.as_str())))?;
        let decl = self.p.tensor(tensor);
        if written && decl.role == TensorRole::Input {
            return Err(Diagnostic::at(
                span,
                format!("`{}` is an input: a kernel does not write its inputs", decl.name),
            ));
        }
        if decl.elem != elem {
            return Err(Diagnostic::at(
                span,
                format!("this `mma` takes {elem} here, but `{}` holds {}", decl.name, decl.elem),
            ));
        }
        let mut origin = Vec::new();
        for i in parts {
            origin.push(self.index(i, offset)?);
        }
        self.check_rank(tensor, origin.len(), span)?;
        let dim = |p: &Pair<Rule>| -> R<usize> {
            p.as_str().parse::<usize>().ok().filter(|&d| d < origin.len()).ok_or_else(|| {
                Diagnostic::at(
                    self.span(offset, p),
                    format!("expected a dimension of `{}` (0 to {})", name_p.as_str(), origin.len() - 1),
                )
            })
        };
        let (rows, cols) = (dim(&rows_p)?, dim(&cols_p)?);
        if rows == cols {
            return Err(Diagnostic::at(
                self.span(offset, &cols_p),
                "a tile's rows and columns run along two different dimensions",
            ));
        }
        Ok(Tile { tensor, origin, rows, cols })
    }

    fn check_rank(&self, t: TensorId, n: usize, span: Span) -> R<()> {
        let d = self.p.tensor(t);
        if d.shape.len() != n {
            let dims = match d.shape.len() {
                1 => "1 dimension".to_string(),
                k => format!("{k} dimensions"),
            };
            return Err(Diagnostic::at(span, format!("`{}` has {dims}, but {n} indices are given", d.name)));
        }
        Ok(())
    }

    fn index(&mut self, pair: Pair<Rule>, offset: usize) -> R<TExprId> {
        let e = self.expr(pair, offset)?;
        match self.p.ty(e) {
            Ty::Index | Ty::Elem(ElemType::I8 | ElemType::U8 | ElemType::I32 | ElemType::I64) => Ok(e),
            t => Err(Diagnostic::at(self.p.span(e), format!("an index must be an integer, not {t}"))),
        }
    }

    fn alloc(&mut self, e: TExpr, ty: Ty, span: Span) -> R<TExprId> {
        let id = self.p.alloc(e, ty, span);
        let d = 1 + self.p.children(id).iter().map(|c| self.depth[c.0 as usize]).max().unwrap_or(0);
        self.depth.push(d);
        if d > MAX_EXPR_DEPTH {
            return Err(Diagnostic::at(span, format!("expression nested more than {MAX_EXPR_DEPTH} deep")));
        }
        Ok(id)
    }

    /// An `expr` pair: operands and infix operators, climbed by precedence.
    fn expr(&mut self, pair: Pair<Rule>, offset: usize) -> R<TExprId> {
        let mut toks = pair.into_inner().peekable();
        let e = self.climb(&mut toks, offset, 0)?;
        debug_assert!(toks.peek().is_none());
        Ok(e)
    }

    fn climb(&mut self, toks: &mut std::iter::Peekable<Pairs<Rule>>, offset: usize, min: u8) -> R<TExprId> {
        let mut lhs = self.operand(toks, offset)?;
        while let Some(op) = toks.peek().and_then(|p| infix_op(p.as_rule()).map(|o| (o, p.clone()))) {
            let (op, pair) = op;
            let prec = precedence(op);
            if prec < min {
                break;
            }
            toks.next();
            let rhs = self.climb(toks, offset, prec + 1)?;
            lhs = self.binary(op, lhs, rhs, self.span(offset, &pair))?;
        }
        Ok(lhs)
    }

    fn operand(&mut self, toks: &mut std::iter::Peekable<Pairs<Rule>>, offset: usize) -> R<TExprId> {
        let pair = toks.next().expect("the grammar puts an operand here");
        let span = self.span(offset, &pair);
        match pair.as_rule() {
            Rule::neg | Rule::not => {
                let a = self.operand(toks, offset)?;
                let ty = self.p.ty(a);
                let whole = Span::new(self.file, span.start as usize, self.p.span(a).end as usize);
                if pair.as_rule() == Rule::not {
                    if ty != Ty::Elem(ElemType::Bool) {
                        return Err(Diagnostic::at(whole, format!("`!` needs a bool, not {ty}")));
                    }
                    return self.alloc(TExpr::Unary(UnOp::Not, a), ty, whole);
                }
                if ty == Ty::Elem(ElemType::Bool) {
                    return Err(Diagnostic::at(whole, "`-` needs a number, not bool"));
                }
                // `-3` is the literal -3, as the printer writes it.
                let folded = match self.p.expr(a) {
                    TExpr::Int(v) => v.checked_neg().map(TExpr::Int),
                    TExpr::Float(v) => Some(TExpr::Float(-v)),
                    _ => None,
                };
                let e = folded.unwrap_or(TExpr::Unary(UnOp::Neg, a));
                self.alloc(e, ty, whole)
            }
            _ => self.primary(pair, offset),
        }
    }

    fn primary(&mut self, pair: Pair<Rule>, offset: usize) -> R<TExprId> {
        let span = self.span(offset, &pair);
        match pair.as_rule() {
            Rule::boolean => self.alloc(TExpr::Int((pair.as_str() == "true") as i64), Ty::Elem(ElemType::Bool), span),
            Rule::literal => self.literal(pair, span),
            Rule::paren => self.expr(pair.into_inner().next().expect("expr"), offset),
            Rule::access => {
                let mut it = pair.into_inner();
                let name = it.next().expect("name").as_str().to_string();
                let idx: Vec<Pair<Rule>> = it.collect();
                if idx.is_empty() {
                    if let Some((_, v)) = self.scope.iter().rev().find(|(n, _)| *n == name) {
                        return self.alloc(TExpr::Var(*v), Ty::Index, span);
                    }
                    if let Some(i) = self.p.scalars.iter().position(|s| s.name == name) {
                        let ty = Ty::Elem(self.p.scalars[i].elem);
                        return self.alloc(TExpr::Scalar(i as u32), ty, span);
                    }
                }
                let t = self.tensor_named(&name).ok_or_else(|| {
                    let what = if idx.is_empty() { "name" } else { "tensor" };
                    Diagnostic::at(span, format!("unknown {what} `{name}`"))
                })?;
                let mut indices = Vec::new();
                for i in idx {
                    indices.push(self.index(i, offset)?);
                }
                self.check_rank(t, indices.len(), span)?;
                let ty = Ty::Elem(self.p.tensor(t).elem);
                self.alloc(TExpr::Load(t, indices), ty, span)
            }
            Rule::call => self.call(pair, offset, span),
            r => unreachable!("primary {r:?}"),
        }
    }

    fn literal(&mut self, pair: Pair<Rule>, span: Span) -> R<TExprId> {
        let mut it = pair.into_inner();
        let num = it.next().expect("number");
        let suffix = it.next().map(|s| elem_of(s.as_str()));
        let text = num.as_str();
        let looks_float = text.contains(['.', 'e', 'E']) || num.as_rule() == Rule::special;
        match suffix {
            Some(t) if t.is_float() => {
                let v = text.parse::<f64>().map_err(|_| Diagnostic::at(span, "bad float literal"))?;
                self.alloc(TExpr::Float(v), Ty::Elem(t), span)
            }
            _ if looks_float => Err(Diagnostic::at(span, "a float literal needs its type: `1.5f32`")),
            ty => {
                let v = text.parse::<i64>().map_err(|_| Diagnostic::at(span, "integer literal out of range"))?;
                self.alloc(TExpr::Int(v), ty.map_or(Ty::Index, Ty::Elem), span)
            }
        }
    }

    fn call(&mut self, pair: Pair<Rule>, offset: usize, span: Span) -> R<TExprId> {
        let mut it = pair.into_inner();
        let name = it.next().expect("callee").as_str().to_string();
        let mut args = Vec::new();
        for a in it {
            args.push(self.expr(a, offset)?);
        }
        let arity = |n: usize| -> R<()> {
            if args.len() != n {
                return Err(Diagnostic::at(span, format!("`{name}` takes {n} arguments, not {}", args.len())));
            }
            Ok(())
        };
        let same = |b: &Builder, args: &[TExprId]| -> R<Ty> {
            let ty = b.p.ty(args[0]);
            for &a in &args[1..] {
                if b.p.ty(a) != ty {
                    return Err(Diagnostic::at(
                        span,
                        format!("the arguments of `{name}` have types {ty} and {}", b.p.ty(a)),
                    ));
                }
            }
            Ok(ty)
        };
        if name == "select" {
            arity(3)?;
            if self.p.ty(args[0]) != Ty::Elem(ElemType::Bool) {
                return Err(Diagnostic::at(self.p.span(args[0]), "the condition of `select` must be a bool"));
            }
            let ty = same(self, &args[1..])?;
            return self.alloc(TExpr::Select(args[0], args[1], args[2]), ty, span);
        }
        let cast_to = if name == "index" { Some(Ty::Index) } else { ElemType::from_name(&name).map(Ty::Elem) };
        if let Some(ty) = cast_to {
            arity(1)?;
            return self.alloc(TExpr::Cast(args[0]), ty, span);
        }
        if let Some(op) =
            [BinOp::TruncDiv, BinOp::TruncRem, BinOp::UDiv, BinOp::URem].into_iter().find(|o| o.symbol() == name)
        {
            arity(2)?;
            let ty = same(self, &args)?;
            if !is_integer(ty) {
                return Err(Diagnostic::at(span, format!("`{name}` needs integers, not {ty}")));
            }
            return self.alloc(TExpr::Binary(op, args[0], args[1]), ty, span);
        }
        if let Some(i) = Intrinsic::ALL.into_iter().find(|i| i.name() == name) {
            arity(i.arity())?;
            let ty = same(self, &args)?;
            return self.alloc(TExpr::Intrinsic(i, args), ty, span);
        }
        if let Some(f) = MathFn::from_name(&name) {
            if args.is_empty() {
                return Err(Diagnostic::at(span, format!("`{name}` needs arguments")));
            }
            let ty = same(self, &args)?;
            return self.alloc(TExpr::Math(f, args), ty, span);
        }
        Err(Diagnostic::at(span, format!("unknown function `{name}`")))
    }

    fn binary(&mut self, op: BinOp, a: TExprId, b: TExprId, op_span: Span) -> R<TExprId> {
        let (ta, tb) = (self.p.ty(a), self.p.ty(b));
        let whole = Span::new(self.file, self.p.span(a).start as usize, self.p.span(b).end as usize);
        let bool_t = Ty::Elem(ElemType::Bool);
        if ta != tb {
            return Err(Diagnostic::at(op_span, format!("the operands of `{}` have types {ta} and {tb}", op.symbol())));
        }
        let (op, ty) = match op {
            BinOp::And | BinOp::Or if ta != bool_t => {
                return Err(Diagnostic::at(op_span, format!("`{}` needs bools, not {ta}", op.symbol())))
            }
            BinOp::And | BinOp::Or => (op, bool_t),
            _ if ta == bool_t && !matches!(op, BinOp::Eq | BinOp::Ne) => {
                return Err(Diagnostic::at(op_span, format!("`{}` needs numbers, not bool", op.symbol())))
            }
            o if o.is_comparison() => (o, bool_t),
            BinOp::Div if is_integer(ta) => (BinOp::FloorDiv, ta),
            o => (o, ta),
        };
        self.alloc(TExpr::Binary(op, a, b), ty, whole)
    }
}

fn is_integer(t: Ty) -> bool {
    match t {
        Ty::Index => true,
        Ty::Elem(e) => e.is_int(),
    }
}

fn infix_op(r: Rule) -> Option<BinOp> {
    Some(match r {
        Rule::or => BinOp::Or,
        Rule::and => BinOp::And,
        Rule::eq => BinOp::Eq,
        Rule::ne => BinOp::Ne,
        Rule::le => BinOp::Le,
        Rule::ge => BinOp::Ge,
        Rule::lt => BinOp::Lt,
        Rule::gt => BinOp::Gt,
        Rule::add => BinOp::Add,
        Rule::sub => BinOp::Sub,
        Rule::mul => BinOp::Mul,
        Rule::div => BinOp::Div,
        Rule::rem => BinOp::FloorMod,
        _ => return None,
    })
}

/// The printer's precedences (`texc_compiler::print`), all left-associative.
fn precedence(op: BinOp) -> u8 {
    match op {
        BinOp::Or => 1,
        BinOp::And => 2,
        o if o.is_comparison() => 3,
        BinOp::Add | BinOp::Sub => 4,
        _ => 5,
    }
}

fn rule_name(r: Rule) -> String {
    match r {
        Rule::expr
        | Rule::operand
        | Rule::neg
        | Rule::not
        | Rule::literal
        | Rule::boolean
        | Rule::callee
        | Rule::paren
        | Rule::access
        | Rule::call => "an expression".into(),
        Rule::ident => "a name".into(),
        Rule::int => "an integer".into(),
        Rule::elem => "an element type".into(),
        Rule::infix => "an operator".into(),
        Rule::string => "a quoted string".into(),
        Rule::EOI => "the end of the line".into(),
        Rule::header => "`func NAME [SIZES]`".into(),
        Rule::for_loop => "a `for` loop".into(),
        Rule::store => "a store `T[...] = value`".into(),
        r => format!("{r:?}").replace('_', " "),
    }
}

/// The kind written after a loop's range (`parallel`, `block.x`, ...).
fn for_kind(k: Pair<Rule>) -> ForKind {
    match k.as_rule() {
        Rule::parallel => ForKind::Parallel,
        Rule::vectorized => ForKind::Vectorized,
        Rule::unrolled => ForKind::Unrolled,
        Rule::async_copy => ForKind::Async,
        Rule::gpu_bound => {
            let mut it = k.into_inner();
            let unit = it.next().expect("unit").as_str();
            let dim = GpuDim::parse(it.next().expect("dim").as_str()).expect("grammar: x, y or z");
            if unit == "block" {
                ForKind::Block(dim)
            } else {
                ForKind::Thread(dim)
            }
        }
        _ => ForKind::Serial,
    }
}
