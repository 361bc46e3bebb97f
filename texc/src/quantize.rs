//! `texc quantize model.onnx --calibrate DATA -o model.int8.onnx`: static
//! INT8 quantization by calibration. The calibration data stream through
//! the model compiled once for this CPU (the model, with the tensors to
//! calibrate made extra graph outputs, imported like any `.onnx` file);
//! each tensor keeps a min/max and, for `entropy` and `percentile`, a
//! 2048-bin histogram of |x| filled in a second pass once the range is
//! known. The QDQ model is written with ONNX's own encoding (prost), and
//! the report compares an f32 model that rounds exactly as the QDQ model
//! does with the f32 model, layer by layer, on the calibration data.
//!
//! Memory: one batch's values at a time, plus the histograms.

use crate::args::QuantizeArgs;
use crate::calibrate::{self, Histogram, Method, MinMax, QParams};
use crate::qdq::{self, Form, QuantBias, QuantWeight};
use prost::Message;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use texc_compiler::Bindings;
use texc_grammar::Diagnostic;
use texc_onnx::proto::{self, data_type, DimensionValue, ModelProto, TypeProto, TypeProtoTensor, ValueInfoProto};
use texc_onnx::Role;
use texc_pipeline::{Error, Options, Pipeline};
use texc_runtime::{DType, Data, Tensor};

fn input_error(m: impl Into<String>) -> Error {
    Error::Input(vec![Diagnostic::error(m.into())])
}

