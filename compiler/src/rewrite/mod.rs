//! Graph rewriting with an e-graph (`egg`): fusion and batch-norm folding
//! chosen by a roofline cost model, and the chosen plan turned back into a
//! `.tex` kernel that the rest of the compiler specializes and checks.
//!
//! The operator graph of a specialized kernel (`Program::ops`) becomes one
//! term: standard-library calls are operators whose children are their
//! arguments in parameter order (tensors, constants as numbers, scalars as
//! names or numbers); anything else — definitions, calls of user kernels —
//! is an opaque operator. Rewrites are directional (documented on each
//! rule), saturation is bounded (iterations, nodes, time, backoff
//! scheduler), and the cheapest term is extracted greedily.
//!
//! Costs use each target's nominal machine (`Target::nominal`, the same on
//! every machine, so that `emit --stage egraph` is reproducible): an operator costs
//! max(FLOPs / peak, bytes / bandwidth), counting only the bytes that enter
//! and leave it, so fusion pays off exactly by the traffic it removes.

use crate::target::Target;
use crate::tir::{OpArg, Program, TensorId};
use egg::{
    rewrite as rw, Analysis, CostFunction, DidMerge, EGraph, Extractor, Id, Language, RecExpr, Rewrite, Runner,
    SymbolLang,
};
use std::collections::{HashMap, HashSet};
use std::fmt::Write;
use std::time::Duration;

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

/// What is known about an e-class: a tensor's shape, or a number.
#[derive(Clone, Debug, PartialEq)]
pub enum Info {
    Shape(Vec<i64>),
    Num(i64),
    Other,
}

/// Shapes of leaves and of opaque operators, by symbol.
#[derive(Default)]
pub struct Shapes {
    pub of: HashMap<String, Vec<i64>>,
    /// FLOPs and bytes of opaque operators, by symbol.
    pub opaque_cost: HashMap<String, (f64, f64)>,
    /// The kind of machine whose measured shares of the peak convolutions'
    /// compute time counts ([`cpu_efficiency`], [`gpu_efficiency`]); none
    /// (the nominal peak) for the others.
    pub efficiency_of: Option<crate::target::TargetKind>,
    /// Inputs whose values are fixed before the calls (an imported model's
    /// weights): stages that read only them run once (`crate::constants`), so
    /// forms that transform the weights at no cost per call may be chosen.
    pub constants: HashSet<String>,
    /// Operators of this family are made nearly free, so that extraction
    /// takes them wherever the rules allow: the tuner's `winograd=2|3|4`
    /// measures that Winograd form, not the cost model's pick.
    pub prefer: Option<WinogradForm>,
    /// Measured corrections of the estimates ([`Calibration`]).
    pub calibration: Calibration,
}

impl Analysis<SymbolLang> for Shapes {
    type Data = Info;

    fn make(egraph: &mut EGraph<SymbolLang, Self>, n: &SymbolLang, _id: Id) -> Info {
        let op = n.op.as_str();
        if n.children.is_empty() {
            if let Ok(v) = op.parse::<i64>() {
                return Info::Num(v);
            }
            return egraph.analysis.of.get(op).map_or(Info::Other, |s| Info::Shape(s.clone()));
        }
        let ch: Vec<Info> = n.children.iter().map(|&c| egraph[c].data.clone()).collect();
        shape_of(op, &ch).or_else(|| egraph.analysis.of.get(op).cloned()).map_or(Info::Other, Info::Shape)
    }

    fn merge(&mut self, a: &mut Info, b: Info) -> DidMerge {
        if *a == Info::Other && b != Info::Other {
            *a = b;
            return DidMerge(true, false);
        }
        DidMerge(false, false)
    }
}

fn shape(i: &Info) -> Option<&[i64]> {
    match i {
        Info::Shape(s) => Some(s),
        _ => None,
    }
}

fn num(i: &Info) -> Option<i64> {
    match i {
        Info::Num(v) => Some(*v),
        _ => None,
    }
}

/// Output shape of a known operator from its children.
fn shape_of(op: &str, ch: &[Info]) -> Option<Vec<i64>> {
    let s = |i: usize| ch.get(i).and_then(shape);
    Some(match op {
        "conv2d" | "conv2d_bias" | "conv2d_bias_relu" | "conv2d_im2col" | "conv2d_im2col_t" => {
            let (x, w) = (s(0)?, s(1)?);
            let k = if matches!(op, "conv2d" | "conv2d_im2col" | "conv2d_im2col_t") { 2 } else { 3 };
            let (pad, stride, dil) = (num(ch.get(k)?)?, num(ch.get(k + 1)?)?, num(ch.get(k + 2)?)?);
            let out = |h: i64, r: i64| (h + 2 * pad - dil * (r - 1) - 1).div_euclid(stride.max(1)) + 1;
            vec![x[0], w[0], out(x[2], w[2]), out(x[3], w[3])]
        }
        op if op.starts_with("conv2d_winograd_") || op.starts_with("conv2d_1x1") => {
            let (x, w) = (s(0)?, s(1)?);
            vec![x[0], w[0], x[2], x[3]]
        }
        "max_pool2d" | "avg_pool2d" => {
            let x = s(0)?;
            let (k, stride, pad) = (num(ch.get(1)?)?, num(ch.get(2)?)?, num(ch.get(3)?)?);
            let out = |h: i64| (h + 2 * pad - k).div_euclid(stride.max(1)) + 1;
            vec![x[0], x[1], out(x[2]), out(x[3])]
        }
        "global_avg_pool2d" => vec![s(0)?[0], s(0)?[1], 1, 1],
        "dense" => vec![s(0)?[0], s(1)?[0]],
        "matmul" => vec![s(0)?[0], s(1)?[1]],
        "batch_matmul" => vec![s(0)?[0], s(0)?[1], s(1)?[2]],
        "batch_norm" | "relu" | "relu6" | "sigmoid" | "tanh" | "gelu" | "silu" | "leaky_relu" | "bias_add" | "add"
        | "sub" | "mul" | "div" | "bn_fold_weight" | "bn_fold_bias" | "softmax" | "layer_norm" => s(0)?.to_vec(),
        "transpose" => {
            let x = s(0)?;
            let perm: Vec<i64> = ch[1..].iter().map(num).collect::<Option<_>>()?;
            if perm.len() != x.len() {
                return None;
            }
            perm.iter().map(|&p| x.get(usize::try_from(p).ok()?).copied()).collect::<Option<_>>()?
        }
        _ => return None,
    })
}

fn numel(s: &[i64]) -> f64 {
    s.iter().map(|&d| d as f64).product()
}

