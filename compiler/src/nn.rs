//! The operators of the standard library (`std/nn.tex`) as one typed table:
//! what the rest of the compiler needs to know of each, besides its
//! definition in `std/nn.tex`.
//!
//! Every layer that treats a `std.nn` call as more than a call reads this
//! table: the e-graph's language and shape rules (`rewrite`), the weights of
//! a model (`graph::weights`), the recognizer of hand-written operators, the
//! ONNX importer and the input-domain table of `texc run`. Operator names
//! appear as string literals here and in `std/nn.tex` only, so a misspelled
//! operator is a compile error, not a silent fall-through to a default.
//!
//! Invariant (`std_table_matches_the_standard_library` in `tests/`): the
//! table has exactly one row per kernel name of `std/nn.tex`, and every
//! weight or non-negative position is a tensor parameter of every overload.

use std::fmt;
use std::str::FromStr;

/// The forms of Winograd convolution the rewriter knows, each a family of
/// standard-library operators (with `_bias`, `_bias_relu` epilogues).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
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

    /// The family's operator with `epilogue`.
    pub fn op(self, epilogue: Epilogue) -> NnOp {
        NnOp::Conv2dWinograd(self, epilogue)
    }

    /// The side of its output tile.
    pub fn tile(self) -> i64 {
        match self {
            WinogradForm::F2 | WinogradForm::F2k => 2,
            WinogradForm::F4 => 4,
        }
    }

    /// Whether operator `op` is of this family (any epilogue).
    pub fn has(self, op: NnOp) -> bool {
        matches!(op, NnOp::Conv2dWinograd(f, _) if f == self)
    }
}

/// What a convolution computes after its sums, in its own stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Epilogue {
    None,
    /// `+ b[k]`.
    Bias,
    /// `max(· + b[k], 0)`.
    BiasRelu,
}

impl Epilogue {
    /// Operations per output element.
    pub fn ops_per_output(self) -> f64 {
        match self {
            Epilogue::None => 0.0,
            Epilogue::Bias => 1.0,
            Epilogue::BiasRelu => 2.0,
        }
    }
}

/// A standard-library operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NnOp {
    AdaptiveAvgPool2d,
    AdaptiveMaxPool2d,
    Add,
    AvgPool2d,
    BatchMatmul,
    BatchNorm,
    BiasAdd,
    BnFoldBias,
    BnFoldWeight,
    Conv1d(Epilogue),
    /// Direct 2-D convolution, with its epilogue.
    Conv2d(Epilogue),
    /// A 1×1 convolution as a product per image.
    Conv2d1x1(Epilogue),
    /// A 1×1 convolution of stride above 1: the positions read copied out,
    /// then a product per image.
    Conv2d1x1Strided(Epilogue),
    /// im2col: filters × patches.
    Conv2dIm2col,
    /// im2col turned around: patches × filtersᵀ (constant filters).
    Conv2dIm2colT,
    Conv2dWinograd(WinogradForm, Epilogue),
    Conv3d(Epilogue),
    ConvTranspose2d(Epilogue),
    Dense,
    Dequantize,
    Div,
    Elu,
    Embedding,
    Flatten,
    Gelu,
    GeluTanh,
    GlobalAvgPool2d,
    GlobalMaxPool2d,
    GroupNorm,
    Hardsigmoid,
    Hardswish,
    Hardtanh,
    InstanceNorm,
    LayerNorm,
    /// Layer normalization over the last two axes.
    LayerNorm2,
    LeakyRelu,
    LogSoftmax,
    LogSoftmaxDim1,
    Matmul,
    MaxPool2d,
    Mish,
    Mul,
    Pad,
    PixelShuffle,
    Prelu,
    Quantize,
    QuantizeU8,
    Relu,
    Relu6,
    ScaledDotProductAttention,
    ScaledDotProductAttentionCausal,
    Selu,
    Sigmoid,
    Silu,
    Softmax,
    SoftmaxDim1,
    Softplus,
    Sub,
    Tanh,
    Transpose,
    UpsampleBilinear2d,
    UpsampleNearest2d,
}