pub fn quantize(a: &QuantizeArgs) -> Result<(), Error> {
    let method = Method::parse(&a.method).map_err(Error::Usage)?;
    if a.output.extension().is_none_or(|e| e != "onnx") {
        return Err(Error::Usage(format!("-o {}: expected an .onnx file to write", a.output.display())));
    }
    let shown = a.model.display().to_string();
    let bytes = std::fs::read(&a.model).map_err(|e| input_error(format!("cannot read {shown}: {e}")))?;
    let mut model =
        ModelProto::decode(&bytes[..]).map_err(|e| input_error(format!("{shown}: not a valid ONNX model: {e}")))?;
    drop(bytes);
    let base = a.model.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    texc_onnx::inline_external_data(&mut model, base).map_err(|e| input_error(format!("{shown}: {e}")))?;
    let g = model.graph.as_ref().ok_or_else(|| input_error(format!("{shown}: the model has no graph")))?;
    let opset =
        model.opset_import.iter().find(|o| o.domain.is_empty() || o.domain == "ai.onnx").map_or(0, |o| o.version);
    if opset < 11 || (a.per_channel && opset < 13) {
        let need = if a.per_channel { "13 (per-axis DequantizeLinear)" } else { "11" };
        return Err(input_error(format!("{shown}: opset {opset}: quantizing needs opset {need} or later")));
    }
    let targets = qdq::targets(g, &a.exclude).map_err(input_error)?;
    if targets.is_empty() {
        return Err(input_error(format!("{shown}: no node to quantize (Conv, MatMul or Gemm with float inputs)")));
    }
    let inputs = graph_inputs(&model);
    let batches = Batches::open(&a.calibrate, &inputs)?;
    let scratch = Scratch::new()?;

    // The tensors to calibrate (activation inputs of quantized nodes) and
    // to compare (each quantized node's output), in graph order.
    let mut calibrated: Vec<String> = Vec::new();
    for t in &targets {
        for x in &t.activations {
            if !calibrated.contains(x) {
                calibrated.push(x.clone());
            }
        }
    }
    let layer_outputs: Vec<(String, String)> =
        targets.iter().map(|t| (t.label.clone(), g.node[t.node].output[0].clone())).collect();
    let graph_outputs: Vec<String> = g.output.iter().map(|o| o.name.clone()).collect();

    // Pass 1: ranges.
    let mut watched: Vec<String> = calibrated.clone();
    let f32_model = Runner::new(&scratch.write("f32.onnx", &with_outputs(&model, &watched))?, &batches.dims)?;
    let mut mm: HashMap<String, MinMax> = HashMap::new();
    for_each_batch(&batches, "calibrating: ranges", |batch| {
        let values = f32_model.run(batch)?;
        for name in &watched {
            mm.entry(name.clone()).or_default().add(f32s(&values[name]));
        }
        Ok(())
    })?;
    // Pass 2: histograms of |x| over each tensor's range.
    let mut hists: HashMap<String, Histogram> = HashMap::new();
    if method.needs_histogram() {
        for name in &watched {
            hists.insert(name.clone(), Histogram::new(mm[name].abs_max()));
        }
        for_each_batch(&batches, "calibrating: histograms", |batch| {
            let values = f32_model.run(batch)?;
            for name in &watched {
                hists.get_mut(name).expect("made above").add(f32s(&values[name]));
            }
            Ok(())
        })?;
    }
    let mut acts: HashMap<String, QParams> = HashMap::new();
    let mut ranges = Vec::new();
    for name in &calibrated {
        let seen = &mm[name];
        if !(seen.min.is_finite() && seen.max.is_finite()) {
            return Err(input_error(format!(
                "tensor `{name}` takes values in [{}, {}] on the calibration data: it cannot be quantized",
                seen.min, seen.max
            )));
        }
        let (lo, hi) = calibrate::range(method, seen, hists.get(name));
        let p = calibrate::activation_params(lo, hi, a.symmetric);
        ranges.push((name.clone(), mm[name], (lo, hi), p));
        acts.insert(name.clone(), p);
    }
    let mut weights: HashMap<String, QuantWeight> = HashMap::new();
    for t in &targets {
        for (w, axis) in &t.weights {
            if weights.contains_key(w) {
                continue;
            }
            let init = qdq::constant(g, w).expect("targets found it");
            let values = weight_values(init).map_err(|e| input_error(format!("{shown}: weight `{w}`: {e}")))?;
            weights.insert(w.clone(), QuantWeight::new(&init.dims, &values, *axis, a.per_channel, a.reduce_range));
        }
    }

    let mut biases: HashMap<usize, QuantBias> = HashMap::new();
    for t in &targets {
        let Some(b) = &t.bias else { continue };
        let init = qdq::constant(g, b).expect("targets found it");
        let values = weight_values(init).map_err(|e| input_error(format!("{shown}: bias `{b}`: {e}")))?;
        if let Some(q) = QuantBias::new(&values, acts[&t.activations[0]].scale, &weights[&t.weights[0].0]) {
            biases.insert(t.node, q);
        }
    }

    // The QDQ model.
    let mut out = model.clone();
    let og = out.graph.as_mut().expect("checked");
    qdq::rewrite(og, &targets, &acts, &weights, &biases, Form::Qdq);
    out.producer_name = "texc quantize".into();
    write_model(&a.output, out, PROTOBUF_LIMIT).map_err(input_error)?;

    drop(f32_model);

    // Pass 3: the error of each layer and of the outputs.
    let mut sim = model.clone();
    qdq::rewrite(sim.graph.as_mut().expect("checked"), &targets, &acts, &weights, &biases, Form::Simulated);
    watched = layer_outputs.iter().map(|(_, o)| o.clone()).collect();
    let f32_model = Runner::new(&scratch.write("f32-layers.onnx", &with_outputs(&model, &watched))?, &batches.dims)?;
    let sim_model = Runner::new(&scratch.write("simulated.onnx", &with_outputs(&sim, &watched))?, &batches.dims)?;
    let mut noise: HashMap<String, (f64, f64, f64)> = HashMap::new(); // signal², noise², max |Δ|
    for_each_batch(&batches, "measuring the quantization error", |batch| {
        let want = f32_model.run(batch)?;
        let got = sim_model.run(batch)?;
        for name in watched.iter().chain(&graph_outputs) {
            let e = noise.entry(name.clone()).or_default();
            for (&x, &y) in f32s(&want[name]).iter().zip(f32s(&got[name])) {
                e.0 += (x as f64).powi(2);
                e.1 += (x as f64 - y as f64).powi(2);
                e.2 = e.2.max((x as f64 - y as f64).abs());
            }
        }
        Ok(())
    })?;
    print_report(a, method, &ranges, &weights, &layer_outputs, &graph_outputs, &noise, batches.len());
    Ok(())
}

/// Signal-to-quantization-noise ratio in dB (∞ when exact).
fn sqnr(signal: f64, noise: f64) -> f64 {
    if noise == 0.0 {
        f64::INFINITY
    } else {
        10.0 * (signal / noise).log10()
    }
}

