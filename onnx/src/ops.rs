//! One translation per ONNX operator. Each reads the node's attributes (any
//! it does not know is an error), checks its operands' shapes as the operator
//! defines them, infers the output's shape, and writes one statement: a call
//! of the `std.nn` operator with the same semantics where there is one, and
//! the operator's index expression otherwise.

use crate::attrs::Attrs;
use crate::proto::NodeProto;
use crate::{elements, fold, tensor_data, Importer, Ty, ValueId, Values};
use texc_compiler::nn::{Epilogue, NnOp};

type R<T = ()> = Result<T, String>;

/// A sliced axis: the axis, its first index, the step and the length.
type SlicedAxis = (usize, i64, i64, usize);

/// Operators computed at import time when every input is a constant.
#[rustfmt::skip]
const FOLDABLE: &[&str] = &[
    "Concat", "Gather", "Slice", "Cast", "Add", "Sub", "Mul", "Div", "Range", "Equal", "Less", "Greater",
    "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor", "Not", "Where", "Neg", "Abs", "Sqrt", "Reciprocal",
    "Pow", "Max", "Min", "Mod", "Expand", "Transpose", "Trilu", "ScatterND", "GatherND",
];

/// Elements of a constant that folding may fill with one f32 value
/// ([`Importer::fold_would_inflate`]): a bias's size, not a feature map's.
const SMALL_FILL: usize = 4096;

/// Ranks the element-wise operators of `std.nn` have overloads for.
const STD_RANKS: std::ops::RangeInclusive<usize> = 1..=4;