/// One row of the table.
pub struct OpRow {
    pub op: NnOp,
    /// The kernel's name in `std/nn.tex`.
    pub name: &'static str,
    /// Parameter positions that take a layer's learned weights: filters,
    /// biases and normalization statistics. Only these count as
    /// parameters: the operands of `matmul`, `add` and the like may equally
    /// be activations, and a kernel does not say which.
    pub weights: &'static [usize],
    /// Parameters whose values must be ≥ 0 (position, name): random inputs
    /// passed straight to them are drawn from [0, 1) (`texc run`).
    pub non_negative: &'static [(usize, &'static str)],
    /// Computed point by point from its operands: the default schedules
    /// fuse it into its element-wise consumers and producers, and its
    /// output has its first operand's shape.
    pub pointwise: bool,
}

const fn row(op: NnOp, name: &'static str, weights: &'static [usize], pointwise: bool) -> OpRow {
    OpRow { op, name, weights, non_negative: &[], pointwise }
}

use Epilogue::{Bias, BiasRelu, None as Plain};
use WinogradForm::{F2k, F2, F4};

/// Every standard-library operator, once.
pub const TABLE: &[OpRow] = &[
    row(NnOp::AdaptiveAvgPool2d, "adaptive_avg_pool2d", &[], false),
    row(NnOp::AdaptiveMaxPool2d, "adaptive_max_pool2d", &[], false),
    row(NnOp::Add, "add", &[], true),
    row(NnOp::AvgPool2d, "avg_pool2d", &[], false),
    row(NnOp::BatchMatmul, "batch_matmul", &[], false),
    OpRow {
        op: NnOp::BatchNorm,
        name: "batch_norm",
        weights: &[1, 2, 3, 4],
        non_negative: &[(4, "var")],
        pointwise: true,
    },
    row(NnOp::BiasAdd, "bias_add", &[1], true),
    row(NnOp::BnFoldBias, "bn_fold_bias", &[0, 1, 2, 3], false),
    row(NnOp::BnFoldWeight, "bn_fold_weight", &[0, 1, 2], false),
    row(NnOp::Conv1d(Plain), "conv1d", &[1], false),
    row(NnOp::Conv1d(Bias), "conv1d_bias", &[1, 2], false),
    row(NnOp::Conv2d(Plain), "conv2d", &[1], false),
    row(NnOp::Conv2d(Bias), "conv2d_bias", &[1, 2], false),
    row(NnOp::Conv2d(BiasRelu), "conv2d_bias_relu", &[1, 2], false),
    row(NnOp::Conv2d1x1(Plain), "conv2d_1x1", &[1], false),
    row(NnOp::Conv2d1x1(Bias), "conv2d_1x1_bias", &[1, 2], false),
    row(NnOp::Conv2d1x1Strided(Plain), "conv2d_1x1_strided", &[1], false),
    row(NnOp::Conv2d1x1Strided(Bias), "conv2d_1x1_strided_bias", &[1, 2], false),
    row(NnOp::Conv2dIm2col, "conv2d_im2col", &[1], false),
    row(NnOp::Conv2dIm2colT, "conv2d_im2col_t", &[1], false),
    row(NnOp::Conv2dWinograd(F2, Plain), "conv2d_winograd_f2", &[1], false),
    row(NnOp::Conv2dWinograd(F2, Bias), "conv2d_winograd_f2_bias", &[1, 2], false),
    row(NnOp::Conv2dWinograd(F2, BiasRelu), "conv2d_winograd_f2_bias_relu", &[1, 2], false),
    row(NnOp::Conv2dWinograd(F2k, Plain), "conv2d_winograd_f2k", &[1], false),
    row(NnOp::Conv2dWinograd(F2k, Bias), "conv2d_winograd_f2k_bias", &[1, 2], false),
    row(NnOp::Conv2dWinograd(F2k, BiasRelu), "conv2d_winograd_f2k_bias_relu", &[1, 2], false),
    row(NnOp::Conv2dWinograd(F4, Plain), "conv2d_winograd_f4", &[1], false),
    row(NnOp::Conv2dWinograd(F4, Bias), "conv2d_winograd_f4_bias", &[1, 2], false),
    row(NnOp::Conv2dWinograd(F4, BiasRelu), "conv2d_winograd_f4_bias_relu", &[1, 2], false),
    row(NnOp::Conv3d(Plain), "conv3d", &[1], false),
    row(NnOp::Conv3d(Bias), "conv3d_bias", &[1, 2], false),
    row(NnOp::ConvTranspose2d(Plain), "conv_transpose2d", &[1], false),
    row(NnOp::ConvTranspose2d(Bias), "conv_transpose2d_bias", &[1, 2], false),
    row(NnOp::Dense, "dense", &[1, 2], false),
    row(NnOp::Dequantize, "dequantize", &[], false),
    row(NnOp::Div, "div", &[], true),
    row(NnOp::Elu, "elu", &[], true),
    row(NnOp::Embedding, "embedding", &[], false),
    row(NnOp::Flatten, "flatten", &[], false),
    row(NnOp::Gelu, "gelu", &[], true),
    row(NnOp::GeluTanh, "gelu_tanh", &[], true),
    row(NnOp::GlobalAvgPool2d, "global_avg_pool2d", &[], false),
    row(NnOp::GlobalMaxPool2d, "global_max_pool2d", &[], false),
    row(NnOp::GroupNorm, "group_norm", &[1, 2], false),
    row(NnOp::Hardsigmoid, "hardsigmoid", &[], true),
    row(NnOp::Hardswish, "hardswish", &[], true),
    row(NnOp::Hardtanh, "hardtanh", &[], true),
    row(NnOp::InstanceNorm, "instance_norm", &[], false),
    row(NnOp::LayerNorm, "layer_norm", &[1, 2], false),
    row(NnOp::LayerNorm2, "layer_norm2", &[1, 2], false),
    row(NnOp::LeakyRelu, "leaky_relu", &[], true),
    row(NnOp::LogSoftmax, "log_softmax", &[], false),
    row(NnOp::LogSoftmaxDim1, "log_softmax_dim1", &[], false),
    row(NnOp::Matmul, "matmul", &[], false),
    row(NnOp::MaxPool2d, "max_pool2d", &[], false),
    row(NnOp::Mish, "mish", &[], true),
    row(NnOp::Mul, "mul", &[], true),
    row(NnOp::Pad, "pad", &[], false),
    row(NnOp::PixelShuffle, "pixel_shuffle", &[], false),
    row(NnOp::Prelu, "prelu", &[1], true),
    row(NnOp::Quantize, "quantize", &[], false),
    row(NnOp::QuantizeU8, "quantize_u8", &[], false),
    row(NnOp::Relu, "relu", &[], true),
    row(NnOp::Relu6, "relu6", &[], true),
    row(NnOp::ScaledDotProductAttention, "scaled_dot_product_attention", &[], false),
    row(NnOp::ScaledDotProductAttentionCausal, "scaled_dot_product_attention_causal", &[], false),
    row(NnOp::Selu, "selu", &[], true),
    row(NnOp::Sigmoid, "sigmoid", &[], true),
    row(NnOp::Silu, "silu", &[], true),
    row(NnOp::Softmax, "softmax", &[], false),
    row(NnOp::SoftmaxDim1, "softmax_dim1", &[], false),
    row(NnOp::Softplus, "softplus", &[], true),
    row(NnOp::Sub, "sub", &[], true),
    row(NnOp::Tanh, "tanh", &[], true),
    row(NnOp::Transpose, "transpose", &[], false),
    row(NnOp::UpsampleBilinear2d, "upsample_bilinear2d", &[], false),
    row(NnOp::UpsampleNearest2d, "upsample_nearest2d", &[], false),
];

