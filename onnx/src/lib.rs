//! ONNX import: an ONNX model becomes one `.tex` kernel, one statement per
//! node, that calls `std.nn` where it has the operator and writes the
//! operator's index expression where it does not (broadcasting arithmetic,
//! reshapes, concatenation, reductions over an axis). The model's initializers
//! become the kernel's tensor parameters, in the order the graph first uses
//! them, and their values come back beside the text (`Imported::weights`) for
//! an `.npz` archive.
//!
//! Invariants:
//! - every shape is concrete: symbolic input dimensions must be given sizes
//!   (`Options::dims`), and the importer infers every value's shape itself,
//!   checking each node's operands as the ONNX operator defines them;
//! - anything the importer does not translate exactly (an operator, an
//!   attribute, a value of an attribute, an element type) is an error that
//!   names the node and what is missing; nothing is ignored, so a model is
//!   either imported with its meaning or refused;
//! - the output is deterministic: the same model and options give the same
//!   bytes.

mod attrs;
mod fold;
mod names;
mod ops;
pub mod proto;
mod quant;
mod rnn;
#[cfg(test)]
mod tests;

use names::Names;
use prost::Message;
use proto::{data_type, DimensionValue};
use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::path::Path;
use texc_runtime::{Data, Tensor};

#[derive(Debug, thiserror::Error)]
pub enum OnnxError {
    /// The caller names the file.
    #[error("cannot read the model: {source}")]
    Read { source: std::io::Error },
    #[error("not a valid ONNX model: {0}")]
    Decode(String),
    /// A property of the whole model (opset, inputs, outputs, initializers).
    #[error("{0}")]
    Model(String),
    #[error("node `{node}` ({op}): {reason}")]
    Node { node: String, op: String, reason: String },
}

/// What the caller decides about a model.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Sizes of symbolic input dimensions (`dim_param`), such as a batch size.
    pub dims: Vec<(String, i64)>,
    /// The kernel's name, made an identifier (default: the graph's name, else `model`).
    pub kernel: Option<String>,
    /// Where initializers stored outside the model (external data) are
    /// looked for: the model's directory.
    pub base_dir: Option<std::path::PathBuf>,
}

/// An imported model.
#[derive(Clone, Debug)]
pub struct Imported {
    pub kernel: String,
    /// `.tex` source; its comment header names `weights_file`.
    pub source: String,
    /// The initializers the kernel takes as parameters, by parameter name.
    pub weights: Vec<(String, Tensor)>,
    pub nodes: usize,
    /// Elements in all weights.
    pub parameters: usize,
    /// The ONNX name of each parameter (graph inputs and weights, in
    /// signature order) and output, with the identifier the kernel calls it:
    /// `("input.1", "input_1")`, `("191", "t_191")`. Runs of the `.onnx`
    /// file accept and write the ONNX names.
    pub names: Vec<ModelName>,
}

/// A value of the model that is a parameter or an output of its kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelName {
    /// As the model names it.
    pub onnx: String,
    /// As the kernel names it: an identifier (characters outside `[A-Za-z0-9_]`
    /// become `_`, a leading digit gets `t_`, a clash a suffix).
    pub ident: String,
    pub role: Role,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// A graph input: what a run is given.
    Input,
    /// An initializer the kernel takes as a parameter (its value comes with the model).
    Weight,
    Output,
}

/// Import `path`; `weights_file` is the name the header tells users to pass.
pub fn import_file(path: &Path, weights_file: &str, options: &Options) -> Result<Imported, OnnxError> {
    let (bytes, mapped) = model_bytes(path).map_err(|source| OnnxError::Read { source })?;
    let from = path.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
    let mut options = options.clone();
    options.base_dir = Some(path.parent().map_or_else(|| ".".into(), Path::to_path_buf));
    // Decoded from `Bytes`: the initializers' raw data are slices of the
    // file's bytes, not copies of them.
    let model = proto::ModelProto::decode(bytes).map_err(|e| OnnxError::Decode(e.to_string()))?;
    import_model(model, &from, weights_file, &options, mapped)
}

pub fn import_bytes(bytes: &[u8], from: &str, weights_file: &str, options: &Options) -> Result<Imported, OnnxError> {
    let model = proto::ModelProto::decode(bytes).map_err(|e| OnnxError::Decode(e.to_string()))?;
    import_model(model, from, weights_file, options, false)
}