#[allow(clippy::too_many_arguments)]
fn print_report(
    a: &QuantizeArgs,
    method: Method,
    ranges: &[(String, MinMax, (f32, f32), QParams)],
    weights: &HashMap<String, QuantWeight>,
    layers: &[(String, String)],
    outputs: &[String],
    noise: &HashMap<String, (f64, f64, f64)>,
    batches: usize,
) {
    let act = if a.symmetric { "i8 symmetric" } else { "u8 asymmetric" };
    let w = match (a.per_channel, a.reduce_range) {
        (true, false) => "i8 per channel",
        (false, false) => "i8 per tensor",
        (true, true) => "i8 in 7 bits per channel",
        (false, true) => "i8 in 7 bits per tensor",
    };
    println!(
        "quantized {} → {} ({} layers; activations {act}, weights {w}; method {method}; {batches} batches)",
        a.model.display(),
        a.output.display(),
        layers.len()
    );
    println!("activation ranges (seen → kept; scale, zero point):");
    for (name, mm, (lo, hi), p) in ranges {
        println!(
            "  {name:<24} [{:>10.4}, {:>10.4}] → [{lo:>10.4}, {hi:>10.4}]  scale {:.6e}  zero point {}",
            mm.min, mm.max, p.scale, p.zero_point
        );
    }
    let mut ws: Vec<(&String, &QuantWeight)> = weights.iter().collect();
    ws.sort_by_key(|(n, _)| n.as_str());
    println!("weights (scale; min–max over channels):");
    for (name, q) in ws {
        let (lo, hi) = q.scales.iter().fold((f32::INFINITY, 0f32), |(l, h), &s| (l.min(s), h.max(s)));
        println!("  {name:<24} {:?}  scale {lo:.6e}–{hi:.6e} ({} scales)", q.dims, q.scales.len());
    }
    println!("layer SQNR against f32 (dB, higher is better; errors accumulate through the graph):");
    let mut rows: Vec<(String, f64)> = Vec::new();
    for (label, out) in layers {
        let (s, n, _) = noise[out];
        let db = sqnr(s, n);
        println!("  {label:<24} {db:>7.2}");
        rows.push((label.clone(), db));
    }
    for o in outputs {
        let (s, n, m) = noise[o];
        println!(
            "output `{o}`: SQNR {:.2} dB, relative error {:.3e} (‖Δ‖/‖f32‖), max |Δ| {m:.3e}",
            sqnr(s, n),
            (n / s.max(f64::MIN_POSITIVE)).sqrt()
        );
    }
    rows.sort_by(|x, y| x.1.total_cmp(&y.1));
    let worst: Vec<String> = rows.iter().take(3).map(|(l, db)| format!("{l} ({db:.1} dB)")).collect();
    println!("layers that lose most: {}", worst.join(", "));
}

/// The model's graph inputs (not initializers), with their element type
/// and dimensions (`None` for a symbolic one, with its name).
#[derive(Clone)]
pub struct Input {
    name: String,
    elem: i32,
    dims: Vec<Result<i64, String>>,
}

fn graph_inputs(m: &ModelProto) -> Vec<Input> {
    let g = m.graph.as_ref().expect("checked");
    g.input
        .iter()
        .filter(|v| !g.initializer.iter().any(|t| t.name == v.name))
        .map(|v| {
            let t = v.r#type.as_ref().and_then(|t| t.tensor_type.as_ref());
            let dims = t
                .and_then(|t| t.shape.as_ref())
                .map(|s| {
                    s.dim
                        .iter()
                        .map(|d| match &d.value {
                            Some(DimensionValue::DimValue(v)) => Ok(*v),
                            Some(DimensionValue::DimParam(p)) => Err(p.clone()),
                            None => Err(String::new()),
                        })
                        .collect()
                })
                .unwrap_or_default();
            Input { name: v.name.clone(), elem: t.map_or(0, |t| t.elem_type), dims }
        })
        .collect()
}

/// The calibration data: batches read one at a time.
struct Batches {
    /// `.npz`: each batch's arrays (an archive is read whole); directory:
    /// each batch's files.
    source: Source,
    /// Sizes of symbolic dimensions, from the first batch.
    dims: Vec<(String, i64)>,
    inputs: Vec<Input>,
}

enum Source {
    Arrays(Vec<HashMap<String, Tensor>>),
    Files(Vec<Vec<(String, PathBuf)>>),
}

