//! ONNX value names become `.tex` identifiers: characters outside
//! `[A-Za-z0-9_]` turn into `_`, and a name that would be a keyword, an element
//! type, a builtin, a standard-library operator or one of the index variables
//! the importer writes (`i0`, `r0`, ...) gets a trailing `_`. Every name maps to
//! a distinct identifier (a clash gets `_2`, `_3`, ...), so the translation is
//! injective and stable: the same model always gives the same text.

use std::collections::HashSet;

const KEYWORDS: &[&str] = &[
    "kernel", "schedule", "for", "import", "const", "in", "auto", "int", "f16", "bf16", "f32", "f64", "i8", "u8",
    "i32", "i64", "bool", "inf", "select", "sum", "max", "min", "prod", "exp", "log", "sqrt", "rsqrt", "tanh",
    "sigmoid", "erf", "erfc", "abs", "floor", "ceil", "round", "pow", "clamp", "std", "nn", "true", "false",
];

/// Names of the standard library's operators.
fn std_names() -> impl Iterator<Item = &'static str> {
    texc_compiler::nn::TABLE.iter().map(|r| r.name)
}

pub struct Names {
    taken: HashSet<String>,
}

impl Names {
    pub fn new() -> Names {
        let mut taken: HashSet<String> = KEYWORDS.iter().map(|s| s.to_string()).collect();
        taken.extend(std_names().map(str::to_string));
        Names { taken }
    }

    /// A fresh identifier for `onnx_name`: its sanitized form, else that with
    /// `_`, else with `_2`, `_3`, ...
    pub fn fresh(&mut self, onnx_name: &str) -> String {
        let base = sanitize(onnx_name);
        let free = |s: &String| !self.taken.contains(s) && !is_index_variable(s);
        let chosen = std::iter::once(base.clone())
            .chain(std::iter::once(format!("{base}_")))
            .chain((2..).map(|n| format!("{base}_{n}")))
            .find(free)
            .expect("an unbounded sequence of distinct names has a free one");
        self.taken.insert(chosen.clone());
        chosen
    }
}

/// `i0`, `i1`, ... and `r0`, ... are the importer's own index variables.
fn is_index_variable(s: &str) -> bool {
    let mut c = s.chars();
    matches!(c.next(), Some('i' | 'r')) && s.len() > 1 && c.all(|d| d.is_ascii_digit())
}

fn sanitize(name: &str) -> String {
    let mut out = String::new();
    for ch in name.chars() {
        let c = if ch.is_ascii_alphanumeric() { ch } else { '_' };
        if !(c == '_' && (out.is_empty() || out.ends_with('_'))) {
            out.push(c);
        }
    }
    while out.ends_with('_') {
        out.pop();
    }
    if out.is_empty() || out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert_str(0, "t_");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_identifiers_and_distinct() {
        let mut n = Names::new();
        assert_eq!(n.fresh("/layer1/layer1.0/conv1/Conv_output_0"), "layer1_layer1_0_conv1_Conv_output_0");
        assert_eq!(n.fresh("onnx::Conv_193"), "onnx_Conv_193");
        assert_eq!(n.fresh("193"), "t_193");
        assert_eq!(n.fresh("relu"), "relu_");
        assert_eq!(n.fresh("relu"), "relu_2");
        assert_eq!(n.fresh("i0"), "i0_");
        assert_eq!(n.fresh("x.y"), "x_y");
        assert_eq!(n.fresh("x/y"), "x_y_");
        assert_eq!(n.fresh(""), "t_");
        assert_eq!(n.fresh("in"), "in_");
        assert!(std_names().any(|s| s == texc_compiler::nn::NnOp::Conv2d(texc_compiler::nn::Epilogue::None).name()));
    }
}