/// FLOPs and bytes of one operator node (f32 tensors).
fn op_cost(op: &str, ch: &[Info], out: &Info, opaque: &HashMap<String, (f64, f64)>) -> (f64, f64) {
    if let Some(&c) = opaque.get(op) {
        return c;
    }
    let bytes_in: f64 = ch.iter().filter_map(shape).map(numel).sum::<f64>() * 4.0;
    let o = shape(out).map(numel).unwrap_or(0.0);
    let bytes = bytes_in + o * 4.0;
    // Intermediate tensors that these operators materialize.
    let padded = |pad: i64| {
        ch.first().and_then(shape).map_or(0.0, |x| (x[0] * x[1]) as f64 * ((x[2] + 2 * pad) * (x[3] + 2 * pad)) as f64)
    };
    let (flops, extra) = match op {
        "conv2d" | "conv2d_bias" | "conv2d_bias_relu" => {
            let w = ch.get(1).and_then(shape).map_or(0.0, |w| (w[1] * w[2] * w[3]) as f64);
            let pad = ch.get(if op == "conv2d" { 2 } else { 3 }).and_then(num).unwrap_or(0);
            let f = o * 2.0 * w + if op == "conv2d" { 0.0 } else { o } + if op == "conv2d_bias_relu" { o } else { 0.0 };
            (f, 2.0 * padded(pad))
        }
        "conv2d_im2col" | "conv2d_im2col_t" => {
            // The direct convolution's work, plus the patch matrix written and read.
            let w = ch.get(1).and_then(shape).map_or(0.0, |w| (w[1] * w[2] * w[3]) as f64);
            let k = ch.get(1).and_then(shape).map_or(1.0, |w| w[0] as f64);
            let cols = o / k.max(1.0) * w;
            (o * 2.0 * w, 2.0 * padded(ch.get(2).and_then(num).unwrap_or(0)) + 2.0 * cols)
        }
        op if op.starts_with("conv2d_winograd_") => {
            // Per m×m output tile and (k, c): (m+2)² multiply-adds. Transforms,
            // per transformed element: input 2·(m+2)/2 adds, output about as many;
            // a fused epilogue adds one operation (bias) or two (bias, relu) per output.
            let m = winograd_tile(op);
            let epilogue = o * (op.matches("_bias").count() + op.matches("_relu").count()) as f64;
            let a = (m + 2.0) * (m + 2.0);
            let c = ch.first().and_then(shape).map_or(0.0, |x| x[1] as f64);
            let k = ch.get(1).and_then(shape).map_or(0.0, |w| w[0] as f64);
            let tiles = o / k.max(1.0) / (m * m);
            let v = tiles * c * a; // input tiles transformed
            let p = tiles * k * a; // products before the output transform
            (2.0 * a * tiles * k * c + 2.0 * (m + 2.0) * (v + p) + epilogue, 2.0 * (padded(1) + v + p))
        }
        _ => (op_flops(op, ch, o), 0.0),
    };
    (flops, bytes + extra * 4.0)
}

/// The output tile side of Winograd operator `op` (of any form and epilogue).
fn winograd_tile(op: &str) -> f64 {
    let tile = [WinogradForm::F2, WinogradForm::F2k, WinogradForm::F4].into_iter().find(|f| f.has(op));
    tile.map_or(4, WinogradForm::tile) as f64
}

fn op_flops(op: &str, ch: &[Info], o: f64) -> f64 {
    match op {
        "conv2d_1x1" => 2.0 * o * ch.first().and_then(shape).map_or(0.0, |x| x[1] as f64),
        "conv2d_1x1_bias" => (2.0 * ch.first().and_then(shape).map_or(0.0, |x| x[1] as f64) + 1.0) * o,
        "matmul" => {
            let k = ch.first().and_then(shape).map_or(0.0, |a| a[1] as f64);
            2.0 * o * k
        }
        "batch_matmul" => {
            let k = ch.first().and_then(shape).map_or(0.0, |a| a[2] as f64);
            2.0 * o * k
        }
        "batch_norm" => 6.0 * o,
        "bn_fold_weight" => 4.0 * o,
        "bn_fold_bias" => 5.0 * o,
        "transpose" => 0.0,
        _ => o,
    }
}

struct RooflineCost<'a> {
    egraph: &'a EGraph<SymbolLang, Shapes>,
    peak: f64,
    bw: f64,
}

impl CostFunction<SymbolLang> for RooflineCost<'_> {
    type Cost = f64;

    fn cost<C>(&mut self, enode: &SymbolLang, mut costs: C) -> f64
    where
        C: FnMut(Id) -> f64,
    {
        let children: f64 = enode.children.iter().map(|&c| costs(c)).sum();
        children + node_time(self.egraph, enode, self.peak, self.bw)
    }
}

/// The estimated time of one operator node alone, in ns on the nominal machine.
fn node_time(egraph: &EGraph<SymbolLang, Shapes>, enode: &SymbolLang, peak: f64, bw: f64) -> f64 {
    if enode.children.is_empty() || enode.op.as_str() == "plan" {
        return 0.0;
    }
    let ch: Vec<Info> = enode.children.iter().map(|&c| egraph[c].data.clone()).collect();
    let out = shape_of(enode.op.as_str(), &ch).map_or(Info::Other, Info::Shape);
    let (flops, mut bytes) = op_cost(enode.op.as_str(), &ch, &out, &egraph.analysis.opaque_cost);
    let winograd = enode.op.as_str().starts_with("conv2d_winograd_");
    let constant_filters = winograd && constant(egraph, enode.children[1]);
    // Winograd transforms the filters on every call, unless they are constants
    // (then once, at compile time): U, (m+2)² values per filter and channel,
    // written and read again.
    if winograd && !constant_filters {
        let m = winograd_tile(enode.op.as_str());
        let kc = ch.get(1).and_then(shape).map_or(0.0, |w| (w[0] * w[1]) as f64);
        bytes += 2.0 * 4.0 * kc * (m + 2.0) * (m + 2.0);
    }
    // An element-wise chain runs as one fused stage (the scheduler inlines
    // it): the tensor between two of its operators is neither written by the
    // producer nor read here, so the group counts only the bytes that leave it.
    if ELEMENTWISE.contains(&enode.op.as_str()) {
        for (&c, info) in enode.children.iter().zip(&ch) {
            // Any element-wise form of the operand (the scheduler also inlines an
            // element-wise consumer into a fused operator's element-wise epilogue).
            let fused = egraph[c].nodes.iter().any(|n| ELEMENTWISE.contains(&n.op.as_str()));
            if fused {
                bytes -= 2.0 * 4.0 * shape(info).map(numel).unwrap_or(0.0);
            }
        }
        bytes = bytes.max(0.0);
    }
    let efficiency = match egraph.analysis.efficiency_of {
        Some(crate::target::TargetKind::Cpu) => cpu_efficiency(enode.op.as_str(), &ch, flops, constant_filters),
        Some(crate::target::TargetKind::Gpu) => gpu_efficiency(enode.op.as_str()),
        _ => 1.0,
    };
    // A fused epilogue (bias, relu: one operation per output each) runs at
    // the rate of the element-wise operator it replaces, not the convolution's.
    let op = enode.op.as_str();
    let epilogue = if op.starts_with("conv2d") {
        shape(&out).map_or(0.0, numel) * (op.matches("_bias").count() + op.matches("_relu").count()) as f64
    } else {
        0.0
    };
    let compute = (flops - epilogue).max(0.0) / (peak * efficiency) + epilogue / peak;
    // Ties go to fewer bytes, then to fewer operators (each one is a loop nest to run).
    let time = compute.max(bytes / bw) + 1e-6 * bytes / bw + 1e-3;
    let time = time * egraph.analysis.calibration.factor(op, time);
    match &egraph.analysis.prefer {
        Some(p) if p.has(op) => time * 1e-3,
        _ => time,
    }
}