impl Batches {
    /// `.npz`: an array per model input, of the input's shape (one batch)
    /// or with a leading axis of batches. Directory: each `.npy` file is a
    /// batch of a one-input model; each subdirectory, a batch of
    /// `INPUT.npy` files.
    fn open(path: &Path, inputs: &[Input]) -> Result<Batches, Error> {
        let shown = path.display().to_string();
        let source = if path.is_dir() {
            Source::Files(dir_batches(path, inputs)?)
        } else {
            let arrays = texc_runtime::read_npz_limited(path, u64::MAX)
                .map_err(|e| input_error(format!("--calibrate {shown}: {e}")))?;
            Source::Arrays(npz_batches(&shown, arrays, inputs)?)
        };
        let mut b = Batches { source, dims: Vec::new(), inputs: inputs.to_vec() };
        if b.len() == 0 {
            return Err(input_error(format!("--calibrate {shown}: no calibration data (no batches)")));
        }
        let first = b.read(0)?;
        for i in inputs {
            for (d, v) in i.dims.iter().zip(&first[&i.name].shape) {
                if let Err(p) = d {
                    if !p.is_empty() && !b.dims.iter().any(|(n, _)| n == p) {
                        b.dims.push((p.clone(), *v as i64));
                    }
                }
            }
        }
        b.check(&shown, inputs)?;
        Ok(b)
    }

    fn len(&self) -> usize {
        match &self.source {
            Source::Arrays(v) => v.len(),
            Source::Files(v) => v.len(),
        }
    }

    fn get(&self, k: usize) -> Result<HashMap<String, Tensor>, Error> {
        let batch = self.read(k)?;
        for i in &self.inputs {
            check_input(i, &batch[&i.name], &self.dims)
                .map_err(|e| input_error(format!("--calibrate: batch {k}: {e}")))?;
        }
        Ok(batch)
    }

    fn read(&self, k: usize) -> Result<HashMap<String, Tensor>, Error> {
        let batch = match &self.source {
            Source::Arrays(v) => v[k].clone(),
            Source::Files(v) => {
                let mut m = HashMap::new();
                for (name, p) in &v[k] {
                    let t = texc_runtime::read_npy(p).map_err(|e| input_error(format!("--calibrate: {e}")))?;
                    m.insert(name.clone(), t);
                }
                m
            }
        };
        Ok(batch)
    }

    /// Every batch of an archive is checked before calibration starts (its
    /// arrays are in memory); a directory's files are checked as they are read.
    fn check(&self, shown: &str, inputs: &[Input]) -> Result<(), Error> {
        if let Source::Arrays(v) = &self.source {
            for (k, batch) in v.iter().enumerate() {
                for i in inputs {
                    check_input(i, &batch[&i.name], &self.dims)
                        .map_err(|e| input_error(format!("--calibrate {shown}: batch {k}: {e}")))?;
                }
            }
        }
        Ok(())
    }
}

fn check_input(i: &Input, t: &Tensor, dims: &[(String, i64)]) -> Result<(), String> {
    let want_dtype = match i.elem {
        data_type::FLOAT => DType::F32,
        data_type::INT64 => DType::I64,
        data_type::INT32 => DType::I32,
        data_type::BOOL => DType::Bool,
        e => return Err(format!("input `{}` has element type {}", i.name, data_type::name(e))),
    };
    if let Data::F32(v) = &t.data {
        if let Some(x) = v.iter().find(|x| !x.is_finite()) {
            return Err(format!("input `{}` holds {x}: calibration data must be finite", i.name));
        }
    }
    if t.dtype() != want_dtype {
        return Err(format!("input `{}` is {:?} here; the model takes {:?}", i.name, t.dtype(), want_dtype));
    }
    let want: Vec<i64> = i
        .dims
        .iter()
        .zip(&t.shape)
        .map(|(d, &v)| match d {
            Ok(n) => *n,
            Err(p) => dims.iter().find(|(n, _)| n == p).map_or(v as i64, |(_, s)| *s),
        })
        .collect();
    let got: Vec<i64> = t.shape.iter().map(|&d| d as i64).collect();
    if want.len() != i.dims.len() || got != want {
        let shown: Vec<String> = i.dims.iter().map(|d| d.clone().map_or_else(|p| p, |n| n.to_string())).collect();
        return Err(format!("input `{}` has shape {:?}; the model takes [{}]", i.name, t.shape, shown.join(", ")));
    }
    Ok(())
}