impl NnOp {
    /// The operator's row of [`TABLE`].
    pub fn row(self) -> &'static OpRow {
        TABLE.iter().find(|r| r.op == self).expect("every operator has a row")
    }

    /// The kernel's name in `std/nn.tex`.
    pub fn name(self) -> &'static str {
        self.row().name
    }

    /// The operator a `std.nn` kernel name denotes.
    pub fn from_name(name: &str) -> Option<NnOp> {
        TABLE.iter().find(|r| r.name == name).map(|r| r.op)
    }

    pub fn weights(self) -> &'static [usize] {
        self.row().weights
    }

    pub fn pointwise(self) -> bool {
        self.row().pointwise
    }

    /// The epilogue a convolution computes in its own stage.
    pub fn epilogue(self) -> Epilogue {
        match self {
            NnOp::Conv1d(e)
            | NnOp::Conv2d(e)
            | NnOp::Conv2d1x1(e)
            | NnOp::Conv2d1x1Strided(e)
            | NnOp::Conv2dWinograd(_, e)
            | NnOp::Conv3d(e)
            | NnOp::ConvTranspose2d(e) => e,
            _ => Epilogue::None,
        }
    }

    /// Whether this is a 2-D convolution in any form (direct, 1×1,
    /// im2col, Winograd).
    pub fn is_conv2d(self) -> bool {
        matches!(
            self,
            NnOp::Conv2d(_)
                | NnOp::Conv2d1x1(_)
                | NnOp::Conv2d1x1Strided(_)
                | NnOp::Conv2dIm2col
                | NnOp::Conv2dIm2colT
                | NnOp::Conv2dWinograd(..)
        )
    }

    /// The Winograd form, for Winograd convolutions.
    pub fn winograd(self) -> Option<WinogradForm> {
        match self {
            NnOp::Conv2dWinograd(f, _) => Some(f),
            _ => None,
        }
    }
}