/// The model file's bytes, and whether they are mapped: a regular file is
/// mapped read-only (as ONNX Runtime maps models), anything else (a pipe,
/// an empty file) is read.
fn model_bytes(path: &Path) -> std::io::Result<(prost::bytes::Bytes, bool)> {
    let mut file = std::fs::File::open(path)?;
    let meta = file.metadata()?;
    if meta.is_file() && meta.len() > 0 {
        // SAFETY: a read-only map; as for any reader that maps a
        // file, one truncated by another process while texc imports it can
        // fault.
        if let Ok(map) = unsafe { memmap2::Mmap::map(&file) } {
            return Ok((prost::bytes::Bytes::from_owner(map), true));
        }
    }
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut file, &mut bytes)?;
    Ok((bytes.into(), false))
}

/// Drops the whole pages inside `bytes`, a slice of a read-only file map,
/// from memory: they are read again from the file if touched, so nothing
/// changes but the resident memory (a converted initializer's raw data).
fn release_mapped(bytes: &[u8]) {
    #[cfg(target_os = "linux")]
    {
        let pages = texc_runtime::whole_pages(bytes);
        let (start, end) = (bytes.as_ptr() as usize + pages.start, bytes.as_ptr() as usize + pages.end);
        if end > start {
            // SAFETY: [start, end) is whole pages of a read-only file
            // map that `bytes` borrows; MADV_DONTNEED makes the next access
            // read them from the file again, with the same contents.
            unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = bytes;
}

/// Each initializer's shape and values. Of a `mapped` model, each one's
/// pages are dropped from memory once it is converted (the weights are held
/// about once, not as the file and the tensors).
fn initializer_values(
    model: &mut proto::ModelProto,
    options: &Options,
    mapped: bool,
) -> Result<Vec<(Vec<usize>, Values)>, OnnxError> {
    let Some(graph) = model.graph.as_mut() else { return Ok(Vec::new()) };
    let mut out = Vec::with_capacity(graph.initializer.len());
    for t in &mut graph.initializer {
        let converted = tensor_values(t, options.base_dir.as_deref(), mapped)
            .map_err(|e| OnnxError::Model(format!("initializer `{}`: {e}", t.name)))?;
        if mapped {
            release_mapped(&t.raw_data);
        }
        t.raw_data = Default::default();
        t.float_data = Vec::new();
        out.push(converted);
    }
    Ok(out)
}

fn import_model(
    mut model: proto::ModelProto,
    from: &str,
    weights_file: &str,
    options: &Options,
    mapped: bool,
) -> Result<Imported, OnnxError> {
    let initializers = initializer_values(&mut model, options, mapped)?;
    let model = &model;
    let graph = model.graph.as_ref().ok_or_else(|| OnnxError::Decode("the model has no graph".into()))?;
    let opset = default_opset(model)?;
    if !model.functions.is_empty() {
        return Err(OnnxError::Model("model-local functions are not supported".into()));
    }
    if !graph.sparse_initializer.is_empty() {
        return Err(OnnxError::Model("sparse initializers are not supported".into()));
    }
    let wanted = options.kernel.clone().unwrap_or_else(|| graph.name.clone());
    let mut im = Importer::new(opset, graph, initializers, options, if wanted.is_empty() { "model" } else { &wanted })?;
    for (i, node) in graph.node.iter().enumerate() {
        let label = if node.name.is_empty() { format!("#{i}") } else { node.name.clone() };
        let fail = |reason: String| OnnxError::Node { node: label.clone(), op: node.op_type.clone(), reason };
        if !(node.domain.is_empty() || node.domain == "ai.onnx") {
            return Err(fail(format!("operators of domain `{}` are not supported", node.domain)));
        }
        im.translate(node).map_err(fail)?;
    }
    im.finish(model, graph, from, weights_file)
}

/// The version of the default operator set: it decides attribute defaults
/// (Softmax's axis) and whether some operands are inputs or attributes.
fn default_opset(model: &proto::ModelProto) -> Result<i64, OnnxError> {
    let default = model.opset_import.iter().find(|o| o.domain.is_empty() || o.domain == "ai.onnx");
    match default {
        Some(o) if (7..=23).contains(&o.version) => Ok(o.version),
        Some(o) => Err(OnnxError::Model(format!("opset {} is not supported (7 to 23 are)", o.version))),
        None => Err(OnnxError::Model("the model imports no version of the default operator set".into())),
    }
}

// ---------------------------------------------------------------- values

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct ValueId(u32);

/// The element type of a value: what the kernel declares it as. ONNX's
/// int32 is widened to i64 at import (the importer computes indices and
/// masks in i64; an int32 graph input keeps its type, `Ty::I32`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ty {
    F32,
    I64,
    I32,
    Bool,
    /// Quantized tensors (QuantizeLinear's outputs, quantized weights).
    U8,
    I8,
}

impl Ty {
    fn name(self) -> &'static str {
        match self {
            Ty::F32 => "f32",
            Ty::I64 => "i64",
            Ty::I32 => "i32",
            Ty::Bool => "bool",
            Ty::U8 => "u8",
            Ty::I8 => "i8",
        }
    }

    fn is_int(self) -> bool {
        matches!(self, Ty::I64 | Ty::I32 | Ty::U8 | Ty::I8)
    }

    /// The range of an 8-bit quantized type.
    fn q8_range(self) -> Option<(i64, i64)> {
        match self {
            Ty::U8 => Some((0, 255)),
            Ty::I8 => Some((-128, 127)),
            _ => None,
        }
    }
}

