//! The graph side of `texc quantize`: which tensors of an ONNX model are
//! quantized, and the two models written from the calibrated parameters —
//! the standard QDQ model (QuantizeLinear/DequantizeLinear on activations,
//! int8 weight initializers and int32 biases behind DequantizeLinear, as
//! ONNX Runtime's `quantize_static` writes) and an f32 model that rounds the
//! same values with f32 operators (what texc runs to measure each layer's
//! error). The int32 bias, at scale `s_a · s_w`, is what lets an importer
//! run a Conv or Gemm whose output is quantized as one integer product
//! (texc's does: texc-onnx's `quant`); an f32 bias would keep it in f32.
//!
//! Invariants: only the inputs of quantized nodes are rewired; every name
//! added is fresh in the graph; nodes stay in topological order (each Q/DQ
//! pair is inserted just before its first consumer).

use crate::calibrate::QParams;
use std::collections::{HashMap, HashSet};
use texc_onnx::proto::{self, data_type, AttributeProto, GraphProto, NodeProto, TensorProto};

/// Operators whose inputs are quantized (ONNX Runtime's default for CNNs
/// and MLPs): products, additions of a product's output (a residual
/// connection) and max pooling, so that the product before them ends in a
/// QuantizeLinear and runs in integers (the Add itself between its
/// DequantizeLinear and QuantizeLinear; the pooling on the integers), as in
/// ONNX Runtime's QDQ models.
pub const QUANTIZED_OPS: &[&str] = &["Conv", "MatMul", "Gemm", "Add", "MaxPool"];

/// A node to quantize: its index, label and which inputs are activations
/// or weights (with the axis of a weight's output channels).
#[derive(Clone, Debug)]
pub struct Target {
    pub node: usize,
    pub label: String,
    pub activations: Vec<String>,
    pub weights: Vec<(String, usize)>,
    /// A Conv's or Gemm's constant f32 bias, one value per output channel,
    /// where input 0 is an activation and input 1 a weight.
    pub bias: Option<String>,
}

pub fn label(i: usize, n: &NodeProto) -> String {
    if n.name.is_empty() {
        format!("#{i}")
    } else {
        n.name.clone()
    }
}

/// The nodes to quantize, less `exclude` (each of which must name a node).
pub fn targets(g: &GraphProto, exclude: &[String]) -> Result<Vec<Target>, String> {
    for e in exclude {
        if !g.node.iter().enumerate().any(|(i, n)| label(i, n) == *e) {
            let names: Vec<String> = g
                .node
                .iter()
                .enumerate()
                .filter(|(_, n)| QUANTIZED_OPS.contains(&n.op_type.as_str()))
                .map(|(i, n)| label(i, n))
                .collect();
            return Err(format!(
                "--exclude {e}: the model has no node `{e}` (nodes it quantizes: {})",
                if names.is_empty() { "none".into() } else { names.join(", ") }
            ));
        }
        let (_, n) = g.node.iter().enumerate().find(|(i, n)| label(*i, n) == *e).expect("found above");
        if !QUANTIZED_OPS.contains(&n.op_type.as_str()) {
            return Err(format!(
                "--exclude {e}: node `{e}` ({}) is not quantized anyway (texc quantizes {})",
                n.op_type,
                QUANTIZED_OPS.join(", ")
            ));
        }
    }
    let mut out = Vec::new();
    for (i, n) in g.node.iter().enumerate() {
        let l = label(i, n);
        if !QUANTIZED_OPS.contains(&n.op_type.as_str())
            || exclude.contains(&l)
            || (n.op_type == "Add" && !residual(g, n))
        {
            continue;
        }
        let mut t = Target { node: i, label: l, activations: Vec::new(), weights: Vec::new(), bias: None };
        // Data inputs: Conv X, W; MatMul A, B; Gemm A, B; Add's two; MaxPool's X.
        let data = if n.op_type == "MaxPool" { 1 } else { 2 };
        for (k, name) in n.input.iter().enumerate().take(data) {
            match constant(g, name) {
                Some(w) if w.data_type == data_type::FLOAT => t.weights.push((name.clone(), channel_axis(n, k, w))),
                Some(_) => {}
                None => t.activations.push(name.clone()),
            }
        }
        t.bias = bias_of(g, n).filter(|_| t.activations == n.input[..1] && t.weights.len() == 1);
        out.push(t);
    }
    Ok(out)
}