impl Importer<'_> {
    pub(crate) fn translate(&mut self, n: &NodeProto) -> R {
        if n.output.first().is_some_and(|o| self.done.contains(o)) {
            return Ok(());
        }
        if self.quantized(n)? {
            return Ok(());
        }
        if self.fold(n)? {
            return Ok(());
        }
        let ty = self.result_ty(n)?;
        let before = self.values.len();
        self.translate_op(n)?;
        for v in &mut self.values[before..] {
            if v.data.is_none() {
                v.ty = ty;
            }
        }
        Ok(())
    }

    /// The element type of what `n` computes at run time; operators that
    /// compute on f32 only refuse other inputs here, naming the type.
    fn result_ty(&self, n: &NodeProto) -> R<Ty> {
        let ty_of = |i: usize| -> Option<Ty> {
            n.input.get(i).filter(|s| !s.is_empty()).and_then(|s| self.by_name.get(s)).map(|&id| self.value(id).ty)
        };
        let first = ty_of(0).unwrap_or(Ty::F32);
        let op = n.op_type.as_str();
        Ok(match op {
            "Equal" | "Less" | "Greater" | "LessOrEqual" | "GreaterOrEqual" | "And" | "Or" | "Xor" | "Not"
            | "IsNaN" => Ty::Bool,
            "Where" => ty_of(1).unwrap_or(Ty::F32),
            "Cast" => {
                let to = Attrs::new(n, &["to", "saturate"])?.int("to", 0)? as i32;
                match to {
                    crate::proto::data_type::FLOAT => Ty::F32,
                    crate::proto::data_type::INT64 => Ty::I64,
                    crate::proto::data_type::INT32 => Ty::I32,
                    crate::proto::data_type::BOOL => Ty::Bool,
                    other => {
                        return Err(format!("a cast to {} is not supported", crate::proto::data_type::name(other)))
                    }
                }
            }
            // Operators that move or pick elements, and integer arithmetic, keep their input's type.
            "Identity" | "Reshape" | "Flatten" | "Squeeze" | "Unsqueeze" | "Transpose" | "Concat" | "Slice"
            | "Split" | "Gather" | "Expand" | "Trilu" | "Pad" | "Add" | "Sub" | "Mul" | "Div" | "Mod" | "Neg"
            | "Abs" => first,
            // The maximum of quantized data is quantized data (a monotone map commutes with it).
            "MaxPool" if matches!(first, Ty::U8 | Ty::I8) => first,
            // Dropout's mask output is refused where it is used.
            _ if first == Ty::F32 => Ty::F32,
            _ => {
                return Err(format!(
                    "an input of elements of type {}: this operator is supported on f32 tensors",
                    first.name()
                ))
            }
        })
    }

    fn translate_op(&mut self, n: &NodeProto) -> R {
        match n.op_type.as_str() {
            "Conv" => self.conv(n),
            "BatchNormalization" => self.batch_norm(n),
            "Relu" => self.unary(n, &[], Some(NnOp::Relu), |x| format!("max({x}, 0.0)")),
            "Sigmoid" => self.unary(n, &[], Some(NnOp::Sigmoid), |x| format!("sigmoid({x})")),
            "Tanh" => self.unary(n, &[], Some(NnOp::Tanh), |x| format!("tanh({x})")),
            "Erf" => self.unary(n, &[], None, |x| format!("erf({x})")),
            "Sqrt" => self.unary(n, &[], None, |x| format!("sqrt({x})")),
            "Exp" => self.unary(n, &[], None, |x| format!("exp({x})")),
            "Log" => self.unary(n, &[], None, |x| format!("log({x})")),
            "Abs" => self.unary(n, &[], None, |x| format!("abs({x})")),
            "Neg" => self.unary(n, &[], None, |x| format!("-{x}")),
            "Reciprocal" => self.unary(n, &[], None, |x| format!("1.0 / {x}")),
            "Floor" => self.unary(n, &[], None, |x| format!("floor({x})")),
            "Ceil" => self.unary(n, &[], None, |x| format!("ceil({x})")),
            "Round" => self.unary(n, &[], None, |x| format!("round({x})")),
            // ONNX's log(exp(x) + 1) and PyTorch's (linear above 20) agree in f32.
            "Softplus" => self.unary(n, &[], Some(NnOp::Softplus), |x| format!("log(exp({x}) + 1.0)")),
            "HardSwish" => {
                self.unary(n, &[], Some(NnOp::Hardswish), |x| format!("{x} * clamp({x} + 3.0, 0.0, 6.0) / 6.0"))
            }
            "Mish" => self.unary(n, &[], Some(NnOp::Mish), |x| format!("{x} * tanh(log(exp({x}) + 1.0))")),
            "Elu" => self.elu(n),
            "Selu" => self.selu(n),
            "PRelu" => self.prelu(n),
            "GlobalMaxPool" => self.global_pool(n),
            "HardSigmoid" => self.hard_sigmoid(n),
            "LeakyRelu" => self.leaky_relu(n),
            "Clip" => self.clip(n),
            "Gelu" => self.gelu(n),
            "Add" => self.binary(n, NnOp::Add, "+"),
            "Sub" => self.binary(n, NnOp::Sub, "-"),
            "Mul" => self.binary(n, NnOp::Mul, "*"),
            "Div" => self.binary(n, NnOp::Div, "/"),
            "Mod" => self.modulo(n),
            "Pow" => self.pow(n),
            "MaxPool" | "AveragePool" => self.pool(n),
            "GlobalAveragePool" => self.global_pool(n),
            "Flatten" => self.flatten(n),
            "Reshape" => self.reshape(n),
            "Squeeze" | "Unsqueeze" => self.squeeze(n),
            "Transpose" => self.transpose(n),
            "Gemm" => self.gemm(n),
            "MatMul" => self.matmul(n),
            "Softmax" | "LogSoftmax" => self.softmax(n),
            "Identity" | "Dropout" => self.identity(n),
            "Constant" => self.constant_node(n),
            "Concat" => self.concat(n),
            "Slice" => self.slice(n),
            "Split" => self.split(n),
            "Gather" => self.gather(n),
            "Resize" | "Upsample" => self.resize(n),
            "DepthToSpace" => self.depth_to_space(n),
            "Cast" => self.cast(n),
            "ReduceMean" | "ReduceSum" | "ReduceMax" | "ReduceMin" | "ReduceProd" | "ReduceL1" | "ReduceL2"
            | "ReduceSumSquare" => self.reduce(n),
            "LayerNormalization" => self.layer_norm(n),
            "ConvTranspose" => self.conv_transpose(n),
            "Attention" => self.attention(n),
            "Expand" => self.expand(n),
            "Equal" => self.logical(n, 2, |a| format!("{} == {}", a[0], a[1])),
            "Greater" => self.logical(n, 2, |a| format!("{} > {}", a[0], a[1])),
            "GreaterOrEqual" => self.logical(n, 2, |a| format!("{} >= {}", a[0], a[1])),
            "Less" => self.logical(n, 2, |a| format!("{} < {}", a[0], a[1])),
            "LessOrEqual" => self.logical(n, 2, |a| format!("{} <= {}", a[0], a[1])),
            "And" => self.logical(n, 2, |a| format!("{} && {}", a[0], a[1])),
            "Or" => self.logical(n, 2, |a| format!("{} || {}", a[0], a[1])),
            "Not" => self.logical(n, 1, |a| format!("!{}", a[0])),
            // NaN is the one value unequal to itself (IEEE 754), on every target.
            "IsNaN" => self.logical(n, 1, |a| format!("{0} != {0}", a[0])),
            "Xor" => self.logical(n, 2, |a| format!("({0} || {1}) && !({0} && {1})", a[0], a[1])),
            "Where" => self.logical(n, 3, |a| format!("select({}, {}, {})", a[0], a[1], a[2])),
            "Trilu" => self.trilu(n),
            "LSTM" => self.lstm(n),
            "Einsum" => self.einsum(n),
            "Pad" => self.pad(n),
            "GRU" => self.gru(n),
            // Swin's shifted-window mask: built from constants, computed at import (`fold_scatter_nd`).
            "ScatterND" => Err("data, indices and updates must be constants (computed at import)".into()),
            "GatherND" => self.gather_nd(n),
            // Constant ranges fold at import (`fold_range`); a computed one has a data-dependent length.
            "Range" => {
                Err("start, limit and delta must be constants: a computed range's length depends on data".into())
            }
            other => Err(format!("operator `{other}` is not supported")),
        }
    }

    // ------------------------------------------------------------ operands

    /// The node's inputs, `None` for an omitted optional one (an empty name).
    pub(crate) fn inputs(&self, n: &NodeProto, min: usize, max: usize) -> R<Vec<Option<ValueId>>> {
        let count = n.input.len();
        if count < min || count > max {
            let want = if min == max { format!("{min}") } else { format!("{min} to {max}") };
            return Err(format!("has {count} inputs, expected {want}"));
        }
        n.input.iter().map(|i| if i.is_empty() { Ok(None) } else { self.lookup(i).map(Some) }).collect()
    }

    pub(crate) fn required(ins: &[Option<ValueId>], i: usize) -> R<ValueId> {
        ins.get(i).copied().flatten().ok_or_else(|| format!("input {i} is required"))
    }

    /// The node's one output; further outputs must be unused (empty names).
    pub(crate) fn output<'n>(&self, n: &'n NodeProto) -> R<&'n str> {
        let first = n.output.first().filter(|o| !o.is_empty()).ok_or("has no output")?;
        if let Some((i, o)) = n.output.iter().enumerate().skip(1).find(|(_, o)| !o.is_empty()) {
            return Err(format!("output {i} (`{o}`) is used: only the first output is supported"));
        }
        Ok(first)
    }

    /// A scalar constant operand (clip bounds, exponents).
    fn scalar_constant(&self, id: ValueId, what: &str) -> R<f64> {
        match self.constant(id) {
            Some(v) if v.len() == 1 => Ok(v.as_f64()[0]),
            Some(_) => Err(format!("{what} must be a single value")),
            None => Err(format!("{what} must be a constant (an initializer or a Constant node)")),
        }
    }

    /// A constant vector of integers (shapes, axes).
    pub(crate) fn int_constant(&self, id: ValueId, what: &str) -> R<Vec<i64>> {
        self.constant(id)
            .and_then(Values::as_i64)
            .ok_or_else(|| format!("{what} must be a constant of integers (an initializer or a Constant node)"))
    }

    /// `x` at index variables `vars` of a result of rank `vars.len()`,
    /// broadcast as NumPy does (right-aligned; an axis of size 1 stays at 0).
    /// A one-element constant becomes a literal.
    pub(crate) fn broadcast_access(&mut self, x: ValueId, vars: &[String]) -> R<String> {
        if let Some(v) = self.constant(x) {
            if v.len() == 1 && self.value(x).shape.iter().all(|&d| d == 1) {
                return typed_literal(v);
            }
        }
        let shape = self.shape(x).to_vec();
        let skip = vars.len() - shape.len();
        let idx: Vec<String> =
            shape.iter().enumerate().map(|(k, &d)| if d == 1 { "0".into() } else { vars[skip + k].clone() }).collect();
        Ok(format!("{}[{}]", self.tensor(x)?, idx.join(", ")))
    }

    // ------------------------------------------------------------ results

    /// `out = CALL;`
    pub(crate) fn emit_call(&mut self, out: &str, shape: Vec<usize>, call: String) -> R {
        let id = self.add(out, shape, None)?;
        let ident = self.value(id).ident.clone();
        self.line(format!("{ident} = {call};"));
        Ok(())
    }

    /// `out[i0, i1, ...] = RHS;` with the axes' ranges written unless `out`
    /// is a graph output, whose declared shape gives them.
    pub(crate) fn emit_def(&mut self, out: &str, shape: Vec<usize>, rhs: String) -> R {
        if shape.is_empty() {
            let id = self.add(out, shape, None)?;
            let ident = self.value(id).ident.clone();
            self.line(format!("{ident} = {rhs};"));
            return Ok(());
        }
        let ranged = !self.is_graph_output(out);
        let lhs: Vec<String> = vars("i", shape.len())
            .into_iter()
            .zip(&shape)
            .map(|(v, d)| if ranged { format!("{v} in 0..{d}") } else { v })
            .collect();
        let id = self.add(out, shape, None)?;
        let ident = self.value(id).ident.clone();
        self.line(format!("{ident}[{}] = {rhs};", lhs.join(", ")));
        Ok(())
    }

    /// `out` is `src`: the same value under a second name, or a copy when
    /// `out` is a graph output or `src` a parameter.
    pub(crate) fn alias(&mut self, out: &str, src: ValueId) -> R {
        let v = self.value(src);
        if self.is_graph_output(out) || v.param {
            let shape = v.shape.clone();
            let iv = vars("i", shape.len());
            let rhs = format!("{}[{}]", self.tensor(src)?, iv.join(", "));
            return self.emit_def(out, shape, rhs);
        }
        if self.by_name.contains_key(out) {
            return Err(format!("value `{out}` is defined twice"));
        }
        self.by_name.insert(out.to_string(), src);
        Ok(())
    }

    /// A constant the importer makes (a reshaped or transposed weight).
    fn synthetic(&mut self, name: String, shape: Vec<usize>, data: Vec<f32>) -> R<ValueId> {
        self.add(&name, shape, Some(Values::F32(data)))
    }

    // ------------------------------------------------------------ element-wise

    fn unary(&mut self, n: &NodeProto, attrs: &[&str], std: Option<NnOp>, f: impl Fn(&str) -> String) -> R {
        Attrs::new(n, attrs)?;
        let ins = self.inputs(n, 1, 1)?;
        let x = Self::required(&ins, 0)?;
        self.unary_with(n, x, std, f)
    }

    fn unary_with(&mut self, n: &NodeProto, x: ValueId, std: Option<NnOp>, f: impl Fn(&str) -> String) -> R {
        let out = self.output(n)?;
        let shape = self.shape(x).to_vec();
        match std {
            Some(name) if STD_RANKS.contains(&shape.len()) && self.value(x).ty == Ty::F32 => {
                let call = format!("{name}({})", self.tensor(x)?);
                self.emit_call(out, shape, call)
            }
            _ => {
                let v = vars("i", shape.len());
                let xa = self.broadcast_access(x, &v)?;
                self.emit_def(out, shape, f(&xa))
            }
        }
    }

    fn hard_sigmoid(&mut self, n: &NodeProto) -> R {
        let a = Attrs::new(n, &["alpha", "beta"])?;
        let (alpha, beta) = (a.float("alpha", 0.2)?, a.float("beta", 0.5)?);
        let x = Self::required(&self.inputs(n, 1, 1)?, 0)?;
        // PyTorch's hardsigmoid is alpha = 1/6, beta = 1/2 (what it exports).
        let std = (alpha == 1.0 / 6.0 && beta == 0.5).then_some(NnOp::Hardsigmoid);
        let (alpha, beta) = (literal(alpha as f64)?, literal(beta as f64)?);
        self.unary_with(n, x, std, |x| format!("clamp({alpha} * {x} + {beta}, 0.0, 1.0)"))
    }

    fn elu(&mut self, n: &NodeProto) -> R {
        self.with_alpha(n, NnOp::Elu, 1.0, |x, al| format!("select({x} > 0.0, {x}, {al} * (exp({x}) - 1.0))"))
    }

    /// An activation with one `alpha` attribute: the std.nn operator of that
    /// name for ranks 1–4, else `f(x, alpha)`.
    fn with_alpha(&mut self, n: &NodeProto, std: NnOp, default: f32, f: impl Fn(&str, &str) -> String) -> R {
        let a = Attrs::new(n, &["alpha"])?;
        let al = literal(a.float("alpha", default)? as f64)?;
        let x = Self::required(&self.inputs(n, 1, 1)?, 0)?;
        let out = self.output(n)?;
        let shape = self.shape(x).to_vec();
        if STD_RANKS.contains(&shape.len()) {
            let call = format!("{std}({}, alpha = {al})", self.tensor(x)?);
            return self.emit_call(out, shape, call);
        }
        self.unary_with(n, x, None, |x| f(x, &al))
    }

    fn selu(&mut self, n: &NodeProto) -> R {
        let a = Attrs::new(n, &["alpha", "gamma"])?;
        let (alpha, gamma) = (a.float("alpha", 1.673_263_2)?, a.float("gamma", 1.050_701)?);
        let x = Self::required(&self.inputs(n, 1, 1)?, 0)?;
        let std = (alpha == 1.673_263_2 && gamma == 1.050_701).then_some(NnOp::Selu);
        let (al, ga) = (literal(alpha as f64)?, literal(gamma as f64)?);
        self.unary_with(n, x, std, |x| format!("{ga} * select({x} > 0.0, {x}, {al} * (exp({x}) - 1.0))"))
    }

    /// One slope per channel (axis 1), as PyTorch exports `nn.PReLU(C)`; other slopes broadcast.
    fn prelu(&mut self, n: &NodeProto) -> R {
        Attrs::new(n, &[])?;
        let ins = self.inputs(n, 2, 2)?;
        let (x, slope) = (Self::required(&ins, 0)?, Self::required(&ins, 1)?);
        let out = self.output(n)?;
        let xs = self.shape(x).to_vec();
        let ss = self.shape(slope).to_vec();
        let channel_slope = xs.len() >= 2
            && ss.first() == Some(&xs[1])
            && ss.len() == xs.len() - 1
            && ss[1..].iter().all(|&d| d == 1)
            && (2..=4).contains(&xs.len());
        if let (true, Some(Values::F32(d))) = (channel_slope, &self.value(slope).data) {
            let (d, name) = (d.clone(), format!("{}_c", self.value(slope).ident));
            let a = if ss.len() == 1 { slope } else { self.synthetic(name, vec![xs[1]], d)? };
            let call = format!("prelu({}, {})", self.tensor(x)?, self.tensor(a)?);
            return self.emit_call(out, xs, call);
        }
        let shape = broadcast(&xs, &ss)?;
        let v = vars("i", shape.len());
        let (xa, sa) = (self.broadcast_access(x, &v)?, self.broadcast_access(slope, &v)?);
        self.emit_def(out, shape, format!("select({xa} >= 0.0, {xa}, {sa} * {xa})"))
    }

    fn leaky_relu(&mut self, n: &NodeProto) -> R {
        self.with_alpha(n, NnOp::LeakyRelu, 0.01, |x, al| format!("select({x} >= 0.0, {x}, {al} * {x})"))
    }

    fn clip(&mut self, n: &NodeProto) -> R {
        let (x, lo, hi) = if self.opset < 11 {
            let a = Attrs::new(n, &["min", "max"])?;
            let x = Self::required(&self.inputs(n, 1, 1)?, 0)?;
            (x, a.float("min", f32::NEG_INFINITY)? as f64, a.float("max", f32::INFINITY)? as f64)
        } else {
            Attrs::new(n, &[])?;
            let ins = self.inputs(n, 1, 3)?;
            let bound = |i: usize, what: &str, default: f64| match ins.get(i).copied().flatten() {
                Some(id) => self.scalar_constant(id, what),
                None => Ok(default),
            };
            (
                Self::required(&ins, 0)?,
                bound(1, "the lower bound", f64::NEG_INFINITY)?,
                bound(2, "the upper bound", f64::INFINITY)?,
            )
        };
        let (lo32, hi32) = (lo as f32 as f64, hi as f32 as f64);
        match (lo32, hi32) {
            (0.0, 6.0) => self.unary_with(n, x, Some(NnOp::Relu6), |x| format!("clamp({x}, 0.0, 6.0)")),
            (0.0, f64::INFINITY) => self.unary_with(n, x, Some(NnOp::Relu), |x| format!("max({x}, 0.0)")),
            (f64::NEG_INFINITY, f64::INFINITY) => {
                let out = self.output(n)?;
                self.alias(out, x)
            }
            (f64::NEG_INFINITY, _) => {
                let h = literal(hi32)?;
                self.unary_with(n, x, None, |x| format!("min({x}, {h})"))
            }
            (_, f64::INFINITY) => {
                let l = literal(lo32)?;
                self.unary_with(n, x, None, |x| format!("max({x}, {l})"))
            }
            _ => {
                let (l, h) = (literal(lo32)?, literal(hi32)?);
                self.unary_with(n, x, None, |x| format!("clamp({x}, {l}, {h})"))
            }
        }
    }

    fn gelu(&mut self, n: &NodeProto) -> R {
        let a = Attrs::new(n, &["approximate"])?;
        let x = Self::required(&self.inputs(n, 1, 1)?, 0)?;
        match a.string("approximate", "none")?.as_str() {
            "none" => self
                .unary_with(n, x, Some(NnOp::Gelu), |x| format!("0.5 * {x} * (1.0 + erf({x} * 0.70710678118654752))")),
            "tanh" => self.unary_with(n, x, Some(NnOp::GeluTanh), |x| {
                format!("0.5 * {x} * (1.0 + tanh(0.7978845608028654 * ({x} + 0.044715 * {x} * {x} * {x})))")
            }),
            other => Err(format!("approximate = \"{other}\": expected \"none\" or \"tanh\"")),
        }
    }

    fn binary(&mut self, n: &NodeProto, std: NnOp, op: &str) -> R {
        let a = Attrs::new(n, &["broadcast", "axis"])?;
        if a.has("broadcast") || a.has("axis") {
            return Err("the `broadcast`/`axis` attributes of opsets before 7 are not supported".into());
        }
        let ins = self.inputs(n, 2, 2)?;
        let (x, y) = (Self::required(&ins, 0)?, Self::required(&ins, 1)?);
        let out = self.output(n)?;
        let shape = broadcast(self.shape(x), self.shape(y))?;
        let scalar = |id: ValueId| self.constant(id).is_some_and(|v| v.len() == 1);
        let same = self.shape(x) == shape.as_slice() && self.shape(y) == shape.as_slice();
        let f32s = self.value(x).ty == Ty::F32 && self.value(y).ty == Ty::F32;
        if same && f32s && STD_RANKS.contains(&shape.len()) && !scalar(x) && !scalar(y) {
            let call = format!("{std}({}, {})", self.tensor(x)?, self.tensor(y)?);
            return self.emit_call(out, shape, call);
        }
        let v = vars("i", shape.len());
        let (a, b) = (self.broadcast_access(x, &v)?, self.broadcast_access(y, &v)?);
        let rhs = if op == "/" && self.value(x).ty.is_int() {
            // ONNX's integer division truncates toward zero; texc's floors.
            let q = format!("{a} / {b}");
            format!("select({a} % {b} != 0 && ({a} < 0 && {b} > 0 || {a} > 0 && {b} < 0), {q} + 1, {q})")
        } else {
            format!("{a} {op} {b}")
        };
        self.emit_def(out, shape, rhs)
    }

    /// Integer `Mod` (`fmod = 0`): the remainder takes the divisor's sign, as texc's `%` does.
    fn modulo(&mut self, n: &NodeProto) -> R {
        let a = Attrs::new(n, &["fmod"])?;
        let ins = self.inputs(n, 2, 2)?;
        let (x, y) = (Self::required(&ins, 0)?, Self::required(&ins, 1)?);
        if a.int("fmod", 0)? != 0 || !self.value(x).ty.is_int() {
            return Err("only the integer Mod with fmod = 0 is supported".into());
        }
        let out = self.output(n)?;
        let shape = broadcast(self.shape(x), self.shape(y))?;
        let v = vars("i", shape.len());
        let rhs = format!("{} % {}", self.broadcast_access(x, &v)?, self.broadcast_access(y, &v)?);
        self.emit_def(out, shape, rhs)
    }

    /// Comparisons, logic and `Where`: the result of `rhs` over the inputs'
    /// accesses, element by element, the inputs broadcast as NumPy does.
    /// (Their boolean results are temporaries of the kernel.)
    fn logical(&mut self, n: &NodeProto, arity: usize, rhs: impl Fn(&[String]) -> String) -> R {
        Attrs::new(n, &[])?;
        let ins = self.inputs(n, arity, arity)?;
        let ids: Vec<ValueId> = (0..arity).map(|i| Self::required(&ins, i)).collect::<R<_>>()?;
        let out = self.output(n)?;
        let mut shape = self.shape(ids[0]).to_vec();
        for &id in &ids[1..] {
            shape = broadcast(&shape, self.shape(id))?;
        }
        let v = vars("i", shape.len());
        let access: Vec<String> = ids.iter().map(|&id| self.broadcast_access(id, &v)).collect::<R<_>>()?;
        self.emit_def(out, shape, rhs(&access))
    }

    /// `Expand`: the input broadcast (both ways, as NumPy) with a constant shape.
    fn expand(&mut self, n: &NodeProto) -> R {
        Attrs::new(n, &[])?;
        let ins = self.inputs(n, 2, 2)?;
        let (x, s) = (Self::required(&ins, 0)?, Self::required(&ins, 1)?);
        let out = self.output(n)?;
        let target = self.int_constant(s, "the shape")?;
        let target: Vec<usize> = target
            .iter()
            .map(|&d| usize::try_from(d).ok().filter(|d| (1..=1 << 24).contains(d)))
            .collect::<Option<_>>()
            .ok_or_else(|| format!("shape {target:?}: sizes from 1 to 2^24 are supported"))?;
        let shape = broadcast(self.shape(x), &target)?;
        if shape == self.shape(x) {
            return self.alias(out, x);
        }
        let v = vars("i", shape.len());
        let rhs = self.broadcast_access(x, &v)?;
        self.emit_def(out, shape, rhs)
    }

    fn pow(&mut self, n: &NodeProto) -> R {
        Attrs::new(n, &[])?;
        let ins = self.inputs(n, 2, 2)?;
        let (x, e) = (Self::required(&ins, 0)?, Self::required(&ins, 1)?);
        let exponent = self.constant(e).filter(|v| v.len() == 1).map(|v| v.as_f64()[0]);
        let out = self.output(n)?;
        match exponent {
            Some(p) if broadcast(self.shape(x), self.shape(e))? == self.shape(x) => {
                let text = match p {
                    1.0 => return self.alias(out, x),
                    2.0 => |x: &str| format!("{x} * {x}"),
                    3.0 => |x: &str| format!("{x} * {x} * {x}"),
                    0.5 => |x: &str| format!("sqrt({x})"),
                    _ => {
                        let l = literal(p)?;
                        return self.unary_with(n, x, None, |x| format!("pow({x}, {l})"));
                    }
                };
                self.unary_with(n, x, None, text)
            }
            _ => {
                let shape = broadcast(self.shape(x), self.shape(e))?;
                let v = vars("i", shape.len());
                let rhs = format!("pow({}, {})", self.broadcast_access(x, &v)?, self.broadcast_access(e, &v)?);
                self.emit_def(out, shape, rhs)
            }
        }
    }

    // ------------------------------------------------------------ convolution, pooling, normalization

    fn conv(&mut self, n: &NodeProto) -> R {
        let a = Attrs::new(n, &["auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"])?;
        let ins = self.inputs(n, 2, 3)?;
        let (x, w) = (Self::required(&ins, 0)?, Self::required(&ins, 1)?);
        let bias = ins.get(2).copied().flatten();
        let (xs, ws) = (self.shape(x).to_vec(), self.shape(w).to_vec());
        if xs.len() == 3 && ws.len() == 3 {
            return self.conv1d(n, &a, x, w, bias);
        }
        if xs.len() == 5 && ws.len() == 5 {
            return self.conv3d(n, &a, x, w, bias);
        }
        if xs.len() != 4 || ws.len() != 4 {
            return Err(format!(
                "input of rank {} and weight of rank {}: only 2-D convolution (NCHW input, KCRS weight) is supported",
                xs.len(),
                ws.len()
            ));
        }
        let groups = a.int("group", 1)?;
        let g =
            usize::try_from(groups).ok().filter(|&g| (1..=xs[1]).contains(&g)).ok_or(format!("group = {groups}"))?;
        if xs[1] % g != 0 || ws[1] * g != xs[1] || ws[0] % g != 0 {
            return Err(format!(
                "input channels {}, weight {:?} and group {g} do not fit (weight [K, C/group, R, S] with K divisible by group)",
                xs[1], ws
            ));
        }
        if let Some(k) = a.ints("kernel_shape")? {
            if k != [ws[2] as i64, ws[3] as i64] {
                return Err(format!("kernel_shape {k:?} differs from the weight's {:?}", &ws[2..]));
            }
        }
        if let Some(b) = bias {
            if self.shape(b) != [ws[0]] {
                return Err(format!("bias of shape {:?}, expected [{}]", self.shape(b), ws[0]));
            }
        }
        let stride = same_on_both_axes("strides", a.ints("strides")?, 1)?;
        let dilation = same_on_both_axes("dilations", a.ints("dilations")?, 1)?;
        let window = [dilation * (ws[2] - 1) + 1, dilation * (ws[3] - 1) + 1];
        let pads = pads(&a, [xs[2], xs[3]], window, stride)?;
        let out = self.output(n)?;
        let oh = conv_out(xs[2], pads[0] + pads[2], window[0], stride)?;
        let ow = conv_out(xs[3], pads[1] + pads[3], window[1], stride)?;
        let mut input = self.tensor(x)?;
        let mut pad = pads[0];
        if pads.iter().any(|&p| p != pads[0]) {
            // Unequal padding: an explicit pad, then an unpadded convolution.
            let [t, l, b, r] = pads;
            let padded = format!("{out}#pad");
            let call = format!("pad({input}, b0 = 0, b1 = 0, b2 = {t}, b3 = {l}, a0 = 0, a1 = 0, a2 = {b}, a3 = {r})");
            self.emit_call(&padded, vec![xs[0], xs[1], xs[2] + t + b, xs[3] + l + r], call)?;
            input = self.value(self.lookup(&padded)?).ident.clone();
            pad = 0;
        }
        let mut args = vec![input, self.tensor(w)?];
        let name = match bias {
            Some(b) => {
                args.push(self.tensor(b)?);
                NnOp::Conv2d(Epilogue::Bias)
            }
            None => NnOp::Conv2d(Epilogue::None),
        };
        args.extend(keyword_args(&[
            ("pad", pad, 0),
            ("stride", stride, 1),
            ("dilation", dilation, 1),
            ("groups", g, 1),
        ]));
        self.emit_call(out, vec![xs[0], ws[0], oh, ow], format!("{name}({})", args.join(", ")))
    }

    /// `conv_transpose2d` (PyTorch's ConvTranspose2d): one group, no
    /// dilation, the same stride, padding and output padding on both axes.
    fn conv_transpose(&mut self, n: &NodeProto) -> R {
        let a = Attrs::new(
            n,
            &["auto_pad", "dilations", "group", "kernel_shape", "output_padding", "output_shape", "pads", "strides"],
        )?;
        let ins = self.inputs(n, 2, 3)?;
        let (x, w) = (Self::required(&ins, 0)?, Self::required(&ins, 1)?);
        let bias = ins.get(2).copied().flatten();
        let (xs, ws) = (self.shape(x).to_vec(), self.shape(w).to_vec());
        if xs.len() != 4 || ws.len() != 4 || ws[0] != xs[1] {
            return Err(format!(
                "input {xs:?} and weight {ws:?}: only 2-D transposed convolution (NCHW input, weight [C, K, R, S]) is supported"
            ));
        }
        if a.int("group", 1)? != 1 {
            return Err(format!("group = {}: only one group is supported", a.int("group", 1)?));
        }
        if same_on_both_axes("dilations", a.ints("dilations")?, 1)? != 1 {
            return Err("dilations other than 1 are not supported".into());
        }
        if let Some(k) = a.ints("kernel_shape")? {
            if k != [ws[2] as i64, ws[3] as i64] {
                return Err(format!("kernel_shape {k:?} differs from the weight's {:?}", &ws[2..]));
            }
        }
        if a.string("auto_pad", "NOTSET")? != "NOTSET" {
            return Err(format!("auto_pad = \"{}\" is not supported", a.string("auto_pad", "NOTSET")?));
        }
        if let Some(b) = bias {
            if self.shape(b) != [ws[1]] {
                return Err(format!("bias of shape {:?}, expected [{}]", self.shape(b), ws[1]));
            }
        }
        let stride = same_on_both_axes("strides", a.ints("strides")?, 1)?;
        let extra = match a.ints("output_padding")?.as_deref() {
            None => 0,
            Some(&[p, q]) if p == q && (0..stride as i64).contains(&p) => p as usize,
            Some(other) => {
                return Err(format!("output_padding = {other:?}: equal values below the stride are supported"))
            }
        };
        let pad = match a.ints("pads")?.as_deref() {
            None => 0,
            Some(&[t, l, b, r]) if [l, b, r].iter().all(|&p| p == t) && (0..1 << 20).contains(&t) => t as usize,
            Some(other) => return Err(format!("pads = {other:?}: only equal padding on every side is supported")),
        };
        let side = |d: usize, r: usize| ((d - 1) * stride + r + extra).checked_sub(2 * pad).filter(|&o| o > 0);
        let (Some(oh), Some(ow)) = (side(xs[2], ws[2]), side(xs[3], ws[3])) else {
            return Err(format!("pads = {pad} leave no output"));
        };
        if let Some(shape) = a.ints("output_shape")? {
            // The spatial shape only, as ONNX Runtime reads it (it refuses [N, C, H, W]).
            if shape[..] != [oh as i64, ow as i64] {
                return Err(format!(
                    "output_shape = {shape:?}: only the spatial shape the padding gives, [{oh}, {ow}], is supported"
                ));
            }
        }
        let out = self.output(n)?;
        let mut args = vec![self.tensor(x)?, self.tensor(w)?];
        let name = match bias {
            Some(b) => {
                args.push(self.tensor(b)?);
                NnOp::ConvTranspose2d(Epilogue::Bias)
            }
            None => NnOp::ConvTranspose2d(Epilogue::None),
        };
        args.extend(keyword_args(&[("stride", stride, 1), ("pad", pad, 0), ("output_padding", extra, 0)]));
        self.emit_call(out, vec![xs[0], ws[1], oh, ow], format!("{name}({})", args.join(", ")))
    }

    /// `conv3d`: one group, no dilation, the same stride and padding on every side of every axis.
    fn conv3d(&mut self, n: &NodeProto, a: &Attrs, x: ValueId, w: ValueId, bias: Option<ValueId>) -> R {
        let (xs, ws) = (self.shape(x).to_vec(), self.shape(w).to_vec());
        if a.int("group", 1)? != 1 || ws[1] != xs[1] {
            return Err(format!("input {xs:?}, weight {ws:?}: 3-D convolution of one group is supported"));
        }
        let same = |name: &str, v: Option<Vec<i64>>, len: usize, default: i64| -> R<usize> {
            match v.as_deref() {
                None => Ok(default as usize),
                Some(v) if v.len() == len && v.iter().all(|&e| e == v[0]) && (0..1 << 20).contains(&v[0]) => {
                    Ok(v[0] as usize)
                }
                Some(other) => Err(format!("{name} = {other:?}: only equal values on every axis are supported")),
            }
        };
        if same("dilations", a.ints("dilations")?, 3, 1)? != 1 {
            return Err("dilations other than 1 are not supported".into());
        }
        if a.string("auto_pad", "NOTSET")? != "NOTSET" {
            return Err("auto_pad is not supported for 3-D convolutions".into());
        }
        if let Some(k) = a.ints("kernel_shape")? {
            if k != [ws[2] as i64, ws[3] as i64, ws[4] as i64] {
                return Err(format!("kernel_shape {k:?} differs from the weight's {:?}", &ws[2..]));
            }
        }
        if let Some(b) = bias {
            if self.shape(b) != [ws[0]] {
                return Err(format!("bias of shape {:?}, expected [{}]", self.shape(b), ws[0]));
            }
        }
        let stride = same("strides", a.ints("strides")?, 3, 1)?.max(1);
        let pad = same("pads", a.ints("pads")?, 6, 0)?;
        let side = |k: usize| conv_out(xs[k], 2 * pad, ws[k], stride);
        let shape = vec![xs[0], ws[0], side(2)?, side(3)?, side(4)?];
        let out = self.output(n)?;
        let mut args = vec![self.tensor(x)?, self.tensor(w)?];
        let name = match bias {
            Some(b) => {
                args.push(self.tensor(b)?);
                NnOp::Conv3d(Epilogue::Bias)
            }
            None => NnOp::Conv3d(Epilogue::None),
        };
        args.extend(keyword_args(&[("pad", pad, 0), ("stride", stride, 1)]));
        self.emit_call(out, shape, format!("{name}({})", args.join(", ")))
    }

    /// `conv1d`: groups, dilation, stride; equal padding at both ends.
    fn conv1d(&mut self, n: &NodeProto, a: &Attrs, x: ValueId, w: ValueId, bias: Option<ValueId>) -> R {
        let (xs, ws) = (self.shape(x).to_vec(), self.shape(w).to_vec());
        let groups = a.int("group", 1)?;
        let g =
            usize::try_from(groups).ok().filter(|&g| (1..=xs[1]).contains(&g)).ok_or(format!("group = {groups}"))?;
        if ws[1] * g != xs[1] || ws[0] % g != 0 {
            return Err(format!("input channels {}, weight {ws:?} and group {g} do not fit", xs[1]));
        }
        if let Some(b) = bias {
            if self.shape(b) != [ws[0]] {
                return Err(format!("bias of shape {:?}, expected [{}]", self.shape(b), ws[0]));
            }
        }
        let one = |name: &str| -> R<usize> {
            match a.ints(name)?.as_deref() {
                None => Ok(1),
                Some(&[v]) if (1..=1 << 20).contains(&v) => Ok(v as usize),
                Some(v) => Err(format!("{name} = {v:?}: expected one value")),
            }
        };
        if a.ints("kernel_shape")?.is_some_and(|k| k != [ws[2] as i64]) {
            return Err(format!("kernel_shape differs from the weight's [{}]", ws[2]));
        }
        let (stride, dilation) = (one("strides")?, one("dilations")?);
        let window = dilation * (ws[2] - 1) + 1;
        let pads = pads_nd(a, &xs[2..], &[window], &[stride])?;
        let (pb, pe) = pads[0];
        if pb != pe {
            return Err(format!(
                "pads {pb} and {pe}: only equal padding at both ends is supported for 1-D convolution"
            ));
        }
        let out = self.output(n)?;
        let ol = conv_out(xs[2], pb + pe, window, stride)?;
        let mut args = vec![self.tensor(x)?, self.tensor(w)?];
        if let Some(b) = bias {
            args.push(self.tensor(b)?);
        }
        args.extend(keyword_args(&[
            ("pad", pb, 0),
            ("stride", stride, 1),
            ("dilation", dilation, 1),
            ("groups", g, 1),
        ]));
        let name = if bias.is_some() { NnOp::Conv1d(Epilogue::Bias) } else { NnOp::Conv1d(Epilogue::None) };
        self.emit_call(out, vec![xs[0], ws[0], ol], format!("{name}({})", args.join(", ")))
    }

    fn batch_norm(&mut self, n: &NodeProto) -> R {
        let a = Attrs::new(n, &["epsilon", "momentum", "training_mode", "spatial", "is_test"])?;
        if a.int("training_mode", 0)? != 0 {
            return Err("training_mode = 1: only inference is supported".into());
        }
        if a.int("spatial", 1)? != 1 {
            return Err("spatial = 0 is not supported".into());
        }
        let ins = self.inputs(n, 5, 5)?;
        let ids: Vec<ValueId> = (0..5).map(|i| Self::required(&ins, i)).collect::<R<_>>()?;
        let out = self.output(n)?;
        let xs = self.shape(ids[0]).to_vec();
        if !(2..=4).contains(&xs.len()) {
            return Err(format!("input of rank {}: batch normalization of rank 2 to 4 inputs is supported", xs.len()));
        }
        for &p in &ids[1..] {
            if self.shape(p) != [xs[1]] {
                return Err(format!("parameter of shape {:?}, expected [{}]", self.shape(p), xs[1]));
            }
        }
        let mut args = ids.iter().map(|&i| self.tensor(i)).collect::<R<Vec<_>>>()?;
        let eps = a.float("epsilon", 1e-5)?;
        if eps != 1e-5 {
            args.push(format!("eps = {}", literal(eps as f64)?));
        }
        self.emit_call(out, xs, format!("batch_norm({})", args.join(", ")))
    }

    fn pool(&mut self, n: &NodeProto) -> R {
        let max = n.op_type == "MaxPool";
        let known: &[&str] = if max {
            &["auto_pad", "ceil_mode", "dilations", "kernel_shape", "pads", "storage_order", "strides"]
        } else {
            &["auto_pad", "ceil_mode", "count_include_pad", "dilations", "kernel_shape", "pads", "strides"]
        };
        let a = Attrs::new(n, known)?;
        let x = Self::required(&self.inputs(n, 1, 1)?, 0)?;
        let out = self.output(n)?;
        let xs = self.shape(x).to_vec();
        if !(xs.len() == 3 || xs.len() == 4) {
            return Err(format!("input of rank {}: 1-D and 2-D pooling (NCL, NCHW) are supported", xs.len()));
        }
        if a.int("storage_order", 0)? != 0 {
            return Err("storage_order = 1 is not supported".into());
        }
        let axes = xs.len() - 2;
        let per_axis = |name: &str, default: usize| -> R<Vec<usize>> {
            match a.ints(name)? {
                None => Ok(vec![default; axes]),
                Some(v) if v.len() == axes && v.iter().all(|d| (1..=1 << 20).contains(d)) => {
                    Ok(v.iter().map(|&d| d as usize).collect())
                }
                Some(v) => Err(format!("{name} = {v:?}: expected {axes} values from 1 to 2^20")),
            }
        };
        let k = match a.ints("kernel_shape")? {
            Some(_) => per_axis("kernel_shape", 1)?,
            None => return Err("kernel_shape is required".into()),
        };
        let (stride, dilation) = (per_axis("strides", 1)?, per_axis("dilations", 1)?);
        let window: Vec<usize> = (0..axes).map(|j| dilation[j] * (k[j] - 1) + 1).collect();
        let pads = pads_nd(&a, &xs[2..], &window, &stride)?;
        let ceil = a.int("ceil_mode", 0)? != 0;
        let mut shape = xs[..2].to_vec();
        for j in 0..axes {
            shape.push(pool_out(xs[2 + j], pads[j], window[j], stride[j], ceil)?);
        }
        let floor_shape: Vec<usize> =
            (0..axes).map(|j| pool_out(xs[2 + j], pads[j], window[j], stride[j], false)).collect::<R<_>>()?;
        let include_pad = a.int("count_include_pad", 0)? != 0;
        let padded = pads.iter().any(|&(b, e)| b + e > 0);
        if !max && include_pad && shape[2..] != floor_shape[..] {
            return Err(
                "ceil_mode = 1 with count_include_pad = 1 gives windows beyond the padding: not supported".into()
            );
        }
        // std.nn's pools: square 2-D windows, one stride, equal padding, no dilation.
        let p = pads[0].0;
        let square = axes == 2 && k[0] == k[1] && stride[0] == stride[1] && dilation == [1, 1];
        let std_form = square && pads.iter().all(|&(b, e)| b == p && e == p) && shape[2..] == floor_shape[..];
        // Quantized data (u8, i8) is pooled by the expression, padded with the type's least value.
        let ty = self.value(x).ty;
        if std_form && (max || include_pad || p == 0) && ty == Ty::F32 {
            let mut args = vec![self.tensor(x)?, format!("k = {}", k[0]), format!("stride = {}", stride[0])];
            if p > 0 {
                args.push(format!("pad = {p}"));
            }
            let name = if max { NnOp::MaxPool2d } else { NnOp::AvgPool2d };
            return self.emit_call(out, shape, format!("{name}({})", args.join(", ")));
        }
        // Otherwise the window as an expression: positions outside the input are
        // -inf for max, and left out of the average (or counted as zeros).
        let v = vars("i", shape.len());
        let mut conds = Vec::new();
        let mut idx = vec![v[0].clone(), v[1].clone()];
        let mut ranges = Vec::new();
        let mut count_ranges = Vec::new();
        for j in 0..axes {
            let (size, (pb, _)) = (xs[2 + j], pads[j]);
            let mut pos = if stride[j] == 1 { v[2 + j].clone() } else { format!("{} * {}", v[2 + j], stride[j]) };
            pos = match dilation[j] {
                1 => format!("{pos} + r{j}"),
                d => format!("{pos} + r{j} * {d}"),
            };
            let last = (shape[2 + j] - 1) * stride[j] + window[j] - 1;
            if pb > 0 {
                conds.push(format!("{pos} >= {pb}"));
            }
            if last >= size + pb {
                conds.push(format!("{pos} < {}", size + pb));
            }
            idx.push(if pb > 0 { format!("{pos} - {pb}") } else { pos });
            ranges.push(format!("r{j} in 0..{}", k[j]));
            count_ranges.push(format!("r{} in 0..{}", axes + j, k[j]));
        }
        let access = format!("{}[{}]", self.tensor(x)?, idx.join(", "));
        let cond = conds.join(" && ");
        let guarded = |value: &str, outside: &str| {
            if conds.is_empty() {
                value.to_string()
            } else {
                format!("select({cond}, {value}, {outside})")
            }
        };
        let rhs = if max {
            let least = match ty.q8_range() {
                Some((lo, _)) => format!("{}({lo})", ty.name()),
                None => "-inf".into(),
            };
            format!("max[{}]({})", ranges.join(", "), guarded(&access, &least))
        } else {
            let total = format!("sum[{}]({})", ranges.join(", "), guarded(&access, "0.0"));
            if include_pad || !padded {
                format!("{total} / {}", literal(k.iter().product::<usize>() as f64)?)
            } else {
                // The count uses its own variables: a second reduction over the same window.
                let count_cond =
                    (0..axes).fold(cond.clone(), |c, j| c.replace(&format!("r{j}"), &format!("r{}", axes + j)));
                format!("{total} / sum[{}](select({count_cond}, 1.0, 0.0))", count_ranges.join(", "))
            }
        };
        self.emit_def(out, shape, rhs)
    }

    /// GlobalAveragePool and GlobalMaxPool of NCHW inputs.
    fn global_pool(&mut self, n: &NodeProto) -> R {
        Attrs::new(n, &[])?;
        let x = Self::required(&self.inputs(n, 1, 1)?, 0)?;
        let out = self.output(n)?;
        let xs = self.shape(x).to_vec();
        if xs.len() != 4 {
            return Err(format!("input of rank {}: only NCHW inputs are supported", xs.len()));
        }
        let name = if n.op_type == "GlobalMaxPool" { NnOp::GlobalMaxPool2d } else { NnOp::GlobalAvgPool2d };
        let call = format!("{name}({})", self.tensor(x)?);
        self.emit_call(out, vec![xs[0], xs[1], 1, 1], call)
    }

    fn layer_norm(&mut self, n: &NodeProto) -> R {
        let a = Attrs::new(n, &["axis", "epsilon", "stash_type"])?;
        let ins = self.inputs(n, 2, 3)?;
        let (x, scale) = (Self::required(&ins, 0)?, Self::required(&ins, 1)?);
        let out = self.output(n)?;
        let xs = self.shape(x).to_vec();
        let axis = normalize_axis(a.int("axis", -1)?, xs.len())?;
        if n.output.iter().skip(1).any(|o| !o.is_empty()) {
            return Err("only the first output is supported (not the mean and inverse standard deviation)".into());
        }
        // The last axis of rank 2 and 3 inputs (`layer_norm`), or the last two
        // of rank 3 and 4 inputs (`layer_norm2`); other trailing axes (a
        // channels-last [N, H, W, C] tensor) through a reshape to rank 2.
        let last_two = axis + 2 == xs.len() && (xs.len() == 3 || xs.len() == 4);
        if !(axis + 1 == xs.len() && (xs.len() == 2 || xs.len() == 3) || last_two) {
            return self.layer_norm_flat(n, &a, x, scale, ins.get(2).copied().flatten(), axis);
        }
        let d = xs[axis..].to_vec();
        let bias = match ins.get(2).copied().flatten() {
            Some(b) => b,
            None => self.synthetic(format!("{out}#zero_bias"), d.clone(), vec![0.0; d.iter().product()])?,
        };
        for p in [scale, bias] {
            if self.shape(p) != d {
                return Err(format!("scale or bias of shape {:?}, expected {d:?}", self.shape(p)));
            }
        }
        let mut args = vec![self.tensor(x)?, self.tensor(scale)?, self.tensor(bias)?];
        let eps = a.float("epsilon", 1e-5)?;
        if eps != 1e-5 {
            args.push(format!("eps = {}", literal(eps as f64)?));
        }
        let name = if last_two { NnOp::LayerNorm2 } else { NnOp::LayerNorm };
        self.emit_call(out, xs, format!("{name}({})", args.join(", ")))
    }

    /// LayerNormalization over axes `axis..` of any rank: `layer_norm` of
    /// the input reshaped to [outer, inner], the scale and bias broadcast to
    /// the normalized shape and flattened, and the result reshaped back.
    fn layer_norm_flat(
        &mut self,
        n: &NodeProto,
        a: &Attrs,
        x: ValueId,
        scale: ValueId,
        bias: Option<ValueId>,
        axis: usize,
    ) -> R {
        let out = self.output(n)?.to_string();
        let xs = self.shape(x).to_vec();
        let d = xs[axis..].to_vec();
        let (outer, inner) = (xs[..axis].iter().product::<usize>(), d.iter().product::<usize>());
        let mut params = Vec::new();
        for (p, what) in [(Some(scale), "scale"), (bias, "bias")] {
            let flat = match p {
                None => self.synthetic(format!("{out}#zero_bias"), vec![inner], vec![0.0; inner])?,
                Some(p) => {
                    if broadcast(self.shape(p), &d).ok().as_deref() != Some(&d[..]) {
                        return Err(format!("{what} of shape {:?} does not broadcast to {d:?}", self.shape(p)));
                    }
                    let full = if self.shape(p) == d {
                        p
                    } else {
                        let v = vars("i", d.len());
                        let rhs = self.broadcast_access(p, &v)?;
                        self.emit_def(&format!("{out}#{what}"), d.clone(), rhs)?;
                        self.lookup(&format!("{out}#{what}"))?
                    };
                    self.reshape_named(&format!("{out}#{what}_flat"), full, vec![inner])?
                }
            };
            params.push(flat);
        }
        let flat = self.reshape_named(&format!("{out}#flat"), x, vec![outer, inner])?;
        let mut args = vec![self.tensor(flat)?, self.tensor(params[0])?, self.tensor(params[1])?];
        let eps = a.float("epsilon", 1e-5)?;
        if eps != 1e-5 {
            args.push(format!("eps = {}", literal(eps as f64)?));
        }
        let normed = format!("{out}#normed");
        self.emit_call(&normed, vec![outer, inner], format!("{}({})", NnOp::LayerNorm, args.join(", ")))?;
        let normed = self.lookup(&normed)?;
        self.reshape_into(&out, normed, xs)
    }

    fn softmax(&mut self, n: &NodeProto) -> R {
        let a = Attrs::new(n, &["axis"])?;
        let x = Self::required(&self.inputs(n, 1, 1)?, 0)?;
        let out = self.output(n)?;
        let xs = self.shape(x).to_vec();
        let default = if self.opset < 13 { 1 } else { -1 };
        let axis = normalize_axis(a.int("axis", default)?, xs.len())?;
        // Before opset 13 the axis flattens the trailing axes into one; it
        // is the last-axis softmax only when it is the last axis.
        // Opset 13 on: one axis. The last axis of ranks 2 to 4, or the channels
        // (axis 1) of ranks 3 and 4 (`softmax_dim1`, which opsets before 13
        // mean only for rank 2, where it is the last axis).
        let channels = axis == 1 && (xs.len() == 3 || xs.len() == 4) && self.opset >= 13;
        if !(axis + 1 == xs.len() && (2..=4).contains(&xs.len()) || channels) {
            return self.softmax_reshaped(n, x, axis);
        }
        let name = match (n.op_type == "LogSoftmax", channels) {
            (true, false) => NnOp::LogSoftmax,
            (false, false) => NnOp::Softmax,
            (true, true) => NnOp::LogSoftmaxDim1,
            (false, true) => NnOp::SoftmaxDim1,
        };
        let call = format!("{name}({})", self.tensor(x)?);
        self.emit_call(out, xs, call)
    }

    /// Softmax over any axis: the input reshaped to [outer, d, inner] (the
    /// axis alone from opset 13; the axis and every one after it, flattened,
    /// before), `softmax` over the last axis of [outer, d] or `softmax_dim1`
    /// of [outer, d, inner], reshaped back.
    fn softmax_reshaped(&mut self, n: &NodeProto, x: ValueId, axis: usize) -> R {
        let out = self.output(n)?.to_string();
        let xs = self.shape(x).to_vec();
        let outer: usize = xs[..axis].iter().product();
        let (d, inner) = if self.opset < 13 {
            (xs[axis..].iter().product::<usize>(), 1)
        } else {
            (xs[axis], xs[axis + 1..].iter().product::<usize>())
        };
        let log = n.op_type == "LogSoftmax";
        let (shape, name) = match (inner, log) {
            (1, false) => (vec![outer, d], NnOp::Softmax),
            (1, true) => (vec![outer, d], NnOp::LogSoftmax),
            (_, false) => (vec![outer, d, inner], NnOp::SoftmaxDim1),
            (_, true) => (vec![outer, d, inner], NnOp::LogSoftmaxDim1),
        };
        let flat = self.reshape_named(&format!("{out}#flat"), x, shape.clone())?;
        let call = format!("{name}({})", self.tensor(flat)?);
        let normed = format!("{out}#normed");
        self.emit_call(&normed, shape, call)?;
        let normed = self.lookup(&normed)?;
        self.reshape_into(&out, normed, xs)
    }

    /// Opset 23's Attention on 4-D Q, K, V without a mask, cache or softcap:
    /// `scaled_dot_product_attention` (`_causal` with `is_causal = 1`).
    fn attention(&mut self, n: &NodeProto) -> R {
        let a = Attrs::new(
            n,
            &[
                "is_causal",
                "kv_num_heads",
                "q_num_heads",
                "qk_matmul_output_mode",
                "scale",
                "softcap",
                "softmax_precision",
            ],
        )?;
        let ins = self.inputs(n, 3, 6)?;
        if ins[3..].iter().any(Option::is_some) {
            return Err("an attention mask or past key and value inputs are not supported".into());
        }
        if n.output.iter().skip(1).any(|o| !o.is_empty()) {
            return Err("only the first output (the attention result) is supported".into());
        }
        let (q, k, v) = (Self::required(&ins, 0)?, Self::required(&ins, 1)?, Self::required(&ins, 2)?);
        let (qs, ks, vs) = (self.shape(q).to_vec(), self.shape(k).to_vec(), self.shape(v).to_vec());
        let fits = qs.len() == 4
            && ks.len() == 4
            && vs.len() == 4
            && qs[..2] == ks[..2]
            && ks[..3] == vs[..3]
            && qs[3] == ks[3];
        if !fits {
            return Err(format!(
                "Q {qs:?}, K {ks:?}, V {vs:?}: 4-D [batch, heads, length, size] with equal heads are supported"
            ));
        }
        if a.float("softcap", 0.0)? != 0.0 || a.int("qk_matmul_output_mode", 0)? != 0 {
            return Err("softcap and qk_matmul_output_mode are not supported".into());
        }
        if a.has("scale") && (a.float("scale", 1.0)? as f64 - 1.0 / (qs[3] as f64).sqrt()).abs() > 1e-7 {
            return Err("a scale other than 1/√(head size) is not supported".into());
        }
        // ONNX's causal mask is aligned top-left, as PyTorch's and std.nn's.
        let causal = a.int("is_causal", 0)? != 0;
        let name = if causal { NnOp::ScaledDotProductAttentionCausal } else { NnOp::ScaledDotProductAttention };
        let call = format!("{name}({}, {}, {})", self.tensor(q)?, self.tensor(k)?, self.tensor(v)?);
        let out = self.output(n)?;
        self.emit_call(out, vec![qs[0], qs[1], qs[2], vs[3]], call)
    }

    // ------------------------------------------------------------ linear algebra

    fn gemm(&mut self, n: &NodeProto) -> R {
        let a = Attrs::new(n, &["alpha", "beta", "transA", "transB"])?;
        let ins = self.inputs(n, 2, 3)?;
        let (x, y) = (Self::required(&ins, 0)?, Self::required(&ins, 1)?);
        let c = ins.get(2).copied().flatten();
        let out = self.output(n)?;
        let (ta, tb) = (a.int("transA", 0)? != 0, a.int("transB", 0)? != 0);
        let (alpha, beta) = (a.float("alpha", 1.0)?, a.float("beta", 1.0)?);
        let (xs, ys) = (self.shape(x).to_vec(), self.shape(y).to_vec());
        if xs.len() != 2 || ys.len() != 2 {
            return Err(format!("operands of shapes {xs:?} and {ys:?}: Gemm takes matrices"));
        }
        let (m, k) = if ta { (xs[1], xs[0]) } else { (xs[0], xs[1]) };
        let (k2, nn) = if tb { (ys[1], ys[0]) } else { (ys[0], ys[1]) };
        if k != k2 {
            return Err(format!("inner dimensions differ: {k} and {k2}"));
        }
        let shape = vec![m, nn];
        if let Some(c) = c {
            broadcast(self.shape(c), &shape).ok().filter(|s| *s == shape).ok_or_else(|| {
                format!("C of shape {:?} does not broadcast to the result's [{m}, {nn}]", self.shape(c))
            })?;
        }
        // The common case, a fully connected layer: dense(X, W, b) = X·Wᵀ + b.
        let bias_row = c.filter(|&c| matches!(self.shape(c), [d] | [1, d] if *d == nn));
        let weight = if tb { Some(y) } else { self.transposed_constant(y)? };
        if let (false, 1.0, 1.0, Some(b), Some(w)) = (ta, alpha, beta, bias_row, weight) {
            let b = self.as_vector(b)?;
            let call = format!("dense({}, {}, {})", self.tensor(x)?, self.tensor(w)?, self.tensor(b)?);
            return self.emit_call(out, shape, call);
        }
        let v = vars("i", 2);
        let xa = if ta { format!("[r0, {}]", v[0]) } else { format!("[{}, r0]", v[0]) };
        let ya = if tb { format!("[{}, r0]", v[1]) } else { format!("[r0, {}]", v[1]) };
        let mut rhs = format!("sum[r0 in 0..{k}]({}{xa} * {}{ya})", self.tensor(x)?, self.tensor(y)?);
        if alpha != 1.0 {
            rhs = format!("{} * {rhs}", literal(alpha as f64)?);
        }
        if let Some(c) = c.filter(|_| beta != 0.0) {
            let ca = self.broadcast_access(c, &v)?;
            rhs =
                if beta == 1.0 { format!("{rhs} + {ca}") } else { format!("{rhs} + {} * {ca}", literal(beta as f64)?) };
        }
        self.emit_def(out, shape, rhs)
    }

    /// `Einsum`: the sum over the letters missing from the output of the
    /// product of the operands (explicit `->` or implicit output, `...`
    /// for leading axes, a letter repeated in one operand for a diagonal).
    fn einsum(&mut self, n: &NodeProto) -> R {
        let a = Attrs::new(n, &["equation"])?;
        let ins = self.inputs(n, 1, 8)?;
        let ids: Vec<ValueId> = (0..ins.len()).map(|i| Self::required(&ins, i)).collect::<R<_>>()?;
        let out = self.output(n)?;
        let eq: String = a.string("equation", "")?.chars().filter(|c| !c.is_whitespace()).collect();
        let (lhs, explicit) = match eq.split_once("->") {
            Some((l, r)) => (l.to_string(), Some(r.to_string())),
            None => (eq.clone(), None),
        };
        let terms: Vec<&str> = lhs.split(',').collect();
        if terms.len() != ids.len() {
            return Err(format!("equation `{eq}` has {} operands, the node {}", terms.len(), ids.len()));
        }
        // Each operand's axes as letters; `...` stands for its leading axes, named by digits.
        if eq.chars().any(|c| c.is_ascii_digit()) {
            return Err(format!("equation `{eq}`: subscripts are letters"));
        }
        let ell = ids
            .iter()
            .zip(&terms)
            .filter(|(_, t)| t.contains("..."))
            .map(|(&id, t)| (self.shape(id).len() + 3).saturating_sub(t.len()))
            .max()
            .unwrap_or(0);
        let expand = |t: &str, rank: usize| -> R<Vec<char>> {
            let mut axes = Vec::new();
            if let Some((pre, post)) = t.split_once("...") {
                let k = rank.checked_sub(pre.len() + post.len()).ok_or(format!("`{t}` has more letters than axes"))?;
                axes.extend(pre.chars());
                axes.extend((ell - k..ell).map(|d| char::from(b'0' + d as u8)));
                axes.extend(post.chars());
            } else {
                axes.extend(t.chars());
            }
            if axes.len() != rank || axes.iter().any(|c| !(c.is_ascii_alphanumeric())) || ell > 10 {
                return Err(format!("`{t}` does not name the {rank} axes of its operand"));
            }
            Ok(axes)
        };
        let mut sizes: Vec<(char, usize)> = Vec::new();
        let mut operands = Vec::new();
        for (&id, t) in ids.iter().zip(&terms) {
            let shape = self.shape(id).to_vec();
            let axes = expand(t, shape.len())?;
            for (&c, &d) in axes.iter().zip(&shape) {
                match sizes.iter().find(|(l, _)| *l == c) {
                    Some(&(_, e)) if e != d => return Err(format!("`{c}` has sizes {e} and {d}")),
                    Some(_) => {}
                    None => sizes.push((c, d)),
                }
            }
            operands.push((id, axes));
        }
        let output: Vec<char> = match &explicit {
            Some(r) => {
                let digits: Vec<char> = (0..ell).map(|d| char::from(b'0' + d as u8)).collect();
                let r = r.replace("...", &digits.iter().collect::<String>());
                r.chars().collect()
            }
            None => {
                let count =
                    |c: char| operands.iter().map(|(_, a)| a.iter().filter(|&&x| x == c).count()).sum::<usize>();
                let mut once: Vec<char> = sizes.iter().map(|&(c, _)| c).filter(|&c| count(c) == 1).collect();
                once.sort_by_key(|&c| (c.is_ascii_alphabetic(), c));
                once
            }
        };
        let size = |c: char| sizes.iter().find(|(l, _)| *l == c).map(|&(_, d)| d);
        let shape: Vec<usize> =
            output.iter().map(|&c| size(c).ok_or(format!("output letter `{c}` names no axis"))).collect::<R<_>>()?;
        let v = vars("i", output.len());
        let reduced: Vec<char> = sizes.iter().map(|&(c, _)| c).filter(|c| !output.contains(c)).collect();
        let var = |c: char| match output.iter().position(|&o| o == c) {
            Some(k) => v[k].clone(),
            None => format!("r{}", reduced.iter().position(|&x| x == c).unwrap_or(0)),
        };
        let mut factors = Vec::new();
        for (id, axes) in &operands {
            let idx: Vec<String> = axes.iter().map(|&c| var(c)).collect();
            factors.push(format!("{}[{}]", self.tensor(*id)?, idx.join(", ")));
        }
        let product = factors.join(" * ");
        let rhs = if reduced.is_empty() {
            product
        } else {
            let ranges: Vec<String> =
                reduced.iter().enumerate().map(|(k, &c)| format!("r{k} in 0..{}", size(c).unwrap_or(1))).collect();
            format!("sum[{}]({product})", ranges.join(", "))
        };
        self.emit_def(out, shape, rhs)
    }

    /// `w` transposed, when it is a constant matrix; made at import time.
    fn transposed_constant(&mut self, w: ValueId) -> R<Option<ValueId>> {
        let (shape, data) = match (&self.value(w).data, self.shape(w)) {
            (Some(Values::F32(d)), &[r, c]) => ([r, c], d.clone()),
            _ => return Ok(None),
        };
        let [r, c] = shape;
        let t: Vec<f32> = (0..c * r).map(|i| data[(i % r) * c + i / r]).collect();
        let name = format!("{}_t", self.value(w).ident);
        self.synthetic(name, vec![c, r], t).map(Some)
    }

    /// A `[1, N]` constant as an `[N]` one.
    fn as_vector(&mut self, b: ValueId) -> R<ValueId> {
        match (self.shape(b).len(), &self.value(b).data) {
            (1, _) => Ok(b),
            (_, Some(Values::F32(d))) => {
                let (d, name) = (d.clone(), format!("{}_row", self.value(b).ident));
                self.synthetic(name, vec![d.len()], d)
            }
            _ => Err("a bias of shape [1, N] must be a constant".into()),
        }
    }

    fn matmul(&mut self, n: &NodeProto) -> R {
        Attrs::new(n, &[])?;
        let ins = self.inputs(n, 2, 2)?;
        let (x, y) = (Self::required(&ins, 0)?, Self::required(&ins, 1)?);
        let out = self.output(n)?;
        let (xs, ys) = (self.shape(x).to_vec(), self.shape(y).to_vec());
        if xs.len() < 2 || ys.len() < 2 {
            return Err(format!("operands of shapes {xs:?} and {ys:?}: matrix-vector products are not supported"));
        }
        let (m, k) = (xs[xs.len() - 2], xs[xs.len() - 1]);
        let (k2, nn) = (ys[ys.len() - 2], ys[ys.len() - 1]);
        if k != k2 {
            return Err(format!("inner dimensions differ: {k} and {k2}"));
        }
        let batch = broadcast(&xs[..xs.len() - 2], &ys[..ys.len() - 2])?;
        let mut shape = batch.clone();
        shape.extend([m, nn]);
        if xs.len() == 2 && ys.len() == 2 {
            let call = format!("matmul({}, {})", self.tensor(x)?, self.tensor(y)?);
            return self.emit_call(out, shape, call);
        }
        if xs.len() == 3 && xs[..1] == ys[..ys.len() - 2] && ys.len() == 3 {
            let call = format!("batch_matmul({}, {})", self.tensor(x)?, self.tensor(y)?);
            return self.emit_call(out, shape, call);
        }
        let v = vars("i", shape.len());
        let r = shape.len();
        // Each operand is indexed like a broadcast batch, then its matrix axes.
        let index = |this: &mut Self, id: ValueId, rows: &str, cols: &str| -> R<String> {
            let s = this.shape(id).to_vec();
            let skip = r - s.len();
            let mut idx: Vec<String> =
                (0..s.len() - 2).map(|a| if s[a] == 1 { "0".into() } else { v[skip + a].clone() }).collect();
            idx.extend([rows.to_string(), cols.to_string()]);
            Ok(format!("{}[{}]", this.tensor(id)?, idx.join(", ")))
        };
        let xa = index(self, x, &v[r - 2], "r0")?;
        let ya = index(self, y, "r0", &v[r - 1])?;
        self.emit_def(out, shape, format!("sum[r0 in 0..{k}]({xa} * {ya})"))
    }

    // ------------------------------------------------------------ layout

    fn flatten(&mut self, n: &NodeProto) -> R {
        let a = Attrs::new(n, &["axis"])?;
        let x = Self::required(&self.inputs(n, 1, 1)?, 0)?;
        let xs = self.shape(x).to_vec();
        let axis = normalize_axis_inclusive(a.int("axis", 1)?, xs.len())?;
        let shape = vec![xs[..axis].iter().product(), xs[axis..].iter().product()];
        let f32_data = self.value(x).ty == Ty::F32 && self.constant(x).is_none();
        if f32_data && axis == 1 && (xs.len() == 3 || xs.len() == 4) && xs[2..].iter().any(|&d| d != 1) {
            let out = self.output(n)?;
            let call = format!("flatten({})", self.tensor(x)?);
            return self.emit_call(out, shape, call);
        }
        self.reshape_to(n, x, shape)
    }

    fn reshape(&mut self, n: &NodeProto) -> R {
        let a = Attrs::new(n, &["allowzero", "shape"])?;
        let (x, target) = if self.opset < 5 {
            let x = Self::required(&self.inputs(n, 1, 1)?, 0)?;
            (x, a.ints("shape")?.ok_or("the shape attribute is required")?)
        } else {
            let ins = self.inputs(n, 2, 2)?;
            let s = Self::required(&ins, 1)?;
            (Self::required(&ins, 0)?, self.int_constant(s, "the shape")?)
        };
        let xs = self.shape(x).to_vec();
        let allow_zero = a.int("allowzero", 0)? != 0;
        let total = elements(&xs).ok_or("too many elements")?;
        let mut shape = Vec::new();
        let mut infer = None;
        for (k, &d) in target.iter().enumerate() {
            match d {
                -1 if infer.is_none() => {
                    infer = Some(k);
                    shape.push(1)
                }
                0 if !allow_zero => shape.push(*xs.get(k).ok_or(format!("shape {target:?}: no axis {k} to copy"))?),
                d if (1..=1 << 40).contains(&d) => shape.push(d as usize),
                _ => return Err(format!("shape {target:?} is not supported")),
            }
        }
        if let Some(k) = infer {
            let known = elements(&shape).ok_or_else(|| format!("shape {target:?} has too many elements"))?;
            if known == 0 || !total.is_multiple_of(known) {
                return Err(format!("shape {target:?} does not fit {total} elements"));
            }
            shape[k] = total / known;
        }
        self.reshape_to(n, x, shape)
    }

    fn squeeze(&mut self, n: &NodeProto) -> R {
        let squeeze = n.op_type == "Squeeze";
        let a = Attrs::new(n, &["axes"])?;
        let ins = self.inputs(n, 1, 2)?;
        let x = Self::required(&ins, 0)?;
        let xs = self.shape(x).to_vec();
        let axes = match (self.opset < 13, ins.get(1).copied().flatten()) {
            (true, _) => a.ints("axes")?,
            (false, Some(id)) => Some(self.int_constant(id, "the axes")?),
            (false, None) => None,
        };
        let shape = if squeeze {
            let axes = match axes {
                Some(list) => list.iter().map(|&ax| normalize_axis(ax, xs.len())).collect::<R<Vec<_>>>()?,
                None => (0..xs.len()).filter(|&k| xs[k] == 1).collect(),
            };
            if let Some(&k) = axes.iter().find(|&&k| xs[k] != 1) {
                return Err(format!("axis {k} has size {}, not 1", xs[k]));
            }
            xs.iter().enumerate().filter(|(k, _)| !axes.contains(k)).map(|(_, &d)| d).collect()
        } else {
            let axes = axes.ok_or("the axes are required")?;
            let rank = xs.len() + axes.len();
            let axes = axes.iter().map(|&ax| normalize_axis(ax, rank)).collect::<R<Vec<_>>>()?;
            let mut rest = xs.iter();
            (0..rank).map(|k| if axes.contains(&k) { 1 } else { *rest.next().unwrap_or(&1) }).collect()
        };
        self.reshape_to(n, x, shape)
    }

    /// The elements of `x` in row-major order, in `shape`.
    fn reshape_to(&mut self, n: &NodeProto, x: ValueId, shape: Vec<usize>) -> R {
        let out = self.output(n)?;
        self.reshape_into(out, x, shape)
    }

    /// `x` reshaped, as a value the importer names (`x` itself when the
    /// shape is its own).
    fn reshape_named(&mut self, name: &str, x: ValueId, shape: Vec<usize>) -> R<ValueId> {
        if self.shape(x) == shape.as_slice() {
            return Ok(x);
        }
        self.reshape_into(name, x, shape)?;
        self.lookup(name)
    }

    /// Value `out` is `x`'s elements in row-major order, in `shape`.
    fn reshape_into(&mut self, out: &str, x: ValueId, shape: Vec<usize>) -> R {
        let xs = self.shape(x).to_vec();
        if elements(&shape).is_none() || elements(&xs) != elements(&shape) {
            return Err(format!("cannot reshape {xs:?} to {shape:?}: different element counts"));
        }
        if xs == shape {
            return self.alias(out, x);
        }
        if let Some(data) = self.constant(x).cloned() {
            return self.add(out, shape, Some(data)).map(|_| ());
        }
        let v = vars("i", shape.len());
        let linear = linear_index(&v, &shape);
        let total: usize = shape.iter().product();
        let mut stride = total;
        let mut idx = Vec::new();
        for &d in &xs {
            stride /= d;
            let i = if d == 1 {
                "0".to_string()
            } else {
                let q = if stride == 1 { linear.clone() } else { format!("{} / {stride}", parenthesized(&linear)) };
                // No modulo where the quotient stays below the axis's size (the first axis of size > 1).
                if total / stride <= d {
                    q
                } else {
                    format!("{} % {d}", parenthesized(&q))
                }
            };
            idx.push(i);
        }
        let rhs = format!("{}[{}]", self.tensor(x)?, idx.join(", "));
        self.emit_def(out, shape, rhs)
    }

    fn transpose(&mut self, n: &NodeProto) -> R {
        let x = Self::required(&self.inputs(n, 1, 1)?, 0)?;
        let out = self.output(n)?;
        let xs = self.shape(x).to_vec();
        let perm = transpose_perm(n, xs.len())?;
        if perm.iter().enumerate().all(|(k, &p)| k == p) {
            return self.alias(out, x);
        }
        let shape: Vec<usize> = perm.iter().map(|&p| xs[p]).collect();
        if (2..=4).contains(&xs.len()) && self.value(x).ty == Ty::F32 {
            let mut args = vec![self.tensor(x)?];
            args.extend(perm.iter().enumerate().map(|(k, p)| format!("p{k} = {p}")));
            return self.emit_call(out, shape, format!("transpose({})", args.join(", ")));
        }
        let v = vars("i", shape.len());
        let mut idx = vec![String::new(); xs.len()];
        for (k, &p) in perm.iter().enumerate() {
            idx[p] = v[k].clone();
        }
        let rhs = format!("{}[{}]", self.tensor(x)?, idx.join(", "));
        self.emit_def(out, shape, rhs)
    }

    fn concat(&mut self, n: &NodeProto) -> R {
        let a = Attrs::new(n, &["axis"])?;
        let ins = self.inputs(n, 1, usize::MAX)?;
        let ids: Vec<ValueId> = (0..ins.len()).map(|i| Self::required(&ins, i)).collect::<R<_>>()?;
        let out = self.output(n)?;
        let first = self.shape(ids[0]).to_vec();
        if !a.has("axis") {
            return Err("the axis attribute is required".into());
        }
        let axis = normalize_axis(a.int("axis", 0)?, first.len())?;
        let mut offsets = Vec::new();
        let mut total = 0;
        for &id in &ids {
            let s = self.shape(id);
            let fits =
                s.len() == first.len() && s.iter().zip(&first).enumerate().all(|(k, (a, b))| k == axis || a == b);
            if !fits {
                return Err(format!("inputs of shapes {first:?} and {s:?} cannot be joined along axis {axis}"));
            }
            offsets.push(total);
            total += s[axis];
        }
        if ids.len() == 1 {
            return self.alias(out, ids[0]);
        }
        let mut shape = first;
        shape[axis] = total;
        let v = vars("i", shape.len());
        let mut rhs = String::new();
        for (j, &id) in ids.iter().enumerate().rev() {
            let (lo, hi) = (offsets[j], offsets[j] + self.shape(id)[axis]);
            let mut idx = v.clone();
            if lo > 0 {
                idx[axis] = format!("{} - {lo}", v[axis]);
            }
            let access = format!("{}[{}]", self.tensor(id)?, idx.join(", "));
            // Inputs are tested in order, so each one's lower bound is the
            // false branch of the test before it, and the last needs no test.
            rhs = if rhs.is_empty() { access } else { format!("select({} < {hi}, {access}, {rhs})", v[axis]) };
        }
        self.emit_def(out, shape, rhs)
    }

    /// Constant starts, ends, axes and steps (inputs from opset 10, attributes before).
    fn slice(&mut self, n: &NodeProto) -> R {
        let (x, plan) = self.slice_plan(n, false)?;
        let out = self.output(n)?;
        let v = vars("i", self.shape(x).len());
        let (mut shape, mut idx) = (self.shape(x).to_vec(), v.clone());
        for &(ax, start, step, len) in &plan {
            shape[ax] = len;
            idx[ax] = match (start, step) {
                (0, 1) => v[ax].clone(),
                (s0, 1) => format!("{} + {s0}", v[ax]),
                (s0, st) => format!("{s0} + {} * {st}", v[ax]),
            };
        }
        let rhs = format!("{}[{}]", self.tensor(x)?, idx.join(", "));
        self.emit_def(out, shape, rhs)
    }

    /// The sliced tensor, and each sliced axis; an empty slice only where
    /// `empty_ok` (of a constant: an empty list of dimensions).
    fn slice_plan(&self, n: &NodeProto, empty_ok: bool) -> R<(ValueId, Vec<SlicedAxis>)> {
        let a = Attrs::new(n, &["starts", "ends", "axes"])?;
        let (x, starts, ends, axes, steps) = if self.opset < 10 {
            let x = Self::required(&self.inputs(n, 1, 1)?, 0)?;
            let need = |k: &str| a.ints(k)?.ok_or_else(|| format!("the {k} attribute is required"));
            (x, need("starts")?, need("ends")?, a.ints("axes")?, None)
        } else {
            let ins = self.inputs(n, 3, 5)?;
            let list = |i: usize, what: &str| -> R<Option<Vec<i64>>> {
                ins.get(i).copied().flatten().map(|id| self.int_constant(id, what)).transpose()
            };
            let (starts, ends) = (list(1, "starts")?.unwrap_or_default(), list(2, "ends")?.unwrap_or_default());
            (Self::required(&ins, 0)?, starts, ends, list(3, "axes")?, list(4, "steps")?)
        };
        let xs = self.shape(x);
        let axes = match axes {
            Some(list) => list.iter().map(|&ax| normalize_axis(ax, xs.len())).collect::<R<Vec<_>>>()?,
            None => (0..starts.len()).collect(),
        };
        let steps = steps.unwrap_or_else(|| vec![1; axes.len()]);
        if starts.len() != axes.len() || ends.len() != axes.len() || steps.len() != axes.len() {
            return Err("starts, ends, axes and steps differ in length".into());
        }
        let mut plan = Vec::new();
        for (j, &ax) in axes.iter().enumerate() {
            let (d, step) = (xs[ax] as i64, steps[j]);
            if step == 0 {
                return Err("a step of 0".into());
            }
            // ONNX: negative positions count from the end; then clamp to the axis.
            let at = |p: i64| if p < 0 { p.saturating_add(d) } else { p };
            let (lo, hi) = if step > 0 { (0, d) } else { (-1, d - 1) };
            let (start, end) = (at(starts[j]).clamp(lo, hi), at(ends[j]).clamp(lo, hi));
            let len = if step > 0 { (end - start).max(0) } else { (start - end).max(0) };
            let len = (len + step.abs() - 1) / step.abs();
            if len == 0 && !empty_ok {
                return Err(format!("the slice of axis {ax} is empty: not supported"));
            }
            plan.push((ax, start, step, len as usize));
        }
        Ok((x, plan))
    }

    /// Every output is a slice along the axis.
    fn split(&mut self, n: &NodeProto) -> R {
        let a = Attrs::new(n, &["axis", "split", "num_outputs"])?;
        let ins = self.inputs(n, 1, 2)?;
        let x = Self::required(&ins, 0)?;
        let xs = self.shape(x).to_vec();
        let axis = normalize_axis(a.int("axis", 0)?, xs.len())?;
        let parts = n.output.len();
        let sizes: Vec<usize> = match (ins.get(1).copied().flatten(), a.ints("split")?) {
            (Some(id), _) => self.int_constant(id, "the split sizes")?.iter().map(|&d| d.max(0) as usize).collect(),
            (None, Some(list)) => list.iter().map(|&d| d.max(0) as usize).collect(),
            // Equal parts, the last one smaller (opset 18's num_outputs).
            (None, None) => {
                let each = xs[axis].div_ceil(parts.max(1));
                (0..parts).map(|i| each.min(xs[axis].saturating_sub(i * each))).collect()
            }
        };
        if sizes.len() != parts || sizes.iter().sum::<usize>() != xs[axis] || sizes.contains(&0) {
            return Err(format!("split sizes {sizes:?} do not divide axis {axis} of {xs:?} into {parts} outputs"));
        }
        let mut offset = 0;
        for (o, &len) in n.output.iter().zip(&sizes) {
            if !o.is_empty() {
                let v = vars("i", xs.len());
                let mut idx = v.clone();
                if offset > 0 {
                    idx[axis] = format!("{} + {offset}", v[axis]);
                }
                let mut shape = xs.clone();
                shape[axis] = len;
                let rhs = format!("{}[{}]", self.tensor(x)?, idx.join(", "));
                self.emit_def(o, shape, rhs)?;
            }
            offset += len;
        }
        Ok(())
    }

    /// Constant indices: one, or a list (a chain of selects, at most 64).
    fn gather(&mut self, n: &NodeProto) -> R {
        let ins = self.inputs(n, 2, 2)?;
        let i = Self::required(&ins, 1)?;
        if self.constant(i).is_none() || self.shape(i).len() > 1 || self.shape(i).iter().product::<usize>() > 64 {
            if self.constant(i).is_some() {
                self.gather_plan(n)?; // the indices checked against the axis
            }
            return self.gather_by_data(n, Self::required(&ins, 0)?, i);
        }
        let (x, axis, ishape, indices) = self.gather_plan(n)?;
        let out = self.output(n)?;
        let xs = self.shape(x).to_vec();
        let mut shape = xs[..axis].to_vec();
        shape.extend(&ishape);
        shape.extend(&xs[axis + 1..]);
        let v = vars("i", shape.len());
        let t = self.tensor(x)?;
        let at = |k: String| {
            let mut idx: Vec<String> = v[..axis].to_vec();
            idx.push(k);
            idx.extend(v[axis + ishape.len()..].iter().cloned());
            format!("{t}[{}]", idx.join(", "))
        };
        let rhs = if ishape.is_empty() {
            at(indices[0].to_string())
        } else if indices.windows(2).all(|w| w[1] == w[0] + 1) {
            at(if indices[0] == 0 { v[axis].clone() } else { format!("{} + {}", v[axis], indices[0]) })
        } else {
            let mut e = at(indices[indices.len() - 1].to_string());
            for (j, &k) in indices.iter().enumerate().rev().skip(1) {
                e = format!("select({} == {j}, {}, {e})", v[axis], at(k.to_string()));
            }
            e
        };
        self.emit_def(out, shape, rhs)
    }

    /// A Gather whose indices are an integer input (token ids into an
    /// embedding): each output element a one-hot sum over the axis, which
    /// texc computes as a load of the picked element (see
    /// `texc_schedules::normalize::one_hot_gather`). A negative index counts
    /// from the end, as in ONNX; one outside the axis gives 0 (ONNX Runtime
    /// refuses it).
    fn gather_by_data(&mut self, n: &NodeProto, x: ValueId, i: ValueId) -> R {
        let a = Attrs::new(n, &["axis"])?;
        let axis = normalize_axis(a.int("axis", 0)?, self.shape(x).len())?;
        let out = self.output(n)?;
        self.gather_rows(out, x, i, axis)
    }

    /// `out` = `x` gathered along `axis` at integer indices `i` (a one-hot sum).
    fn gather_rows(&mut self, out: &str, x: ValueId, i: ValueId, axis: usize) -> R {
        let xs = self.shape(x).to_vec();
        let ishape = self.shape(i).to_vec();
        let ity = self.value(i).ty;
        if !ity.is_int() {
            return Err(format!("indices of elements of type {}: integers are required", ity.name()));
        }
        if self.value(x).ty != Ty::F32 {
            return Err(format!(
                "gathering {} data at indices computed at run time: only f32 data is supported",
                self.value(x).ty.name()
            ));
        }
        let mut shape = xs[..axis].to_vec();
        shape.extend(&ishape);
        shape.extend(&xs[axis + 1..]);
        let v = vars("i", shape.len());
        let data = self.tensor(x)?;
        let (idx, int) = (self.tensor(i)?, ity.name());
        let at = format!("{idx}[{}]", v[axis..axis + ishape.len()].join(", "));
        // The one-hot variable: `r0` (the importer's names never take it).
        let mut xi: Vec<String> = v[..axis].to_vec();
        xi.push("r0".into());
        xi.extend(v[axis + ishape.len()..].iter().cloned());
        let d = xs[axis];
        let rhs = format!(
            "sum[r0 in 0..{d}](select({at} + select({at} < 0, {d}, 0) == {int}(r0), {data}[{}], 0.0))",
            xi.join(", ")
        );
        self.emit_def(out, shape, rhs)
    }

    /// The gathered tensor, the axis, the indices' shape (scalar or 1-D) and
    /// the indices made non-negative.
    fn gather_plan(&self, n: &NodeProto) -> R<(ValueId, usize, Vec<usize>, Vec<i64>)> {
        let a = Attrs::new(n, &["axis"])?;
        let ins = self.inputs(n, 2, 2)?;
        let (x, i) = (Self::required(&ins, 0)?, Self::required(&ins, 1)?);
        let xs = self.shape(x);
        let axis = normalize_axis(a.int("axis", 0)?, xs.len())?;
        let ishape = self.shape(i).to_vec();
        let d = xs[axis] as i64;
        let indices = self
            .int_constant(i, "the indices")?
            .iter()
            .map(|&k| {
                if (-d..d).contains(&k) {
                    Ok(k.rem_euclid(d))
                } else {
                    Err(format!("index {k} is outside an axis of {d}"))
                }
            })
            .collect::<R<Vec<i64>>>()?;
        Ok((x, axis, ishape, indices))
    }

    /// Gather or Slice of a constant: the output's shape and, for each output
    /// element in row-major order, the flat position of its input element.
    fn constant_index_map(&self, n: &NodeProto) -> R<(ValueId, Vec<usize>, Vec<usize>)> {
        let strides = |shape: &[usize]| -> Vec<usize> {
            let mut st = vec![1; shape.len()];
            for k in (0..shape.len().saturating_sub(1)).rev() {
                st[k] = st[k + 1] * shape[k + 1];
            }
            st
        };
        if n.op_type == "Slice" {
            let (x, plan) = self.slice_plan(n, true)?;
            let xs = self.shape(x).to_vec();
            let mut shape = xs.clone();
            for &(ax, _, _, len) in &plan {
                shape[ax] = len;
            }
            let (sx, count) = (strides(&xs), elements(&shape).ok_or("too many elements")?);
            let at = (0..count)
                .map(|flat| {
                    let mut rest = flat;
                    let mut pos = 0i64;
                    for (k, st) in strides(&shape).iter().enumerate() {
                        let i = (rest / st) as i64;
                        rest %= st;
                        let i = plan.iter().find(|p| p.0 == k).map_or(i, |&(_, start, step, _)| start + i * step);
                        pos += i * sx[k] as i64;
                    }
                    pos as usize
                })
                .collect();
            return Ok((x, shape, at));
        }
        let (x, axis, ishape, indices) = self.gather_plan(n)?;
        let xs = self.shape(x).to_vec();
        let (outer, inner): (usize, usize) = (xs[..axis].iter().product(), xs[axis + 1..].iter().product());
        let mut shape = xs[..axis].to_vec();
        shape.extend(&ishape);
        shape.extend(&xs[axis + 1..]);
        let mut at = Vec::new();
        for o in 0..outer {
            for &k in &indices {
                at.extend((0..inner).map(|j| (o * xs[axis] + k as usize) * inner + j));
            }
        }
        Ok((x, shape, at))
    }

    /// Nearest-neighbour upsampling by whole factors (what
    /// `F.interpolate(mode="nearest")` exports): output index / factor.
    /// Nearest-neighbour resizing by whole factors (an index expression);
    /// with other factors, PyTorch's `nearest` (`upsample_nearest2d`) and
    /// `bilinear` without corner alignment (`upsample_bilinear2d`) of the
    /// two spatial axes.
    fn resize(&mut self, n: &NodeProto) -> R {
        let upsample = n.op_type == "Upsample";
        let known: &[&str] = if upsample {
            &["mode", "scales"]
        } else {
            &[
                "mode",
                "coordinate_transformation_mode",
                "nearest_mode",
                "antialias",
                "axes",
                "cubic_coeff_a",
                "exclude_outside",
                "extrapolation_value",
                "keep_aspect_ratio_policy",
            ]
        };
        let a = Attrs::new(n, known)?;
        let ins = self.inputs(n, 1, 4)?;
        let x = Self::required(&ins, 0)?;
        let out = self.output(n)?;
        let xs = self.shape(x).to_vec();
        let mode = a.string("mode", "nearest")?;
        // Opset 10's Resize has Upsample's semantics: asymmetric coordinates, floor.
        let (ct, nm) = if upsample || self.opset < 11 {
            ("asymmetric".to_string(), "floor".to_string())
        } else {
            if a.has("axes") || a.int("antialias", 0)? != 0 || a.int("exclude_outside", 0)? != 0 {
                return Err("axes, antialias and exclude_outside are not supported".into());
            }
            let policy = a.string("keep_aspect_ratio_policy", "stretch")?;
            if policy != "stretch" {
                return Err(format!("keep_aspect_ratio_policy = \"{policy}\": only \"stretch\" is supported"));
            }
            (a.string("coordinate_transformation_mode", "half_pixel")?, a.string("nearest_mode", "round_prefer_floor")?)
        };
        let float_list = |this: &Self, id: ValueId| this.constant(id).map(|v| v.as_f64());
        // The output sizes, and whether each is the input's times its scale exactly.
        let (scales, sizes): (Vec<f64>, Vec<usize>) = if upsample {
            let scales: Vec<f64> = match (a.floats("scales")?, ins.get(1).copied().flatten()) {
                (Some(f), _) => f.iter().map(|&v| v as f64).collect(),
                (None, Some(id)) => float_list(self, id).ok_or("the scales must be a constant")?,
                _ => return Err("the scales are required".into()),
            };
            let sizes = xs.iter().zip(&scales).map(|(&d, &f)| (d as f64 * f).floor() as usize).collect();
            (scales, sizes)
        } else {
            // Opset 10's Resize takes the scales second; later opsets put the ROI there.
            let (scales_at, sizes_at) = if self.opset < 11 { (1, usize::MAX) } else { (2, 3) };
            match (ins.get(scales_at).copied().flatten(), ins.get(sizes_at).copied().flatten()) {
                (Some(id), _) if self.shape(id).iter().product::<usize>() > 0 => {
                    let scales = float_list(self, id).ok_or("the scales must be a constant")?;
                    let sizes = xs.iter().zip(&scales).map(|(&d, &f)| (d as f64 * f).floor() as usize).collect();
                    (scales, sizes)
                }
                (_, Some(id)) => {
                    let sizes = self.int_constant(id, "the sizes")?;
                    let sizes: Vec<usize> = sizes.iter().map(|&s| s.clamp(0, 1 << 20) as usize).collect();
                    (sizes.iter().zip(&xs).map(|(&s, &d)| s as f64 / d as f64).collect(), sizes)
                }
                _ => return Err("scales or sizes are required".into()),
            }
        };
        if scales.len() != xs.len() || sizes.len() != xs.len() {
            return Err(format!("{} scales or sizes for a rank-{} input", scales.len().max(sizes.len()), xs.len()));
        }
        // The coordinates scale by the ratio of the sizes: given sizes, or scales that give them exactly.
        let given_sizes = !upsample && {
            let scales_at = if self.opset < 11 { 1 } else { 2 };
            ins.get(scales_at).copied().flatten().is_none_or(|id| self.shape(id).iter().product::<usize>() == 0)
        };
        let exact = given_sizes || sizes.iter().zip(&xs).zip(&scales).all(|((&o, &d), &f)| o as f64 == d as f64 * f);
        let whole = scales.iter().all(|&f| (1.0..=1024.0).contains(&f) && f.fract() == 0.0);
        let spatial_only =
            xs.len() == 4 && sizes[..2] == xs[..2] && sizes[2..].iter().all(|&o| (1..=1 << 16).contains(&o));
        let nearest_whole = matches!(
            (ct.as_str(), nm.as_str()),
            ("asymmetric", "floor") | ("half_pixel" | "pytorch_half_pixel", "round_prefer_floor" | "round_prefer_ceil")
        );
        let (oh, ow) = (sizes.get(2).copied().unwrap_or(0), sizes.get(3).copied().unwrap_or(0));
        let call = match mode.as_str() {
            // With whole factors, asymmetric+floor and the other common pairs pick the same element.
            "nearest" if whole && nearest_whole => {
                let f: Vec<usize> = scales.iter().map(|&v| v as usize).collect();
                let shape: Vec<usize> = xs.iter().zip(&f).map(|(d, k)| d * k).collect();
                let v = vars("i", shape.len());
                let idx: Vec<String> =
                    v.iter().zip(&f).map(|(i, &k)| if k == 1 { i.clone() } else { format!("{i} / {k}") }).collect();
                let rhs = format!("{}[{}]", self.tensor(x)?, idx.join(", "));
                return self.emit_def(out, shape, rhs);
            }
            "nearest" if (ct.as_str(), nm.as_str()) == ("asymmetric", "floor") && exact && spatial_only => {
                format!("upsample_nearest2d({}, {oh}, {ow})", self.tensor(x)?)
            }
            "nearest" => {
                return Err(format!(
                    "nearest resizing with coordinate_transformation_mode = \"{ct}\", nearest_mode = \"{nm}\" and \
                     scales {scales:?}: whole factors, or asymmetric + floor (PyTorch's `nearest`) on the spatial axes, \
                     are supported"
                ))
            }
            "linear" if matches!(ct.as_str(), "half_pixel" | "pytorch_half_pixel") && exact && spatial_only && oh > 1 && ow > 1 => {
                format!("upsample_bilinear2d({}, {oh}, {ow})", self.tensor(x)?)
            }
            "linear" => {
                return Err(format!(
                    "linear resizing with coordinate_transformation_mode = \"{ct}\" and scales {scales:?}: only \
                     half_pixel (PyTorch's bilinear, align_corners=False) of the spatial axes of an NCHW tensor is supported"
                ))
            }
            other => return Err(format!("mode = \"{other}\": only nearest and linear resizing are supported")),
        };
        self.emit_call(out, sizes, call)
    }

    /// `[N, C·b², H, W]` to `[N, C, H·b, W·b]`: DCR (the default) or CRD (`pixel_shuffle`).
    fn depth_to_space(&mut self, n: &NodeProto) -> R {
        let a = Attrs::new(n, &["blocksize", "mode"])?;
        let x = Self::required(&self.inputs(n, 1, 1)?, 0)?;
        let out = self.output(n)?;
        let xs = self.shape(x).to_vec();
        let b = a.int("blocksize", 0)?;
        if xs.len() != 4 || !(1..=64).contains(&b) || !xs[1].is_multiple_of((b * b) as usize) {
            return Err(format!("blocksize {b} does not fit an input of shape {xs:?}"));
        }
        let b = b as usize;
        let c = xs[1] / (b * b);
        let shape = vec![xs[0], c, xs[2] * b, xs[3] * b];
        let channel = match a.string("mode", "DCR")?.as_str() {
            "DCR" => format!("(i2 % {b}) * {} + (i3 % {b}) * {c} + i1", b * c),
            "CRD" => {
                let call = format!("pixel_shuffle({}, {b})", self.tensor(x)?);
                return self.emit_call(out, shape, call);
            }
            other => return Err(format!("mode = \"{other}\" is not supported")),
        };
        let rhs = format!("{}[i0, {channel}, i2 / {b}, i3 / {b}]", self.tensor(x)?);
        self.emit_def(out, shape, rhs)
    }

    /// A cast between f32, i64, i32 and bool: texc's casts have ONNX's
    /// meaning (floats truncate toward zero, `bool` tests `!= 0`, a bool
    /// becomes 0 or 1); a cast to the same type is the input.
    fn cast(&mut self, n: &NodeProto) -> R {
        Attrs::new(n, &["to", "saturate"])?;
        let x = Self::required(&self.inputs(n, 1, 1)?, 0)?;
        let out = self.output(n)?;
        let to = self.result_ty(n)?;
        if matches!(self.constant(x), Some(Values::F64(_))) {
            return Err("a cast of f64 data is not supported".into());
        }
        if self.value(x).ty == to {
            return self.alias(out, x);
        }
        let shape = self.shape(x).to_vec();
        let access = self.broadcast_access(x, &vars("i", shape.len()))?;
        self.emit_def(out, shape, format!("{}({access})", to.name()))
    }

    /// `Pad` in `constant` mode with constant, non-negative pads (an
    /// attribute before opset 11, inputs after; `axes` from opset 18): the
    /// input where the index falls inside it, the constant value elsewhere.
    fn pad(&mut self, n: &NodeProto) -> R {
        let a = Attrs::new(n, &["mode", "pads", "value"])?;
        let mode = a.string("mode", "constant")?;
        if mode != "constant" {
            return Err(format!("mode = \"{mode}\": only constant padding is supported"));
        }
        let (x, pads, value, axes) = if self.opset < 11 {
            let x = Self::required(&self.inputs(n, 1, 1)?, 0)?;
            (x, a.ints("pads")?.ok_or("the pads attribute is required")?, None, None)
        } else {
            let ins = self.inputs(n, 2, 4)?;
            let pads = self.int_constant(Self::required(&ins, 1)?, "the pads")?;
            let axes = ins.get(3).copied().flatten().map(|id| self.int_constant(id, "the axes")).transpose()?;
            (Self::required(&ins, 0)?, pads, ins.get(2).copied().flatten(), axes)
        };
        let out = self.output(n)?;
        let xs = self.shape(x).to_vec();
        let axes: Vec<usize> = match axes {
            Some(list) => list.iter().map(|&ax| normalize_axis(ax, xs.len())).collect::<R<_>>()?,
            None => (0..xs.len()).collect(),
        };
        if pads.len() != 2 * axes.len() || pads.iter().any(|&p| !(0..1 << 20).contains(&p)) {
            return Err(format!("pads {pads:?}: {} non-negative values are supported", 2 * axes.len()));
        }
        let ty = self.value(x).ty;
        let fill = match value {
            Some(id) => {
                let v = self.constant(id).filter(|v| v.len() == 1).ok_or("the value must be a one-element constant")?;
                typed_literal(v)?
            }
            None if a.has("value") => literal(a.float("value", 0.0)? as f64)?,
            None => zero_literal(ty),
        };
        if pads.iter().all(|&p| p == 0) {
            return self.alias(out, x);
        }
        let mut shape = xs.clone();
        let v = vars("i", xs.len());
        let (mut idx, mut inside) = (v.clone(), Vec::new());
        for (j, &ax) in axes.iter().enumerate() {
            let (b, e) = (pads[j] as usize, pads[j + axes.len()] as usize);
            shape[ax] = xs[ax] + b + e;
            if b > 0 {
                inside.push(format!("{} >= {b}", v[ax]));
                idx[ax] = format!("{} - {b}", v[ax]);
            }
            if e > 0 {
                inside.push(format!("{} < {}", v[ax], b + xs[ax]));
            }
        }
        let access = format!("{}[{}]", self.tensor(x)?, idx.join(", "));
        self.emit_def(out, shape, format!("select({}, {access}, {fill})", inside.join(" && ")))
    }

    /// `Trilu`: the upper (default) or lower triangle of the last two axes,
    /// shifted by the constant diagonal `k`; other elements are 0.
    fn trilu(&mut self, n: &NodeProto) -> R {
        let a = Attrs::new(n, &["upper"])?;
        let ins = self.inputs(n, 1, 2)?;
        let x = Self::required(&ins, 0)?;
        let k = match ins.get(1).copied().flatten() {
            Some(id) => self.int_constant(id, "k")?.first().copied().ok_or("k must hold one value")?,
            None => 0,
        };
        let out = self.output(n)?;
        let shape = self.shape(x).to_vec();
        if shape.len() < 2 {
            return Err(format!("an input of rank {}: Trilu takes rank 2 or more", shape.len()));
        }
        let v = vars("i", shape.len());
        let (row, col) = (&v[shape.len() - 2], &v[shape.len() - 1]);
        // col - row >= k (upper) or <= k (lower), with non-negative terms on each side.
        let (l, r) =
            if k >= 0 { (col.clone(), format!("{row} + {k}")) } else { (format!("{col} + {}", -k), row.clone()) };
        let keep = if a.int("upper", 1)? != 0 { format!("{l} >= {r}") } else { format!("{l} <= {r}") };
        let zero = zero_literal(self.value(x).ty);
        let access = format!("{}[{}]", self.tensor(x)?, v.join(", "));
        self.emit_def(out, shape, format!("select({keep}, {access}, {zero})"))
    }

    fn reduce(&mut self, n: &NodeProto) -> R {
        let a = Attrs::new(n, &["axes", "keepdims", "noop_with_empty_axes"])?;
        let axes_are_input = self.opset >= 18 || (n.op_type == "ReduceSum" && self.opset >= 13);
        let ins = self.inputs(n, 1, if axes_are_input { 2 } else { 1 })?;
        let x = Self::required(&ins, 0)?;
        let out = self.output(n)?;
        let xs = self.shape(x).to_vec();
        let axes = match (axes_are_input, ins.get(1).copied().flatten()) {
            (false, _) => a.ints("axes")?,
            (true, Some(id)) => Some(self.int_constant(id, "the axes")?),
            (true, None) => None,
        };
        let mut axes: Vec<usize> = match axes.filter(|l| !l.is_empty()) {
            Some(list) => list.iter().map(|&ax| normalize_axis(ax, xs.len())).collect::<R<_>>()?,
            None if a.int("noop_with_empty_axes", 0)? != 0 => return self.alias(out, x),
            None => (0..xs.len()).collect(),
        };
        axes.sort_unstable();
        axes.dedup();
        let keep = a.int("keepdims", 1)? != 0;
        let shape: Vec<usize> =
            (0..xs.len()).filter_map(|k| if axes.contains(&k) { keep.then_some(1) } else { Some(xs[k]) }).collect();
        let v = vars("i", shape.len());
        let mut out_axis = v.iter();
        let mut reduced = Vec::new();
        let mut idx = Vec::new();
        for (k, &d) in xs.iter().enumerate() {
            if axes.contains(&k) {
                let r = format!("r{}", reduced.len());
                reduced.push(format!("{r} in 0..{d}"));
                idx.push(r);
                if keep {
                    out_axis.next();
                }
            } else {
                idx.push(out_axis.next().cloned().unwrap_or_default());
            }
        }
        let access = format!("{}[{}]", self.tensor(x)?, idx.join(", "));
        let count: usize = axes.iter().map(|&k| xs[k]).product();
        let over = reduced.join(", ");
        let rhs = match n.op_type.as_str() {
            "ReduceMean" => format!("sum[{over}]({access}) / {}", literal(count as f64)?),
            "ReduceSum" => format!("sum[{over}]({access})"),
            "ReduceMax" => format!("max[{over}]({access})"),
            "ReduceMin" => format!("min[{over}]({access})"),
            "ReduceProd" => format!("prod[{over}]({access})"),
            "ReduceL1" => format!("sum[{over}](abs({access}))"),
            "ReduceL2" => format!("sqrt(sum[{over}]({access} * {access}))"),
            _ => format!("sum[{over}]({access} * {access})"),
        };
        self.emit_def(out, shape, rhs)
    }

    // ------------------------------------------------------------ constant folding

    /// Nodes whose inputs are all constants compute at import time: the
    /// shape arithmetic exporters write (Shape → Gather → Unsqueeze → Concat
    /// → Reshape) and reshapes of weights. Returns whether `n` was folded.
    fn fold(&mut self, n: &NodeProto) -> R<bool> {
        let op = n.op_type.as_str();
        if op == "Shape" {
            return self.fold_shape(n).map(|()| true);
        }
        if op == "ConstantOfShape" {
            return self.fold_constant_of_shape(n).map(|()| true);
        }
        let foldable = FOLDABLE;
        let ins: Vec<Option<ValueId>> = n.input.iter().map(|i| self.by_name.get(i).copied()).collect();
        let all_constant = !ins.is_empty()
            && ins
                .iter()
                .zip(&n.input)
                .all(|(id, name)| name.is_empty() || id.is_some_and(|id| self.constant(id).is_some()));
        if !foldable.contains(&op) || !all_constant || self.fold_would_inflate(n) {
            return Ok(false);
        }
        match op {
            "Concat" | "Gather" | "Slice" | "Cast" => self.fold_layout(n).map(|()| true),
            "Range" => self.fold_range(n).map(|()| true),
            "Expand" | "Transpose" | "Trilu" => self.fold_moves(n).map(|()| true),
            "ScatterND" => self.fold_scatter_nd(n).map(|()| true),
            "GatherND" => self.fold_gather_nd(n).map(|()| true),
            _ => self.fold_elementwise(n),
        }
    }

    /// Whether folding `n` would broadcast f32 data into a larger constant
    /// (an Expand of a bias to a feature map): the kernel then broadcasts it
    /// as it reads it instead, and the model's weights stay their size.
    /// Integers and bools (shapes, masks) always fold, and so does a single
    /// value filled into at most [`SMALL_FILL`] elements, as ConstantOfShape
    /// would make it, which operators that need constants may read (Swin
    /// V2's ScatterND zeroes part of a bias with an Expand of 0).
    fn fold_would_inflate(&self, n: &NodeProto) -> bool {
        let ids: Vec<ValueId> = n.input.iter().filter_map(|i| self.by_name.get(i).copied()).collect();
        let f32_data = |id: &ValueId| matches!(self.constant(*id), Some(Values::F32(_) | Values::F64(_)));
        let data: Vec<ValueId> = match n.op_type.as_str() {
            "Expand" => ids.first().into_iter().copied().collect(),
            "Where" => ids.iter().skip(1).copied().collect(),
            op if fold::is_elementwise(op) => ids.clone(),
            _ => return false,
        };
        if !data.iter().any(f32_data) {
            return false;
        }
        let largest = ids.iter().map(|&id| self.shape(id).iter().product::<usize>()).max().unwrap_or(0);
        let shape = match n.op_type.as_str() {
            "Expand" => match ids.get(1).and_then(|&s| self.constant(s)).and_then(Values::as_i64) {
                Some(t) => broadcast(self.shape(ids[0]), &t.iter().map(|&d| d.max(0) as usize).collect::<Vec<_>>()),
                None => return false,
            },
            _ => ids.iter().try_fold(Vec::new(), |s, &id| broadcast(&s, self.shape(id))),
        };
        // A single value filled into a small constant is what ConstantOfShape makes.
        let fill = data.iter().all(|&id| self.shape(id).iter().product::<usize>() == 1);
        shape.is_ok_and(|s| {
            let len = s.iter().product::<usize>();
            len > largest && !(fill && len <= SMALL_FILL)
        })
    }

    /// `ScatterND` of constants (`reduction = none`): the data with the
    /// slices the indices name replaced by the updates, in order.
    fn fold_scatter_nd(&mut self, n: &NodeProto) -> R {
        let a = Attrs::new(n, &["reduction"])?;
        if a.string("reduction", "none")? != "none" {
            return Err("only reduction = \"none\" is supported".into());
        }
        let ins = self.inputs(n, 3, 3)?;
        let (x, i, u) = (Self::required(&ins, 0)?, Self::required(&ins, 1)?, Self::required(&ins, 2)?);
        let out = self.output(n)?.to_string();
        let (xs, is, us) = (self.shape(x).to_vec(), self.shape(i).to_vec(), self.shape(u).to_vec());
        let k = *is.last().ok_or("0-d indices")?;
        if k == 0 || k > xs.len() {
            return Err(format!("indices of shape {is:?} for data of rank {}", xs.len()));
        }
        let mut want = is[..is.len() - 1].to_vec();
        want.extend(&xs[k..]);
        if us != want {
            return Err(format!("updates of shape {us:?}, expected {want:?}"));
        }
        let indices = self.int_constant(i, "the indices")?;
        let like = self.constant(x).cloned().ok_or("a constant")?;
        let mut result = fold::cells(&like);
        let updates = fold::cells(self.constant(u).ok_or("a constant")?);
        let inner: usize = xs[k..].iter().product();
        let st = fold::strides(&xs);
        for (p, tuple) in indices.chunks(k).enumerate() {
            let base = fold::offset_of(tuple, &xs, &st)?;
            result[base..base + inner].copy_from_slice(&updates[p * inner..(p + 1) * inner]);
        }
        let data = fold::values(&result, &like)?;
        self.add(&out, xs, Some(data)).map(|_| ())
    }

    /// `GatherND` of constants (`batch_dims = 0`; Swin V2's relative
    /// position table): the slices of the data the index tuples name.
    fn fold_gather_nd(&mut self, n: &NodeProto) -> R {
        let (x, at, shape) = self.gather_nd_plan(n)?;
        let out = self.output(n)?.to_string();
        let data = self.constant(x).ok_or("a constant")?.pick(&at);
        self.add(&out, shape, Some(data)).map(|_| ())
    }

    /// `GatherND` of data at constant indices: a Gather along the first axis
    /// of the data with its indexed axes flattened into one.
    fn gather_nd(&mut self, n: &NodeProto) -> R {
        let (x, _, _) = self.gather_nd_plan(n)?;
        let ins = self.inputs(n, 2, 2)?;
        let i = Self::required(&ins, 1)?;
        let out = self.output(n)?.to_string();
        let (xs, is) = (self.shape(x).to_vec(), self.shape(i).to_vec());
        let k = is[is.len() - 1];
        let st = fold::strides(&xs[..k]);
        let rows: Vec<i64> = self
            .int_constant(i, "the indices")?
            .chunks(k)
            .map(|t| t.iter().zip(&xs).zip(&st).map(|((&t, &d), &s)| t.rem_euclid(d as i64) * s as i64).sum())
            .collect();
        let rows = self.add(&format!("{out}#rows"), is[..is.len() - 1].to_vec(), Some(Values::I64(rows)))?;
        let mut flat = vec![xs[..k].iter().product::<usize>()];
        flat.extend(&xs[k..]);
        let flat = self.reshape_named(&format!("{out}#flat"), x, flat)?;
        self.gather_rows(&out, flat, rows, 0)
    }

    /// The data, the flat position of each element of the result in the
    /// data, and the result's shape; the indices checked.
    fn gather_nd_plan(&self, n: &NodeProto) -> R<(ValueId, Vec<usize>, Vec<usize>)> {
        let a = Attrs::new(n, &["batch_dims"])?;
        if a.int("batch_dims", 0)? != 0 {
            return Err("only batch_dims = 0 is supported".into());
        }
        let ins = self.inputs(n, 2, 2)?;
        let (x, i) = (Self::required(&ins, 0)?, Self::required(&ins, 1)?);
        let (xs, is) = (self.shape(x).to_vec(), self.shape(i).to_vec());
        let k = *is.last().ok_or("0-d indices")?;
        if k == 0 || k > xs.len() {
            return Err(format!("indices of shape {is:?} for data of rank {}", xs.len()));
        }
        let mut shape = is[..is.len() - 1].to_vec();
        shape.extend(&xs[k..]);
        elements(&shape).filter(|&c| c <= 1 << 26).ok_or("too many elements for a constant")?;
        let indices = self.int_constant(i, "the indices")?;
        let inner: usize = xs[k..].iter().product();
        let st = fold::strides(&xs);
        let mut at = Vec::new();
        for tuple in indices.chunks(k) {
            let base = fold::offset_of(tuple, &xs, &st)?;
            at.extend(base..base + inner);
        }
        Ok((x, at, shape))
    }

    /// An element-wise operator of constants (`fold::elementwise`).
    fn fold_elementwise(&mut self, n: &NodeProto) -> R<bool> {
        if n.op_type == "Mod" {
            if Attrs::new(n, &["fmod"])?.int("fmod", 0)? != 0 {
                return Ok(false);
            }
        } else {
            Attrs::new(n, &[])?;
        }
        let mut operands = Vec::new();
        for i in &n.input {
            let id = self.lookup(i)?;
            operands.push((self.constant(id).cloned().ok_or("a constant")?, self.shape(id).to_vec()));
        }
        let Some((shape, data)) = fold::elementwise(&n.op_type, &operands)? else {
            return Ok(false);
        };
        let out = self.output(n)?;
        self.add(out, shape, Some(data)).map(|_| true)
    }

    /// Expand, Transpose and Trilu of a constant: its elements moved or zeroed.
    fn fold_moves(&mut self, n: &NodeProto) -> R {
        let out = self.output(n)?.to_string();
        let ins = self.inputs(n, 1, 2)?;
        let x = Self::required(&ins, 0)?;
        let xs = self.shape(x).to_vec();
        let data = self.constant(x).cloned().ok_or("a constant")?;
        let (shape, at) = match n.op_type.as_str() {
            "Expand" => {
                Attrs::new(n, &[])?;
                let s = Self::required(&ins, 1)?;
                let target = self.int_constant(s, "the shape")?;
                let target: Vec<usize> = target
                    .iter()
                    .map(|&d| usize::try_from(d).map_err(|_| format!("shape {target:?}")))
                    .collect::<R<_>>()?;
                let shape = broadcast(&xs, &target)?;
                elements(&shape).filter(|&c| c <= 1 << 26).ok_or("too many elements for a constant")?;
                let at = broadcast_positions(&xs, &shape);
                (shape, at)
            }
            "Transpose" => {
                let perm = transpose_perm(n, xs.len())?;
                (perm.iter().map(|&p| xs[p]).collect(), fold::transpose_positions(&xs, &perm))
            }
            _ => {
                let a = Attrs::new(n, &["upper"])?;
                let k = match ins.get(1).copied().flatten() {
                    Some(id) => self.int_constant(id, "k")?.first().copied().ok_or("k must hold one value")?,
                    None => 0,
                };
                if xs.len() < 2 {
                    return Err(format!("an input of rank {}: Trilu takes rank 2 or more", xs.len()));
                }
                let (rows, cols) = (xs[xs.len() - 2], xs[xs.len() - 1]);
                let upper = a.int("upper", 1)? != 0;
                let zero = fold::zero_like(&data);
                let c: Vec<fold::Cell> = fold::cells(&data)
                    .into_iter()
                    .enumerate()
                    .map(|(f, v)| if fold::trilu_keeps(f / cols % rows, f % cols, k, upper) { v } else { zero })
                    .collect();
                let data = fold::values(&c, &data)?;
                return self.add(&out, xs, Some(data)).map(|_| ());
            }
        };
        self.add(&out, shape, Some(data.pick(&at))).map(|_| ())
    }

    /// `Range(start, limit, delta)` of constants: its values (integers, or
    /// f32 as ONNX computes them, `start + i * delta`).
    fn fold_range(&mut self, n: &NodeProto) -> R {
        Attrs::new(n, &[])?;
        let ins = self.inputs(n, 3, 3)?;
        let ids: Vec<ValueId> = (0..3).map(|i| Self::required(&ins, i)).collect::<R<_>>()?;
        let out = self.output(n)?;
        let scalar = |id: ValueId, what: &str| -> R<Values> {
            let v = self.constant(id).ok_or_else(|| format!("{what} must be a constant"))?;
            if v.len() != 1 {
                return Err(format!("{what} must be a single value"));
            }
            Ok(v.clone())
        };
        let (start, limit, delta) = (scalar(ids[0], "start")?, scalar(ids[1], "limit")?, scalar(ids[2], "delta")?);
        const MAX: f64 = (1u64 << 24) as f64;
        let one = |v: &Values| v.as_i64().map(|x| x[0]);
        match (one(&start), one(&limit), one(&delta)) {
            (Some(s), Some(l), Some(d)) => {
                if d == 0 {
                    return Err("delta = 0: the range would not end".into());
                }
                let count = ((l as f64 - s as f64) / d as f64).ceil().max(0.0);
                if count > MAX {
                    return Err(format!("{count} elements: at most 2^24 are supported"));
                }
                let v: Vec<i64> = (0..count as i64).map(|i| s + i * d).collect();
                self.add(out, vec![v.len()], Some(Values::I64(v))).map(|_| ())
            }
            _ => {
                let (s, l, d) = (start.as_f64()[0], limit.as_f64()[0], delta.as_f64()[0]);
                if d == 0.0 || !(s.is_finite() && l.is_finite() && d.is_finite()) {
                    return Err(format!("start {s}, limit {l}, delta {d}: the range would not end"));
                }
                let count = ((l - s) / d).ceil().max(0.0);
                if count > MAX {
                    return Err(format!("{count} elements: at most 2^24 are supported"));
                }
                let v: Vec<f32> = (0..count as usize).map(|i| (s as f32) + (i as f32) * (d as f32)).collect();
                self.add(out, vec![v.len()], Some(Values::F32(v))).map(|_| ())
            }
        }
    }

    fn fold_shape(&mut self, n: &NodeProto) -> R {
        let a = Attrs::new(n, &["start", "end"])?;
        let x = Self::required(&self.inputs(n, 1, 1)?, 0)?;
        let out = self.output(n)?;
        let dims: Vec<i64> = self.shape(x).iter().map(|&d| d as i64).collect();
        let r = dims.len() as i64;
        let clamp = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
        let (start, end) = (clamp(a.int("start", 0)?), clamp(a.int("end", r)?));
        let picked = dims[start..end.max(start)].to_vec();
        self.add(out, vec![picked.len()], Some(Values::I64(picked))).map(|_| ())
    }

    fn fold_constant_of_shape(&mut self, n: &NodeProto) -> R {
        let a = Attrs::new(n, &["value"])?;
        let s = Self::required(&self.inputs(n, 1, 1)?, 0)?;
        let out = self.output(n)?;
        let dims = self.int_constant(s, "the shape")?;
        let shape: Vec<usize> =
            dims.iter().map(|&d| usize::try_from(d).map_err(|_| format!("dimension {d}"))).collect::<R<_>>()?;
        let count = elements(&shape).filter(|&c| c <= 1 << 26).ok_or("too many elements for a constant")?;
        let value = match a.tensor("value")? {
            Some(t) => tensor_data(t, None)?.1,
            None => Values::F32(vec![0.0]),
        };
        if value.len() != 1 {
            return Err("value must hold one element".into());
        }
        self.add(out, shape, Some(value.pick(&vec![0; count]))).map(|_| ())
    }

    /// Concat, Gather, Slice and Cast of constants: the elements of the
    /// result, picked from the constants' (Gather and Slice read the same
    /// plans as their translations into expressions).
    fn fold_layout(&mut self, n: &NodeProto) -> R {
        let out = self.output(n)?.to_string();
        match n.op_type.as_str() {
            "Cast" => {
                let a = Attrs::new(n, &["to", "saturate"])?;
                let x = Self::required(&self.inputs(n, 1, 1)?, 0)?;
                let data = self.constant(x).cloned().ok_or("a constant")?;
                let cast = fold::cast(&data, a.int("to", 0)? as i32)?;
                let shape = self.shape(x).to_vec();
                self.add(&out, shape, Some(cast)).map(|_| ())
            }
            "Concat" => {
                let a = Attrs::new(n, &["axis"])?;
                let ins = self.inputs(n, 1, usize::MAX)?;
                let ids: Vec<ValueId> = (0..ins.len()).map(|i| Self::required(&ins, i)).collect::<R<_>>()?;
                let first = self.shape(ids[0]).to_vec();
                let axis = normalize_axis(a.int("axis", 0)?, first.len())?;
                // Row-major: blocks of the inner axes, one input after another.
                let outer: usize = first[..axis].iter().product();
                let mut shape = first.clone();
                shape[axis] = 0;
                let mut parts = Vec::new();
                for &id in &ids {
                    let s = self.shape(id).to_vec();
                    if s.len() != first.len() || (0..s.len()).any(|k| k != axis && s[k] != first[k]) {
                        return Err(format!(
                            "constants of shapes {first:?} and {s:?} cannot be joined along axis {axis}"
                        ));
                    }
                    shape[axis] += s[axis];
                    parts.push((self.constant(id).cloned().ok_or("a constant")?, s[axis..].iter().product::<usize>()));
                }
                let mut joined: Option<Values> = None;
                for o in 0..outer {
                    for (data, block) in &parts {
                        let piece = data.pick(&(o * block..(o + 1) * block).collect::<Vec<_>>());
                        joined = Some(match joined {
                            None => piece,
                            Some(j) => j.concat(&piece).ok_or("constants of different element types")?,
                        });
                    }
                }
                let joined = joined.ok_or("nothing to join")?;
                self.add(&out, shape, Some(joined)).map(|_| ())
            }
            _ => {
                // Gather and Slice: translate as for activations into an index
                // map over the constant's elements.
                let (x, shape, at) = self.constant_index_map(n)?;
                let data = self.constant(x).cloned().ok_or("a constant")?;
                self.add(&out, shape, Some(data.pick(&at))).map(|_| ())
            }
        }
    }

    // ------------------------------------------------------------ values

    fn identity(&mut self, n: &NodeProto) -> R {
        let dropout = n.op_type == "Dropout";
        Attrs::new(n, if dropout { &["seed", "ratio", "is_test"] } else { &[] })?;
        let ins = self.inputs(n, 1, if dropout { 3 } else { 1 })?;
        if let Some(t) = ins.get(2).copied().flatten() {
            if self.scalar_constant(t, "training_mode")? != 0.0 {
                return Err("training_mode = true: only inference is supported".into());
            }
        }
        let x = Self::required(&ins, 0)?;
        let out = self.output(n)?;
        self.alias(out, x)
    }

    fn constant_node(&mut self, n: &NodeProto) -> R {
        let a = Attrs::new(n, &["value", "value_float", "value_floats", "value_int", "value_ints"])?;
        self.inputs(n, 0, 0)?;
        let out = self.output(n)?;
        let (shape, data) = if let Some(t) = a.tensor("value")? {
            tensor_data(t, None)?
        } else if let Some(f) = a.floats("value_floats")? {
            (vec![f.len()], Values::F32(f))
        } else if let Some(i) = a.ints("value_ints")? {
            (vec![i.len()], Values::I64(i))
        } else if a.has("value_float") {
            (vec![], Values::F32(vec![a.float("value_float", 0.0)?]))
        } else if a.has("value_int") {
            (vec![], Values::I64(vec![a.int("value_int", 0)?]))
        } else {
            return Err("has no value".into());
        };
        self.add(out, shape, Some(data)).map(|_| ())
    }
}