/// Constant data, as the model stores it.
#[derive(Clone, Debug)]
enum Values {
    F32(Vec<f32>),
    F64(Vec<f64>),
    I64(Vec<i64>),
    Bool(Vec<bool>),
    /// Quantized data (int8 and uint8 initializers).
    I8(Vec<i8>),
    U8(Vec<u8>),
    /// Integers the importer computes in i32 (an integer product's bias).
    I32(Vec<i32>),
}

impl Values {
    fn len(&self) -> usize {
        match self {
            Values::F32(v) => v.len(),
            Values::F64(v) => v.len(),
            Values::I64(v) => v.len(),
            Values::Bool(v) => v.len(),
            Values::I8(v) => v.len(),
            Values::U8(v) => v.len(),
            Values::I32(v) => v.len(),
        }
    }

    /// The element type the kernel gives these values (f64 constants are
    /// refused where they are used as data).
    fn ty(&self) -> Ty {
        match self {
            Values::F32(_) | Values::F64(_) => Ty::F32,
            Values::I64(_) => Ty::I64,
            Values::Bool(_) => Ty::Bool,
            Values::I8(_) => Ty::I8,
            Values::U8(_) => Ty::U8,
            Values::I32(_) => Ty::I32,
        }
    }

    fn as_f64(&self) -> Vec<f64> {
        match self {
            Values::F32(v) => v.iter().map(|&x| x as f64).collect(),
            Values::F64(v) => v.clone(),
            Values::I64(v) => v.iter().map(|&x| x as f64).collect(),
            Values::Bool(v) => v.iter().map(|&x| x as u8 as f64).collect(),
            Values::I8(v) => v.iter().map(|&x| x as f64).collect(),
            Values::U8(v) => v.iter().map(|&x| x as f64).collect(),
            Values::I32(v) => v.iter().map(|&x| x as f64).collect(),
        }
    }

    fn as_i64(&self) -> Option<Vec<i64>> {
        match self {
            Values::I64(v) => Some(v.clone()),
            _ => None,
        }
    }

    /// Integer data of any width (quantized values, zero points).
    fn as_wide_ints(&self) -> Option<Vec<i64>> {
        match self {
            Values::I64(v) => Some(v.clone()),
            Values::I8(v) => Some(v.iter().map(|&x| x as i64).collect()),
            Values::U8(v) => Some(v.iter().map(|&x| x as i64).collect()),
            Values::I32(v) => Some(v.iter().map(|&x| x as i64).collect()),
            _ => None,
        }
    }

    /// The elements at flat positions `at`, in that order.
    fn pick(&self, at: &[usize]) -> Values {
        match self {
            Values::F32(v) => Values::F32(at.iter().map(|&i| v[i]).collect()),
            Values::F64(v) => Values::F64(at.iter().map(|&i| v[i]).collect()),
            Values::I64(v) => Values::I64(at.iter().map(|&i| v[i]).collect()),
            Values::Bool(v) => Values::Bool(at.iter().map(|&i| v[i]).collect()),
            Values::I8(v) => Values::I8(at.iter().map(|&i| v[i]).collect()),
            Values::U8(v) => Values::U8(at.iter().map(|&i| v[i]).collect()),
            Values::I32(v) => Values::I32(at.iter().map(|&i| v[i]).collect()),
        }
    }

