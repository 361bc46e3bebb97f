//! The operator graph of a specialized kernel: its top-level statements as
//! operators (calls of std.nn or user kernels, definitions, copies) with the
//! tensors that flow between them. `texc emit --stage graph` prints it;
//! `texc analyze` costs it.

use crate::cost::{cost_of_stages, Counts};
use crate::tir::*;
use std::fmt::Write;

fn decl(p: &Program, t: TensorId) -> String {
    let d = p.tensor(t);
    let dims: Vec<String> = d.shape.iter().map(|x| x.to_string()).collect();
    format!("{}: {}[{}]", d.name, d.elem, dims.join(", "))
}

pub fn print_graph(p: &Program) -> String {
    let mut out = String::new();
    let b: Vec<String> = p.bindings.iter().map(|(n, v)| format!("{n}={v}")).collect();
    let _ = writeln!(out, "graph {} [{}]", p.name, b.join(", "));
    for t in p.input_tensors() {
        let _ = writeln!(out, "  input {}", decl(p, t));
    }
    for s in &p.scalars {
        let _ = writeln!(out, "  scalar {}: {}", s.name, s.elem);
    }
    for (i, op) in p.ops.iter().enumerate() {
        let outs: Vec<String> = op.outputs.iter().map(|&t| decl(p, t)).collect();
        let ins: Vec<&str> = op.inputs.iter().map(|&t| p.tensor(t).name.as_str()).collect();
        let attrs = if op.attrs.is_empty() { String::new() } else { format!(" [{}]", op.attrs.join(", ")) };
        let known = match crate::recognize::recognize(p, i) {
            Some((name, _)) => format!("  # recognized as {name}"),
            None => String::new(),
        };
        let _ = writeln!(out, "  {} = {}({}){attrs}{known}", outs.join(", "), op.op, ins.join(", "));
    }
    for &t in &p.outputs {
        let _ = writeln!(out, "  output {}", p.tensor(t).name);
    }
    out
}

/// Work and traffic of each operator. Bytes count what crosses the
/// operator's boundary (its inputs read once, its outputs written once);
/// temporaries inside a fused operator are free.
pub fn op_costs(p: &Program) -> Vec<(String, Counts)> {
    p.ops
        .iter()
        .map(|op| {
            let flops = cost_of_stages(p, op.stages.clone());
            let bytes = op
                .inputs
                .iter()
                .chain(&op.outputs)
                .map(|&t| p.tensor(t).len() as f64 * p.tensor(t).elem.size() as f64)
                .sum();
            let names: Vec<&str> = op.outputs.iter().map(|&t| p.tensor(t).name.as_str()).collect();
            (format!("{} = {}", names.join(", "), op.op), Counts { flops, bytes })
        })
        .collect()
}
