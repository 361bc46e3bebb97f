//! The GPU strategy's performance model: the share of the nominal f32 peak
//! its schedules reach on each operator, which the e-graph's cost model
//! prices operators with (`texc_compiler::rewrite::PerformanceModel`),
//! measured on a GPU and kept beside the schedules it describes.

use texc_compiler::nn::NnOp;
use texc_compiler::rewrite::{OpNode, PerformanceModel};

/// The default GPU schedules' efficiencies.
pub struct GpuModel;

impl PerformanceModel for GpuModel {
    fn name(&self) -> &'static str {
        "gpu"
    }

    /// The share of the f32 peak that texc's default GPU schedules reach on an
    /// operator, measured on an H200 (`benches/gpu.py --tune`: ResNet-50's
    /// 56×56×64 3×3 layer at batch 32, f32): the direct convolution, a 4×4 block
    /// of outputs per thread with its accumulators in registers, 0.2 (0.54 ms),
    /// as the same blocks reach on a 4096³ product (the im2col form's); Winograd
    /// F(4×4, 3×3) 0.035 of its reduced work (0.96 ms: its transforms and
    /// batched products are launches of their own, each through global memory).
    /// At the nominal peak the model had chosen Winograd, 1.8× slower.
    fn efficiency(&self, node: &OpNode<'_>) -> f64 {
        match node.op {
            NnOp::Conv2dWinograd(..) => 0.035,
            op if op.is_conv2d() => 0.2,
            _ => 1.0,
        }
    }
}