    /// `self` followed by `other` (of the same kind).
    fn concat(&self, other: &Values) -> Option<Values> {
        Some(match (self, other) {
            (Values::F32(a), Values::F32(b)) => Values::F32([a.as_slice(), b].concat()),
            (Values::F64(a), Values::F64(b)) => Values::F64([a.as_slice(), b].concat()),
            (Values::I64(a), Values::I64(b)) => Values::I64([a.as_slice(), b].concat()),
            (Values::Bool(a), Values::Bool(b)) => Values::Bool([a.as_slice(), b].concat()),
            (Values::I8(a), Values::I8(b)) => Values::I8([a.as_slice(), b].concat()),
            (Values::U8(a), Values::U8(b)) => Values::U8([a.as_slice(), b].concat()),
            (Values::I32(a), Values::I32(b)) => Values::I32([a.as_slice(), b].concat()),
            _ => return None,
        })
    }
}

#[derive(Clone, Debug)]
struct Value {
    /// The name the model defines it under (an alias by `Identity` adds
    /// other names for the same value).
    onnx: String,
    ident: String,
    shape: Vec<usize>,
    /// Constants (initializers, `Constant` nodes) carry their data.
    data: Option<Values>,
    /// A parameter of the kernel: a graph input, or a constant used as a tensor.
    param: bool,
    /// The element type: of the data for constants, of the input for graph
    /// inputs, what the node computes otherwise.
    ty: Ty,
}

struct Importer<'m> {
    opset: i64,
    values: Vec<Value>,
    by_name: HashMap<String, ValueId>,
    names: Names,
    /// Parameters in signature order.
    params: Vec<ValueId>,
    graph_outputs: HashSet<&'m str>,
    body: Vec<String>,
    kernel: String,
    /// The graph's nodes, and the nodes that read each value (by index):
    /// the integer forms look at what reads a product.
    nodes: &'m [proto::NodeProto],
    readers: HashMap<&'m str, Vec<usize>>,
    /// Dequantized values and what they dequantize (`quant.rs`).
    dq: HashMap<ValueId, quant::Dequantized>,
    /// Statements of dequantizations written at their first use (`tensor`),
    /// never when only integer forms read the quantized value.
    deferred: HashMap<ValueId, String>,
    /// Outputs of nodes that an integer form computed with an earlier node.
    done: HashSet<String>,
}