/// What the shape and work rules know of an argument: a tensor's shape, an
/// integer constant, or nothing.
#[derive(Clone, Debug, PartialEq)]
pub enum Info {
    Shape(Vec<i64>),
    Num(i64),
    Other,
}

impl Info {
    pub fn shape(&self) -> Option<&[i64]> {
        match self {
            Info::Shape(s) => Some(s),
            _ => None,
        }
    }

    pub fn num(&self) -> Option<i64> {
        match self {
            Info::Num(v) => Some(*v),
            _ => None,
        }
    }

    /// Elements of a tensor; 0 for anything else.
    pub fn numel(&self) -> f64 {
        self.shape().map_or(0.0, |s| s.iter().map(|&d| d as f64).product())
    }
}

/// The arithmetic an operator does and the temporaries it materializes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Work {
    pub flops: f64,
    /// Elements of intermediate tensors written and read again (a padded
    /// copy of the input, im2col's patches, Winograd's transformed tiles).
    pub temporaries: f64,
}

impl NnOp {
    /// Output shape from the arguments, for the operators the e-graph
    /// rewrites and prices; `None` where not known.
    pub fn shape(self, args: &[Info]) -> Option<Vec<i64>> {
        let s = |i: usize| args.get(i).and_then(Info::shape);
        let n = |i: usize| args.get(i).and_then(Info::num);
        Some(match self {
            NnOp::Conv2d(_) | NnOp::Conv2dIm2col | NnOp::Conv2dIm2colT => {
                let (x, w) = (s(0)?, s(1)?);
                let k = self.conv_pad_at();
                let (pad, stride, dil) = (n(k)?, n(k + 1)?, n(k + 2)?);
                let out = |h: i64, r: i64| (h + 2 * pad - dil * (r - 1) - 1).div_euclid(stride.max(1)) + 1;
                vec![x[0], w[0], out(x[2], w[2]), out(x[3], w[3])]
            }
            NnOp::Conv2d1x1(_) => {
                let (x, w) = (s(0)?, s(1)?);
                vec![x[0], w[0], x[2], x[3]]
            }
            // Every stride-th position of each side.
            NnOp::Conv2d1x1Strided(e) => {
                let (x, w, stride) = (s(0)?, s(1)?, n(Self::stride_at(e))?);
                let out = |h: i64| (h - 1).div_euclid(stride.max(1)) + 1;
                vec![x[0], w[0], out(x[2]), out(x[3])]
            }
            // 3×3 filters, stride 1: each side grows by 2·pad − 2.
            NnOp::Conv2dWinograd(..) => {
                let (x, w, pad) = (s(0)?, s(1)?, n(self.conv_pad_at())?);
                vec![x[0], w[0], x[2] + 2 * pad - 2, x[3] + 2 * pad - 2]
            }
            NnOp::MaxPool2d | NnOp::AvgPool2d => {
                let x = s(0)?;
                let (k, stride, pad) = (n(1)?, n(2)?, n(3)?);
                let out = |h: i64| (h + 2 * pad - k).div_euclid(stride.max(1)) + 1;
                vec![x[0], x[1], out(x[2]), out(x[3])]
            }
            NnOp::GlobalAvgPool2d => vec![s(0)?[0], s(0)?[1], 1, 1],
            NnOp::Dense => vec![s(0)?[0], s(1)?[0]],
            NnOp::Matmul => vec![s(0)?[0], s(1)?[1]],
            NnOp::BatchMatmul => vec![s(0)?[0], s(0)?[1], s(1)?[2]],
            NnOp::BnFoldWeight | NnOp::BnFoldBias | NnOp::Softmax | NnOp::LayerNorm => s(0)?.to_vec(),
            op if op.pointwise() => s(0)?.to_vec(),
            NnOp::Transpose => {
                let x = s(0)?;
                let perm: Vec<i64> = args[1..].iter().map(Info::num).collect::<Option<_>>()?;
                if perm.len() != x.len() {
                    return None;
                }
                perm.iter().map(|&p| x.get(usize::try_from(p).ok()?).copied()).collect::<Option<_>>()?
            }
            _ => return None,
        })
    }