fn npz_batches(
    shown: &str,
    arrays: Vec<(String, Tensor)>,
    inputs: &[Input],
) -> Result<Vec<HashMap<String, Tensor>>, Error> {
    let mut per_input: Vec<Vec<Tensor>> = Vec::new();
    for i in inputs {
        let Some((_, t)) = arrays.iter().find(|(n, _)| *n == i.name) else {
            let held: Vec<&str> = arrays.iter().map(|(n, _)| n.as_str()).collect();
            return Err(input_error(format!(
                "--calibrate {shown}: no array for the model's input `{}` (it holds: {})",
                i.name,
                if held.is_empty() { "nothing".into() } else { held.join(", ") }
            )));
        };
        // One more axis than the input: a stack of batches.
        let split = if t.shape.len() == i.dims.len() + 1 { unstack(t) } else { vec![t.clone()] };
        per_input.push(split);
    }
    let n = per_input.iter().map(Vec::len).min().unwrap_or(0);
    if per_input.iter().any(|v| v.len() != n) {
        return Err(input_error(format!("--calibrate {shown}: the inputs hold different numbers of batches")));
    }
    Ok((0..n).map(|k| inputs.iter().zip(&per_input).map(|(i, v)| (i.name.clone(), v[k].clone())).collect()).collect())
}

/// The slices of `t` along its first axis.
fn unstack(t: &Tensor) -> Vec<Tensor> {
    let n = t.shape[0];
    let inner: usize = t.shape[1..].iter().product();
    let values = t.to_f64();
    (0..n).map(|k| Tensor::from_f64(t.dtype(), t.shape[1..].to_vec(), &values[k * inner..(k + 1) * inner])).collect()
}

fn dir_batches(dir: &Path, inputs: &[Input]) -> Result<Vec<Vec<(String, PathBuf)>>, Error> {
    let shown = dir.display().to_string();
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| input_error(format!("--calibrate {shown}: {e}")))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    let mut out = Vec::new();
    for p in entries {
        if p.is_dir() {
            let mut batch = Vec::new();
            for i in inputs {
                let f = p.join(format!("{}.npy", i.name));
                if !f.is_file() {
                    return Err(input_error(format!(
                        "--calibrate {shown}: batch {} has no {}.npy for the model's input `{}`",
                        p.display(),
                        i.name,
                        i.name
                    )));
                }
                batch.push((i.name.clone(), f));
            }
            out.push(batch);
        } else if p.extension().is_some_and(|e| e == "npy") {
            if inputs.len() != 1 {
                return Err(input_error(format!(
                    "--calibrate {shown}: the model has {} inputs; give each batch as a subdirectory of INPUT.npy files",
                    inputs.len()
                )));
            }
            out.push(vec![(inputs[0].name.clone(), p)]);
        }
    }
    Ok(out)
}

fn for_each_batch(
    b: &Batches,
    what: &str,
    mut body: impl FnMut(&HashMap<String, Tensor>) -> Result<(), Error>,
) -> Result<(), Error> {
    let bar = indicatif::ProgressBar::with_draw_target(Some(b.len() as u64), indicatif::ProgressDrawTarget::stderr());
    if !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    bar.set_message(what.to_string());
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} batches ({eta})")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    for k in 0..b.len() {
        let batch = b.get(k)?;
        body(&batch)?;
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(())
}

fn f32s(t: &Tensor) -> &[f32] {
    match &t.data {
        Data::F32(v) => v,
        _ => &[],
    }
}

/// Protocol Buffers encode no message over 2 GiB: ONNX's checker and ONNX
/// Runtime refuse a larger model file.
const PROTOBUF_LIMIT: usize = i32::MAX as usize;

/// Initializers smaller than this stay in the model when the rest go to
/// external data (as `onnx.save_model`'s `size_threshold`).
const EXTERNAL_MIN_BYTES: usize = 1024;