impl<'m> Importer<'m> {
    fn new(
        opset: i64,
        graph: &'m proto::GraphProto,
        initializers: Vec<(Vec<usize>, Values)>,
        options: &Options,
        kernel: &str,
    ) -> Result<Importer<'m>, OnnxError> {
        let mut names = Names::new();
        let kernel = names.fresh(kernel);
        let mut im = Importer {
            opset,
            values: Vec::new(),
            by_name: HashMap::new(),
            names,
            kernel,
            params: Vec::new(),
            graph_outputs: graph.output.iter().map(|o| o.name.as_str()).collect(),
            body: Vec::new(),
            nodes: &graph.node,
            readers: HashMap::new(),
            dq: HashMap::new(),
            deferred: HashMap::new(),
            done: HashSet::new(),
        };
        for (i, node) in graph.node.iter().enumerate() {
            for input in node.input.iter().filter(|s| !s.is_empty()) {
                im.readers.entry(input.as_str()).or_default().push(i);
            }
        }
        let initialized: HashSet<&str> = graph.initializer.iter().map(|t| t.name.as_str()).collect();
        // Before IR version 4, initializers were also listed as inputs.
        for input in graph.input.iter().filter(|i| !initialized.contains(i.name.as_str())) {
            let (shape, ty) = input_shape(input, options).map_err(OnnxError::Model)?;
            let id = im.add(&input.name, shape, None).map_err(OnnxError::Model)?;
            im.values[id.0 as usize].param = true;
            im.values[id.0 as usize].ty = ty;
            im.params.push(id);
        }
        // Converted by `initializer_values`, in the same order.
        for (t, (shape, data)) in graph.initializer.iter().zip(initializers) {
            im.add(&t.name, shape, Some(data)).map_err(OnnxError::Model)?;
        }
        Ok(im)
    }

    /// A new value named `onnx_name`; names are defined once.
    fn add(&mut self, onnx_name: &str, shape: Vec<usize>, data: Option<Values>) -> Result<ValueId, String> {
        if onnx_name.is_empty() {
            return Err("a value has an empty name".into());
        }
        if self.by_name.contains_key(onnx_name) {
            return Err(format!("value `{onnx_name}` is defined twice"));
        }
        if elements(&shape).is_none() {
            return Err(format!("value `{onnx_name}` of shape {shape:?} has more than 2^40 elements"));
        }
        // Empty constants are lists (no axes) or inputs left out (an empty
        // `roi`); an empty tensor computed at run time is not supported, and an
        // empty constant used as data is refused where it is used ([`Importer::tensor`]).
        if shape.contains(&0) && data.is_none() {
            return Err(format!("value `{onnx_name}` of shape {shape:?} is empty: not supported"));
        }
        let id = ValueId(self.values.len() as u32);
        let ident = self.names.fresh(onnx_name);
        let ty = data.as_ref().map_or(Ty::F32, Values::ty);
        self.values.push(Value { onnx: onnx_name.to_string(), ident, shape, data, param: false, ty });
        self.by_name.insert(onnx_name.to_string(), id);
        Ok(id)
    }

    fn value(&self, id: ValueId) -> &Value {
        &self.values[id.0 as usize]
    }

    fn shape(&self, id: ValueId) -> &[usize] {
        &self.values[id.0 as usize].shape
    }

    /// The value an operand names; it must be defined already (ONNX graphs
    /// are topologically sorted).
    fn lookup(&self, onnx_name: &str) -> Result<ValueId, String> {
        self.by_name
            .get(onnx_name)
            .copied()
            .ok_or_else(|| format!("input `{onnx_name}` is not defined before this node"))
    }

    /// A constant's data, for operands the importer reads at import time
    /// (shapes, axes, clip bounds).
    fn constant(&self, id: ValueId) -> Option<&Values> {
        self.value(id).data.as_ref()
    }

    /// The identifier that stands for `id` in an expression; a constant used
    /// this way becomes a parameter of the kernel.
    fn tensor(&mut self, id: ValueId) -> Result<String, String> {
        if let Some(line) = self.deferred.remove(&id) {
            self.body.push(line);
        }
        let v = &self.values[id.0 as usize];
        if v.data.is_some() && !v.param {
            if matches!(v.data, Some(Values::F64(_))) {
                return Err(format!(
                    "`{}` is a constant of f64 elements used as data: f32, integer and bool tensors are supported",
                    v.ident
                ));
            }
            if v.shape.contains(&0) {
                return Err(format!("`{}` of shape {:?} is empty: not supported as data", v.ident, v.shape));
            }
            self.values[id.0 as usize].param = true;
            self.params.push(id);
        }
        Ok(self.values[id.0 as usize].ident.clone())
    }

    fn is_graph_output(&self, onnx_name: &str) -> bool {
        self.graph_outputs.contains(onnx_name)
    }

    fn line(&mut self, s: String) {
        self.body.push(s);
    }

    fn finish(
        mut self,
        model: &proto::ModelProto,
        graph: &proto::GraphProto,
        from: &str,
        weights_file: &str,
    ) -> Result<Imported, OnnxError> {
        let mut outputs = Vec::new();
        let mut names = Vec::new();
        let mut listed = HashSet::new();
        for o in &graph.output {
            // The kernel's results are named once each; a second listing
            // would be refused by the front end, in text that is no file.
            if !listed.insert(o.name.as_str()) {
                return Err(OnnxError::Model(format!("graph output `{}` is listed twice", o.name)));
            }
            let id = *self
                .by_name
                .get(&o.name)
                .ok_or_else(|| OnnxError::Model(format!("graph output `{}` is never computed", o.name)))?;
            let v = self.value(id);
            // An initializer, or a node computed at import time from constants only.
            if v.data.is_some() {
                return Err(OnnxError::Model(format!(
                    "graph output `{}` is a constant: nothing to compute at run time",
                    o.name
                )));
            }
            if v.param {
                return Err(OnnxError::Model(format!("graph output `{}` is an input: nothing to compute", o.name)));
            }
            if let Some(declared) = declared_shape(o) {
                if declared != v.shape {
                    return Err(OnnxError::Model(format!(
                        "graph output `{}` is declared {:?} but computes {:?}",
                        o.name, declared, v.shape
                    )));
                }
            }
            outputs.push(format!("{}: {}{}", v.ident, v.ty.name(), dims(&v.shape)));
            names.push(ModelName { onnx: o.name.clone(), ident: v.ident.clone(), role: Role::Output });
        }
        if outputs.is_empty() {
            return Err(OnnxError::Model("the graph has no outputs".into()));
        }
        let mut weights = Vec::new();
        let mut parameters = 0;
        let mut signature = Vec::new();
        let mut params = Vec::new();
        for &id in &self.params {
            let v = self.value(id);
            let role = if v.data.is_some() { Role::Weight } else { Role::Input };
            params.push(ModelName { onnx: v.onnx.clone(), ident: v.ident.clone(), role });
            signature.push(format!("{}: {}{}", v.ident, v.ty.name(), dims(&v.shape)));
            if !matches!(v.data, None | Some(Values::F64(_))) {
                parameters += v.data.as_ref().map_or(0, Values::len);
                weights.push((id, v.ident.clone(), v.shape.clone()));
            }
        }
        // The weights move out of the importer (`finish` consumes it): held once, not twice.
        let weights: Vec<(String, Tensor)> = weights
            .into_iter()
            .map(|(id, ident, shape)| {
                let data = match self.values[id.0 as usize].data.take() {
                    Some(Values::F32(d)) => Data::F32(d),
                    Some(Values::I64(d)) => Data::I64(d),
                    Some(Values::Bool(d)) => Data::Bool(d),
                    Some(Values::I8(d)) => Data::I8(d),
                    Some(Values::U8(d)) => Data::U8(d),
                    Some(Values::I32(d)) => Data::I32(d),
                    _ => unreachable!("chosen above for data other than f64"),
                };
                (ident, Tensor { shape, data })
            })
            .collect();
        let mut s = String::new();
        let producer = format!("{} {}", model.producer_name, model.producer_version);
        let _ = writeln!(
            s,
            "# Imported from {from} by texc {} (ONNX IR version {}, opset {}, producer `{}`).",
            env!("CARGO_PKG_VERSION"),
            model.ir_version,
            self.opset,
            producer.trim()
        );
        let _ = writeln!(
            s,
            "# {} nodes; {} weights with {parameters} parameters, in {weights_file}:",
            graph.node.len(),
            weights.len()
        );
        if let Some(stem) = weights_file.strip_suffix(".npz") {
            let _ = writeln!(s, "#     texc run {stem}.tex --input {weights_file}");
        }
        let _ = writeln!(s, "import std.nn;\n");
        let _ = writeln!(s, "kernel {}(", self.kernel);
        for (i, p) in signature.iter().enumerate() {
            let _ = writeln!(s, "    {p}{}", if i + 1 < signature.len() { "," } else { "" });
        }
        if outputs.len() == 1 {
            let _ = writeln!(s, ") -> {} {{", outputs[0]);
        } else {
            let _ = writeln!(s, ") -> ({}) {{", outputs.join(", "));
        }
        for l in &self.body {
            let _ = writeln!(s, "    {l}");
        }
        s.push_str("}\n");
        params.extend(names);
        Ok(Imported {
            kernel: self.kernel.clone(),
            source: s,
            weights,
            nodes: graph.node.len(),
            parameters,
            names: params,
        })
    }
}