/// The share of the peak that texc's default CPU schedules reach on an
/// operator, measured (1 thread, x86-avx2 and x86-avx512, ResNet-18's
/// layers at 224×224: `benches/models.py`, docs/onnx.md): direct
/// convolutions 0.5–0.64 at stride 1 (0.4 with 1×1 filters, whose matrix
/// products reach 0.58–0.78) but 0.18–0.27 at stride 2 and for
/// 3-channel inputs, where im2col's matrix product reaches 0.4–0.62; Winograd
/// 0.34–0.6 of its reduced work, less on small images. Without these the
/// roofline ties a direct strided convolution with im2col, and the direct
/// one, 3.3× slower, was chosen. Below 10 MFLOP the data stays in the
/// first-level cache and direct convolutions keep their speed (a 16-channel
/// 10×10 strided layer: 0.010 ms direct, 0.026 ms by im2col), so the
/// penalty is for larger layers only. Operators not listed reach the peak
/// their roofline bound allows as far as the model knows.
fn cpu_efficiency(op: &str, ch: &[Info], flops: f64, constant_filters: bool) -> f64 {
    let x = ch.first().and_then(shape);
    let stride = |k: usize| ch.get(k).and_then(num).unwrap_or(1);
    // Output pixels per image and filter: below 100 (7×7), rows of pixels
    // fill vectors badly and the products over them slow down.
    let few_pixels = shape_of(op, ch).is_some_and(|o| o.len() == 4 && o[2] * o[3] < 100);
    // Images of at most 14×14: few Winograd tiles.
    let small = x.is_some_and(|x| x.len() == 4 && x[2] * x[3] <= 14 * 14);
    match op {
        "conv2d" | "conv2d_bias" | "conv2d_bias_relu" => {
            let k = if op == "conv2d" { 3 } else { 4 };
            let few_channels = x.is_some_and(|x| x[1] < 8);
            let pointwise = ch.get(1).and_then(shape).is_some_and(|w| w[2] == 1 && w[3] == 1);
            if (stride(k) > 1 || few_channels) && flops > 1e7 {
                0.22
            } else if pointwise || few_pixels {
                // A 1×1 filter leaves the direct nest no window to reuse; a
                // 7×7 image, rows of 7 in 8-lane vectors (3×3 at 7×7×512: 0.37).
                0.4
            } else {
                0.6
            }
        }
        // 1×1 convolutions as products (56×56, 24→144): 0.78 alone, 0.58 with the bias added in.
        "conv2d_1x1" => 0.78,
        "conv2d_1x1_bias" => 0.58,
        // 3×3 at 7×7×512: 0.39 by pixel rows, 0.63 by filter rows (weights folded).
        "conv2d_im2col" if few_pixels => 0.4,
        "conv2d_im2col" => 0.55,
        "conv2d_im2col_t" if few_pixels => 0.63,
        "conv2d_im2col_t" => 0.45,
        // Vectors along the filters, 1 thread (3×3, direct measured at 0.6):
        // 14×14×256 0.42 (AVX-512) and 0.38 (AVX2), where the other layout
        // measured 0.27 (the model keeps its 0.35 below); 28×28×128 0.52 and
        // 56×56×64 0.41, where the other reaches 0.55. With constant filters
        // the other layout reads U packed by rows of filters (`prepack`) and
        // its products run 1.25× faster (ResNet-18's 14×14×256 layers,
        // AVX-512: 1.0 against 1.25 ms). Few filters fill few vectors. So
        // 0.28, below the other layout, wherever it was not measured faster.
        op if op.starts_with("conv2d_winograd_f2k") => {
            let many_filters = ch.get(1).and_then(shape).is_some_and(|w| w[0] >= 128);
            if small && many_filters && !constant_filters {
                0.42
            } else {
                0.28
            }
        }
        op if op.starts_with("conv2d_winograd_") => {
            // Fewer tiles to spread the transforms over on small images.
            if small {
                0.35
            } else {
                0.55
            }
        }
        _ => 1.0,
    }
}

/// The share of the f32 peak that texc's default GPU schedules reach on an
/// operator, measured on an H200 (`benches/gpu.py --tune`: ResNet-50's
/// 56×56×64 3×3 layer at batch 32, f32): the direct convolution, a 4×4 block
/// of outputs per thread with its accumulators in registers, 0.2 (0.54 ms),
/// as the same blocks reach on a 4096³ product (the im2col form's); Winograd
/// F(4×4, 3×3) 0.035 of its reduced work (0.96 ms: its transforms and
/// batched products are launches of their own, each through global memory).
/// At the nominal peak the model had chosen Winograd, 1.8× slower.
fn gpu_efficiency(op: &str) -> f64 {
    match op {
        op if op.starts_with("conv2d_winograd_") => 0.035,
        op if op.starts_with("conv2d") => 0.2,
        _ => 1.0,
    }
}

/// Operators computed point by point, which the scheduler fuses into their
/// element-wise consumers.
const ELEMENTWISE: [&str; 13] = [
    "relu",
    "relu6",
    "sigmoid",
    "tanh",
    "gelu",
    "silu",
    "leaky_relu",
    "bias_add",
    "add",
    "sub",
    "mul",
    "div",
    "batch_norm",
];

/// How the plan is chosen from the saturated e-graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Extraction {
    /// Per e-class, the node whose subtree is cheapest (egg's `Extractor`);
    /// shared subterms count once per use.
    Greedy,
    /// An integer program over the whole DAG (egg's `LpExtractor` with CBC):
    /// shared subterms count once. Built with the cargo feature `ilp`.
    Ilp,
}

impl Extraction {
    /// By name: `greedy` or `ilp` (the latter only when built with the feature `ilp`).
    pub fn from_name(name: &str) -> Result<Extraction, String> {
        match name {
            "" | "greedy" => Ok(Extraction::Greedy),
            "ilp" if cfg!(feature = "ilp") => Ok(Extraction::Ilp),
            "ilp" => Err("this texc was built without ILP extraction; build it with `--features ilp` \
                          (needs CBC: apt install coinor-libcbc-dev)"
                .into()),
            _ => Err("expected `greedy` or `ilp`".into()),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Extraction::Greedy => "greedy",
            Extraction::Ilp => "ilp",
        }
    }
}

#[cfg(feature = "ilp")]
struct LpTime {
    peak: f64,
    bw: f64,
}

#[cfg(feature = "ilp")]
impl egg::LpCostFunction<SymbolLang, Shapes> for LpTime {
    fn node_cost(&mut self, egraph: &EGraph<SymbolLang, Shapes>, _class: Id, enode: &SymbolLang) -> f64 {
        node_time(egraph, enode, self.peak, self.bw)
    }
}