// ---------------------------------------------------------------- helpers

/// `i0, i1, ...`
pub(crate) fn vars(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|k| format!("{prefix}{k}")).collect()
}

/// A float literal that reads back as the same f32.
pub(crate) fn literal(v: f64) -> R<String> {
    if v.is_nan() {
        return Err("a NaN constant is not supported".into());
    }
    if v.is_infinite() {
        return Ok(if v > 0.0 { "inf".into() } else { "-inf".into() });
    }
    let s = format!("{:?}", v as f32);
    Ok(if s.contains(['.', 'e', 'E']) { s } else { format!("{s}.0") })
}

/// A one-element constant as a literal of its type.
fn typed_literal(v: &Values) -> R<String> {
    Ok(match v {
        Values::F32(_) | Values::F64(_) => literal(v.as_f64()[0])?,
        Values::I64(d) => format!("i64({})", d[0]),
        Values::Bool(d) => bool_literal(d[0]).into(),
        Values::I8(d) => format!("i8({})", d[0]),
        Values::U8(d) => format!("u8({})", d[0]),
        Values::I32(d) => format!("i32({})", d[0]),
    })
}

fn bool_literal(b: bool) -> &'static str {
    if b {
        "(0 == 0)"
    } else {
        "(0 == 1)"
    }
}