/// The number of elements of `shape`, if at most 2^40 (texc's bound on a tensor).
fn elements(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d)).filter(|&n| n <= 1 << 40)
}

/// `[1, 3, 224, 224]`
fn dims(shape: &[usize]) -> String {
    format!("[{}]", shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", "))
}

/// A graph input's shape, and its element type where it holds integers.
fn input_shape(input: &proto::ValueInfoProto, options: &Options) -> Result<(Vec<usize>, Ty), String> {
    let tensor = input
        .r#type
        .as_ref()
        .and_then(|t| t.tensor_type.as_ref())
        .ok_or_else(|| format!("graph input `{}` is not a tensor", input.name))?;
    let ty = match tensor.elem_type {
        data_type::FLOAT => Ty::F32,
        data_type::INT64 => Ty::I64,
        data_type::INT32 => Ty::I32,
        data_type::BOOL => Ty::Bool,
        data_type::UINT8 => Ty::U8,
        data_type::INT8 => Ty::I8,
        other => {
            return Err(format!(
                "graph input `{}` has elements of type {}: float (f32), int64, int32, uint8, int8 and bool inputs are supported",
                input.name,
                data_type::name(other)
            ))
        }
    };
    let shape = tensor.shape.as_ref().ok_or_else(|| format!("graph input `{}` has no shape", input.name))?;
    let mut out = Vec::new();
    for d in &shape.dim {
        let size = match &d.value {
            Some(DimensionValue::DimValue(v)) => *v,
            Some(DimensionValue::DimParam(p)) => {
                options.dims.iter().find(|(n, _)| n == p).map(|(_, v)| *v).ok_or_else(|| {
                    format!(
                        "graph input `{}` has a symbolic dimension `{p}`: give it a size with --dim {p}=SIZE",
                        input.name
                    )
                })?
            }
            None => return Err(format!("graph input `{}` has a dimension of unknown size", input.name)),
        };
        if !(1..=1 << 32).contains(&size) {
            return Err(format!("graph input `{}` has a dimension of size {size}", input.name));
        }
        out.push(size as usize);
    }
    Ok((out, ty))
}

