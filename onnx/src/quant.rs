//! Quantized models: the QDQ form (QuantizeLinear / DequantizeLinear around
//! f32 operators, what ONNX Runtime's `quantize_static` writes) and the
//! QOperator form (QLinearConv, QLinearMatMul, MatMulInteger, ConvInteger,
//! DynamicQuantizeLinear, what `quantize_dynamic` writes).
//!
//! Semantics are ONNX's: QuantizeLinear is
//! `saturate(round_half_to_even(x / scale) + zero_point)` with the quotient
//! rounded to f32 first (as ONNX Runtime divides in f32), DequantizeLinear
//! `(q - zero_point) * scale` in f32.
//!
//! Integer products. A Conv, Gemm or MatMul whose operands are dequantized
//! (DQ → op), whose only reader is a QuantizeLinear (directly or through one
//! Relu or Clip), and whose bias, if any, is the i32 one `quantize_static`
//! writes (scale `s_a·s_w`, zero point 0), becomes one statement that
//! computes the product in integers with exact 32-bit sums and requantizes
//! in its epilogue: `q = sat(round(f32(f32(acc) · s_a·s_w/s_y)) + z_y)`,
//! a following Relu or Clip folded into the saturation bounds (QuantizeLinear
//! is monotone, so `Q(clip(x, a, b)) = clamp(Q(x), Q(a), Q(b))`). The
//! pattern is matched here, at import, not in the e-graph: the importer
//! already knows every constant (scales, zero points, weights) and writes
//! one statement per operator, so the integer form is that statement; the
//! e-graph sees an ordinary integer reduction. The product is written in
//! one form that later passes can recognize (x86 VNNI):
//! `sum[k](i32(A[.., k]) * i32(W[j, k]))` with `A` u8 or i8 and `W` constant
//! i8 of zero point 0; the activation's zero point is a separate term,
//! `za · Σ_k W[j, k]`, folded with the bias into one i32 constant at import.
//! Anything else (a weight zero point, both operands computed) is the exact
//! integer sum `sum[k]((i32(A) - za) * (i32(B) - zb))`. A pattern that does
//! not fit runs in f32 between its DequantizeLinear and QuantizeLinear, as
//! the model says.
//!
//! Invariants: a DequantizeLinear of a computed value is written only where
//! something reads it in f32 (its statement is deferred until a first use,
//! [`Importer::tensor`]); a QuantizeLinear of a DequantizeLinear with the
//! same parameters is the quantized value itself; Reshape, Flatten,
//! Transpose, Squeeze and Unsqueeze of a dequantized value move the integers
//! and dequantize after (they commute with an element-wise map), and so does
//! MaxPool (a maximum commutes with an increasing map: a positive scale). Constant
//! scales must be positive and finite, zero points of the type the operator
//! requires: anything else is an error naming the node.

use crate::attrs::Attrs;
use crate::ops::{conv_out, literal, normalize_axis, pads, same_on_both_axes, vars};
use crate::proto::{data_type, NodeProto};
use crate::{Importer, Ty, ValueId, Values};

type R<T = ()> = Result<T, String>;

/// A scale or zero point: constants (one, or one per index of the axis), or
/// a value computed at run time (DynamicQuantizeLinear's).
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Param<T> {
    Const(Vec<T>),
    Tensor(ValueId),
}

/// The parameters of a QuantizeLinear or DequantizeLinear.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Linear {
    scale: Param<f32>,
    zero: Param<i64>,
    /// The axis the parameters run along; `None` per tensor.
    axis: Option<usize>,
    /// The quantized type.
    ty: Ty,
}

impl Linear {
    /// One constant scale and zero point.
    fn per_tensor(&self) -> Option<(f32, i64)> {
        match (&self.scale, &self.zero, self.axis) {
            (Param::Const(s), Param::Const(z), None) => Some((s[0], z[0])),
            _ => None,
        }
    }

    /// Constant scales and zero points, one per index of `axis` (or one).
    fn constants_along(&self, axis: usize) -> Option<(Vec<f32>, Vec<i64>)> {
        match (&self.scale, &self.zero, self.axis) {
            (Param::Const(s), Param::Const(z), None) => Some((s.clone(), z.clone())),
            (Param::Const(s), Param::Const(z), Some(a)) if a == axis => Some((s.clone(), z.clone())),
            _ => None,
        }
    }
}

/// A dequantized value: the quantized value it is computed from.
#[derive(Clone, Debug)]
pub(crate) struct Dequantized {
    pub(crate) src: ValueId,
    linear: Linear,
}

/// An operand of an integer product: the quantized value and its zero point
/// (per tensor for activations; per output channel for weights).
struct Side {
    id: ValueId,
    zero: Param<i64>,
}

/// The shape of an integer product.
#[derive(Clone, Copy)]
enum Geometry {
    /// `A[.., M, K] · B[K, N]` (or `B[.., K, N]`); `b_rows_out`: B is `[N, K]` (Gemm's transB).
    MatMul {
        b_rows_out: bool,
    },
    Conv {
        groups: usize,
        stride: usize,
        dilation: usize,
        pads: [usize; 4],
    },
}

/// Requantization of an i32 product: `sat(round(f32(f32(acc) · mult)) + zero)`.
struct Requant {
    /// One multiplier, or one per output channel.
    mult: Vec<f32>,
    zero: i64,
    ty: Ty,
    lo: i64,
    hi: i64,
}

