//! The search space of a schedule template: its tunables (`?t` factors and
//! `tune t in [...]` lists) and their candidates.
//!
//! A tunable with a `tune` list takes its values; one without takes the
//! powers of two from 1 to 64 (schedule application rejects a value that is
//! illegal for its loop before anything is compiled). Candidate zero is the
//! template's own choice — each list's first value, and for unlisted
//! tunables what the template does without a knob (left out) — so a tuned
//! kernel is never slower than the untuned one.

use crate::ScheduleSrc;
use texc_grammar::ast::{Factor, PrimKind, ScheduleBody};
use texc_grammar::span::SourceMap;

/// One tunable and the values it may take.
#[derive(Clone, Debug, PartialEq)]
pub struct Tunable {
    pub name: String,
    pub candidates: Vec<i64>,
    /// Whether the template lists them (`tune`); else they are powers of two.
    pub listed: bool,
}

/// The tunables of a schedule block, in the order they first appear.
pub fn tunables(src: ScheduleSrc) -> Vec<Tunable> {
    let ScheduleBody::Primitives(prims) = &src.block.body else { return Vec::new() };
    let mut out: Vec<Tunable> = Vec::new();
    let mut add = |name: &str, listed: Option<Vec<i64>>| {
        let pos = out.iter().position(|t| t.name == name);
        match (pos, listed) {
            (Some(i), Some(values)) => {
                out[i].candidates = values;
                out[i].listed = true;
            }
            (Some(_), None) => {}
            (None, Some(values)) => out.push(Tunable { name: name.to_string(), candidates: values, listed: true }),
            (None, None) => out.push(Tunable {
                name: name.to_string(),
                candidates: (0..7).map(|k| 1i64 << k).collect(),
                listed: false,
            }),
        }
    };
    for prim in prims {
        match &prim.kind {
            PrimKind::Tune { name, values } => add(&name.name, Some(values.iter().map(|(v, _)| *v).collect())),
            PrimKind::Split { factor: Factor::Tunable(n), .. } => add(&n.name, None),
            PrimKind::Tile { factors, .. } => {
                for f in factors {
                    if let Factor::Tunable(n) = f {
                        add(&n.name, None);
                    }
                }
            }
            _ => {}
        }
    }
    out
}

/// The space as records list it: each tunable's name and candidates
/// (what [`crate::tuning::db::check_knobs`] checks knobs against).
pub fn table(ts: &[Tunable]) -> crate::tuning::db::Table {
    ts.iter().map(|t| (t.name.clone(), t.candidates.clone())).collect()
}

/// Number of points of the space (saturating).
pub fn size(ts: &[Tunable]) -> u64 {
    ts.iter().fold(1u64, |n, t| n.saturating_mul(t.candidates.len() as u64))
}

/// The schedule block's text with `?t` replaced by the knob values and the
/// `tune` statements removed: a schedule to paste into the kernel's file.
pub fn instantiate(src: ScheduleSrc, sources: &SourceMap, knobs: &[(String, i64)]) -> String {
    let text = &sources.file(src.ast.file).text;
    let block = src.block.span;
    let mut cut: Vec<(usize, usize)> = Vec::new();
    if let ScheduleBody::Primitives(prims) = &src.block.body {
        for p in prims {
            if matches!(p.kind, PrimKind::Tune { .. }) {
                let (s, mut e) = (p.span.start as usize, p.span.end as usize);
                // The statement's `;` and the rest of its line go with it.
                let rest = &text[e..block.end as usize];
                if let Some(semi) = rest.find(';').filter(|&i| rest[..i].trim().is_empty()) {
                    e += semi + 1;
                }
                let line_start = text[..s].rfind('\n').map_or(0, |i| i + 1);
                let indent_only = text[line_start..s].trim().is_empty();
                let line_end = text[e..].find('\n').map_or(text.len(), |i| e + i);
                if indent_only && text[e..line_end].trim().is_empty() {
                    cut.push((line_start, (line_end + 1).min(text.len())));
                } else {
                    cut.push((s, e));
                }
            }
        }
    }
    let mut out = String::new();
    let mut at = block.start as usize;
    let end = block.end as usize;
    for (s, e) in cut {
        if s >= at {
            out.push_str(&substitute(&text[at..s], knobs));
            at = e;
        }
    }
    out.push_str(&substitute(&text[at..end], knobs));
    out
}

/// `?name` → its value, where a knob gives one.
fn substitute(text: &str, knobs: &[(String, i64)]) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find('?') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        let n = after.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(after.len());
        match knobs.iter().find(|(k, _)| k == &after[..n]) {
            Some((_, v)) => out.push_str(&v.to_string()),
            None => out.push_str(&rest[i..i + 1 + n]),
        }
        rest = &after[n..];
    }
    out.push_str(rest);
    out
}