/// A graph output's declared shape, when every dimension is a number.
fn declared_shape(o: &proto::ValueInfoProto) -> Option<Vec<usize>> {
    let shape = o.r#type.as_ref()?.tensor_type.as_ref()?.shape.as_ref()?;
    shape
        .dim
        .iter()
        .map(|d| match d.value {
            Some(DimensionValue::DimValue(v)) if v >= 0 => Some(v as usize),
            _ => None,
        })
        .collect()
}

/// A tensor's shape and elements; the element count must match its dims.
/// External data is read from `base` (the model's directory).
fn tensor_data(t: &proto::TensorProto, base: Option<&Path>) -> Result<(Vec<usize>, Values), String> {
    tensor_values(t, base, false)
}

/// [`tensor_data`]; with `mapped` (raw data in a file map), each megabyte
/// of raw data is dropped from memory once converted, so that converting a
/// weight holds it about once, not as its pages and its values.
fn tensor_values(t: &proto::TensorProto, base: Option<&Path>, mapped: bool) -> Result<(Vec<usize>, Values), String> {
    let external;
    let raw_data: &[u8] = if t.data_location == 1 {
        external = external_data(t, base)?;
        &external[..]
    } else {
        &t.raw_data[..]
    };
    let mut shape = Vec::new();
    let mut count: usize = 1;
    for &d in &t.dims {
        let d = usize::try_from(d).map_err(|_| format!("negative dimension {d}"))?;
        count = count.checked_mul(d).filter(|&c| c <= 1 << 34).ok_or("too many elements")?;
        shape.push(d);
    }
    // Each element read straight from the bytes (no wider copy of a
    // weight in between: the largest weights are hundreds of MB).
    fn raw<const W: usize, T>(
        raw_data: &[u8],
        count: usize,
        mapped: bool,
        f: impl Fn([u8; W]) -> T,
    ) -> Result<Vec<T>, String> {
        if raw_data.len() != count * W {
            return Err(format!("raw data of {} bytes for {count} elements", raw_data.len()));
        }
        let mut out = Vec::with_capacity(count);
        for piece in raw_data.chunks(W << 20) {
            out.extend(piece.chunks_exact(W).map(|c| f(c.try_into().expect("chunks of W bytes"))));
            if mapped {
                release_mapped(piece);
            }
        }
        Ok(out)
    }
    let has_raw = !raw_data.is_empty() || count == 0;
    let values = match t.data_type {
        data_type::FLOAT if has_raw => Values::F32(raw(raw_data, count, mapped, f32::from_le_bytes)?),
        data_type::FLOAT => Values::F32(t.float_data.clone()),
        data_type::DOUBLE if has_raw => Values::F64(raw(raw_data, count, mapped, f64::from_le_bytes)?),
        data_type::DOUBLE => Values::F64(t.double_data.clone()),
        data_type::INT64 if has_raw => Values::I64(raw(raw_data, count, mapped, i64::from_le_bytes)?),
        data_type::INT64 => Values::I64(t.int64_data.clone()),
        data_type::INT32 if has_raw => Values::I64(raw(raw_data, count, mapped, |b| i32::from_le_bytes(b) as i64)?),
        data_type::INT32 => Values::I64(t.int32_data.iter().map(|&x| x as i64).collect()),
        data_type::BOOL if has_raw => Values::Bool(raw(raw_data, count, mapped, |b: [u8; 1]| b[0] != 0)?),
        data_type::BOOL => Values::Bool(t.int32_data.iter().map(|&x| x != 0).collect()),
        data_type::INT8 if has_raw => Values::I8(raw(raw_data, count, mapped, i8::from_le_bytes)?),
        data_type::INT8 => Values::I8(t.int32_data.iter().map(|&x| x as i8).collect()),
        data_type::UINT8 if has_raw => Values::U8(raw(raw_data, count, mapped, u8::from_le_bytes)?),
        data_type::UINT8 => Values::U8(t.int32_data.iter().map(|&x| x as u8).collect()),
        other => return Err(format!("elements of type {} are not supported", data_type::name(other))),
    };
    if values.len() != count {
        return Err(format!("{} elements for dimensions {:?}", values.len(), shape));
    }
    Ok((shape, values))
}