/// Write `m` to `path`: whole when it encodes within `limit` bytes, else
/// with each initializer of raw data of at least [`EXTERNAL_MIN_BYTES`]
/// moved to the file `<name>.data` beside it (ONNX's external data, as
/// `onnx.save_model(..., save_as_external_data=True)` writes it; offsets
/// 64-byte aligned), so that a model over Protocol Buffers' limit still
/// writes and loads.
fn write_model(path: &Path, mut m: ModelProto, limit: usize) -> Result<(), String> {
    let write = |at: &Path, bytes: &[u8]| {
        texc_runtime::atomic::write_with(at, |f| std::io::Write::write_all(f, bytes))
            .map_err(|e| format!("cannot write {}: {e}", at.display()))
    };
    if m.encoded_len() <= limit {
        return write(path, &m.encode_to_vec());
    }
    let file_name = path.file_name().ok_or_else(|| format!("cannot write {}: not a file name", path.display()))?;
    let location = format!("{}.data", file_name.to_string_lossy());
    let mut data: Vec<u8> = Vec::new();
    for t in &mut m.graph.as_mut().expect("checked").initializer {
        if t.raw_data.len() < EXTERNAL_MIN_BYTES {
            continue;
        }
        data.resize(data.len().next_multiple_of(64), 0);
        let entry = |key: &str, value: String| proto::StringStringEntryProto { key: key.into(), value };
        t.external_data = vec![
            entry("location", location.clone()),
            entry("offset", data.len().to_string()),
            entry("length", t.raw_data.len().to_string()),
        ];
        t.data_location = 1;
        data.extend_from_slice(&std::mem::take(&mut t.raw_data));
    }
    if m.encoded_len() > limit {
        return Err(format!(
            "cannot write {}: {} bytes without its weights, over Protocol Buffers' 2 GiB",
            path.display(),
            m.encoded_len()
        ));
    }
    write(&path.with_file_name(&location), &data)?;
    write(path, &m.encode_to_vec())
}

/// A weight initializer's f32 values (raw or `float_data`).
fn weight_values(t: &proto::TensorProto) -> Result<Vec<f32>, String> {
    if !t.raw_data.is_empty() {
        return Ok(t.raw_data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect());
    }
    Ok(t.float_data.clone())
}

