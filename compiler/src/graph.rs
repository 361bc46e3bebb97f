//! The operator graph of a specialized kernel: its top-level statements as
//! operators (calls of std.nn or user kernels, definitions, copies) with the
//! tensors that flow between them. `texc emit --stage graph` prints it;
//! `texc analyze` costs it and sizes it ([`summary`]: FLOPs, parameters,
//! bytes moved, peak memory).

use crate::cost::{work_of_stages, Counts};
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
            let (flops, int_ops) = work_of_stages(p, op.stages.clone());
            let bytes = op
                .inputs
                .iter()
                .chain(&op.outputs)
                .map(|&t| p.tensor(t).len() as f64 * p.tensor(t).elem.size() as f64)
                .sum();
            let names: Vec<&str> = op.outputs.iter().map(|&t| p.tensor(t).name.as_str()).collect();
            (format!("{} = {}", names.join(", "), op.op), Counts { flops, int_ops, bytes })
        })
        .collect()
}

/// The kernel's weights: input tensors every use of which is a weight
/// parameter (`crate::nn::OpRow::weights`) of a standard-library call or of a
/// hand-written operator recognized as one. An input that anything else
/// reads is an activation. In parameter order.
pub fn weights(p: &Program) -> Vec<TensorId> {
    let mut as_weight = vec![false; p.tensors.len()];
    let mut otherwise = vec![false; p.tensors.len()];
    for (i, op) in p.ops.iter().enumerate() {
        let recognized;
        let (nn, args) = if op.std_callee {
            (crate::nn::NnOp::from_name(&op.op), op.args.as_slice())
        } else {
            recognized = crate::recognize::recognize(p, i);
            match &recognized {
                Some((nn, args)) => (Some(*nn), args.as_slice()),
                None => (None, &[][..]),
            }
        };
        let positions = nn.map_or(&[][..], crate::nn::NnOp::weights);
        let mut weight_uses = Vec::new();
        for (at, a) in args.iter().enumerate() {
            if let OpArg::Tensor(t) = a {
                if positions.contains(&at) {
                    weight_uses.push(*t);
                } else {
                    otherwise[t.0 as usize] = true;
                }
            }
        }
        for &t in &op.inputs {
            if weight_uses.contains(&t) {
                as_weight[t.0 as usize] = true;
            } else {
                otherwise[t.0 as usize] = true;
            }
        }
    }
    p.input_tensors().filter(|t| as_weight[t.0 as usize] && !otherwise[t.0 as usize]).collect()
}

/// The figures that size a kernel: work, weights, traffic and memory.
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    pub flops: f64,
    /// Elements of the weights ([`weights`]).
    pub parameters: i64,
    pub weights: Vec<TensorId>,
    /// The operators' traffic, run one by one ([`op_costs`]).
    pub bytes_moved: f64,
    /// The largest total size of the buffers live while one operator runs.
    pub peak_bytes: u64,
    /// The operator during which the peak is reached (the first, on a tie),
    /// and the buffers live then.
    pub peak_op: Option<usize>,
    pub peak_live: Vec<TensorId>,
}

fn size_of(p: &Program, t: TensorId) -> u64 {
    let d = p.tensor(t);
    (d.len().max(0) as u64).saturating_mul(d.elem.size() as u64)
}

/// Sizing figures of a program's operator graph. Peak memory walks the
/// operators in order: inputs and outputs are the caller's buffers and live
/// for the whole call; a tensor passed between operators is live from the
/// operator that writes it through the last one that reads it. Temporaries
/// inside one operator (the padded input of `conv2d`) are not buffers of the
/// graph: whether they are materialized is the schedule's choice.
pub fn summary(p: &Program) -> Summary {
    let ops = op_costs(p);
    let weights = weights(p);
    let mut live_from = vec![usize::MAX; p.tensors.len()];
    let mut live_to = vec![0usize; p.tensors.len()];
    let whole_call = |t: TensorId| p.tensor(t).role != TensorRole::Temp;
    for (i, op) in p.ops.iter().enumerate() {
        for &t in &op.outputs {
            live_from[t.0 as usize] = live_from[t.0 as usize].min(i);
            live_to[t.0 as usize] = live_to[t.0 as usize].max(i);
        }
        for &t in &op.inputs {
            live_to[t.0 as usize] = live_to[t.0 as usize].max(i);
        }
    }
    let (mut peak_bytes, mut peak_op, mut peak_live) = (0u64, None, Vec::new());
    // A graph without operators still holds its inputs and outputs.
    for i in 0..p.ops.len().max(1) {
        let live: Vec<TensorId> = (0..p.tensors.len())
            .map(|t| TensorId(t as u32))
            .filter(|&t| whole_call(t) || (live_from[t.0 as usize] <= i && i <= live_to[t.0 as usize]))
            .collect();
        let bytes = live.iter().fold(0u64, |s, &t| s.saturating_add(size_of(p, t)));
        if peak_op.is_none() || bytes > peak_bytes {
            (peak_bytes, peak_op, peak_live) = (bytes, (!p.ops.is_empty()).then_some(i), live);
        }
    }
    Summary {
        flops: crate::cost::count(p).flops,
        parameters: weights.iter().map(|&t| p.tensor(t).len()).sum(),
        weights,
        bytes_moved: ops.iter().map(|(_, c)| c.bytes).sum(),
        peak_bytes,
        peak_op,
        peak_live,
    }
}
