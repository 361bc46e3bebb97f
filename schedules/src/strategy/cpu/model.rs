//! The CPU strategy's performance model: the share of the nominal peak its
//! schedules reach on each operator, which the e-graph's cost model prices
//! operators with (`texc_compiler::rewrite::PerformanceModel`). It lives
//! beside the schedules it describes: a schedule change that moves an
//! operator's speed updates its efficiency here, in the same change, with
//! the measurement.

use texc_compiler::nn::{Epilogue, Info, NnOp, WinogradForm};
use texc_compiler::rewrite::{OpNode, PerformanceModel};
use texc_compiler::target::Target;

/// The default CPU schedules' efficiencies, by vector width and L2: where
/// rows fill vectors differently, so do the forms' speeds, and where an
/// operator's intermediates outgrow L2, its passes over them slow down.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuModel {
    /// 512-bit vectors (16 `f32` lanes: a 7-wide row fills less than half).
    wide: bool,
    /// Bytes of L2 per core (the target's caches, nominal where it names none).
    l2: i64,
}

impl CpuModel {
    /// The model of `target`'s vector width and caches.
    pub fn of(target: &Target) -> CpuModel {
        CpuModel { wide: target.vector_bits >= 512, l2: target.cpu_caches().l2 }
    }

    /// Whether a Winograd form's transformed tensors stream from beyond L2
    /// while its product is too thin to hide that: the input's tiles after
    /// each of the transform's two passes and the output's before each
    /// (`Bd`, `V`, `M`, `Am`: 36 floats a 4 × 4 tile, 16 a 2 × 2 one, for
    /// every channel and filter; `Am` 24 and 8), each written by one pass
    /// and read by the next, more than five times L2, for a product of
    /// fewer than 32 multiply-adds per float moved (`C·K / (C + K)`: 32 →
    /// 64 channels, 128 → 32; 16 with 256-bit vectors: on AVX2 DenseNet's
    /// 128 → 32 at 56² ran 2.08 ms by Winograd, 2.33 direct). MEASURED (1
    /// thread, Intel Xeon, AVX-512, bias and ReLU, Winograd against direct,
    /// ONNX Runtime beside): Inception-v3's 32 → 32 and 32 → 64 at 147²
    /// 3.36 / 2.28 and 5.48 / 4.53 ms (ORT 2.36, 4.34), 32 → 64 at 112² 2.73
    /// / 2.46, DenseNet's 128 → 32 at 56² 1.58 / 1.33 (ORT 1.23); Winograd
    /// stays ahead at 32 → 64 on 56² (0.50 / 0.62: F(4×4), 2.7 MB in `V`
    /// and `M`, 4.8 MB in all four), 64 → 64 on 56² and 112² (0.88 / 1.25,
    /// 4.1 / 5.3) and 80 → 192 at 73² (6.0 / 8.6). Counted in `V` and `M`
    /// only (as until 2026-12-02) against four times this Xeon's 2 MiB of
    /// L2, DenseNet's layer (F(2×2): 8.0 MB so) kept Winograd on `host`,
    /// and in DenseNet-121 ran 2.2–3.4 ms a layer against 1.9 direct (the
    /// model at 1 thread 52.2 → 47.9 ms): in all four tensors it has 15 MB,
    /// 7.3 times that L2, where the 32 → 64 layer has 2.3 times. Five times
    /// L2 lies between, and keeps the named targets' choices (their nominal
    /// 1 MiB L2: that layer 4.6 times).
    fn winograd_spills(&self, form: WinogradForm, x: &[i64], w: &[i64], out: &[i64]) -> bool {
        let (c, k) = (x[1] as f64, w[0] as f64);
        // Floats a tile takes per channel in `Bd` and `V`, and per filter in `M`
        // and in `Am` (the output transform's first pass: 2 × 4, 4 × 6).
        let (tile, floats, am) = match form {
            WinogradForm::F4 => (4, 36.0, 24.0),
            WinogradForm::F2 | WinogradForm::F2k => (2, 16.0, 8.0),
        };
        let tiles = ((out[2] + tile - 1) / tile) as f64 * ((out[3] + tile - 1) / tile) as f64 * out[0] as f64;
        let bytes = tiles * 4.0 * (floats * (2.0 * c + k) + am * k);
        // Half the vector width computes the product in twice the time,
        // which hides the passes over the tiles at half the intensity.
        let thin = if self.wide { 32.0 } else { 16.0 };
        c * k / (c + k) < thin && bytes > 5.0 * self.l2 as f64
    }
}