/// Whether Add node `n` adds two computed tensors, one a product's
/// output (Conv, MatMul, Gemm): a residual connection, whose inputs are
/// float. (Other Adds — a bias, index arithmetic in a shape computation —
/// are left alone.)
fn residual(g: &GraphProto, n: &NodeProto) -> bool {
    let made_by_product = |v: &String| {
        g.node.iter().any(|m| m.output.first() == Some(v) && ["Conv", "MatMul", "Gemm"].contains(&m.op_type.as_str()))
    };
    n.input.len() == 2 && n.input.iter().all(|v| constant(g, v).is_none()) && n.input.iter().any(made_by_product)
}

/// The bias of Conv or Gemm node `n` (with `alpha` and `beta` 1) when the
/// model holds it as a vector of f32.
fn bias_of(g: &GraphProto, n: &NodeProto) -> Option<String> {
    let unit = |a: &str| n.attribute.iter().find(|x| x.name == a).is_none_or(|x| x.f == 1.0);
    let name = n.input.get(2).filter(|b| !b.is_empty())?;
    let b = constant(g, name)?;
    let takes = matches!(n.op_type.as_str(), "Conv") || (n.op_type == "Gemm" && unit("alpha") && unit("beta"));
    (takes && b.data_type == data_type::FLOAT && b.dims.len() == 1).then(|| name.clone())
}

/// The value of `name` when the model holds it: an initializer, or the
/// `value` of a `Constant` node (as some exporters write weights).
pub fn constant<'g>(g: &'g GraphProto, name: &str) -> Option<&'g TensorProto> {
    g.initializer.iter().find(|t| t.name == name).or_else(|| {
        let n = g.node.iter().find(|n| n.op_type == "Constant" && n.output.first().is_some_and(|o| o == name))?;
        n.attribute.iter().find(|a| a.name == "value").and_then(|a| a.t.as_ref())
    })
}

/// The axis of a weight's output channels: Conv's W is `[M, C, ...]`,
/// MatMul's B `[K, N]`, Gemm's B `[K, N]` or `[N, K]` with `transB`.
fn channel_axis(n: &NodeProto, k: usize, w: &TensorProto) -> usize {
    let trans_b = n.attribute.iter().find(|a| a.name == "transB").is_some_and(|a| a.i != 0);
    match (n.op_type.as_str(), k) {
        ("Conv", _) => 0,
        ("Gemm", 1) if trans_b => 0,
        _ => w.dims.len().saturating_sub(1),
    }
}

/// A weight's values, quantized: scales and int8 values per channel along
/// `axis` (`per_channel`) or one scale for the tensor.
pub struct QuantWeight {
    pub dims: Vec<i64>,
    pub axis: Option<usize>,
    pub scales: Vec<f32>,
    pub values: Vec<i8>,
}

impl QuantWeight {
    pub fn new(dims: &[i64], w: &[f32], axis: usize, per_channel: bool, reduce_range: bool) -> QuantWeight {
        let channels = if per_channel { dims[axis] as usize } else { 1 };
        let inner: usize = dims[axis + 1..].iter().product::<i64>() as usize;
        let channel_of = |i: usize| if per_channel { (i / inner) % channels } else { 0 };
        let mut abs_max = vec![0f32; channels];
        for (i, &x) in w.iter().enumerate() {
            let c = channel_of(i);
            abs_max[c] = abs_max[c].max(x.abs());
        }
        let params: Vec<QParams> = abs_max.iter().map(|&a| crate::calibrate::weight_params(a, reduce_range)).collect();
        let values = w
            .iter()
            .enumerate()
            .map(|(i, &x)| {
                let p = &params[channel_of(i)];
                ((x / p.scale).round_ties_even() as i64).clamp(p.qmin as i64, p.qmax as i64) as i8
            })
            .collect();
        QuantWeight {
            dims: dims.to_vec(),
            axis: per_channel.then_some(axis),
            scales: params.iter().map(|p| p.scale).collect(),
            values,
        }
    }