    /// Position of a 2-D convolution's `pad` argument (then stride, dilation, groups).
    pub fn conv_pad_at(self) -> usize {
        match self {
            NnOp::Conv2d(Epilogue::None)
            | NnOp::Conv2dIm2col
            | NnOp::Conv2dIm2colT
            | NnOp::Conv2dWinograd(_, Epilogue::None) => 2,
            _ => 3,
        }
    }

    /// Position of a strided 1×1 convolution's `stride` argument (after
    /// the bias, where there is one).
    fn stride_at(e: Epilogue) -> usize {
        if e == Epilogue::None {
            2
        } else {
            3
        }
    }

    /// FLOPs and temporaries of one call with arguments `args` and `out`
    /// output elements. Operators without a rule count one operation per
    /// output element.
    pub fn work(self, args: &[Info], out: f64) -> Work {
        let x = args.first().and_then(Info::shape);
        let w = args.get(1).and_then(Info::shape);
        // The zero-padded copy of the input that these operators materialize.
        let padded = |pad: i64| {
            x.filter(|x| x.len() == 4)
                .map_or(0.0, |x| (x[0] * x[1]) as f64 * ((x[2] + 2 * pad) * (x[3] + 2 * pad)) as f64)
        };
        // Multiply-adds per output of a 2-D convolution: its filter's C·R·S.
        let window = || w.filter(|w| w.len() == 4).map_or(0.0, |w| (w[1] * w[2] * w[3]) as f64);
        let pad = || args.get(self.conv_pad_at()).and_then(Info::num).unwrap_or(0);
        let flops = |flops: f64| Work { flops, temporaries: 0.0 };
        match self {
            NnOp::Conv2d(e) => {
                Work { flops: out * 2.0 * window() + out * e.ops_per_output(), temporaries: 2.0 * padded(pad()) }
            }
            NnOp::Conv2dIm2col | NnOp::Conv2dIm2colT => {
                // The direct convolution's work, plus the patch matrix written and read.
                let k = w.map_or(1.0, |w| w[0] as f64);
                let cols = out / k.max(1.0) * window();
                Work { flops: out * 2.0 * window(), temporaries: 2.0 * padded(pad()) + 2.0 * cols }
            }
            NnOp::Conv2dWinograd(form, e) => {
                // Per m×m output tile and (k, c): (m+2)² multiply-adds. Transforms,
                // per transformed element: input 2·(m+2)/2 adds, output about as many;
                // a fused epilogue adds one operation (bias) or two (bias, relu) per output.
                let m = form.tile() as f64;
                let a = (m + 2.0) * (m + 2.0);
                let c = x.map_or(0.0, |x| x[1] as f64);
                let k = w.map_or(0.0, |w| w[0] as f64);
                // Whole tiles: an output side that is not a multiple of m computes past the image.
                let tiles = x.filter(|x| x.len() == 4).map_or(0.0, |x| {
                    let (t, grow) = (form.tile(), 2 * pad() - 2);
                    (x[0] * ((x[2] + grow + t - 1) / t) * ((x[3] + grow + t - 1) / t)) as f64
                });
                let v = tiles * c * a; // input tiles transformed
                let p = tiles * k * a; // products before the output transform
                Work {
                    flops: 2.0 * a * tiles * k * c + 2.0 * (m + 2.0) * (v + p) + out * e.ops_per_output(),
                    temporaries: 2.0 * (padded(pad()) + v + p),
                }
            }
            NnOp::Conv2d1x1(e) => flops((2.0 * x.map_or(0.0, |x| x[1] as f64) + e.ops_per_output()) * out),
            // The product of conv2d_1x1 on the copied positions, written and read again.
            NnOp::Conv2d1x1Strided(e) => {
                let c = x.map_or(0.0, |x| x[1] as f64);
                let k = w.map_or(1.0, |w| w[0] as f64);
                Work { flops: (2.0 * c + e.ops_per_output()) * out, temporaries: 2.0 * out / k.max(1.0) * c }
            }
            NnOp::Matmul => flops(2.0 * out * x.map_or(0.0, |a| a[1] as f64)),
            // Y = X·Wᵀ + b: a K-long dot product and the bias per output.
            NnOp::Dense => flops((2.0 * x.map_or(0.0, |a| a[1] as f64) + 1.0) * out),
            NnOp::BatchMatmul => flops(2.0 * out * x.map_or(0.0, |a| a[2] as f64)),
            NnOp::BatchNorm => flops(6.0 * out),
            NnOp::BnFoldWeight => flops(4.0 * out),
            NnOp::BnFoldBias => flops(5.0 * out),
            NnOp::Transpose => flops(0.0),
            _ => flops(out),
        }
    }
}