/// Read every tensor of `m` stored in another file (external data, found
/// in `base`, the model's directory, under the same checks as an import)
/// into the model itself: a tool that rewrites the model and writes it
/// elsewhere (`texc quantize`) then has its values wherever it goes.
pub fn inline_external_data(m: &mut proto::ModelProto, base: &Path) -> Result<(), String> {
    let Some(g) = m.graph.as_mut() else { return Ok(()) };
    let tensors = g
        .initializer
        .iter_mut()
        .chain(g.sparse_initializer.iter_mut().filter_map(|s| s.values.as_mut()))
        .chain(g.node.iter_mut().flat_map(|n| n.attribute.iter_mut()).filter_map(|a| a.t.as_mut()));
    for t in tensors.filter(|t| t.data_location == 1) {
        t.raw_data = external_data(t, Some(base)).map_err(|e| format!("tensor `{}`: {e}", t.name))?.into();
        t.external_data.clear();
        t.data_location = 0;
    }
    Ok(())
}

/// The bytes of a tensor stored in another file: `location` (relative to
/// the model, inside its directory), from `offset`, `length` bytes (or to
/// the end).
fn external_data(t: &proto::TensorProto, base: Option<&Path>) -> Result<Vec<u8>, String> {
    use std::io::{Read, Seek, SeekFrom};
    let entry = |k: &str| t.external_data.iter().find(|e| e.key == k).map(|e| e.value.as_str());
    let location = entry("location").ok_or("its external data has no location")?;
    let relative = Path::new(location);
    if relative.is_absolute() || relative.components().any(|c| matches!(c, std::path::Component::ParentDir)) {
        return Err(format!("external data `{location}` is outside the model's directory"));
    }
    let base = base.ok_or("its data is stored in another file, and the model's directory is not known")?;
    let number = |k: &str| -> Result<Option<u64>, String> {
        entry(k).map(|v| v.parse::<u64>().map_err(|_| format!("external data {k} `{v}` is not a number"))).transpose()
    };
    let (offset, length) = (number("offset")?.unwrap_or(0), number("length")?);
    let (mut f, path) = open_inside(base, location)?;
    let fail = |e: std::io::Error| format!("external data {}: {e}", path.display());
    let size = f.metadata().map_err(fail)?.len();
    let length = length.unwrap_or(size.saturating_sub(offset));
    if offset.checked_add(length).is_none_or(|end| end > size) {
        return Err(format!("external data {}: bytes {offset}..+{length} beyond its {size} bytes", path.display()));
    }
    f.seek(SeekFrom::Start(offset)).map_err(fail)?;
    let mut bytes = Vec::new();
    f.take(length).read_to_end(&mut bytes).map_err(fail)?;
    Ok(bytes)
}

/// Open external data `location` of the model in directory `base`: the
/// path it resolves to (symbolic links followed) must be inside `base`
/// resolved, and must be a regular file. A link beside the model to
/// `/etc/passwd`, or through a linked directory, would otherwise be read
/// (and `compile -o` would embed its bytes in a library), and a FIFO would
/// block the import forever. The resolved path is opened without
/// following a link at its end and without blocking (a FIFO put there
/// after the check opens at once), and the opened file's own metadata
/// decides that it is a regular file.
fn open_inside(base: &Path, location: &str) -> Result<(std::fs::File, std::path::PathBuf), String> {
    let shown = base.join(location);
    let fail = |e: std::io::Error| format!("external data {}: {e}", shown.display());
    let root = base.canonicalize().map_err(|e| format!("the model's directory {}: {e}", base.display()))?;
    let resolved = shown.canonicalize().map_err(fail)?;
    if !resolved.starts_with(&root) {
        return Err(format!(
            "external data `{location}` resolves to {}, outside the model's directory {}",
            resolved.display(),
            root.display()
        ));
    }
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW);
    }
    let f = options.open(&resolved).map_err(fail)?;
    let m = f.metadata().map_err(fail)?;
    if !m.is_file() {
        return Err(format!("external data {} is {}, not a regular file", shown.display(), file_kind(&m)));
    }
    Ok((f, shown))
}

/// What a file that is not a regular one is, in words.
fn file_kind(m: &std::fs::Metadata) -> &'static str {
    let t = m.file_type();
    if t.is_dir() {
        return "a directory";
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return "a FIFO";
        }
        if t.is_char_device() {
            return "a character device";
        }
        if t.is_block_device() {
            return "a block device";
        }
        if t.is_socket() {
            return "a socket";
        }
    }
    "not a regular file"
}