    pub fn dequantized(&self) -> Vec<f32> {
        let inner: usize = self.axis.map_or(1, |a| self.dims[a + 1..].iter().product::<i64>() as usize);
        let n = self.scales.len();
        self.values.iter().enumerate().map(|(i, &q)| q as f32 * self.scales[(i / inner) % n]).collect()
    }
}

/// A bias quantized as `quantize_static` quantizes it: int32 values at
/// scale `s_a · s_w[j]` (an f32 product), zero point 0.
pub struct QuantBias {
    pub scales: Vec<f32>,
    pub values: Vec<i32>,
}

impl QuantBias {
    /// `b` over the output channels of weight `w`, its activation at scale
    /// `sa`; `None` where the lengths differ or a value leaves i32 (the
    /// bias then stays f32).
    pub fn new(b: &[f32], sa: f32, w: &QuantWeight) -> Option<QuantBias> {
        let channels = w.axis.map_or(1, |a| w.dims[a] as usize);
        if w.axis.is_some() && b.len() != channels {
            return None;
        }
        let scales: Vec<f32> = (0..b.len()).map(|j| sa * w.scales[if w.axis.is_some() { j } else { 0 }]).collect();
        let values = b
            .iter()
            .zip(&scales)
            .map(|(&x, &s)| i32::try_from((f64::from(x) / f64::from(s)).round_ties_even() as i64).ok())
            .collect::<Option<Vec<i32>>>()?;
        Some(QuantBias { scales, values })
    }

    fn dequantized(&self) -> Vec<f32> {
        self.values.iter().zip(&self.scales).map(|(&v, &s)| v as f32 * s).collect()
    }
}

/// Fresh names in a graph.
struct Fresh(HashSet<String>);

impl Fresh {
    fn of(g: &GraphProto) -> Fresh {
        let mut s: HashSet<String> = g.node.iter().flat_map(|n| n.input.iter().chain(&n.output).cloned()).collect();
        s.extend(g.initializer.iter().map(|t| t.name.clone()));
        s.extend(g.input.iter().chain(&g.output).map(|v| v.name.clone()));
        s.extend(g.node.iter().map(|n| n.name.clone()));
        Fresh(s)
    }

    fn name(&mut self, base: String) -> String {
        let mut n = base.clone();
        let mut k = 1;
        while self.0.contains(&n) {
            n = format!("{base}_{k}");
            k += 1;
        }
        self.0.insert(n.clone());
        n
    }
}

pub fn f32_tensor(name: &str, dims: &[i64], v: &[f32]) -> TensorProto {
    let raw: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    TensorProto {
        name: name.into(),
        dims: dims.to_vec(),
        data_type: data_type::FLOAT,
        raw_data: raw.into(),
        ..Default::default()
    }
}

fn int_tensor(name: &str, dims: &[i64], v: &[i32], signed: bool) -> TensorProto {
    let raw: Vec<u8> = v.iter().map(|&x| if signed { x as i8 as u8 } else { x as u8 }).collect();
    TensorProto {
        name: name.into(),
        dims: dims.to_vec(),
        data_type: if signed { data_type::INT8 } else { data_type::UINT8 },
        raw_data: raw.into(),
        ..Default::default()
    }
}

fn i32_tensor(name: &str, dims: &[i64], v: &[i32]) -> TensorProto {
    let raw: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    TensorProto {
        name: name.into(),
        dims: dims.to_vec(),
        data_type: data_type::INT32,
        raw_data: raw.into(),
        ..Default::default()
    }
}

fn node(op: &str, name: String, inputs: Vec<String>, output: String, attrs: Vec<AttributeProto>) -> NodeProto {
    NodeProto { input: inputs, output: vec![output], name, op_type: op.into(), attribute: attrs, ..Default::default() }
}

fn int_attr(name: &str, i: i64) -> AttributeProto {
    AttributeProto { name: name.into(), r#type: proto::attribute_type::INT, i, ..Default::default() }
}

/// The two forms of the quantized model.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// QuantizeLinear/DequantizeLinear and int8 weights: the model written.
    Qdq,
    /// The same rounding in f32 operators (Div, Round, Add, Clip, Sub,
    /// Mul) and dequantized weights: what texc runs to measure the error.
    Simulated,
}