/// The zero of a type, as a literal.
fn zero_literal(ty: Ty) -> String {
    match ty {
        Ty::F32 => "0.0".into(),
        Ty::Bool => bool_literal(false).into(),
        int => format!("{}(0)", int.name()),
    }
}

/// For each element of `shape` in row-major order, the flat position of
/// the element of an operand of shape `from` that broadcasting reads.
pub(crate) fn broadcast_positions(from: &[usize], shape: &[usize]) -> Vec<usize> {
    let skip = shape.len() - from.len();
    let count: usize = shape.iter().product();
    (0..count)
        .map(|flat| {
            let (mut rest, mut pos, mut stride) = (flat, 0, 1);
            for k in (0..shape.len()).rev() {
                let i = rest % shape[k];
                rest /= shape[k];
                if k >= skip && from[k - skip] != 1 {
                    pos += i * stride;
                }
                if k >= skip {
                    stride *= from[k - skip];
                }
            }
            pos
        })
        .collect()
}

/// NumPy broadcasting of two shapes.
pub(crate) fn broadcast(a: &[usize], b: &[usize]) -> R<Vec<usize>> {
    let r = a.len().max(b.len());
    let at = |s: &[usize], k: usize| if k + s.len() >= r { s[k + s.len() - r] } else { 1 };
    (0..r)
        .map(|k| match (at(a, k), at(b, k)) {
            (x, y) if x == y => Ok(x),
            (1, y) => Ok(y),
            (x, 1) => Ok(x),
            _ => Err(format!("shapes {a:?} and {b:?} do not broadcast")),
        })
        .collect()
}

