//! Seeded random inputs inside the domain of the operators they feed.
//!
//! Random floats are uniform in [-1, 1). A standard-library parameter that
//! must not be negative — the variance of `batch_norm`, which goes under a
//! square root — would then give NaN on half its elements, and a run on
//! random data would say nothing about the kernel. An input passed straight
//! to such a parameter is drawn from [0, 1) instead: the absolute values of
//! the same draws, so every other input keeps the values its seed gives.
//! Inputs read from files are never changed.

use texc_compiler::interp::Arg;
use texc_compiler::nn::NnOp;
use texc_compiler::tir::{OpArg, ProgramParam, TensorId};
use texc_compiler::Program;

/// Input tensors of `p` passed to a parameter whose values must be ≥ 0
/// (`texc_compiler::nn::OpRow::non_negative`).
pub fn non_negative_inputs(p: &Program) -> Vec<TensorId> {
    let inputs: Vec<TensorId> = p.input_tensors().collect();
    let mut out = Vec::new();
    for op in p.ops.iter().filter(|op| op.std_callee) {
        let Some(nn) = NnOp::from_name(&op.op) else { continue };
        for &(at, _) in nn.row().non_negative {
            if let Some(OpArg::Tensor(t)) = op.args.get(at) {
                if inputs.contains(t) && !out.contains(t) {
                    out.push(*t);
                }
            }
        }
    }
    out
}

/// Fold the random arguments (in `p.params` order) of non-negative inputs
/// into [0, 1); `from_files` names the inputs that were given.
pub fn into_domain(p: &Program, args: &mut [Arg], from_files: &[String]) {
    let keep = non_negative_inputs(p);
    for (param, arg) in p.params.iter().zip(args.iter_mut()) {
        let (ProgramParam::Tensor(t), Arg::Tensor(x)) = (param, arg) else { continue };
        if keep.contains(t) && !from_files.contains(&p.tensor(*t).name) && x.dtype().is_float() {
            let v: Vec<f64> = x.to_f64().iter().map(|v| v.abs()).collect();
            *x = texc_runtime::Tensor::from_f64(x.dtype(), x.shape.clone(), &v);
        }
    }
}