/// Operators that move elements, and MaxPool (a maximum commutes with an
/// increasing map: a positive scale): on a dequantized value they move or
/// pool the integers instead.
const MOVES: &[&str] = &["Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "MaxPool"];

impl Importer<'_> {
    /// Translates `n` if it is a quantized operator or the start of an
    /// integer pattern; `false` leaves it to the ordinary translation.
    pub(crate) fn quantized(&mut self, n: &NodeProto) -> R<bool> {
        let op = n.op_type.as_str();
        match op {
            "QuantizeLinear" => self.quantize_linear(n).map(|()| true),
            "DequantizeLinear" => self.dequantize_linear(n).map(|()| true),
            "DynamicQuantizeLinear" => self.dynamic_quantize_linear(n).map(|()| true),
            "MatMulInteger" | "ConvInteger" => self.integer_op(n).map(|()| true),
            "QLinearConv" | "QLinearMatMul" => self.qlinear_op(n).map(|()| true),
            "Conv" | "Gemm" | "MatMul" => self.qdq_product(n),
            _ if MOVES.contains(&op) => self.move_quantized(n),
            _ => Ok(false),
        }
    }

    // ------------------------------------------------------------ parameters

    /// The scale, zero point and axis of a QuantizeLinear (`quantize`) or
    /// DequantizeLinear of `x`, from inputs 1 and 2 and the attributes.
    fn linear_params(&self, n: &NodeProto, x: ValueId, quantize: bool) -> R<Linear> {
        let a = Attrs::new(n, &["axis", "saturate", "block_size", "output_dtype"])?;
        if a.int("block_size", 0)? != 0 {
            return Err("blocked quantization (block_size) is not supported".into());
        }
        let ins = self.inputs(n, 2, 3)?;
        let scale_id = Self::required(&ins, 1)?;
        let rank = self.shape(x).len();
        let count = self.shape(scale_id).iter().product::<usize>();
        let axis = match self.shape(scale_id).len() {
            0 => None,
            1 if count == 1 => None,
            1 if self.opset < 13 => return Err("a per-axis scale needs opset 13 or later".into()),
            1 => {
                let axis = normalize_axis(a.int("axis", 1)?, rank)?;
                if self.shape(x)[axis] != count {
                    return Err(format!(
                        "{count} scales for axis {axis} of size {} (input of shape {:?})",
                        self.shape(x)[axis],
                        self.shape(x)
                    ));
                }
                Some(axis)
            }
            _ => {
                return Err(format!("a scale of shape {:?}: one value or a vector is supported", self.shape(scale_id)))
            }
        };
        let scale = match self.constant(scale_id) {
            Some(Values::F32(s)) => {
                if let Some((i, v)) = s.iter().enumerate().find(|(_, v)| !(v.is_finite() && **v > 0.0)) {
                    let at = if s.len() > 1 { format!(" (element {i})") } else { String::new() };
                    return Err(format!("scale {v}{at}: a scale must be positive and finite"));
                }
                Param::Const(s.clone())
            }
            Some(other) => {
                return Err(format!("a scale of type {}: float (f32) scales are supported", other.ty().name()))
            }
            None if self.value(scale_id).ty == Ty::F32 => Param::Tensor(scale_id),
            None => {
                return Err(format!(
                    "a scale of type {}: float (f32) scales are supported",
                    self.value(scale_id).ty.name()
                ))
            }
        };
        let zero_id = ins.get(2).copied().flatten();
        if let Some(z) = zero_id {
            if self.shape(z).iter().product::<usize>() != count {
                return Err(format!(
                    "a zero point of shape {:?} for a scale of shape {:?}",
                    self.shape(z),
                    self.shape(scale_id)
                ));
            }
        }
        let zero_ty = zero_id.map(|z| self.value(z).ty);
        let ty = if quantize {
            let wanted = match a.int("output_dtype", 0)? as i32 {
                0 => None,
                data_type::UINT8 => Some(Ty::U8),
                data_type::INT8 => Some(Ty::I8),
                other => return Err(format!("output_dtype {}: uint8 and int8 are supported", data_type::name(other))),
            };
            let ty = zero_ty.or(wanted).unwrap_or(Ty::U8);
            if ty.q8_range().is_none() {
                // int32 constants are held as i64 (`tensor_data`).
                let shown = if ty == Ty::I64 { "int32 or int64" } else { ty.name() };
                return Err(format!(
                    "a zero point of type {shown}: QuantizeLinear writes uint8 or int8, the zero point's type"
                ));
            }
            if wanted.is_some_and(|w| w != ty) {
                return Err(format!("output_dtype differs from the zero point's type {}", ty.name()));
            }
            ty
        } else {
            let xty = self.value(x).ty;
            // int32 constants are held as i64 (`tensor_data`).
            let xty = if matches!(self.constant(x), Some(Values::I64(_))) { Ty::I32 } else { xty };
            if !matches!(xty, Ty::U8 | Ty::I8 | Ty::I32) {
                return Err(format!("an input of type {}: uint8, int8 and int32 are supported", xty.name()));
            }
            let zty = if zero_id.is_some_and(|z| matches!(self.constant(z), Some(Values::I64(_)))) {
                Some(Ty::I32)
            } else {
                zero_ty
            };
            if let Some(zty) = zty.filter(|&t| t != xty) {
                return Err(format!("a zero point of type {} for an input of type {}", zty.name(), xty.name()));
            }
            xty
        };
        let zero = match zero_id {
            None => Param::Const(vec![0; count]),
            Some(z) => match self.constant(z) {
                Some(v) => {
                    let ints = v.as_wide_ints().ok_or("the zero point must be integers")?;
                    let (lo, hi) = ty.q8_range().unwrap_or((i32::MIN as i64, i32::MAX as i64));
                    if let Some(bad) = ints.iter().find(|&&z| !(lo..=hi).contains(&z)) {
                        return Err(format!("zero point {bad} is outside {}'s range {lo}..={hi}", ty.name()));
                    }
                    if ty == Ty::I32 && ints.iter().any(|&z| z != 0) {
                        return Err("an int32 zero point must be 0".into());
                    }
                    Param::Const(ints)
                }
                None => Param::Tensor(z),
            },
        };
        Ok(Linear { scale, zero, axis, ty })
    }

    /// `i32 - Z` terms and `* S` factors of a dequantization at index
    /// variables `v`: literals for one constant, accesses otherwise.
    fn zero_term(&mut self, zero: &Param<i64>, name: &str, along: Option<&str>) -> R<Option<String>> {
        Ok(match zero {
            Param::Const(z) if z.iter().all(|&z| z == 0) => None,
            Param::Const(z) if z.len() == 1 => Some(z[0].to_string()),
            Param::Const(z) => {
                let id = self.add(name, vec![z.len()], Some(Values::I32(z.iter().map(|&z| z as i32).collect())))?;
                Some(format!("{}[{}]", self.tensor(id)?, along.unwrap_or("0")))
            }
            Param::Tensor(id) => Some(format!("i32({})", self.param_access(*id, along)?)),
        })
    }

    fn scale_factor(&mut self, scale: &Param<f32>, name: &str, along: Option<&str>) -> R<String> {
        match scale {
            Param::Const(s) if s.len() == 1 => literal(s[0] as f64),
            Param::Const(s) => {
                let id = self.add(name, vec![s.len()], Some(Values::F32(s.clone())))?;
                Ok(format!("{}[{}]", self.tensor(id)?, along.unwrap_or("0")))
            }
            Param::Tensor(id) => self.param_access(*id, along),
        }
    }

    /// A scale or zero point computed at run time: a 0-d, `[1]` or per-axis value.
    fn param_access(&mut self, id: ValueId, along: Option<&str>) -> R<String> {
        let t = self.tensor(id)?;
        Ok(match self.shape(id).len() {
            0 => format!("{t}[]"),
            _ if self.shape(id) == [1] => format!("{t}[0]"),
            _ => format!("{t}[{}]", along.unwrap_or("0")),
        })
    }

    // ------------------------------------------------------------ QuantizeLinear, DequantizeLinear

    fn quantize_linear(&mut self, n: &NodeProto) -> R {
        let x = Self::required(&self.inputs(n, 2, 3)?, 0)?;
        let out = self.output(n)?;
        if self.value(x).ty != Ty::F32 {
            return Err(format!("an input of type {}: QuantizeLinear takes f32", self.value(x).ty.name()));
        }
        let q = self.linear_params(n, x, true)?;
        // Q(DQ(v)) with the same parameters is v.
        if let Some(d) = self.dq.get(&x).filter(|d| d.linear == q && self.constant(d.src).is_none()).cloned() {
            self.alias(out, d.src)?;
            return self.set_ty(out, q.ty);
        }
        let shape = self.shape(x).to_vec();
        let v = vars("i", shape.len());
        let along = q.axis.map(|a| v[a].clone());
        let s = self.scale_factor(&q.scale, &format!("{out}#scale"), along.as_deref())?;
        let z = match &q.zero {
            Param::Const(z) if z.iter().all(|&z| z == 0) => None,
            Param::Const(z) if z.len() == 1 => Some(literal(z[0] as f64)?),
            zero => self.zero_term(zero, &format!("{out}#zero"), along.as_deref())?.map(|t| format!("f32({t})")),
        };
        let xa = format!("{}[{}]", self.tensor(x)?, v.join(", "));
        let (lo, hi) = q.ty.q8_range().expect("checked: 8-bit");
        let rounded = format!("round(f32({xa} / {s}))");
        let shifted = z.map_or(rounded.clone(), |z| format!("{rounded} + {z}"));
        let rhs = format!("{}(clamp({shifted}, {}, {}))", q.ty.name(), literal(lo as f64)?, literal(hi as f64)?);
        self.emit_def(out, shape, rhs)?;
        self.set_ty(out, q.ty)
    }

    fn dequantize_linear(&mut self, n: &NodeProto) -> R {
        let x = Self::required(&self.inputs(n, 2, 3)?, 0)?;
        let out = self.output(n)?.to_string();
        let q = self.linear_params(n, x, false)?;
        let shape = self.shape(x).to_vec();
        if let Some(data) = self.constant(x) {
            let folded = self.dequantize_constant(data, &shape, &q)?;
            let id = self.add(&out, shape, Some(Values::F32(folded)))?;
            self.dq.insert(id, Dequantized { src: x, linear: q });
            return Ok(());
        }
        let v = vars("i", shape.len());
        let along = q.axis.map(|a| v[a].clone());
        let s = self.scale_factor(&q.scale, &format!("{out}#scale"), along.as_deref())?;
        let z = self.zero_term(&q.zero, &format!("{out}#zero"), along.as_deref())?;
        let xa = format!("i32({}[{}])", self.tensor(x)?, v.join(", "));
        let centered = z.map_or(xa.clone(), |z| format!("{xa} - {z}"));
        let rhs = format!("f32({centered}) * {s}");
        let id = if self.is_graph_output(&out) {
            self.emit_def(&out, shape, rhs)?;
            self.lookup(&out)?
        } else {
            self.defer_def(&out, shape, rhs)?
        };
        self.dq.insert(id, Dequantized { src: x, linear: q });
        Ok(())
    }

    /// `(q - z) · s` of constant data in f32, as ONNX Runtime computes it
    /// (the product of two f32 values rounded once).
    fn dequantize_constant(&self, data: &Values, shape: &[usize], q: &Linear) -> R<Vec<f32>> {
        let ints = data.as_wide_ints().ok_or("quantized data must be integers")?;
        let (Param::Const(s), Param::Const(z)) = (&q.scale, &q.zero) else {
            return Err("a constant's scale and zero point must be constants".into());
        };
        let inner: usize = q.axis.map_or(1, |a| shape[a + 1..].iter().product());
        let along = |i: usize| q.axis.map_or(0, |a| (i / inner) % shape[a]);
        Ok(ints.iter().enumerate().map(|(i, &v)| ((v - z[along(i)]) as f32) * s[along(i)]).collect())
    }

    /// `out[...] = rhs;` written before the first statement that reads it,
    /// or never when nothing does.
    fn defer_def(&mut self, out: &str, shape: Vec<usize>, rhs: String) -> R<ValueId> {
        let lhs: Vec<String> =
            vars("i", shape.len()).iter().zip(&shape).map(|(v, d)| format!("{v} in 0..{d}")).collect();
        let id = self.add(out, shape, None)?;
        let ident = self.value(id).ident.clone();
        let line =
            if lhs.is_empty() { format!("{ident} = {rhs};") } else { format!("{ident}[{}] = {rhs};", lhs.join(", ")) };
        self.deferred.insert(id, line);
        Ok(id)
    }

    pub(crate) fn set_ty(&mut self, onnx: &str, ty: Ty) -> R {
        let id = self.lookup(onnx)?;
        self.values[id.0 as usize].ty = ty;
        Ok(())
    }

    /// Reshape, Flatten, Transpose, Squeeze, Unsqueeze of a dequantized
    /// value: the move of the integers, dequantized after (deferred too).
    fn move_quantized(&mut self, n: &NodeProto) -> R<bool> {
        let Some(&x) = n.input.first().and_then(|i| self.by_name.get(i)) else { return Ok(false) };
        let Some(d) = self.dq.get(&x).cloned() else { return Ok(false) };
        let out = self.output(n)?.to_string();
        if self.constant(d.src).is_some() || d.linear.axis.is_some() || self.is_graph_output(&out) {
            return Ok(false);
        }
        // Constant scales are positive (checked); one computed at run time might not be.
        if n.op_type == "MaxPool" && !matches!(d.linear.scale, Param::Const(_)) {
            return Ok(false);
        }
        let mut moved = n.clone();
        moved.input[0] = self.value(d.src).onnx.clone();
        let inner = format!("{out}#q");
        moved.output[0] = inner.clone();
        self.translate(&moved)?;
        let src = self.lookup(&inner)?;
        let shape = self.shape(src).to_vec();
        let v = vars("i", shape.len());
        let s = self.scale_factor(&d.linear.scale, &format!("{out}#scale"), None)?;
        let z = self.zero_term(&d.linear.zero, &format!("{out}#zero"), None)?;
        let xa = format!("i32({}[{}])", self.tensor(src)?, v.join(", "));
        let centered = z.map_or(xa.clone(), |z| format!("{xa} - {z}"));
        let id = self.defer_def(&out, shape, format!("f32({centered}) * {s}"))?;
        self.dq.insert(id, Dequantized { src, linear: d.linear });
        Ok(true)
    }

    // ------------------------------------------------------------ DynamicQuantizeLinear

    /// ONNX Runtime's: the range of `x` widened to include 0, `scale =
    /// (max − min) / 255`, `zero_point = sat(round(−min / scale))`, then
    /// QuantizeLinear to uint8.
    fn dynamic_quantize_linear(&mut self, n: &NodeProto) -> R {
        Attrs::new(n, &[])?;
        let x = Self::required(&self.inputs(n, 1, 1)?, 0)?;
        if self.value(x).ty != Ty::F32 {
            return Err(format!("an input of type {}: f32 is supported", self.value(x).ty.name()));
        }
        let named = |i: usize, internal: String| n.output.get(i).filter(|o| !o.is_empty()).cloned().unwrap_or(internal);
        let y = n.output.first().filter(|o| !o.is_empty()).ok_or("has no output")?.clone();
        let (scale, zero) = (named(1, format!("{y}#scale")), named(2, format!("{y}#zero")));
        let shape = self.shape(x).to_vec();
        if shape.is_empty() {
            return Err("a 0-d input is not supported".into());
        }
        let r = vars("r", shape.len());
        let ranges: Vec<String> = r.iter().zip(&shape).map(|(v, d)| format!("{v} in 0..{d}")).collect();
        let xt = self.tensor(x)?;
        let all = format!("{xt}[{}]", r.join(", "));
        let (mx, mn) = (format!("{y}#max"), format!("{y}#min"));
        self.emit_def(&mx, vec![], format!("max(max[{}]({all}), 0.0)", ranges.join(", ")))?;
        self.emit_def(&mn, vec![], format!("min(min[{}]({all}), 0.0)", ranges.join(", ")))?;
        let (mxi, mni) = (self.ident_of(&mx)?, self.ident_of(&mn)?);
        self.emit_def(&scale, vec![], format!("select({mxi}[] == {mni}[], 1.0, f32({mxi}[] - {mni}[]) / 255.0)"))?;
        let si = self.ident_of(&scale)?;
        self.emit_def(&zero, vec![], format!("u8(clamp(round(0.0 - f32({mni}[] / {si}[])), 0.0, 255.0))"))?;
        self.set_ty(&zero, Ty::U8)?;
        let zi = self.ident_of(&zero)?;
        let v = vars("i", shape.len());
        let rhs = format!("u8(clamp(round(f32({xt}[{}] / {si}[])) + f32({zi}[]), 0.0, 255.0))", v.join(", "));
        self.emit_def(&y, shape, rhs)?;
        self.set_ty(&y, Ty::U8)
    }

    fn ident_of(&self, onnx: &str) -> R<String> {
        Ok(self.value(self.lookup(onnx)?).ident.clone())
    }

    // ------------------------------------------------------------ QOperator forms

    /// MatMulInteger, ConvInteger: the i32 product with zero points subtracted.
    fn integer_op(&mut self, n: &NodeProto) -> R {
        let conv = n.op_type == "ConvInteger";
        let ins = self.inputs(n, 2, 4)?;
        let (a, b) = (Self::required(&ins, 0)?, Self::required(&ins, 1)?);
        let out = self.output(n)?.to_string();
        let geometry = if conv {
            self.conv_geometry(n, a, b)?
        } else {
            Attrs::new(n, &[])?;
            Geometry::MatMul { b_rows_out: false }
        };
        let a_side = self.integer_side(a, ins.get(2).copied().flatten(), "A")?;
        let b_side = self.integer_side(b, ins.get(3).copied().flatten(), "B")?;
        self.int_product(&out, a_side, b_side, None, geometry, None)
    }

    /// An operand of MatMulInteger/ConvInteger and its optional zero point.
    fn integer_side(&self, id: ValueId, zero: Option<ValueId>, what: &str) -> R<Side> {
        let ty = self.value(id).ty;
        if !matches!(ty, Ty::U8 | Ty::I8) {
            return Err(format!("{what} of type {}: uint8 and int8 are supported", ty.name()));
        }
        let zero = match zero {
            None => Param::Const(vec![0]),
            Some(z) => {
                if self.value(z).ty != ty {
                    return Err(format!(
                        "a zero point of type {} for {what} of type {}",
                        self.value(z).ty.name(),
                        ty.name()
                    ));
                }
                match self.constant(z) {
                    Some(v) => Param::Const(v.as_wide_ints().ok_or("zero points must be integers")?),
                    None => Param::Tensor(z),
                }
            }
        };
        Ok(Side { id, zero })
    }

    /// QLinearConv, QLinearMatMul: the integer product requantized.
    fn qlinear_op(&mut self, n: &NodeProto) -> R {
        let conv = n.op_type == "QLinearConv";
        let ins = if conv { self.inputs(n, 8, 9)? } else { self.inputs(n, 8, 8)? };
        let id = |i: usize| Self::required(&ins, i);
        let (a, b) = (id(0)?, id(3)?);
        let out = self.output(n)?.to_string();
        let geometry = if conv {
            self.conv_geometry(n, a, b)?
        } else {
            Attrs::new(n, &[])?;
            Geometry::MatMul { b_rows_out: false }
        };
        let channels = match geometry {
            Geometry::Conv { .. } => self.shape(b)[0],
            Geometry::MatMul { .. } => *self.shape(b).last().ok_or("B has no axes")?,
        };
        let (sa, za) = self.qlinear_params(id(1)?, Some(id(2)?), a, 1, "A")?;
        let (sb, zb) = self.qlinear_params(id(4)?, Some(id(5)?), b, channels, "B")?;
        let (sy, zy) = self.qlinear_params(id(6)?, Some(id(7)?), a, 1, "Y")?;
        let yty = self.value(id(7)?).ty;
        let bias = match ins.get(8).copied().flatten() {
            None => None,
            Some(bias) => match self.constant(bias) {
                Some(Values::I64(v)) if v.len() == channels => Some(v.clone()),
                _ => return Err(format!("the bias must be a constant int32 vector of {channels} values")),
            },
        };
        let mult = sb.iter().map(|&sb| (sa[0] as f64 * sb as f64 / sy[0] as f64) as f32).collect();
        let (lo, hi) = yty.q8_range().ok_or("Y's zero point must be uint8 or int8")?;
        let requant = Requant { mult, zero: zy[0], ty: yty, lo, hi };
        let a_side = Side { id: a, zero: Param::Const(za) };
        let b_side = Side { id: b, zero: Param::Const(zb) };
        self.int_product(&out, a_side, b_side, bias, geometry, Some(requant))
    }

    /// A QLinear operator's constant scale and zero point for `x` (one, or
    /// `count` per channel), checked as QuantizeLinear's are.
    fn qlinear_params(
        &self,
        scale: ValueId,
        zero: Option<ValueId>,
        x: ValueId,
        count: usize,
        what: &str,
    ) -> R<(Vec<f32>, Vec<i64>)> {
        let s = match self.constant(scale) {
            Some(Values::F32(s)) if s.len() == 1 || s.len() == count => s.clone(),
            Some(_) => return Err(format!("{what}'s scale must be one f32 value or one per channel")),
            None => return Err(format!("{what}'s scale must be a constant")),
        };
        if let Some(bad) = s.iter().find(|v| !(v.is_finite() && **v > 0.0)) {
            return Err(format!("{what}'s scale {bad}: a scale must be positive and finite"));
        }
        let z = match zero.map(|z| (self.value(z).ty, self.constant(z))) {
            None => vec![0],
            Some((ty, Some(v))) if what == "Y" || ty == self.value(x).ty => {
                v.as_wide_ints().ok_or(format!("{what}'s zero point must be integers"))?
            }
            Some((ty, Some(_))) => {
                return Err(format!(
                    "{what}'s zero point of type {} for data of type {}",
                    ty.name(),
                    self.value(x).ty.name()
                ))
            }
            Some((_, None)) => return Err(format!("{what}'s zero point must be a constant")),
        };
        if z.len() != 1 && z.len() != count {
            return Err(format!("{what}'s zero point has {} values, expected 1 or {count}", z.len()));
        }
        let z = if z.len() == 1 && s.len() > 1 { vec![z[0]; s.len()] } else { z };
        let s = if s.len() == 1 && z.len() > 1 { vec![s[0]; z.len()] } else { s };
        Ok((s, z))
    }

    /// Groups, strides, dilations and pads of a 2-D (integer) convolution of `x` by `w`.
    fn conv_geometry(&self, n: &NodeProto, x: ValueId, w: ValueId) -> R<Geometry> {
        let a = Attrs::new(n, &["auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"])?;
        let (xs, ws) = (self.shape(x), self.shape(w));
        if xs.len() != 4 || ws.len() != 4 {
            return Err(format!(
                "input of rank {} and weight of rank {}: 2-D integer convolutions are supported",
                xs.len(),
                ws.len()
            ));
        }
        let g = a.int("group", 1)?;
        let groups = usize::try_from(g).ok().filter(|&g| (1..=xs[1]).contains(&g)).ok_or(format!("group = {g}"))?;
        if ws[1] * groups != xs[1] || ws[0] % groups != 0 {
            return Err(format!("input channels {}, weight {ws:?} and group {groups} do not fit", xs[1]));
        }
        if let Some(k) = a.ints("kernel_shape")? {
            if k != [ws[2] as i64, ws[3] as i64] {
                return Err(format!("kernel_shape {k:?} differs from the weight's {:?}", &ws[2..]));
            }
        }
        let stride = same_on_both_axes("strides", a.ints("strides")?, 1)?;
        let dilation = same_on_both_axes("dilations", a.ints("dilations")?, 1)?;
        let window = [dilation * (ws[2] - 1) + 1, dilation * (ws[3] - 1) + 1];
        let pads = pads(&a, [xs[2], xs[3]], window, stride)?;
        conv_out(xs[2], pads[0] + pads[2], window[0], stride)?;
        conv_out(xs[3], pads[1] + pads[3], window[1], stride)?;
        Ok(Geometry::Conv { groups, stride, dilation, pads })
    }

    // ------------------------------------------------------------ DQ → op → Q

    /// A Conv, Gemm or MatMul of dequantized operands read only by a
    /// QuantizeLinear (through at most one Relu or Clip): the integer form.
    /// `false` when the pattern does not fit; the f32 translation follows.
    fn qdq_product(&mut self, n: &NodeProto) -> R<bool> {
        let Some(plan) = self.qdq_plan(n)? else { return Ok(false) };
        let QdqPlan { a, b, bias, geometry, requant, q_out, skipped } = plan;
        self.int_product(&q_out, a, b, bias, geometry, Some(requant))?;
        self.done.extend(skipped);
        Ok(true)
    }

    fn qdq_plan(&self, n: &NodeProto) -> R<Option<QdqPlan>> {
        let op = n.op_type.as_str();
        let get = |i: usize| n.input.get(i).filter(|s| !s.is_empty()).and_then(|s| self.by_name.get(s)).copied();
        let (Some(a), Some(b)) = (get(0), get(1)) else { return Ok(None) };
        let (Some(da), Some(db)) = (self.dq.get(&a), self.dq.get(&b)) else { return Ok(None) };
        // The activation: computed, one constant scale and zero point.
        let Some((sa, za)) = da.linear.per_tensor() else { return Ok(None) };
        if self.constant(da.src).is_some() || !matches!(da.linear.ty, Ty::U8 | Ty::I8) {
            return Ok(None);
        }
        let attrs_ok = match op {
            "Gemm" => {
                let a = Attrs::new(n, &["alpha", "beta", "transA", "transB"])?;
                a.float("alpha", 1.0)? == 1.0 && a.float("beta", 1.0)? == 1.0 && a.int("transA", 0)? == 0
            }
            _ => true,
        };
        if !attrs_ok || !matches!(db.linear.ty, Ty::U8 | Ty::I8) {
            return Ok(None);
        }
        let trans_b = op == "Gemm" && Attrs::new(n, &["alpha", "beta", "transA", "transB"])?.int("transB", 0)? != 0;
        let bshape = self.shape(db.src).to_vec();
        let (geometry, channel_axis) = match op {
            "Conv" => match self.conv_geometry(n, da.src, db.src) {
                Ok(g) => (g, 0),
                Err(_) => return Ok(None),
            },
            "Gemm" if self.shape(a).len() == 2 && bshape.len() == 2 => {
                (Geometry::MatMul { b_rows_out: trans_b }, if trans_b { 0 } else { 1 })
            }
            "MatMul" if self.shape(a).len() >= 2 && bshape.len() >= 2 => {
                (Geometry::MatMul { b_rows_out: false }, bshape.len() - 1)
            }
            _ => return Ok(None),
        };
        let Some((sb, zb)) = db.linear.constants_along(channel_axis) else { return Ok(None) };
        if self.constant(db.src).is_none() && sb.len() > 1 {
            return Ok(None);
        }
        let channels = bshape[channel_axis];
        let sb = if sb.len() == 1 { vec![sb[0]; channels] } else { sb };
        // The bias: the i32 one quantize_static writes, at scale s_a·s_w.
        let bias = match (op, get(2)) {
            ("Conv" | "Gemm", Some(c)) => match self.i32_bias(c, sa, &sb) {
                Some(b) => Some(b),
                None => return Ok(None),
            },
            _ => None,
        };
        // The readers: one QuantizeLinear, possibly after one Relu or Clip.
        let Some(out) = n.output.first().filter(|o| !o.is_empty()) else { return Ok(None) };
        let Some((q_node, skipped, bounds)) = self.quantize_reader(out)? else { return Ok(None) };
        let Some((sy, zy)) = self.q_params_of(q_node)? else { return Ok(None) };
        let ty = self.q_ty_of(q_node);
        let Some((mut lo, mut hi)) = ty.q8_range() else { return Ok(None) };
        if let Some((l, h)) = bounds {
            let range = (lo, hi);
            lo = lo.max(quantize_bound(l, sy, zy, range));
            hi = hi.min(quantize_bound(h, sy, zy, range));
        }
        let mult = sb.iter().map(|&s| (sa as f64 * s as f64 / sy as f64) as f32).collect();
        Ok(Some(QdqPlan {
            a: Side { id: da.src, zero: Param::Const(vec![za]) },
            b: Side { id: db.src, zero: Param::Const(zb) },
            bias,
            geometry,
            requant: Requant { mult, zero: zy, ty, lo, hi },
            q_out: q_node.output[0].clone(),
            skipped,
        }))
    }

    /// The i32 values of a bias that is the DequantizeLinear of an int32
    /// constant with zero point 0 and scale `s_a · s_w[j]` (f32 products, as
    /// ONNX Runtime computes them).
    fn i32_bias(&self, c: ValueId, sa: f32, sb: &[f32]) -> Option<Vec<i64>> {
        let d = self.dq.get(&c)?;
        let Some(Values::I64(v)) = self.constant(d.src) else { return None };
        let (s, z) = d.linear.constants_along(0)?;
        if v.len() != sb.len() || z.iter().any(|&z| z != 0) {
            return None;
        }
        let s = if s.len() == 1 { vec![s[0]; sb.len()] } else { s };
        s.iter().zip(sb).all(|(&s, &w)| s == sa * w).then(|| v.clone())
    }

    /// The QuantizeLinear that alone reads `value` (directly, or through a
    /// Relu or Clip of constant bounds that alone reads it), with the
    /// outputs the integer form computes in their place and the f32 bounds
    /// of the activation.
    #[allow(clippy::type_complexity)]
    fn quantize_reader(&self, value: &str) -> R<Option<(&NodeProto, Vec<String>, Option<(f64, f64)>)>> {
        let sole = |v: &str| -> Option<&NodeProto> {
            if self.is_graph_output(v) {
                return None;
            }
            match self.readers.get(v).map(Vec::as_slice) {
                Some(&[i]) => Some(&self.nodes[i]),
                _ => None,
            }
        };
        let Some(first) = sole(value) else { return Ok(None) };
        let (q, bounds) = match first.op_type.as_str() {
            "QuantizeLinear" => (first, None),
            "Relu" | "Clip" => {
                let Some(b) = self.clip_bounds(first) else { return Ok(None) };
                let Some(out) = first.output.first().filter(|o| !o.is_empty() && first.output.len() == 1) else {
                    return Ok(None);
                };
                let Some(q) = sole(out).filter(|q| q.op_type == "QuantizeLinear") else {
                    return Ok(None);
                };
                (q, Some(b))
            }
            _ => return Ok(None),
        };
        if q.output.iter().skip(1).any(|o| !o.is_empty()) || q.output.first().is_none_or(|o| o.is_empty()) {
            return Ok(None);
        }
        let mut skipped = vec![q.output[0].clone()];
        if bounds.is_some() {
            skipped.push(first.output[0].clone());
        }
        Ok(Some((q, skipped, bounds)))
    }

    /// A Relu's or a Clip's bounds when they are constants.
    fn clip_bounds(&self, n: &NodeProto) -> Option<(f64, f64)> {
        if n.op_type == "Relu" {
            return n.attribute.is_empty().then_some((0.0, f64::INFINITY));
        }
        if self.opset < 11 {
            let a = Attrs::new(n, &["min", "max"]).ok()?;
            return Some((a.float("min", f32::NEG_INFINITY).ok()? as f64, a.float("max", f32::INFINITY).ok()? as f64));
        }
        if !n.attribute.is_empty() {
            return None;
        }
        let bound = |i: usize, default: f64| -> Option<f64> {
            match n.input.get(i).filter(|s| !s.is_empty()) {
                None => Some(default),
                Some(name) => {
                    let v = self.constant(*self.by_name.get(name)?)?;
                    (v.len() == 1).then(|| v.as_f64()[0] as f32 as f64)
                }
            }
        };
        Some((bound(1, f64::NEG_INFINITY)?, bound(2, f64::INFINITY)?))
    }

    /// A QuantizeLinear's one constant scale and zero point, checked.
    fn q_params_of(&self, q: &NodeProto) -> R<Option<(f32, i64)>> {
        let get = |i: usize| q.input.get(i).filter(|s| !s.is_empty()).and_then(|s| self.by_name.get(s)).copied();
        let Some(scale) = get(1) else { return Ok(None) };
        let s = match self.constant(scale) {
            Some(Values::F32(s)) if s.len() == 1 => s[0],
            _ => return Ok(None),
        };
        if !(s.is_finite() && s > 0.0) {
            return Ok(None); // The QuantizeLinear itself reports it.
        }
        let z = match get(2).map(|z| self.constant(z)) {
            None => 0,
            Some(Some(v @ (Values::U8(_) | Values::I8(_)))) if v.len() == 1 => v.as_wide_ints().expect("ints")[0],
            Some(_) => return Ok(None),
        };
        if Attrs::new(q, &["axis", "saturate"]).is_err() {
            return Ok(None);
        }
        Ok(Some((s, z)))
    }

    fn q_ty_of(&self, q: &NodeProto) -> Ty {
        let z = q.input.get(2).filter(|s| !s.is_empty()).and_then(|s| self.by_name.get(s)).copied();
        z.map_or(Ty::U8, |z| self.value(z).ty)
    }

    // ------------------------------------------------------------ the integer product

    /// `out` = the integer product of `a` and `b` (zero points subtracted),
    /// plus `bias`, requantized or left in i32.
    fn int_product(
        &mut self,
        out: &str,
        a: Side,
        b: Side,
        bias: Option<Vec<i64>>,
        geometry: Geometry,
        requant: Option<Requant>,
    ) -> R {
        let (ash, bsh) = (self.shape(a.id).to_vec(), self.shape(b.id).to_vec());
        let (aty, bty) = (self.value(a.id).ty, self.value(b.id).ty);
        for (what, ty) in [("A", aty), ("B", bty)] {
            if !matches!(ty, Ty::U8 | Ty::I8) {
                return Err(format!("{what} of type {}: uint8 and int8 are supported", ty.name()));
            }
        }
        let za = match &a.zero {
            Param::Const(z) if z.len() == 1 => Param::Const(z.clone()),
            Param::Const(_) => return Err("A's zero point must be one value (per tensor)".into()),
            Param::Tensor(id) if self.shape(*id).iter().product::<usize>() == 1 => Param::Tensor(*id),
            Param::Tensor(_) => return Err("A's zero point must be one value (per tensor)".into()),
        };
        // Output shape, the output channel axis, the reduction and accesses.
        let (shape, channels) = self.product_shape(&ash, &bsh, geometry)?;
        let rank = shape.len();
        let v = vars("i", rank);
        let j = match geometry {
            Geometry::Conv { .. } => v[1].clone(),
            Geometry::MatMul { .. } => v[rank - 1].clone(),
        };
        let bconst = match self.constant(b.id) {
            Some(Values::I8(w)) => Some(w.clone()),
            _ => None,
        };
        let zb_zero = matches!(&b.zero, Param::Const(z) if z.iter().all(|&z| z == 0));
        if let Param::Const(z) = &b.zero {
            if z.len() != 1 && z.len() != channels {
                return Err(format!("B's zero point has {} values for {channels} output channels", z.len()));
            }
        }
        // The activation, padded with its zero point (a zero after dequantization).
        let a_name = self.padded_input(out, a.id, &za, geometry)?;
        let canonical = bconst.is_some() && zb_zero && (bsh.len() == 2 || matches!(geometry, Geometry::Conv { .. }));
        let mut terms = Vec::new();
        let mut bias = bias.unwrap_or_else(|| vec![0; channels]);
        if canonical {
            let w = bconst.expect("constant");
            // W as [channels, K...] so that the sum reads W[j, k].
            let (wid, wsum) = self.weight_rows(out, b.id, &w, &bsh, geometry)?;
            let w_name = self.tensor(wid)?;
            terms.push(self.product_sum((&a_name, &ash), (&w_name, &bsh), &v, &j, geometry, true, None));
            match &za {
                Param::Const(z) => bias.iter_mut().zip(&wsum).for_each(|(b, s)| *b -= z[0] * s),
                Param::Tensor(id) => {
                    let ws = self.add(
                        &format!("{out}#wsum"),
                        vec![channels],
                        Some(Values::I32(wsum.iter().map(|&s| s as i32).collect())),
                    )?;
                    let zt = format!("i32({})", self.param_access(*id, None)?);
                    terms.push(format!("- {zt} * {}[{j}]", self.tensor(ws)?));
                }
            }
        } else if let Some(split) =
            self.activation_product(out, (&a_name, &ash, aty, &za), (&b, &bsh, bty), &v, &j, geometry)?
        {
            terms.extend(split);
        } else {
            let za_t = self.zero_term(&za, &format!("{out}#azero"), None)?;
            let zb_t = self.zero_term(&b.zero, &format!("{out}#bzero"), Some(&j))?;
            let b_name = self.tensor(b.id)?;
            let zeros = Some((za_t, zb_t));
            terms.push(self.product_sum((&a_name, &ash), (&b_name, &bsh), &v, &j, geometry, false, zeros));
        }
        if let Some(big) = bias.iter().find(|&&b| i32::try_from(b).is_err()) {
            return Err(format!("the bias {big} does not fit in i32"));
        }
        if bias.iter().any(|&b| b != 0) {
            let bid = self.add(
                &format!("{out}#bias"),
                vec![channels],
                Some(Values::I32(bias.iter().map(|&b| b as i32).collect())),
            )?;
            terms.push(format!("+ {}[{j}]", self.tensor(bid)?));
        }
        let acc = terms.join(" ");
        match requant {
            None => {
                self.emit_def(out, shape, acc)?;
                self.set_ty(out, Ty::I32)
            }
            Some(rq) => {
                let m = if rq.mult.iter().all(|&m| m == rq.mult[0]) {
                    literal(rq.mult[0] as f64)?
                } else {
                    let id = self.add(&format!("{out}#requant"), vec![channels], Some(Values::F32(rq.mult)))?;
                    format!("{}[{j}]", self.tensor(id)?)
                };
                let rounded = format!("round(f32(f32({acc}) * {m}))");
                let shifted = if rq.zero == 0 { rounded } else { format!("{rounded} + {}", literal(rq.zero as f64)?) };
                let (lo, hi) = (literal(rq.lo as f64)?, literal(rq.hi as f64)?);
                self.emit_def(out, shape, format!("{}(clamp({shifted}, {lo}, {hi}))", rq.ty.name()))?;
                self.set_ty(out, rq.ty)
            }
        }
    }

    /// The terms of a product of two u8 operands (one constant zero point
    /// each: attention's `Q·Kᵀ` and `softmax·V` as `quantize_static` makes
    /// them, or a u8 weight, whose `B'` and column sums are then weight-only
    /// statements, folded) in the form the dot-product instructions take, unsigned
    /// bytes times signed ones: with `B' = B − 128` in i8 and `d = 128 − z_B`,
    /// `Σ(A − z_A)(B − z_B) = Σ A·B' + d·ΣA − z_A·ΣB' − K·z_A·d`, the row
    /// sums of `A` and column sums of `B'` statements of their own. Exact
    /// in i32, as the product it replaces (it ran as 32-bit multiplies:
    /// a BERT-base layer's two attention products, a third of its time).
    /// `None` where the form does not apply.
    fn activation_product(
        &mut self,
        out: &str,
        (a_name, ash, aty, za): (&str, &[usize], Ty, &Param<i64>),
        (b, bsh, bty): (&Side, &[usize], Ty),
        v: &[String],
        j: &str,
        geometry: Geometry,
    ) -> R<Option<Vec<String>>> {
        let (Param::Const(za), Param::Const(zb)) = (za, &b.zero) else { return Ok(None) };
        let ([za], [zb], Geometry::MatMul { b_rows_out: false }, Ty::U8, Ty::U8) =
            (za.as_slice(), zb.as_slice(), geometry, aty, bty)
        else {
            return Ok(None);
        };
        if ash.len() < 2 || bsh.len() < 2 {
            return Ok(None);
        }
        let (rank, na, nb) = (v.len(), ash.len(), bsh.len());
        let k = ash[na - 1];
        let b_name = self.tensor(b.id)?;
        let signed = {
            let idx = vars("i", nb).join(", ");
            let name = format!("{out}#bsigned");
            self.emit_def(&name, bsh.to_vec(), format!("i8(i32({b_name}[{idx}]) - 128)"))?;
            self.set_ty(&name, Ty::I8)?;
            self.ident_of(&name)?
        };
        let d = 128 - zb;
        let signed_term = |c: i64, t: String| if c < 0 { format!("- {} * {t}", -c) } else { format!("+ {c} * {t}") };
        let mut terms = vec![self.product_sum((a_name, ash), (&signed, bsh), v, j, geometry, false, None)];
        if d != 0 {
            let lhs = vars("i", na - 1).join(", ");
            let name = format!("{out}#arows");
            self.emit_def(&name, ash[..na - 1].to_vec(), format!("sum[r0 in 0..{k}](i32({a_name}[{lhs}, r0]))"))?;
            self.set_ty(&name, Ty::I32)?;
            let mut at = batch_indices(v, ash);
            at.push(v[rank - 2].clone());
            terms.push(signed_term(d, format!("{}[{}]", self.ident_of(&name)?, at.join(", "))));
        }
        if *za != 0 {
            let iv = vars("i", nb - 1);
            let mut read = iv[..nb - 2].to_vec();
            read.extend(["r0".to_string(), iv[nb - 2].clone()]);
            let mut shape = bsh[..nb - 2].to_vec();
            shape.push(bsh[nb - 1]);
            let name = format!("{out}#bcols");
            self.emit_def(&name, shape, format!("sum[r0 in 0..{k}](i32({signed}[{}]))", read.join(", ")))?;
            self.set_ty(&name, Ty::I32)?;
            let mut at = batch_indices(v, bsh);
            at.push(j.to_string());
            terms.push(signed_term(-za, format!("{}[{}]", self.ident_of(&name)?, at.join(", "))));
        }
        let constant = (k as i64) * za * d;
        if constant != 0 {
            terms.push(if constant < 0 { format!("+ {}", -constant) } else { format!("- {constant}") });
        }
        Ok(Some(terms))
    }

    /// The product's shape and its number of output channels.
    fn product_shape(&self, ash: &[usize], bsh: &[usize], geometry: Geometry) -> R<(Vec<usize>, usize)> {
        match geometry {
            Geometry::Conv { stride, dilation, pads, .. } => {
                let window = [dilation * (bsh[2] - 1) + 1, dilation * (bsh[3] - 1) + 1];
                let oh = conv_out(ash[2], pads[0] + pads[2], window[0], stride)?;
                let ow = conv_out(ash[3], pads[1] + pads[3], window[1], stride)?;
                Ok((vec![ash[0], bsh[0], oh, ow], bsh[0]))
            }
            Geometry::MatMul { b_rows_out } => {
                if ash.len() < 2 || bsh.len() < 2 {
                    return Err(format!("operands of shapes {ash:?} and {bsh:?}: matrices are supported"));
                }
                let k = ash[ash.len() - 1];
                let (k2, n) = if b_rows_out { (bsh[1], bsh[0]) } else { (bsh[bsh.len() - 2], bsh[bsh.len() - 1]) };
                if k != k2 {
                    return Err(format!("inner dimensions differ: {k} and {k2}"));
                }
                let batch = crate::ops::broadcast(&ash[..ash.len() - 2], &bsh[..bsh.len() - 2])?;
                let mut shape = batch;
                shape.extend([ash[ash.len() - 2], n]);
                Ok((shape, n))
            }
        }
    }

    /// The activation of a convolution padded with its zero point (an
    /// explicit statement), or the activation itself.
    fn padded_input(&mut self, out: &str, a: ValueId, za: &Param<i64>, geometry: Geometry) -> R<String> {
        let Geometry::Conv { pads: [t, l, b, r], .. } = geometry else { return self.tensor(a) };
        if [t, l, b, r] == [0; 4] {
            return self.tensor(a);
        }
        let s = self.shape(a).to_vec();
        let ty = self.value(a).ty;
        let fill = match za {
            Param::Const(z) => format!("{}({})", ty.name(), z[0]),
            Param::Tensor(id) => self.param_access(*id, None)?,
        };
        let x = self.tensor(a)?;
        let rhs = format!(
            "select(i2 >= {t} && i2 < {} && i3 >= {l} && i3 < {}, {x}[i0, i1, i2 - {t}, i3 - {l}], {fill})",
            s[2] + t,
            s[3] + l
        );
        let name = format!("{out}#pad");
        self.emit_def(&name, vec![s[0], s[1], s[2] + t + b, s[3] + l + r], rhs)?;
        self.set_ty(&name, ty)?;
        self.ident_of(&name)
    }

    /// A constant i8 weight with output channels first (`[N, K]` for a
    /// product, as it is for a convolution) and each channel's sum.
    fn weight_rows(
        &mut self,
        out: &str,
        b: ValueId,
        w: &[i8],
        bsh: &[usize],
        geometry: Geometry,
    ) -> R<(ValueId, Vec<i64>)> {
        let (id, rows): (ValueId, Vec<i8>) = match geometry {
            Geometry::Conv { .. } | Geometry::MatMul { b_rows_out: true } => (b, w.to_vec()),
            Geometry::MatMul { b_rows_out: false } => {
                let (k, n) = (bsh[0], bsh[1]);
                let t: Vec<i8> = (0..n * k).map(|i| w[(i % k) * n + i / k]).collect();
                let id = self.add(&format!("{out}#weight_t"), vec![n, k], Some(Values::I8(t.clone())))?;
                (id, t)
            }
        };
        let channels = self.shape(id)[0];
        let per = rows.len() / channels.max(1);
        let sums = rows.chunks(per.max(1)).map(|c| c.iter().map(|&x| x as i64).sum()).collect();
        Ok((id, sums))
    }

    /// `sum[...](i32(A[..]) * i32(W[j, ..]))`, the canonical form (`b_name`
    /// channels-first: `W[j, k]`, `W[j, c, r, s]`), or with `zeros` the sum of
    /// the products of the operands less their zero points.
    #[allow(clippy::too_many_arguments)]
    fn product_sum(
        &self,
        (a_name, ash): (&str, &[usize]),
        (b_name, bsh): (&str, &[usize]),
        v: &[String],
        j: &str,
        geometry: Geometry,
        rows_first: bool,
        zeros: Option<(Option<String>, Option<String>)>,
    ) -> String {
        let (ra, rb, ranges) = match geometry {
            Geometry::Conv { groups, stride, dilation, .. } => {
                let (cg, kg, r, s) = (bsh[1], bsh[0] / groups, bsh[2], bsh[3]);
                let ch = match (groups, kg, cg) {
                    (1, _, _) => "r0".to_string(),
                    (_, 1, 1) => format!("{j} + r0"),
                    (_, 1, _) => format!("{j} * {cg} + r0"),
                    (_, _, 1) => format!("{j} / {kg} + r0"),
                    _ => format!("({j} / {kg}) * {cg} + r0"),
                };
                let at = |o: &str, x: &str| {
                    let o = if stride == 1 { o.to_string() } else { format!("{o} * {stride}") };
                    let x = if dilation == 1 { x.to_string() } else { format!("{x} * {dilation}") };
                    format!("{o} + {x}")
                };
                let ra = format!("{a_name}[{}, {ch}, {}, {}]", v[0], at(&v[2], "r1"), at(&v[3], "r2"));
                (ra, format!("{b_name}[{j}, r0, r1, r2]"), format!("r0 in 0..{cg}, r1 in 0..{r}, r2 in 0..{s}"))
            }
            Geometry::MatMul { b_rows_out } => {
                let rank = v.len();
                let k = ash[ash.len() - 1];
                let mut ai = batch_indices(v, ash);
                ai.extend([v[rank - 2].clone(), "r0".into()]);
                let rb = if rows_first || b_rows_out {
                    format!("{b_name}[{j}, r0]")
                } else {
                    let mut bi = batch_indices(v, bsh);
                    bi.extend(["r0".to_string(), j.to_string()]);
                    format!("{b_name}[{}]", bi.join(", "))
                };
                (format!("{a_name}[{}]", ai.join(", ")), rb, format!("r0 in 0..{k}"))
            }
        };
        let centered = |x: String, z: Option<String>| match z {
            None => format!("i32({x})"),
            Some(z) => format!("(i32({x}) - {z})"),
        };
        match zeros {
            None => format!("sum[{ranges}](i32({ra}) * i32({rb}))"),
            Some((za, zb)) => format!("sum[{ranges}]({} * {})", centered(ra, za), centered(rb, zb)),
        }
    }
}

/// The batch indices of a matrix operand of shape `s` in a product whose
/// output's variables are `v` (broadcast: a dimension of 1 reads index 0).
fn batch_indices(v: &[String], s: &[usize]) -> Vec<String> {
    let skip = v.len() - s.len();
    (0..s.len() - 2).map(|a| if s[a] == 1 { "0".into() } else { v[skip + a].clone() }).collect()
}

/// What the integer form of a DQ → op → Q pattern needs.
struct QdqPlan {
    a: Side,
    b: Side,
    bias: Option<Vec<i64>>,
    geometry: Geometry,
    requant: Requant,
    /// The QuantizeLinear's output: what the integer form defines.
    q_out: String,
    /// Outputs of the nodes the integer form computes (the QuantizeLinear, a Relu or Clip).
    skipped: Vec<String>,
}

/// `Q(bound)`: an activation bound in the quantized domain, saturated.
fn quantize_bound(bound: f64, scale: f32, zero: i64, (lo, hi): (i64, i64)) -> i64 {
    if bound.is_infinite() {
        return if bound > 0.0 { hi } else { lo };
    }
    let q = ((bound as f32) / scale).round_ties_even() as f64 + zero as f64;
    q.clamp(lo as f64, hi as f64) as i64
}