impl PerformanceModel for CpuModel {
    fn name(&self) -> &'static str {
        "cpu"
    }

    /// The share of the peak that texc's default CPU schedules reach on an
    /// operator, measured (1 thread, x86-avx2 and x86-avx512, ResNet-18's
    /// layers at 224×224: `benches/models.py`, docs/onnx.md): direct
    /// convolutions 0.5–0.64 at stride 1 (0.4 with 1×1 filters, whose matrix
    /// products reach 0.58–0.78) but 0.18–0.27 at stride 2, where im2col's
    /// matrix product reaches 0.4–0.62 (3-channel stems: below); Winograd
    /// 0.34–0.6 of its reduced work, less on small images. Without these the
    /// roofline ties a direct strided convolution with im2col, and the direct
    /// one, 3.3× slower, was chosen. Below 10 MFLOP the data stays in the
    /// first-level cache and direct convolutions keep their speed (a 16-channel
    /// 10×10 strided layer: 0.010 ms direct, 0.026 ms by im2col), so the
    /// penalty is for larger layers only. Operators not listed reach the peak
    /// their roofline bound allows as far as the model knows.
    fn efficiency(&self, node: &OpNode<'_>) -> f64 {
        let (op, ch) = (node.op, node.args);
        let x = ch.first().and_then(Info::shape);
        let stride = |k: usize| ch.get(k).and_then(Info::num).unwrap_or(1);
        // Output pixels per image and filter: below 100 (7×7), rows of pixels
        // fill vectors badly and the products over them slow down.
        let few_pixels = op.shape(ch).is_some_and(|o| o.len() == 4 && o[2] * o[3] < 100);
        // Images of at most 14×14: few Winograd tiles.
        let small = x.is_some_and(|x| x.len() == 4 && x[2] * x[3] <= 14 * 14);
        let winograd_spills = match (op, x, ch.get(1).and_then(Info::shape), op.shape(ch)) {
            (NnOp::Conv2dWinograd(form, _), Some(x), Some(w), Some(out))
                if x.len() == 4 && w.len() == 4 && out.len() == 4 =>
            {
                self.winograd_spills(form, x, w, &out)
            }
            _ => false,
        };
        match op {
            NnOp::Conv2d(_) => {
                let few_channels = x.is_some_and(|x| x[1] < 8);
                let pointwise = ch.get(1).and_then(Info::shape).is_some_and(|w| w[2] == 1 && w[3] == 1);
                if few_channels {
                    // A network's stem (3 channels, stride 2): its rows load as
                    // spans, strided or not. 1 thread, AMD Zen 4, 224 × 224 in:
                    // 3×3 to 32 and to 64, 7×7 to 64 at 0.68–0.87 of the peak on
                    // x86-avx2 and x86-avx512, where im2col's plan reached
                    // 0.31–0.77 (`texc bench` with and without `--no-rewrite`).
                    0.7
                } else if stride(op.conv_pad_at() + 1) > 1 && node.flops > 1e7 {
                    0.22
                } else if few_pixels && node.constant_filters && !pointwise {
                    // Rows of 7 computed filters-last (`filters_last`: the
                    // filters a constant, the sums deep) or in 8-lane vectors.
                    // 3×3, 7×7, 1 thread, Zen 4, bias and ReLU, 32 to 512
                    // filters from 128 to 512 channels: 0.97–0.99 on AVX-512,
                    // 0.65–0.72 on AVX2.
                    if self.wide {
                        0.9
                    } else {
                        0.66
                    }
                } else if pointwise || few_pixels {
                    // A 1×1 filter leaves the direct nest no window to reuse; a
                    // 7×7 image, rows of 7 in 16-lane vectors (3×3 at 7×7×512: 0.37).
                    0.4
                } else {
                    0.6
                }
            }
            // 1×1 convolutions as products (56×56, 24→144): 0.78 alone, 0.58 with the bias added in.
            NnOp::Conv2d1x1(e) if e == Epilogue::None => 0.78,
            NnOp::Conv2d1x1(_) => 0.58,
            // The same products on the copied positions (the copy is priced as
            // bytes). On 7×7 outputs, below im2col turned around: ResNet-50's
            // 1024 → 2048 projection from 14×14 ran 2.28 ms this way and 2.01 ms
            // with vectors along the filters (1 thread, AVX-512, Zen 4).
            NnOp::Conv2d1x1Strided(_) if few_pixels => 0.6,
            NnOp::Conv2d1x1Strided(e) if e == Epilogue::None => 0.78,
            NnOp::Conv2d1x1Strided(_) => 0.58,
            // 3×3 at 7×7×512: 0.39 by pixel rows, 0.63 by filter rows (weights folded).
            NnOp::Conv2dIm2col if few_pixels => 0.4,
            NnOp::Conv2dIm2col => 0.55,
            // Vectors along the filters: few filters, few vectors a row, and
            // the copies (the patches, the output turned back) weigh more.
            // 3×3, 7×7, 1 thread, Zen 4: 32, 128, 160, 256, 512 filters at
            // 0.21, 0.61, 0.64, 0.73, 0.80 on AVX2 (0.68–0.87 from 128 on
            // AVX-512). A 1×1 filter's product over the map's 49 rows is the
            // same as `conv2d_1x1`'s, which has no copies to make: below it.
            NnOp::Conv2dIm2colT if few_pixels => match ch.get(1).and_then(Info::shape) {
                Some(w) if w[2] * w[3] > 1 => 0.85 * w[0] as f64 / (w[0] as f64 + 64.0),
                _ => 0.63,
            },
            NnOp::Conv2dIm2colT => 0.45,
            // Slower than a direct convolution (`winograd_spills`: measured
            // 1.1–1.5×): a fifth below the direct 0.6, over the form's fewer
            // multiplications (4× for F(4×4), 2.25× for F(2×2)); applied to
            // all of its work, transforms and whole tiles included, so such a
            // layer is estimated at 1.5–1.7× the direct one (32 → 64 at 147²:
            // 1.57×), which keeps the choice clear of the bound.
            NnOp::Conv2dWinograd(form, _) if winograd_spills => {
                let fewer = if form == WinogradForm::F4 { 4.0 } else { 2.25 };
                0.6 / 1.2 / fewer
            }
            // Vectors along the filters, 1 thread (3×3, direct measured at 0.6):
            // 14×14×256 0.42 (AVX-512) and 0.38 (AVX2), where the other layout
            // measured 0.27 (the model keeps its 0.35 below); 28×28×128 0.52 and
            // 56×56×64 0.41, where the other reaches 0.55. With constant filters
            // the other layout reads U packed by rows of filters (`prepack`) and
            // its products run 1.25× faster (ResNet-18's 14×14×256 layers,
            // AVX-512: 1.0 against 1.25 ms). Few filters fill few vectors. So
            // 0.28, below the other layout, wherever it was not measured faster.
            NnOp::Conv2dWinograd(WinogradForm::F2k, _) => {
                let many_filters = ch.get(1).and_then(Info::shape).is_some_and(|w| w[0] >= 128);
                if small && many_filters && !node.constant_filters {
                    0.42
                } else {
                    0.28
                }
            }
            // Fewer tiles to spread the transforms over on small images.
            NnOp::Conv2dWinograd(..) if small => 0.35,
            NnOp::Conv2dWinograd(..) => 0.55,
            _ => 1.0,
        }
    }
}