/// The ILP-optimal plan and the e-class of each of its nodes.
#[cfg(feature = "ilp")]
fn extract_ilp(egraph: &EGraph<SymbolLang, Shapes>, root: Id, peak: f64, bw: f64) -> (RecExpr<SymbolLang>, Vec<Id>) {
    let best = egg::LpExtractor::new(egraph, LpTime { peak, bw }).solve(root);
    let mut classes: Vec<Id> = Vec::new();
    for node in best.as_ref() {
        let mapped = node.clone().map_children(|c| classes[usize::from(c)]);
        classes.push(egraph.lookup(mapped).expect("the plan is in the e-graph"));
    }
    (best, classes)
}

#[cfg(not(feature = "ilp"))]
fn extract_ilp(_: &EGraph<SymbolLang, Shapes>, _: Id, _: f64, _: f64) -> (RecExpr<SymbolLang>, Vec<Id>) {
    unreachable!("Extraction::from_env refuses `ilp` without the feature")
}

/// The cost of a term counting each distinct node once (the ILP's objective).
fn dag_cost(egraph: &EGraph<SymbolLang, Shapes>, term: &RecExpr<SymbolLang>, peak: f64, bw: f64) -> f64 {
    let mut classes: Vec<Id> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut total = 0.0;
    for node in term.as_ref() {
        let mapped = node.clone().map_children(|c| classes[usize::from(c)]);
        let class = egraph.lookup(mapped.clone()).expect("the term is in the e-graph");
        classes.push(class);
        if seen.insert(class) {
            total += node_time(egraph, &mapped, peak, bw);
        }
    }
    total
}

/// The numerical error a user accepts from rewrites (`--tolerance`,
/// `--exact`), and which alternatives the rewriter may choose among. Most
/// rules compute the same sums in another order or place, whose rounding
/// is that of the computation as written. Winograd transforms amplify
/// rounding, increasingly with the reduction length, so they are applied
/// only where their error model ([`winograd_error`]) stays within the
/// tolerance, and never when approximate rewrites are off. The autotuner
/// narrows the alternatives (`winograd`, `im2col`) to measure each
/// rather than trust the cost model's choice.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Accuracy {
    /// Relative error accepted on f32 outputs, in the measure `run --check`
    /// uses: max |plan − exact| / max |exact|.
    pub tolerance: f64,
    /// Whether rewrites with amplified rounding error may be chosen at all.
    pub approximate: bool,
    /// Winograd in this form wherever it applies, and no other; `None`:
    /// any, as the cost model picks.
    pub winograd: Option<WinogradForm>,
    /// Whether convolutions may become im2col products.
    pub im2col: bool,
}

impl Default for Accuracy {
    /// The tolerance `run --check` applies to f32 outputs; every rewrite allowed.
    fn default() -> Accuracy {
        Accuracy { tolerance: 1e-5, approximate: true, winograd: None, im2col: true }
    }
}

/// The forms of Winograd convolution the rewriter knows, each a family of
/// standard-library operators (with `_bias`, `_bias_relu` epilogues).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WinogradForm {
    /// F(2×2, 3×3), vectors along the tiles (`conv2d_winograd_f2`).
    F2,
    /// F(2×2, 3×3), vectors along the filters (`conv2d_winograd_f2k`).
    F2k,
    /// F(4×4, 3×3) (`conv2d_winograd_f4`).
    F4,
}

impl WinogradForm {
    /// The value of the tuner's `winograd` knob that selects each form.
    pub const KNOB_VALUES: [(i64, WinogradForm); 3] =
        [(2, WinogradForm::F2), (3, WinogradForm::F2k), (4, WinogradForm::F4)];

    pub fn from_knob(v: i64) -> Option<WinogradForm> {
        Self::KNOB_VALUES.iter().find(|(k, _)| *k == v).map(|&(_, f)| f)
    }

    /// The family's operator without an epilogue.
    pub fn op(self) -> &'static str {
        match self {
            WinogradForm::F2 => "conv2d_winograd_f2",
            WinogradForm::F2k => "conv2d_winograd_f2k",
            WinogradForm::F4 => "conv2d_winograd_f4",
        }
    }

    /// The side of its output tile.
    pub fn tile(self) -> i64 {
        match self {
            WinogradForm::F2 | WinogradForm::F2k => 2,
            WinogradForm::F4 => 4,
        }
    }

    /// Whether operator `op` is of this family.
    pub fn has(self, op: &str) -> bool {
        op.strip_prefix(self.op()).is_some_and(|rest| rest.is_empty() || rest.starts_with('_'))
    }
}

/// Estimated relative error (max-norm, against the exact result) of
/// Winograd F(m×m, 3×3) computed in f32 over `channels` input channels:
/// `a·√C + b`, an envelope 1.2–1.5× above the worst of several seeds of
/// zero-mean uniform data (the worst case for relative error) at C = 16 to
/// 1024, measured with compiled code against the interpreter's direct
/// convolution; `winograd_error_model_is_an_upper_bound` in
/// `tests/tests/rewrite.rs` keeps it honest. (Measured F(4×4, 3×3): 6.1e-6
/// at C = 64, 1.06e-5 at C = 128, 2.25e-5 at C = 1024; F(2×2, 3×3):
/// 4.3e-7 at C = 64, 1.1e-6 at C = 1024; direct: 3.2e-6 at C = 1024.)
pub fn winograd_error(m: i64, channels: i64) -> f64 {
    let (a, b) = if m <= 2 { (5e-8, 1.5e-7) } else { (1e-6, 1.5e-6) };
    a * (channels.max(1) as f64).sqrt() + b
}

