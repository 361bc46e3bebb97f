//! What extraction minimizes: each operator node's time on the target's
//! nominal machine (`Target::nominal`, the same on every machine, so that
//! `emit --stage egraph` is reproducible), by a roofline — max(FLOPs /
//! (peak · efficiency), bytes / bandwidth) — counting only the bytes that
//! enter and leave the operator, so that fusion pays off exactly by the
//! traffic it removes.
//!
//! The efficiencies describe the schedules that will run each operator, so
//! they belong to the target family's scheduling strategy: the compiler
//! defines [`PerformanceModel`], the strategies (`texc_schedules`)
//! implement it, the pipeline hands the target's model to the rewriter.
//! [`Calibration`] then corrects it by what `texc tune` measured.

use super::lang::{constant, infos, Node, Shapes};
use crate::nn::{Info, NnOp};
use egg::{EGraph, Language};

/// How fast a target family's default schedules run an operator: the share
/// of the nominal peak they reach on its FLOPs.
pub trait PerformanceModel: Send + Sync {
    /// The model's name (for reports).
    fn name(&self) -> &'static str;

    /// The share of the peak the schedules reach on `node`: 1 where the
    /// roofline bound is all the model knows.
    fn efficiency(&self, node: &OpNode<'_>) -> f64;
}

/// A performance model as the rewriter holds it: shared by the e-graph's
/// analysis and its copies, made per target (a CPU's depends on its caches).
pub type Model = std::sync::Arc<dyn PerformanceModel>;

/// An operator node as the performance model sees it.
pub struct OpNode<'a> {
    pub op: NnOp,
    /// What is known of each argument.
    pub args: &'a [Info],
    pub flops: f64,
    /// Whether a convolution's filters are constants: Winograd transforms
    /// them once, at compile time, and the CPU schedules may lay them out
    /// filters-last for rows too short for the vectors.
    pub constant_filters: bool,
}

/// The nominal machine: every operator at the peak its roofline bound allows.
pub struct Nominal;

impl PerformanceModel for Nominal {
    fn name(&self) -> &'static str {
        "nominal"
    }

    fn efficiency(&self, _: &OpNode<'_>) -> f64 {
        1.0
    }
}

/// Corrections of the cost model measured by `texc tune` on this machine
/// (`texc_pipeline::tuning::calibration`): each sample is an operator, the
/// model's estimate of a plan that is that operator alone (ns), and how
/// many times slower than the model said that plan ran, relative to the
/// other plans measured for the same kernel (measured over estimated time,
/// divided by its geometric mean over the kernel's plans). A node is
/// scaled by the geometric mean of the samples of its operator whose
/// estimates are within [`Calibration::NEAR`] of its own; without one, 1.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Calibration {
    pub samples: Vec<CalibrationSample>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct CalibrationSample {
    pub op: String,
    pub estimated_ns: f64,
    pub factor: f64,
}

impl Calibration {
    /// How far (as a ratio of estimates) a sample's size may be from a node's.
    pub const NEAR: f64 = 4.0;

    pub fn factor(&self, op: &str, estimated_ns: f64) -> f64 {
        let logs: Vec<f64> = self
            .samples
            .iter()
            .filter(|s| s.op == op && (s.estimated_ns / estimated_ns).ln().abs() <= Self::NEAR.ln())
            .map(|s| s.factor.ln())
            .collect();
        if logs.is_empty() {
            1.0
        } else {
            (logs.iter().sum::<f64>() / logs.len() as f64).exp()
        }
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }
}

/// FLOPs and bytes of one node (f32 tensors).
fn flops_and_bytes(egraph: &EGraph<Node, Shapes>, enode: &Node, ch: &[Info]) -> (f64, f64) {
    let Node::Op(op, _) = enode else {
        let Node::Opaque(k, _) = enode else { return (0.0, 0.0) };
        return egraph.analysis.opaque.get(k).map_or((0.0, 0.0), |o| (o.flops, o.bytes));
    };
    let out = op.shape(ch).map_or(Info::Other, Info::Shape).numel();
    let bytes_in: f64 = ch.iter().map(Info::numel).sum::<f64>() * 4.0;
    let work = op.work(ch, out);
    (work.flops, bytes_in + out * 4.0 + work.temporaries * 4.0)
}

/// The estimated time of one operator node alone, in ns on the nominal machine.
pub fn node_time(egraph: &EGraph<Node, Shapes>, enode: &Node, peak: f64, bw: f64) -> f64 {
    if enode.is_leaf() || matches!(enode, Node::Plan(_)) {
        return 0.0;
    }
    let ch = infos(egraph, enode.children());
    let (flops, mut bytes) = flops_and_bytes(egraph, enode, &ch);
    let op = match enode {
        Node::Op(op, _) => Some(*op),
        _ => None,
    };
    let winograd = op.and_then(NnOp::winograd);
    let constant_filters = op.is_some_and(NnOp::is_conv2d) && constant(egraph, enode.children()[1]);
    // Winograd transforms the filters on every call, unless they are constants
    // (then once, at compile time): U, (m+2)² values per filter and channel,
    // written and read again.
    if let (Some(form), false) = (winograd, constant_filters) {
        let m = form.tile() as f64;
        let kc = ch.get(1).and_then(Info::shape).map_or(0.0, |w| (w[0] * w[1]) as f64);
        bytes += 2.0 * 4.0 * kc * (m + 2.0) * (m + 2.0);
    }
    // An element-wise chain runs as one fused stage (the scheduler inlines
    // it): the tensor between two of its operators is neither written by the
    // producer nor read here, so the group counts only the bytes that leave it.
    if op.is_some_and(NnOp::pointwise) {
        for (&c, info) in enode.children().iter().zip(&ch) {
            // Any element-wise form of the operand (the scheduler also inlines an
            // element-wise consumer into a fused operator's element-wise epilogue).
            let fused = egraph[c].nodes.iter().any(|n| matches!(n, Node::Op(o, _) if o.pointwise()));
            if fused {
                bytes -= 2.0 * 4.0 * info.numel();
            }
        }
        bytes = bytes.max(0.0);
    }
    let efficiency =
        op.map_or(1.0, |op| egraph.analysis.model.efficiency(&OpNode { op, args: &ch, flops, constant_filters }));
    // A fused epilogue (bias, relu: one operation per output each) runs at
    // the rate of the element-wise operator it replaces, not the convolution's.
    let epilogue = match op {
        Some(op) if op.is_conv2d() => {
            op.shape(&ch).map_or(Info::Other, Info::Shape).numel() * op.epilogue().ops_per_output()
        }
        _ => 0.0,
    };
    let compute = (flops - epilogue).max(0.0) / (peak * efficiency) + epilogue / peak;
    // Ties go to fewer bytes, then to fewer operators (each one is a loop nest to run).
    let time = compute.max(bytes / bw) + 1e-6 * bytes / bw + 1e-3;
    // Samples name operators as they print; most runs have none to look up.
    let calibration = &egraph.analysis.calibration;
    let time = if calibration.is_empty() { time } else { time * calibration.factor(&enode.to_string(), time) };
    match (&egraph.analysis.prefer, winograd) {
        (Some(p), Some(form)) if *p == form => time * 1e-3,
        _ => time,
    }
}