pub(crate) fn normalize_axis(axis: i64, rank: usize) -> R<usize> {
    let r = rank as i64;
    if (-r..r).contains(&axis) {
        Ok(axis.rem_euclid(r.max(1)) as usize)
    } else {
        Err(format!("axis {axis} is out of range for rank {rank}"))
    }
}

/// Flatten's axis may also be the rank itself.
fn normalize_axis_inclusive(axis: i64, rank: usize) -> R<usize> {
    if axis == rank as i64 {
        Ok(rank)
    } else {
        normalize_axis(axis, rank)
    }
}

/// A per-axis attribute whose two values must agree (std.nn's operators
/// take one stride and one dilation for both axes).
/// `name = value` arguments of a std.nn call, for those that differ from the default.
fn keyword_args(args: &[(&str, usize, usize)]) -> Vec<String> {
    args.iter().filter(|(_, v, default)| v != default).map(|(k, v, _)| format!("{k} = {v}")).collect()
}

pub(crate) fn same_on_both_axes(name: &str, v: Option<Vec<i64>>, default: usize) -> R<usize> {
    match v.as_deref() {
        None => Ok(default),
        Some([a, b]) if a == b && (1..=1 << 20).contains(a) => Ok(*a as usize),
        Some(other) => Err(format!("{name} = {other:?}: only equal values for both axes are supported")),
    }
}