/// `m` with `names` added to its graph outputs (those not already there,
/// and not graph inputs, whose values the batch gives).
fn with_outputs(m: &ModelProto, names: &[String]) -> ModelProto {
    let mut m = m.clone();
    let g = m.graph.as_mut().expect("checked");
    for n in names {
        if g.output.iter().any(|o| &o.name == n) || g.input.iter().any(|i| &i.name == n) {
            continue;
        }
        let t = TypeProtoTensor { elem_type: data_type::FLOAT, shape: None };
        g.output.push(ValueInfoProto { name: n.clone(), r#type: Some(TypeProto { tensor_type: Some(t) }) });
    }
    m
}

/// Model files written for the interpreter runs, removed at the end.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Result<Scratch, Error> {
        let d = std::env::temp_dir().join(format!("texc-quantize-{}", std::process::id()));
        std::fs::create_dir_all(&d).map_err(|e| input_error(format!("cannot create {}: {e}", d.display())))?;
        Ok(Scratch(d))
    }

    fn write(&self, name: &str, m: &ModelProto) -> Result<PathBuf, Error> {
        let p = self.0.join(name);
        std::fs::write(&p, m.encode_to_vec()).map_err(|e| input_error(format!("cannot write {}: {e}", p.display())))?;
        Ok(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A model compiled once for this CPU (`host`), run on every batch: the
/// interpreter took 6–7 s per run of a ResNet-18 at 64×64, and calibration
/// makes three or four runs per batch.
struct Runner {
    pl: Pipeline,
    compiled: texc_codegen::Compiled,
    /// The compiled code's parameters, in order.
    params: Vec<String>,
    /// Values of the parameters that are not graph inputs: the weights and
    /// the constants folded from them.
    fixed: HashMap<String, Tensor>,
    /// Each graph input's ONNX name by the parameter it is.
    inputs: HashMap<String, String>,
    /// The graph outputs' ONNX names, in the order the code returns them.
    outputs: Vec<String>,
}

impl Runner {
    fn new(path: &Path, dims: &[(String, i64)]) -> Result<Runner, Error> {
        let mut o = Options::new(texc_pipeline::target("host")?);
        o.model_dims = dims.to_vec();
        // The graph as written: the e-graph's plans (Winograd's) would round otherwise.
        o.rewrite = false;
        let mut pl = Pipeline::new(o);
        let built = (|| {
            let m = pl.load(path)?;
            let k = pl.kernel(m, None)?;
            let (built, loops) = pl.build(k, &Bindings::default())?;
            let compiled = pl.compile(&loops.legal)?;
            let params = loops.legal.p.param_names();
            let mut fixed = pl.model_constants()?;
            fixed.retain(|n, _| params.contains(n));
            Ok::<_, Error>((built.written, compiled, params, fixed))
        })();
        let (written, compiled, params, fixed) = built.map_err(|e| render(&pl, e))?;
        let inputs = pl
            .model_names()
            .iter()
            .filter(|n| n.role == Role::Input)
            .map(|n| (n.ident.clone(), n.onnx.clone()))
            .collect();
        let outputs =
            written.outputs.iter().map(|&t| pl.model_output_name(&written.tensor(t).name).to_string()).collect();
        Ok(Runner { pl, compiled, params, fixed, inputs, outputs })
    }

    /// Every graph output (and every input, as given) by ONNX name.
    fn run(&self, batch: &HashMap<String, Tensor>) -> Result<HashMap<String, Tensor>, Error> {
        let args = self
            .params
            .iter()
            .map(|n| {
                let given = self.inputs.get(n).and_then(|onnx| batch.get(onnx));
                match given.or_else(|| self.fixed.get(n)) {
                    Some(t) => Ok(texc_compiler::interp::Arg::Tensor(t.clone())),
                    None => Err(input_error(format!("no value for `{n}` of the calibrated model"))),
                }
            })
            .collect::<Result<Vec<_>, Error>>()?;
        let results = self.compiled.run(args).map_err(|e| render(&self.pl, Diagnostic::error(e.to_string()).into()))?;
        let mut out: HashMap<String, Tensor> = self.outputs.iter().cloned().zip(results).collect();
        for (n, t) in batch {
            out.insert(n.clone(), t.clone());
        }
        Ok(out)
    }
}

/// An error of a run, its diagnostics rendered with the pipeline's sources
/// (whose spans the caller's renderer cannot resolve) into the message of
/// one without spans, which the caller prints after its own `error: `.
fn render(pl: &Pipeline, e: Error) -> Error {
    match e {
        Error::Input(d) => {
            let shown = pl.render(&d);
            input_error(shown.strip_prefix("error: ").unwrap_or(&shown).trim_end())
        }
        u => u,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use texc_onnx::proto::GraphProto;

    fn model() -> ModelProto {
        let big: Vec<f32> = (0..600).map(|k| k as f32 * 0.25).collect();
        let small = [1.0f32, -2.0, 3.0];
        let graph = GraphProto {
            name: "g".into(),
            initializer: vec![qdq::f32_tensor("w", &[20, 30], &big), qdq::f32_tensor("b", &[3], &small)],
            ..Default::default()
        };
        ModelProto { ir_version: 8, graph: Some(graph), ..Default::default() }
    }

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("texc-write-model-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("dir");
        d
    }

    /// Over the limit, the large weight goes to `<name>.data` and the small
    /// one stays; reading the data back gives the model as it was.
    #[test]
    fn a_model_over_the_limit_is_written_with_its_weights_beside_it() {
        let d = scratch("over");
        let m = model();
        let path = d.join("q.onnx");
        write_model(&path, m.clone(), m.encoded_len() - 1).expect("writes");
        let mut back = ModelProto::decode(&std::fs::read(&path).expect("model")[..]).expect("decodes");
        let inits = &back.graph.as_ref().expect("graph").initializer;
        assert_eq!((inits[0].data_location, inits[1].data_location), (1, 0));
        assert_eq!(std::fs::metadata(d.join("q.onnx.data")).expect("data").len(), 2400);
        texc_onnx::inline_external_data(&mut back, &d).expect("reads back");
        assert_eq!(back, m);

        write_model(&path, m.clone(), m.encoded_len()).expect("writes");
        let whole = ModelProto::decode(&std::fs::read(&path).expect("model")[..]).expect("decodes");
        assert_eq!(whole, m);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_model_over_the_limit_without_its_weights_is_a_clear_error() {
        let d = scratch("error");
        let e = write_model(&d.join("q.onnx"), model(), 10).expect_err("over");
        assert!(e.ends_with("bytes without its weights, over Protocol Buffers' 2 GiB"), "{e}");
        assert!(!d.join("q.onnx").exists() && !d.join("q.onnx.data").exists());
        let _ = std::fs::remove_dir_all(&d);
    }
}