/// The rewrite rules, each with its algebra, as `accuracy` allows them.
pub fn rules(accuracy: Accuracy) -> Vec<Rewrite<SymbolLang, Shapes>> {
    let within = |form: WinogradForm| accurate_enough("?x", form, accuracy);
    let im2col = accuracy.im2col;
    let im2col_allowed = move |_: &mut EGraph<SymbolLang, Shapes>, _: Id, _: &egg::Subst| im2col;
    vec![
        // Batch-norm folding into the preceding convolution:
        //   γ·(conv(X, W) − μ)/√(σ²+ε) + β  =  conv(X, W·s) + (β − μ·s),  s = γ/√(σ²+ε)
        rw!("bn-fold";
            "(batch_norm (conv2d ?x ?w ?p ?s ?d ?g) ?ga ?be ?m ?v ?eps)" =>
            "(conv2d_bias ?x (bn_fold_weight ?w ?ga ?v ?eps) (bn_fold_bias ?be ?m ?ga ?v ?eps) ?p ?s ?d ?g)"),
        // Bias fusion: conv(X, W) + b[k] computed in the convolution's stage.
        rw!("conv-bias-fuse";
            "(bias_add (conv2d ?x ?w ?p ?s ?d ?g) ?b)" => "(conv2d_bias ?x ?w ?b ?p ?s ?d ?g)"),
        // Activation fusion: relu(conv(X, W) + b) in one stage.
        rw!("conv-bias-relu-fuse";
            "(relu (conv2d_bias ?x ?w ?b ?p ?s ?d ?g))" => "(conv2d_bias_relu ?x ?w ?b ?p ?s ?d ?g)"),
        // The fusions read backwards: a convolution that arrives fused (an
        // exporter folded batch norm into a Conv with bias) is also its parts,
        // so it can still take the im2col form, which has no fused variant.
        rw!("conv-bias-unfuse";
            "(conv2d_bias ?x ?w ?b ?p ?s ?d ?g)" => "(bias_add (conv2d ?x ?w ?p ?s ?d ?g) ?b)"),
        rw!("conv-bias-relu-unfuse";
            "(conv2d_bias_relu ?x ?w ?b ?p ?s ?d ?g)" => "(relu (conv2d_bias ?x ?w ?b ?p ?s ?d ?g))"),
        // Transposes that reverse the axes cancel: (Xᵀ)ᵀ = X (ranks 2 to 4).
        rw!("transpose-cancel"; "(transpose (transpose ?x 1 0) 1 0)" => "?x"),
        rw!("transpose-cancel-3"; "(transpose (transpose ?x 2 1 0) 2 1 0)" => "?x"),
        rw!("transpose-cancel-4"; "(transpose (transpose ?x 3 2 1 0) 3 2 1 0)" => "?x"),
        // Distributivity: A·B + A·C = A·(B + C), one matmul instead of two.
        rw!("matmul-distribute"; "(add (matmul ?a ?b) (matmul ?a ?c))" => "(matmul ?a (add ?b ?c))"),
        // A 1×1 convolution (no padding, stride 1, one group) is a matrix
        // product per image: Y[n] = W[:, :, 0, 0] · X[n].
        rw!("conv1x1-matmul"; "(conv2d ?x ?w 0 1 ?d 1)" => "(conv2d_1x1 ?x ?w)" if filter_is("?w", 1)),
        // The same with the bias added in the product's stage.
        rw!("conv1x1-bias-matmul";
            "(conv2d_bias ?x ?w ?b 0 1 ?d 1)" => "(conv2d_1x1_bias ?x ?w ?b)" if filter_is("?w", 1)),
        // Winograd F(2×2, 3×3) for 3×3, stride 1, pad 1, one group, even H and W:
        // Y = Aᵀ[(G g Gᵀ) ⊙ (Bᵀ d B)]A per 2×2 tile (Lavin & Gray 2016).
        rw!("conv3x3-winograd"; "(conv2d ?x ?w 1 1 1 1)" => "(conv2d_winograd_f2 ?x ?w)" if filter_is("?w", 3) if image_multiple_of("?x", 2) if within(WinogradForm::F2)),
        // The same laid out with vectors along the filters (small images, many filters).
        rw!("conv3x3-winograd-k"; "(conv2d ?x ?w 1 1 1 1)" => "(conv2d_winograd_f2k ?x ?w)" if filter_is("?w", 3) if image_multiple_of("?x", 2) if within(WinogradForm::F2k)),
        // Winograd F(4×4, 3×3), the same on 6×6 input tiles, H and W multiples of 4:
        // 36 products per 4×4 tile instead of 144 (Lavin & Gray 2016).
        rw!("conv3x3-winograd-f4"; "(conv2d ?x ?w 1 1 1 1)" => "(conv2d_winograd_f4 ?x ?w)" if filter_is("?w", 3) if image_multiple_of("?x", 4) if within(WinogradForm::F4)),
        // im2col: Y[n] = W' · cols(X[n]) with W' the filters as a K × (C·R·S)
        // matrix and cols the (C·R·S) × (Ho·Wo) matrix of patches (one group).
        rw!("conv-im2col"; "(conv2d ?x ?w ?p ?s ?d 1)" => "(conv2d_im2col ?x ?w ?p ?s ?d)" if im2col_allowed),
        // The same product turned around, Yᵀ[n] = cols(X[n])ᵀ · W'ᵀ, vectors
        // along the filters: only for constant filters, whose transposed copy
        // W'ᵀ is then made once rather than on every call.
        rw!("conv-im2col-t"; "(conv2d ?x ?w ?p ?s ?d 1)" => "(conv2d_im2col_t ?x ?w ?p ?s ?d)"
            if is_constant("?w") if im2col_allowed),
        // The same for convolutions with a fused epilogue (after bn-fold and bias/relu fusion).
        rw!("conv3x3-winograd-bias"; "(conv2d_bias ?x ?w ?b 1 1 1 1)" => "(conv2d_winograd_f2_bias ?x ?w ?b)"
            if filter_is("?w", 3) if image_multiple_of("?x", 2) if within(WinogradForm::F2)),
        rw!("conv3x3-winograd-k-bias"; "(conv2d_bias ?x ?w ?b 1 1 1 1)" => "(conv2d_winograd_f2k_bias ?x ?w ?b)"
            if filter_is("?w", 3) if image_multiple_of("?x", 2) if within(WinogradForm::F2k)),
        rw!("conv3x3-winograd-f4-bias"; "(conv2d_bias ?x ?w ?b 1 1 1 1)" => "(conv2d_winograd_f4_bias ?x ?w ?b)"
            if filter_is("?w", 3) if image_multiple_of("?x", 4) if within(WinogradForm::F4)),
        rw!("conv3x3-winograd-bias-relu"; "(conv2d_bias_relu ?x ?w ?b 1 1 1 1)" => "(conv2d_winograd_f2_bias_relu ?x ?w ?b)"
            if filter_is("?w", 3) if image_multiple_of("?x", 2) if within(WinogradForm::F2)),
        rw!("conv3x3-winograd-k-bias-relu"; "(conv2d_bias_relu ?x ?w ?b 1 1 1 1)" => "(conv2d_winograd_f2k_bias_relu ?x ?w ?b)"
            if filter_is("?w", 3) if image_multiple_of("?x", 2) if within(WinogradForm::F2k)),
        rw!("conv3x3-winograd-f4-bias-relu"; "(conv2d_bias_relu ?x ?w ?b 1 1 1 1)" => "(conv2d_winograd_f4_bias_relu ?x ?w ?b)"
            if filter_is("?w", 3) if image_multiple_of("?x", 4) if within(WinogradForm::F4)),
    ]
}

/// Whether e-class `id` is a constant: a constant input, a number, or an
/// operator of constants (the folded filters of batch norm), looked at up
/// to three operators deep.
fn constant(g: &EGraph<SymbolLang, Shapes>, id: Id) -> bool {
    constant_within(g, id, 3)
}

/// [`constant`], looking `depth` operators deep (0: a constant input or a number).
fn constant_within(g: &EGraph<SymbolLang, Shapes>, id: Id, depth: u32) -> bool {
    g[id].nodes.iter().any(|n| {
        if n.is_leaf() {
            g.analysis.constants.contains(n.op.as_str()) || n.op.as_str().parse::<f64>().is_ok()
        } else {
            depth > 0 && n.children.iter().all(|&c| constant_within(g, c, depth - 1))
        }
    })
}

/// Whether pattern variable `var` is a constant input itself (a model's weights).
fn is_constant(var: &str) -> impl Fn(&mut EGraph<SymbolLang, Shapes>, Id, &egg::Subst) -> bool {
    let v: egg::Var = var.parse().expect("a pattern variable");
    move |g, _, subst| constant_within(g, subst[v], 0)
}