/// `[top, left, bottom, right]` from `pads` or `auto_pad`.
pub(crate) fn pads(a: &Attrs, size: [usize; 2], window: [usize; 2], stride: usize) -> R<[usize; 4]> {
    match a.string("auto_pad", "NOTSET")?.as_str() {
        "NOTSET" => match a.ints("pads")?.as_deref() {
            None => Ok([0; 4]),
            Some(&[t, l, b, r]) if [t, l, b, r].iter().all(|&p| (0..1 << 20).contains(&p)) => {
                Ok([t as usize, l as usize, b as usize, r as usize])
            }
            Some(other) => Err(format!("pads = {other:?}: expected four non-negative values")),
        },
        "VALID" => Ok([0; 4]),
        mode @ ("SAME_UPPER" | "SAME_LOWER") => {
            let mut p = [0; 4];
            for k in 0..2 {
                let out = size[k].div_ceil(stride);
                let total = ((out - 1) * stride + window[k]).saturating_sub(size[k]);
                let small = total / 2;
                let (begin, end) = if mode == "SAME_UPPER" { (small, total - small) } else { (total - small, small) };
                p[k] = begin;
                p[k + 2] = end;
            }
            Ok(p)
        }
        other => Err(format!("auto_pad = \"{other}\" is not supported")),
    }
}

