//! What the loop-IR passes' unit tests share: nests read from `.loops`
//! text, and seeded arguments for the loop evaluator.

use crate::ir::LoopFunc;

/// Parses `.loops` text (named `name` in diagnostics), panicking with the
/// diagnostic and the source.
pub(crate) fn parse_loops(name: &str, src: &str) -> LoopFunc {
    let mut sm = texc_grammar::span::SourceMap::new();
    let id = sm.add(name, src.to_string());
    crate::text::parse(src, id).unwrap_or_else(|d| panic!("{}\n{src}", d.render(&sm))).func
}

/// An `f32` tensor of `shape` with values in [-1, 1) set by `seed`.
pub(crate) fn tensor(shape: &[i64], seed: u64) -> texc_compiler::interp::Arg {
    let n: i64 = shape.iter().product();
    let data = (0..n as u64).map(|i| ((i * 2654435761 + seed) % 1000) as f32 / 500.0 - 1.0).collect();
    texc_compiler::interp::Arg::Tensor(texc_runtime::Tensor {
        shape: shape.iter().map(|&d| d as usize).collect(),
        data: texc_runtime::Data::F32(data),
    })
}