fn filter_is(var: &str, size: i64) -> impl Fn(&mut EGraph<SymbolLang, Shapes>, Id, &egg::Subst) -> bool {
    let v: egg::Var = var.parse().expect("a pattern variable");
    move |g, _, subst| matches!(&g[subst[v]].data, Info::Shape(s) if s.len() == 4 && s[2] == size && s[3] == size)
}

/// Whether Winograd `form` on input `var` (N, C, H, W) stays within `accuracy` (and is allowed by it).
fn accurate_enough(
    var: &str,
    form: WinogradForm,
    accuracy: Accuracy,
) -> impl Fn(&mut EGraph<SymbolLang, Shapes>, Id, &egg::Subst) -> bool {
    let v: egg::Var = var.parse().expect("a pattern variable");
    move |g, _, subst| {
        accuracy.approximate
            && accuracy.winograd.is_none_or(|f| f == form)
            && matches!(&g[subst[v]].data, Info::Shape(s) if s.len() == 4 && winograd_error(form.tile(), s[1]) <= accuracy.tolerance)
    }
}

fn image_multiple_of(var: &str, m: i64) -> impl Fn(&mut EGraph<SymbolLang, Shapes>, Id, &egg::Subst) -> bool {
    let v: egg::Var = var.parse().expect("a pattern variable");
    move |g, _, subst| matches!(&g[subst[v]].data, Info::Shape(s) if s.len() == 4 && s[2] % m == 0 && s[3] % m == 0 && s[2] > 0)
}

/// The result of rewriting a kernel.
pub struct Plan {
    /// The chosen term.
    pub best: RecExpr<SymbolLang>,
    /// Its cost as extraction saw it (the tuner's `winograd=2|4` makes that
    /// tile nearly free there: [`Shapes::prefer`]).
    pub best_cost: f64,
    /// Its cost by the model alone, in ns on the nominal machine.
    pub estimated_cost: f64,
    /// The cost of the graph as written.
    pub original_cost: f64,
    /// Rules that fired, in order of first use.
    pub fired: Vec<String>,
    /// The generated kernel, in `.tex`.
    pub source: String,
    /// The same with imports named as the user wrote them (for printing).
    pub display_source: String,
    pub egraph_classes: usize,
    pub egraph_nodes: usize,
    pub iterations: usize,
    /// For each operator of the chosen plan that had alternatives: its
    /// label and every alternative with its estimated cost in ns (the whole
    /// subgraph below it), cheapest first.
    pub alternatives: Vec<(String, Vec<(String, f64)>)>,
    /// `greedy` or `ilp`.
    pub extraction: &'static str,
}

impl Plan {
    /// A plan that keeps the graph as written, without running the e-graph.
    pub fn unchanged() -> Plan {
        Plan {
            best: RecExpr::default(),
            best_cost: 0.0,
            estimated_cost: 0.0,
            original_cost: 0.0,
            fired: Vec::new(),
            source: String::new(),
            display_source: String::new(),
            egraph_classes: 0,
            egraph_nodes: 0,
            iterations: 0,
            alternatives: Vec::new(),
            extraction: "none",
        }
    }
}

/// Build the term of a program's operator graph. Returns the term and, per
/// tensor, the term node that computes it.
fn graph_term(p: &Program, shapes: &mut Shapes) -> (RecExpr<SymbolLang>, HashMap<TensorId, Id>) {
    let mut e = RecExpr::default();
    let mut node_of: HashMap<TensorId, Id> = HashMap::new();
    let leaf = |e: &mut RecExpr<SymbolLang>, name: &str| e.add(SymbolLang::leaf(name));
    for t in p.input_tensors() {
        let d = p.tensor(t);
        shapes.of.insert(d.name.clone(), d.shape.clone());
        node_of.insert(t, leaf(&mut e, &d.name));
    }
    for (i, op) in p.ops.iter().enumerate() {
        let representable =
            op.std_callee && op.outputs.len() == 1 && op.args.iter().all(|a| !matches!(a, OpArg::Scalar(None)));
        // A hand-written matmul or convolution is that operator.
        let recognized = if representable { None } else { crate::recognize::recognize(p, i) };
        let call = match &recognized {
            Some((name, args)) => Some((*name, args.as_slice())),
            None => representable.then_some((op.op.as_str(), op.args.as_slice())),
        };
        let id = if let Some((name, args)) = call {
            let mut children = Vec::new();
            for a in args {
                children.push(match a {
                    OpArg::Tensor(t) => node_of[t],
                    OpArg::Const(v) => leaf(&mut e, &v.to_string()),
                    OpArg::Scalar(Some(text)) => leaf(&mut e, text),
                    OpArg::Scalar(None) => unreachable!("checked"),
                });
            }
            e.add(SymbolLang::new(name, children))
        } else {
            // Opaque: the statement itself, known by the tensor it defines.
            let sym = format!("opaque#{i}");
            let d = p.tensor(op.outputs[0]);
            shapes.of.insert(sym.clone(), d.shape.clone());
            let flops = crate::cost::cost_of_stages(p, op.stages.clone());
            let bytes: f64 = op
                .inputs
                .iter()
                .chain(&op.outputs)
                .map(|&t| p.tensor(t).len() as f64 * p.tensor(t).elem.size() as f64)
                .sum();
            shapes.opaque_cost.insert(sym.clone(), (flops, bytes));
            let children: Vec<Id> = op.inputs.iter().map(|t| node_of[t]).collect();
            e.add(SymbolLang::new(sym.as_str(), children))
        };
        for &t in &op.outputs {
            node_of.insert(t, id);
        }
    }
    let outs: Vec<Id> = p.outputs.iter().map(|t| node_of[t]).collect();
    e.add(SymbolLang::new("plan", outs));
    (e, node_of)
}

/// The cost model's estimate of `p`'s graph as written, in ns on
/// `target`'s nominal machine (uncorrected: what calibration measures).
pub fn written_cost(p: &Program, target: &Target, constants: &HashSet<String>) -> f64 {
    let mut shapes = Shapes { efficiency_of: Some(target.kind), constants: constants.clone(), ..Shapes::default() };
    let (term, _) = graph_term(p, &mut shapes);
    term_cost(&term, shapes, target.nominal.peak_gflops, target.nominal.bandwidth_gbs)
}