/// `(begin, end)` padding of each spatial axis from `pads` or `auto_pad`.
fn pads_nd(a: &Attrs, size: &[usize], window: &[usize], stride: &[usize]) -> R<Vec<(usize, usize)>> {
    let axes = size.len();
    match a.string("auto_pad", "NOTSET")?.as_str() {
        "NOTSET" => match a.ints("pads")? {
            None => Ok(vec![(0, 0); axes]),
            Some(p) if p.len() == 2 * axes && p.iter().all(|&q| (0..1 << 20).contains(&q)) => {
                Ok((0..axes).map(|j| (p[j] as usize, p[axes + j] as usize)).collect())
            }
            Some(p) => Err(format!("pads = {p:?}: expected {} non-negative values", 2 * axes)),
        },
        "VALID" => Ok(vec![(0, 0); axes]),
        mode @ ("SAME_UPPER" | "SAME_LOWER") => Ok((0..axes)
            .map(|j| {
                let out = size[j].div_ceil(stride[j]);
                let total = ((out - 1) * stride[j] + window[j]).saturating_sub(size[j]);
                let small = total / 2;
                if mode == "SAME_UPPER" {
                    (small, total - small)
                } else {
                    (total - small, small)
                }
            })
            .collect()),
        other => Err(format!("auto_pad = \"{other}\" is not supported")),
    }
}