impl fmt::Display for NnOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The name is not a `std.nn` operator.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a std.nn operator")]
pub struct UnknownOp(pub String);

impl FromStr for NnOp {
    type Err = UnknownOp;

    fn from_str(s: &str) -> Result<NnOp, UnknownOp> {
        NnOp::from_name(s).ok_or_else(|| UnknownOp(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_operators_are_one_to_one() {
        for (i, a) in TABLE.iter().enumerate() {
            for b in &TABLE[i + 1..] {
                assert_ne!(a.op, b.op, "{} twice", a.name);
                assert_ne!(a.name, b.name);
            }
            assert_eq!(NnOp::from_name(a.name), Some(a.op));
            assert_eq!(a.op.to_string(), a.name);
        }
        assert!("conv2d_winograd_f3".parse::<NnOp>().is_err());
    }

    /// Products count two operations per multiply-add, whatever their form.
    #[test]
    fn work_counts_multiply_adds_twice() {
        let t = |s: &[i64]| Info::Shape(s.to_vec());
        let (n, k, m) = (4.0, 64.0, 10.0);
        let dense = NnOp::Dense.work(&[t(&[4, 64]), t(&[10, 64]), t(&[10])], n * m);
        assert_eq!(dense.flops, (2.0 * k + 1.0) * n * m, "dot products and the bias");
        let matmul = NnOp::Matmul.work(&[t(&[4, 64]), t(&[64, 10])], n * m);
        assert_eq!(matmul.flops, 2.0 * k * n * m);
        let conv = NnOp::Conv2d(Epilogue::BiasRelu).work(&[t(&[1, 8, 6, 6]), t(&[16, 8, 3, 3])], 16.0 * 36.0);
        assert_eq!(conv.flops, 16.0 * 36.0 * (2.0 * 72.0 + 2.0));
        assert_eq!(NnOp::Relu.shape(&[t(&[3, 5])]), Some(vec![3, 5]));
        assert_eq!(NnOp::Dense.shape(&[t(&[4, 64]), t(&[10, 64])]), Some(vec![4, 10]));
    }

    /// Every name of the table is a kernel of `std/nn.tex` and the other way round.
    #[test]
    fn the_table_is_the_standard_library() {
        let mut std: Vec<&str> = include_str!("../../std/nn.tex")
            .lines()
            .filter_map(|l| l.strip_prefix("kernel "))
            .filter_map(|l| l.split('(').next())
            .map(str::trim)
            .collect();
        std.sort();
        std.dedup();
        let mut table: Vec<&str> = TABLE.iter().map(|r| r.name).collect();
        table.sort();
        assert_eq!(table, std);
    }
}