/// Rewrite the operator graph of `p` for `target`. `source_of` gives the
/// text of a statement (for opaque operators, copied into the new kernel);
/// `header` is the kernel's signature and imports.
pub fn rewrite(
    p: &Program,
    target: &Target,
    header: &str,
    source_of: &dyn Fn(usize) -> String,
    extraction: Extraction,
    accuracy: Accuracy,
    constants: &HashSet<String>,
    calibration: &Calibration,
) -> Plan {
    let mut shapes = Shapes {
        efficiency_of: Some(target.kind),
        constants: constants.clone(),
        prefer: accuracy.winograd,
        calibration: calibration.clone(),
        ..Shapes::default()
    };
    let (term, node_of) = graph_term(p, &mut shapes);
    let runner = Runner::<SymbolLang, Shapes>::new(shapes)
        .with_expr(&term)
        .with_iter_limit(20)
        .with_node_limit(20_000)
        .with_time_limit(Duration::from_secs(2))
        .with_scheduler(egg::BackoffScheduler::default())
        .run(&rules(accuracy));
    let (peak, bw) = (target.nominal.peak_gflops, target.nominal.bandwidth_gbs);
    let root = runner.roots[0];
    let egraph = &runner.egraph;
    let extractor = Extractor::new(egraph, RooflineCost { egraph, peak, bw });
    let (best, classes, best_cost) = match extraction {
        Extraction::Greedy => {
            let mut best = RecExpr::default();
            let mut classes = Vec::new();
            let mut memo = HashMap::new();
            extract(&extractor, egraph, root, &mut best, &mut classes, &mut memo);
            (best, classes, extractor.find_best_cost(root))
        }
        Extraction::Ilp => {
            let (best, classes) = extract_ilp(egraph, root, peak, bw);
            let cost = dag_cost(egraph, &best, peak, bw);
            (best, classes, cost)
        }
    };
    // Tensors of the original graph keep their names where the plan computes them.
    // Term ids are not e-class ids: look each term node up in the e-graph.
    let mut class_of: Vec<Id> = Vec::new();
    for node in term.as_ref() {
        let mapped = node.clone().map_children(|c| class_of[usize::from(c)]);
        class_of.push(egraph.lookup(mapped).expect("the term is in the e-graph"));
    }
    let mut names: HashMap<Id, String> = HashMap::new();
    let mut tensors: Vec<(&TensorId, &Id)> = node_of.iter().collect();
    tensors.sort();
    for (&t, &id) in tensors {
        names.entry(egraph.find(class_of[usize::from(id)])).or_insert_with(|| p.tensor(t).name.clone());
    }
    let node_names: Vec<Option<String>> = classes.iter().map(|c| names.get(c).cloned()).collect();
    // Costs without the tuner's preference (which only steers extraction).
    let unpreferred = || Shapes {
        of: egraph.analysis.of.clone(),
        opaque_cost: egraph.analysis.opaque_cost.clone(),
        efficiency_of: egraph.analysis.efficiency_of,
        constants: egraph.analysis.constants.clone(),
        prefer: None,
        calibration: egraph.analysis.calibration.clone(),
    };
    let original_cost = match extraction {
        Extraction::Greedy => term_cost(&term, unpreferred(), peak, bw),
        Extraction::Ilp => dag_cost(egraph, &term, peak, bw),
    };
    let estimated_cost =
        if egraph.analysis.prefer.is_some() { term_cost(&best, unpreferred(), peak, bw) } else { best_cost };
    let mut fired = Vec::new();
    for it in &runner.iterations {
        let mut names: Vec<String> = it.applied.keys().map(|s| s.to_string()).collect();
        names.sort();
        for n in names {
            if !fired.contains(&n) {
                fired.push(n);
            }
        }
    }
    let source = plan_source(p, &best, &node_names, header, source_of);
    let alternatives = alternatives(egraph, &extractor, &classes, &node_names, peak, bw);
    Plan {
        extraction: extraction.name(),
        alternatives,
        display_source: source.clone(),
        best,
        best_cost,
        estimated_cost,
        original_cost,
        fired,
        source,
        egraph_classes: egraph.number_of_classes(),
        egraph_nodes: egraph.total_number_of_nodes(),
        iterations: runner.iterations.len(),
    }
}

/// The e-nodes of each operator class of the chosen plan, with the cost of
/// the best plan below each, cheapest first (ties by name).
fn alternatives(
    egraph: &EGraph<SymbolLang, Shapes>,
    ex: &Extractor<RooflineCost, SymbolLang, Shapes>,
    classes: &[Id],
    names: &[Option<String>],
    peak: f64,
    bw: f64,
) -> Vec<(String, Vec<(String, f64)>)> {
    let mut cost = RooflineCost { egraph, peak, bw };
    let mut out = Vec::new();
    for (class, name) in classes.iter().zip(names) {
        let nodes = &egraph[*class].nodes;
        if nodes.len() < 2 {
            continue;
        }
        let mut alts: Vec<(String, f64)> =
            nodes.iter().map(|n| (n.op.to_string(), cost.cost(n, |c| ex.find_best_cost(c)))).collect();
        alts.sort_by(|a, b| a.1.total_cmp(&b.1).then_with(|| a.0.cmp(&b.0)));
        let label = name.clone().unwrap_or_else(|| alts[0].0.clone());
        out.push((label, alts));
    }
    out
}

/// Build the best term below e-class `class`, remembering each node's class.
fn extract(
    ex: &Extractor<RooflineCost, SymbolLang, Shapes>,
    egraph: &EGraph<SymbolLang, Shapes>,
    class: Id,
    out: &mut RecExpr<SymbolLang>,
    classes: &mut Vec<Id>,
    memo: &mut HashMap<Id, Id>,
) -> Id {
    let class = egraph.find(class);
    if let Some(&id) = memo.get(&class) {
        return id;
    }
    let node = ex.find_best_node(class).clone();
    let children: Vec<Id> = node.children.iter().map(|&c| extract(ex, egraph, c, out, classes, memo)).collect();
    let id = out.add(SymbolLang::new(node.op, children));
    classes.push(class);
    memo.insert(class, id);
    id
}

/// The cost of the term as written, with the same accounting as extraction:
/// an e-graph of the term alone has exactly one term to extract.
fn term_cost(term: &RecExpr<SymbolLang>, shapes: Shapes, peak: f64, bw: f64) -> f64 {
    let mut g = EGraph::new(shapes);
    let root = g.add_expr(term);
    g.rebuild();
    let ex = Extractor::new(&g, RooflineCost { egraph: &g, peak, bw });
    ex.find_best_cost(root)
}

/// A term as text with each subterm used more than once written once, as
/// `$n` (numbered in dependency order): printed as a tree, a graph with
/// residual connections doubles in size with every block.
fn shared_term(e: &RecExpr<SymbolLang>) -> (String, Vec<String>) {
    let nodes = e.as_ref();
    let mut uses = vec![0usize; nodes.len()];
    for n in nodes {
        for &c in n.children() {
            uses[usize::from(c)] += 1;
        }
    }
    let mut text: Vec<String> = Vec::with_capacity(nodes.len());
    let mut shared = Vec::new();
    for (i, n) in nodes.iter().enumerate() {
        let s = if n.children().is_empty() {
            n.op.to_string()
        } else {
            let args: Vec<&str> = n.children().iter().map(|&c| text[usize::from(c)].as_str()).collect();
            format!("({} {})", n.op, args.join(" "))
        };
        if uses[i] > 1 && !n.children().is_empty() {
            shared.push(s);
            text.push(format!("${}", shared.len()));
        } else {
            text.push(s);
        }
    }
    (text.pop().unwrap_or_default(), shared)
}