/// Rewrite `g` (a copy of the model's graph) into `form`: each target's
/// activation inputs pass through their quantization, its weights and
/// bias (`biases`, by node) are replaced by their quantized values.
pub fn rewrite(
    g: &mut GraphProto,
    targets: &[Target],
    acts: &HashMap<String, QParams>,
    weights: &HashMap<String, QuantWeight>,
    biases: &HashMap<usize, QuantBias>,
    form: Form,
) {
    let mut fresh = Fresh::of(g);
    let old = std::mem::take(&mut g.node);
    let mut replaced: HashMap<String, String> = HashMap::new();
    let by_node: HashMap<usize, &Target> = targets.iter().map(|t| (t.node, t)).collect();
    let mut new_inits = Vec::new();
    for (i, mut n) in old.into_iter().enumerate() {
        if let Some(t) = by_node.get(&i) {
            for a in &t.activations {
                if !replaced.contains_key(a) {
                    let p = &acts[a];
                    let (nodes, inits, out) = quantize_activation(&mut fresh, a, p, form);
                    g.node.extend(nodes);
                    new_inits.extend(inits);
                    replaced.insert(a.clone(), out);
                }
            }
            for (w, _) in &t.weights {
                if !replaced.contains_key(w) {
                    let (nodes, inits, out) = quantize_weight(&mut fresh, w, &weights[w], form);
                    g.node.extend(nodes);
                    new_inits.extend(inits);
                    replaced.insert(w.clone(), out);
                }
            }
            for input in n.input.iter_mut().take(2) {
                if let Some(r) = replaced.get(input) {
                    *input = r.clone();
                }
            }
            if let (Some(b), Some(name)) = (biases.get(&i), &t.bias) {
                let (nodes, inits, out) = quantize_bias(&mut fresh, name, b, form);
                g.node.extend(nodes);
                new_inits.extend(inits);
                n.input[2] = out;
            }
        }
        g.node.push(n);
    }
    // A weight or bias no node reads in f32 any more is dropped (its integer copy replaces it).
    let swapped: HashSet<&String> = weights.keys().chain(targets.iter().filter_map(|t| t.bias.as_ref())).collect();
    let read: HashSet<&String> = g.node.iter().flat_map(|n| &n.input).collect();
    let outputs: HashSet<String> = g.output.iter().map(|o| o.name.clone()).collect();
    g.initializer.retain(|t| !swapped.contains(&t.name) || read.contains(&t.name) || outputs.contains(&t.name));
    let kept: HashSet<String> = g.initializer.iter().map(|t| t.name.clone()).collect();
    // An initializer also listed as a graph input (IR < 4 style) goes with it.
    g.input.retain(|v| kept.contains(&v.name) || !swapped.contains(&v.name));
    g.initializer.extend(new_inits);
}

type Added = (Vec<NodeProto>, Vec<TensorProto>, String);