/// Output size of pooling along an axis: floor, or with `ceil` rounded up
/// as ONNX and PyTorch do (the last window must start inside the input or
/// its leading padding).
fn pool_out(size: usize, (begin, end): (usize, usize), window: usize, stride: usize, ceil: bool) -> R<usize> {
    let span = size + begin + end;
    if span < window {
        return Err(format!("a window of {window} does not fit an axis of {size} padded by {}", begin + end));
    }
    let mut out = if ceil { (span - window).div_ceil(stride) + 1 } else { (span - window) / stride + 1 };
    if ceil && (out - 1) * stride >= size + begin {
        out -= 1;
    }
    Ok(out)
}

/// Output size of a window sliding over `size + padding`.
pub(crate) fn conv_out(size: usize, padding: usize, window: usize, stride: usize) -> R<usize> {
    let span = size + padding;
    if span < window {
        return Err(format!("a window of {window} does not fit an axis of {size} padded by {padding}"));
    }
    Ok((span - window) / stride + 1)
}

/// An index expression ready to be an operand: in parentheses unless it is one term.
fn parenthesized(e: &str) -> String {
    if e.contains(' ') {
        format!("({e})")
    } else {
        e.to_string()
    }
}

/// `i0 * 6 + i1 * 3 + i2` for row-major `shape` (axes of size 1 dropped).
fn linear_index(v: &[String], shape: &[usize]) -> String {
    let mut stride = 1;
    let mut terms = Vec::new();
    for (k, &d) in shape.iter().enumerate().rev() {
        if d != 1 {
            terms.push(if stride == 1 { v[k].clone() } else { format!("{} * {stride}", v[k]) });
        }
        stride *= d;
    }
    terms.reverse();
    if terms.is_empty() {
        "0".into()
    } else {
        terms.join(" + ")
    }
}

/// Transpose's `perm` (default: the axes reversed), checked to be a
/// permutation of `rank` axes.
fn transpose_perm(n: &NodeProto, rank: usize) -> R<Vec<usize>> {
    let a = Attrs::new(n, &["perm"])?;
    let perm: Vec<usize> = match a.ints("perm")? {
        Some(p) => p.iter().map(|&k| normalize_axis(k, rank)).collect::<R<_>>()?,
        None => (0..rank).rev().collect(),
    };
    let mut sorted = perm.clone();
    sorted.sort_unstable();
    if sorted != (0..rank).collect::<Vec<_>>() {
        return Err(format!("perm {perm:?} is not a permutation of the {rank} axes"));
    }
    Ok(perm)
}