/// The chosen term as a `.tex` kernel: one statement per operator node.
fn plan_source(
    p: &Program,
    best: &RecExpr<SymbolLang>,
    original: &[Option<String>],
    header: &str,
    source_of: &dyn Fn(usize) -> String,
) -> String {
    let nodes = best.as_ref();
    let mut name: Vec<Option<String>> = vec![None; nodes.len()];
    let mut out = String::from(header);
    let root = nodes.len() - 1;
    // Which node produces each kernel output.
    let outputs: HashMap<usize, String> = nodes[root]
        .children
        .iter()
        .zip(&p.outputs)
        .map(|(&c, &t)| (usize::from(c), p.tensor(t).name.clone()))
        .collect();
    let mut tmp = 0;
    for (i, n) in nodes.iter().enumerate().take(root) {
        let op = n.op.as_str();
        if n.children.is_empty() {
            name[i] = Some(op.to_string());
            continue;
        }
        if let Some(k) = op.strip_prefix("opaque#") {
            let k: usize = k.parse().expect("opaque index");
            let _ = writeln!(out, "    {}", source_of(k));
            name[i] = Some(p.tensor(p.ops[k].outputs[0]).name.clone());
            continue;
        }
        let target = outputs.get(&i).cloned().or_else(|| original[i].clone()).unwrap_or_else(|| {
            tmp += 1;
            format!("_r{tmp}")
        });
        let args: Vec<String> =
            n.children.iter().map(|&c| name[usize::from(c)].clone().expect("children first")).collect();
        let _ = writeln!(out, "    {target} = {op}({});", args.join(", "));
        name[i] = Some(target);
    }
    // Outputs that are inputs or opaque results need a copy under their own name.
    for (&c, o) in &outputs {
        if name[c].as_deref() != Some(o.as_str()) {
            let _ = writeln!(out, "    {o} = {};", name[c].clone().expect("computed"));
        }
    }
    out.push_str("}\n");
    out
}

/// Deterministic report of a rewrite (`texc emit --stage egraph`).
pub fn print_plan(plan: &Plan, target: &Target, kept_original: Option<&str>) -> String {
    let (peak, bw) = (target.nominal.peak_gflops, target.nominal.bandwidth_gbs);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "egraph for {target}: plans costed by the {target} cost model (nominal machine {peak} GFLOP/s, {bw} GB/s)"
    );
    if plan.extraction == "none" {
        // `Plan::unchanged`: the e-graph never ran, so there are no figures to show.
        let why = kept_original.unwrap_or("not rewritten");
        let _ = writeln!(out, "  the e-graph did not run: {why}; the graph as written runs on {target}");
        return out;
    }
    let _ = writeln!(
        out,
        "  saturation: {} iterations, {} e-classes, {} e-nodes",
        plan.iterations, plan.egraph_classes, plan.egraph_nodes
    );
    let _ = writeln!(
        out,
        "  rules fired: {}",
        if plan.fired.is_empty() { "none".to_string() } else { plan.fired.join(", ") }
    );
    let _ = writeln!(
        out,
        "  estimated time: {:.3} µs as written, {:.3} µs chosen ({} extraction)",
        plan.original_cost / 1e3,
        plan.best_cost / 1e3,
        plan.extraction
    );
    let (root, shared) = shared_term(&plan.best);
    let _ = writeln!(out, "  chosen term: {root}");
    for (i, t) in shared.iter().enumerate() {
        let _ = writeln!(out, "    where ${} = {t}", i + 1);
    }
    if !plan.alternatives.is_empty() {
        let _ = writeln!(out, "  alternatives (estimated µs of the subgraph, cheapest first):");
        for (label, alts) in &plan.alternatives {
            let list: Vec<String> = alts.iter().take(4).map(|(op, c)| format!("{op} {:.3}", c / 1e3)).collect();
            let _ = writeln!(out, "    {label}: {}", list.join(", "));
        }
    }
    match kept_original {
        Some(why) => {
            let _ = writeln!(out, "  the graph as written is kept, and runs on {target}: {why}");
        }
        None => {
            let _ = writeln!(out, "  chosen plan (what runs on {target}):");
            for line in plan.display_source.lines() {
                let _ = writeln!(out, "    {line}");
            }
        }
    }
    out
}

/// The `import`s and signature of kernel `k`, as source text, for a
/// generated kernel that replaces it.
fn kernel_header(s: &crate::Session, k: crate::KernelRef) -> String {
    let m = s.module(k.module as usize);
    let ast = m.kernel_ast(k.index as usize);
    let mut h = String::from("import std.nn;\n");
    if let Some(path) = &m.path {
        h.push_str(&format!("import \"{}\";\n", path.display()));
    }
    let params: Vec<&str> = ast.params.iter().map(|p| s.sources.snippet(p.span)).collect();
    let outs: Vec<&str> = ast.outputs.iter().map(|o| s.sources.snippet(o.span)).collect();
    let outs = if outs.len() == 1 { outs[0].to_string() } else { format!("({})", outs.join(", ")) };
    h.push_str(&format!("kernel {}({}) -> {} {{\n", ast.name.name, params.join(", "), outs));
    h
}

/// Rewrite kernel `k` (specialized as `original`) for `target`: the plan,
/// with its source as a `.tex` kernel that replaces `k` (imports and
/// signature copied from `k`), shown with the file name the user knows.
pub fn rewrite_kernel(
    s: &crate::Session,
    k: crate::KernelRef,
    original: &Program,
    target: &Target,
    extraction: Extraction,
    accuracy: Accuracy,
    constants: &HashSet<String>,
    calibration: &Calibration,
) -> Plan {
    let header = kernel_header(s, k);
    let source_of = |i: usize| s.sources.snippet(original.ops[i].span).to_string();
    let mut plan = rewrite(original, target, &header, &source_of, extraction, accuracy, constants, calibration);
    let m = s.module(k.module as usize);
    if let Some(path) = &m.path {
        let shown = &s.sources.file(m.ast.file).name;
        plan.display_source =
            plan.source.replace(&format!("import \"{}\";", path.display()), &format!("import \"{shown}\";"));
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::{Calibration, CalibrationSample};

    /// A node takes the geometric mean of its operator's samples of a size
    /// within 4× of its estimate; others are left as the model has them.
    #[test]
    fn calibration_applies_to_nearby_sizes_of_an_operator() {
        let s = |op: &str, estimated_ns: f64, factor: f64| CalibrationSample { op: op.into(), estimated_ns, factor };
        let cal = Calibration { samples: vec![s("conv2d", 1e6, 2.0), s("conv2d", 3e6, 8.0), s("matmul", 1e6, 0.5)] };
        assert!((cal.factor("conv2d", 1.5e6) - 4.0).abs() < 1e-9, "both samples: √(2·8)");
        assert!((cal.factor("conv2d", 0.3e6) - 2.0).abs() < 1e-9, "the near one only");
        assert_eq!(cal.factor("conv2d", 1e8), 1.0, "none near");
        assert_eq!(cal.factor("conv2d_winograd_f2", 1e6), 1.0, "another operator");
        assert!((cal.factor("matmul", 1e6) - 0.5).abs() < 1e-9);
    }
}