fn quantize_activation(fresh: &mut Fresh, a: &str, p: &QParams, form: Form) -> Added {
    let signed = p.qmin < 0;
    let scale = fresh.name(format!("{a}_scale"));
    let zp = fresh.name(format!("{a}_zero_point"));
    let out = fresh.name(format!("{a}_dequantized"));
    match form {
        Form::Qdq => {
            let q = fresh.name(format!("{a}_quantized"));
            let nodes = vec![
                node(
                    "QuantizeLinear",
                    fresh.name(format!("{a}_QuantizeLinear")),
                    vec![a.into(), scale.clone(), zp.clone()],
                    q.clone(),
                    vec![],
                ),
                node(
                    "DequantizeLinear",
                    fresh.name(format!("{a}_DequantizeLinear")),
                    vec![q, scale.clone(), zp.clone()],
                    out.clone(),
                    vec![],
                ),
            ];
            let inits = vec![f32_tensor(&scale, &[], &[p.scale]), int_tensor(&zp, &[], &[p.zero_point], signed)];
            (nodes, inits, out)
        }
        Form::Simulated => {
            // (clip(round(x / s) + zp, qmin, qmax) - zp) * s
            let (lo, hi) = (fresh.name(format!("{a}_qmin")), fresh.name(format!("{a}_qmax")));
            let t: Vec<String> = (0..5).map(|k| fresh.name(format!("{a}_sim{k}"))).collect();
            let mut nodes = Vec::new();
            let mut step = |op: &str, ins: Vec<String>, o: &String| {
                nodes.push(node(op, fresh.name(format!("{a}_{op}")), ins, o.clone(), vec![]));
            };
            step("Div", vec![a.into(), scale.clone()], &t[0]);
            step("Round", vec![t[0].clone()], &t[1]);
            step("Add", vec![t[1].clone(), zp.clone()], &t[2]);
            step("Clip", vec![t[2].clone(), lo.clone(), hi.clone()], &t[3]);
            step("Sub", vec![t[3].clone(), zp.clone()], &t[4]);
            step("Mul", vec![t[4].clone(), scale.clone()], &out);
            // QuantizeLinear saturates to its type's whole range (-128 for
            // i8 too, though symmetric scales are computed for [-127, 127]).
            let (tmin, tmax) = if signed { (-128.0, 127.0) } else { (0.0, 255.0) };
            let inits = vec![
                f32_tensor(&scale, &[], &[p.scale]),
                f32_tensor(&zp, &[], &[p.zero_point as f32]),
                f32_tensor(&lo, &[], &[tmin]),
                f32_tensor(&hi, &[], &[tmax]),
            ];
            (nodes, inits, out)
        }
    }
}

fn quantize_bias(fresh: &mut Fresh, b: &str, q: &QuantBias, form: Form) -> Added {
    let out = fresh.name(format!("{b}_dequantized"));
    let n = q.values.len() as i64;
    if form == Form::Simulated {
        return (vec![], vec![f32_tensor(&out, &[n], &q.dequantized())], out);
    }
    let (qn, scale, zp) =
        (fresh.name(format!("{b}_quantized")), fresh.name(format!("{b}_scale")), fresh.name(format!("{b}_zero_point")));
    // One scale where all channels share it (per-tensor weights: opset 11 has no per-axis DequantizeLinear).
    let shared = q.scales.iter().all(|&s| s == q.scales[0]);
    let (sdims, scales): (Vec<i64>, &[f32]) = if shared { (vec![], &q.scales[..1]) } else { (vec![n], &q.scales) };
    let inits = vec![
        i32_tensor(&qn, &[n], &q.values),
        f32_tensor(&scale, &sdims, scales),
        i32_tensor(&zp, &sdims, &vec![0; scales.len()]),
    ];
    let attrs = if shared { vec![] } else { vec![int_attr("axis", 0)] };
    let dq =
        node("DequantizeLinear", fresh.name(format!("{b}_DequantizeLinear")), vec![qn, scale, zp], out.clone(), attrs);
    (vec![dq], inits, out)
}

fn quantize_weight(fresh: &mut Fresh, w: &str, q: &QuantWeight, form: Form) -> Added {
    match form {
        Form::Simulated => {
            let out = fresh.name(format!("{w}_dequantized"));
            (vec![], vec![f32_tensor(&out, &q.dims, &q.dequantized())], out)
        }
        Form::Qdq => {
            let qn = fresh.name(format!("{w}_quantized"));
            let scale = fresh.name(format!("{w}_scale"));
            let zp = fresh.name(format!("{w}_zero_point"));
            let out = fresh.name(format!("{w}_dequantized"));
            let sdims: Vec<i64> = if q.axis.is_some() { vec![q.scales.len() as i64] } else { vec![] };
            let values: Vec<i32> = q.values.iter().map(|&v| v as i32).collect();
            let inits = vec![
                int_tensor(&qn, &q.dims, &values, true),
                f32_tensor(&scale, &sdims, &q.scales),
                int_tensor(&zp, &sdims, &vec![0; q.scales.len()], true),
            ];
            let attrs = q.axis.map(|a| vec![int_attr("axis", a as i64)]).unwrap_or_default();
            let dq = node(
                "DequantizeLinear",
                fresh.name(format!("{w}_DequantizeLinear")),
                vec![qn, scale, zp],
                out.clone(),
                attrs,
            );
            (vec![dq], inits, out)
        }
    }
}
