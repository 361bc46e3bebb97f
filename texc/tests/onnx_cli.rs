//! `texc import` and `.onnx` files given to `run`: models built by
//! `tests/onnx/models.py` with the `onnx` package (random weights, nothing
//! downloaded) are imported and run on `interp` and `x86-avx2`, and compared
//! with ONNX Runtime on the same input (normwise relative error ≤ 1e-4);
//! unsupported and malformed models give clear errors.
//!
//! The models need Python with `onnx` and `onnxruntime` (scripts/bootstrap.sh
//! installs them). Without them the tests print why and pass, except under CI
//! (`CI` set), where a missing tool is a failure rather than a silent skip.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use texc_runtime::{read_npy, Data};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("parent").to_path_buf()
}

fn texc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_texc")).args(args).current_dir(root()).output().expect("texc runs")
}

/// Where the tests write their models: under cargo's per-target scratch
/// directory with stable names, each emptied before use, so runs replace
/// what the last run wrote instead of adding to it (a test run writes about
/// 200 MB of models and outputs).
fn scratch(name: &str) -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("onnx_cli").join(name)
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// Build `model` into a fresh directory with its input and ONNX Runtime's
/// output; `None` (with the reason printed) when Python lacks the packages.
fn build(model: &str, extra: &[&str]) -> Option<PathBuf> {
    // One directory per model and arguments: tests run in parallel.
    let name = [model].iter().chain(extra).copied().collect::<Vec<_>>().join("_").replace('-', "");
    let dir = scratch(&name);
    let _ = std::fs::remove_dir_all(&dir);
    let out = Command::new("python3")
        .arg(root().join("tests/onnx/models.py"))
        .arg(model)
        .arg(&dir)
        .args(extra)
        .output()
        .expect("python3 runs");
    if out.status.success() {
        return Some(dir);
    }
    let why = text(&out);
    if why.contains("No module named") && std::env::var_os("CI").is_none() {
        eprintln!("skipped: Python lacks onnx or onnxruntime (scripts/bootstrap.sh installs them): {why}");
        return None;
    }
    panic!("tests/onnx/models.py {model} failed:\n{why}");
}

fn f32s(path: &Path) -> (Vec<usize>, Vec<f32>) {
    let t = read_npy(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    match t.data {
        Data::F32(v) => (t.shape, v),
        other => panic!("{}: not f32: {:?}", path.display(), other),
    }
}

/// ‖got − want‖₂ / ‖want‖₂
fn normwise_error(got: &Path, want: &Path) -> f64 {
    let ((gs, g), (ws, w)) = (f32s(got), f32s(want));
    assert_eq!(gs, ws, "output shapes differ");
    let diff: f64 = g.iter().zip(&w).map(|(a, b)| (*a as f64 - *b as f64).powi(2)).sum();
    let norm: f64 = w.iter().map(|b| (*b as f64).powi(2)).sum();
    (diff / norm).sqrt()
}

/// Import `model`, run it on each target with the reference input, and
/// compare with ONNX Runtime.
fn imported_model_matches_onnx_runtime(model: &str, targets: &[&str]) {
    let Some(dir) = build(model, &[]) else { return };
    let s = |p: PathBuf| p.display().to_string();
    let onnx = s(dir.join(format!("{model}.onnx")));
    let tex = s(dir.join(format!("{model}.tex")));
    let o = texc(&["import", &onnx, "-o", &tex]);
    assert!(o.status.success(), "{}", text(&o));
    let again = std::fs::read(&tex).expect("tex");
    let npz = s(dir.join(format!("{model}.npz")));
    let x = format!("x={}", s(dir.join("x.npy")));
    for target in targets {
        if !runs_here(target) {
            // What can be checked without running: the model compiles for it.
            let obj = s(dir.join(format!("{model}_{target}.o")));
            let o = texc(&["compile", &tex, "--target", target, "-o", &obj]);
            assert!(o.status.success(), "{model} compiles for {target}: {}", text(&o));
            continue;
        }
        let y = dir.join(format!("y_{target}.npy"));
        let out = format!("y={}", s(y.clone()));
        // x86-avx2 runs the model itself (its weight-only stages folded, computed
        // once); the other targets run the imported text with the weights as inputs.
        let o = if *target == "x86-avx2" {
            let o = texc(&["run", &onnx, "--input", &x, "--output", &out, "--target", target, "--time-passes"]);
            let weighted = ["resnet18", "mobilenetv2", "encoder"].contains(&model);
            assert!(!weighted || text(&o).contains("\nfold "), "{model}: the fold pass ran: {}", text(&o));
            o
        } else {
            texc(&["run", &tex, "--input", &npz, "--input", &x, "--output", &out, "--target", target])
        };
        assert!(o.status.success(), "{model} on {target}: {}", text(&o));
        let e = normwise_error(&y, &dir.join("expected.npy"));
        eprintln!("{model} on {target}: normwise relative error {e:.3e} against ONNX Runtime");
        assert!(e <= 1e-4, "{model} on {target}: error {e:.3e} against ONNX Runtime");
    }
    let o = texc(&["import", &onnx, "-o", &tex]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(std::fs::read(&tex).expect("tex"), again, "import is deterministic");
}

/// Whether `target`'s code runs on this CPU; where not, says why the run is skipped.
fn runs_here(target: &str) -> bool {
    let t = texc_compiler::target::lookup(target).expect("a known target");
    t.check_runs_here().map_err(|e| eprintln!("skipped the run on {target}: {e}")).is_ok()
}

/// EfficientNet's blocks (`mbconv`: expansion, SiLU, depthwise 3 × 3 and
/// 5 × 5 of stride 1 and 2, squeeze-and-excite, projection, residual; maps
/// of 27, 14 and 7, channel counts no vector divides) run from the model
/// itself on every x86 target, their weights constant, so each depthwise
/// convolution's region is stored channels last (the loops' temporaries
/// `[1, y, x, channels]`, checked on every target whether or not this CPU
/// runs it), and match ONNX Runtime.
#[test]
fn depthwise_blocks_stored_channels_last_match_onnx_runtime() {
    let Some(dir) = build("mbconv", &[]) else { return };
    let s = |p: PathBuf| p.display().to_string();
    let onnx = s(dir.join("mbconv.onnx"));
    let x = format!("x={}", s(dir.join("x.npy")));
    for target in ["x86-avx2", "x86-avx512", "host"] {
        let o = texc(&["emit", &onnx, "--target", target, "--stage", "loops"]);
        assert!(o.status.success(), "mbconv loops for {target}: {}", text(&o));
        let loops = String::from_utf8_lossy(&o.stdout);
        for moved in [
            ": f32[1, 27, 27, 144]",
            ": f32[1, 14, 14, 144]",
            ": f32[1, 14, 14, 216]",
            ": f32[1, 7, 7, 144]",
            ": f32[1, 7, 7, 312]",
        ] {
            assert!(loops.contains(moved), "{target}: a temporary `{moved}` stored channels last:\n{loops}");
        }
        if !runs_here(target) {
            continue;
        }
        let y = dir.join(format!("y_{target}.npy"));
        let out = format!("y={}", s(y.clone()));
        let o = texc(&["run", &onnx, "--input", &x, "--output", &out, "--target", target]);
        assert!(o.status.success(), "mbconv on {target}: {}", text(&o));
        let e = normwise_error(&y, &dir.join("expected.npy"));
        eprintln!("mbconv on {target}: normwise relative error {e:.3e} against ONNX Runtime");
        assert!(e <= 1e-5, "mbconv on {target}: error {e:.3e} against ONNX Runtime");
    }
}

/// Token ids (int64 inputs) index embeddings: Gather of data, which texc
/// writes as a one-hot sum and runs as a load of the row.
#[test]
fn embeddings_of_token_ids_match_onnx_runtime() {
    imported_model_matches_onnx_runtime("embedding", &["interp", "x86-avx2", "x86-avx512", "cranelift"]);
}

#[test]
fn resnet18_matches_onnx_runtime() {
    imported_model_matches_onnx_runtime("resnet18", &["interp", "x86-avx2"]);
}

#[test]
fn mobilenetv2_matches_onnx_runtime() {
    imported_model_matches_onnx_runtime("mobilenetv2", &["interp", "x86-avx2"]);
}

/// The encoder's attention, as imported (`MatMul`, `Div`, `Softmax`,
/// `MatMul` around the heads' reshapes and transposes), is one operator on
/// CPUs, computed flash-style (`docs/attention.md`).
#[test]
fn imported_attention_is_one_flash_operator() {
    let Some(dir) = build("encoder", &["--seed", "3"]) else { return };
    let s = |p: PathBuf| p.display().to_string();
    let tex = s(dir.join("encoder.tex"));
    let o = texc(&["import", &s(dir.join("encoder.onnx")), "-o", &tex]);
    assert!(o.status.success(), "{}", text(&o));
    let o = texc(&["emit", &tex, "--stage", "loops", "--target", "x86-avx2", "--dump-ir", "schedule"]);
    assert!(o.status.success(), "{}", text(&o));
    let schedules = text(&o);
    let fused: Vec<&str> = schedules.lines().filter(|l| l.contains("; flash attention:")).collect();
    assert_eq!(fused.len(), 1, "one fused attention:\n{schedules}");
}

#[test]
fn transformer_encoder_matches_onnx_runtime() {
    imported_model_matches_onnx_runtime("encoder", &["interp", "x86-avx2"]);
}

#[test]
fn other_operators_match_onnx_runtime() {
    imported_model_matches_onnx_runtime("small", &["interp", "x86-avx2", "cranelift"]);
}

#[test]
fn activations_match_onnx_runtime() {
    imported_model_matches_onnx_runtime("activations", &["interp", "x86-avx2", "cranelift"]);
}

#[test]
fn layout_and_pooling_forms_match_onnx_runtime() {
    imported_model_matches_onnx_runtime("layout", &["interp", "x86-avx2", "cranelift"]);
}

#[test]
fn decoder_operators_match_onnx_runtime() {
    imported_model_matches_onnx_runtime("decoder", &["interp", "x86-avx2", "cranelift"]);
}

#[test]
fn attention_and_3d_convolution_match_onnx_runtime() {
    imported_model_matches_onnx_runtime("attention3d", &["interp", "x86-avx2", "cranelift"]);
}

/// 3×3 convolutions on 7×7 maps with constant filters run direct on
/// AVX-512 (filters-last, at 0.97 of the peak), and on AVX2 direct with
/// few filters (32: the patches' copy and 4 vectors a row would cost more)
/// but as im2col turned around with many (512); results as ORT's.
#[test]
fn convolutions_on_small_maps_take_the_form_their_vectors_fill() {
    imported_model_matches_onnx_runtime("small_maps", &["interp", "x86-avx2", "x86-avx512"]);
    let Some(dir) = build("small_maps", &["--seed", "1"]) else { return };
    let onnx = dir.join("small_maps.onnx").display().to_string();
    let plan = |target: &str| {
        let o = texc(&["emit", &onnx, "--stage", "egraph", "--target", target]);
        assert!(o.status.success(), "{}", text(&o));
        let all = text(&o);
        let chosen = all.lines().find(|l| l.contains("chosen term:")).unwrap_or_else(|| panic!("{all}")).to_string();
        let count = |op: &str| chosen.matches(&format!("({op} ")).count();
        (count("conv2d_bias_relu"), count("conv2d_im2col_t"), chosen.clone())
    };
    let (direct, turned, chosen) = plan("x86-avx512");
    assert_eq!((direct, turned), (2, 0), "x86-avx512:\n{chosen}");
    let (direct, turned, chosen) = plan("x86-avx2");
    assert_eq!((direct, turned), (1, 1), "x86-avx2:\n{chosen}");
}

/// A direct convolution's filter panels, each read by the map's rows in
/// turn (128 → 512 at 7×7, folded weights), are prefetched a panel ahead,
/// spread over the rows, on LLVM's x86 targets (`texc_schedules::prefetch`);
/// `--knob prefetch=0` leaves them out and Cranelift has none. The outputs
/// are bit-identical either way, and ONNX Runtime's within 1e-4.
#[test]
fn filter_panels_read_row_by_row_are_prefetched_ahead() {
    let Some(dir) = build("small_maps", &["--seed", "2"]) else { return };
    let s = |p: PathBuf| p.display().to_string();
    let onnx = s(dir.join("small_maps.onnx"));
    let prefetches = |target: &str, knob: &str| {
        let o = texc(&["emit", &onnx, "--stage", "asm", "--target", target, "--knob", knob, "--dump-ir", "prefetch"]);
        assert!(o.status.success(), "{}", text(&o));
        let dump = String::from_utf8_lossy(&o.stderr).to_string();
        dump.lines().filter(|l| l.trim_start().starts_with("prefetch ")).count()
    };
    for target in ["x86-avx2", "x86-avx512", "cranelift"] {
        let (with, without) = (prefetches(target, "prefetch=1"), prefetches(target, "prefetch=0"));
        let wanted = if target == "cranelift" { 0 } else { 1 };
        assert_eq!((with > 0) as i32, wanted, "{target}: {with} prefetches");
        assert_eq!(without, 0, "{target}");
        if !runs_here(target) {
            continue;
        }
        let x = format!("x={}", s(dir.join("x.npy")));
        let run = |knob: &str| {
            let y = dir.join(format!("y_{target}_{}.npy", knob.replace('=', "")));
            let out = format!("y={}", s(y.clone()));
            let o = texc(&[
                "run",
                &onnx,
                "--input",
                &x,
                "--output",
                &out,
                "--target",
                target,
                "--knob",
                knob,
                "--time-passes",
            ]);
            assert!(o.status.success(), "{target}: {}", text(&o));
            // Prefetches keep the model compiled nest by nest (deduplicated,
            // in parallel, cached): a model compiled whole took 100× as long.
            let split = text(&o).lines().any(|l| l.starts_with("codegen `") && l.contains(" loop nests"));
            assert!(split || target == "cranelift", "{target} {knob}: not compiled nest by nest\n{}", text(&o));
            y
        };
        let (a, b) = (run("prefetch=1"), run("prefetch=0"));
        assert_eq!(f32s(&a), f32s(&b), "{target}: prefetches changed the results");
        let e = normwise_error(&a, &dir.join("expected.npy"));
        assert!(e <= 1e-4, "{target}: error {e:.3e} against ONNX Runtime");
    }
}

#[test]
fn exporters_shape_arithmetic_is_computed_at_import() {
    imported_model_matches_onnx_runtime("shapes", &["interp", "x86-avx2"]);
}

/// Issue 36: what PyTorch's exporters write for transformers (bool masks,
/// integer shape arithmetic, Trilu, Gather with 2-D indices, 0-d values).
#[test]
fn transformer_masks_and_shape_forms_match_onnx_runtime() {
    imported_model_matches_onnx_runtime("masks", &["interp", "x86-avx2"]);
}

/// Issue 36: integer and bool tensors computed at run time (a padding mask from token ids).
#[test]
fn integer_and_bool_data_match_onnx_runtime() {
    imported_model_matches_onnx_runtime("int_data", &["interp", "x86-avx2"]);
}

/// Issue 36: LayerNormalization over the channels of a channels-last tensor (Swin, ConvNeXt) and other trailing axes.
#[test]
fn channels_last_layer_norm_matches_onnx_runtime() {
    imported_model_matches_onnx_runtime("channels_last", &["interp", "x86-avx2"]);
}

/// Issue 36: LSTM (bidirectional, initial states, peepholes) and GRU (both
/// `linear_before_reset`, reverse), every output.
#[test]
fn lstm_and_gru_match_onnx_runtime() {
    imported_model_matches_onnx_runtime("recurrent", &["interp", "x86-avx2"]);
}

/// The recurrences' products are matrix-vector (one row per time step) with
/// constant weights `W[j, k]`: the weights are transposed once, when
/// constants are folded, so that the products' vectors run along `j`
/// instead of summing each dot product's lanes at every step (LSTM and GRU
/// took 4× as long before).
#[test]
fn recurrent_weights_are_transposed_once() {
    let Some(dir) = build("recurrent", &[]) else { return };
    let onnx = dir.join("recurrent.onnx").display().to_string();
    for target in ["x86-avx2", "x86-avx512"] {
        let o = texc(&["emit", "--stage", "loops", &onnx, "--target", target]);
        assert!(o.status.success(), "{}", text(&o));
        let out = String::from_utf8_lossy(&o.stdout);
        let transposed = out.lines().filter(|l| l.trim_start().starts_with("input w_") && l.contains("_t:")).count();
        // W and R of the LSTM and of both GRUs.
        assert_eq!(transposed, 6, "on {target}:\n{out}");
    }
}

/// Issue 36: Einsum in the forms exporters write (batched products, `...`, implicit output, diagonals).
#[test]
fn einsum_matches_onnx_runtime() {
    imported_model_matches_onnx_runtime("einsum", &["interp", "x86-avx2"]);
}

/// Issue 36: Swin V2's and MaxViT's forms (Softmax over any axis, L1/L2 reductions, GatherND).
#[test]
fn softmax_on_any_axis_and_gather_nd_match_onnx_runtime() {
    imported_model_matches_onnx_runtime("rank5", &["interp", "x86-avx2"]);
}

/// `run` takes the `.onnx` file itself, with its weights, and `--check` works on it.
#[test]
fn run_takes_an_onnx_file() {
    let Some(dir) = build("symbolic", &[]) else { return };
    let onnx = dir.join("symbolic.onnx").display().to_string();
    let x = format!("x={}", dir.join("x.npy").display());
    let y = dir.join("y.npy");
    let out = format!("y={}", y.display());
    let o = texc(&["run", &onnx, "--input", &x, "--target", "x86-avx2", "--check"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("graph input `x` has a symbolic dimension `batch`: give it a size with --dim batch=SIZE"),
        "{}",
        text(&o)
    );
    let o =
        texc(&["run", &onnx, "--dim", "batch=1", "--input", &x, "--output", &out, "--target", "x86-avx2", "--check"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("check `y` against interp"), "{}", text(&o));
    assert!(normwise_error(&y, &dir.join("expected.npy")) <= 1e-6);
}

#[test]
fn unsupported_and_malformed_models_are_refused_clearly() {
    let expect = |model: &str, message: &str| {
        let Some(dir) = build(model, &[]) else { return };
        let onnx = dir.join(format!("{model}.onnx")).display().to_string();
        let tex = dir.join("out.tex");
        let o = texc(&["import", &onnx, "-o", &tex.display().to_string()]);
        assert_eq!(o.status.code(), Some(1), "{}", text(&o));
        assert!(text(&o).contains(message), "{model}: {}", text(&o));
        assert!(!tex.exists(), "nothing is written for a refused model");
    };
    expect("unsupported_op", "node `/hardmax_2/Hardmax` (Hardmax): operator `Hardmax` is not supported");
    expect(
        "bad_strides",
        "node `/conv_2/Conv` (Conv): strides = [2, 1]: only equal values for both axes are supported",
    );

    let dir = scratch("bad");
    std::fs::create_dir_all(&dir).expect("tmp");
    let bad = dir.join("bad.onnx");
    std::fs::write(&bad, b"\x07not a model").expect("write");
    let bad = bad.display().to_string();
    for args in [vec!["import", &bad, "-o", "/tmp/never.tex"], vec!["run", &bad], vec!["check", &bad]] {
        let o = texc(&args);
        assert_eq!(o.status.code(), Some(1), "{}", text(&o));
        assert!(text(&o).contains("bad.onnx: not a valid ONNX model"), "{}", text(&o));
    }
    // A regular file is mapped and an empty one read: both are refused the same way.
    let empty = dir.join("empty.onnx");
    std::fs::write(&empty, b"").expect("write");
    let o = texc(&["import", &empty.display().to_string(), "-o", "/tmp/never.tex"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("empty.onnx: not a valid ONNX model"), "{}", text(&o));
    let o = texc(&["import", "no/such/model.onnx", "-o", "/tmp/never.tex"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("no/such/model.onnx: cannot read the model"), "{}", text(&o));
    let o = texc(&["import", &bad, "-o", "out.txt"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let o = texc(&["run", "examples/gelu.tex", "--dim", "batch=1"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
}

/// `texc compile model.onnx -o model.so`: one library with the weights
/// inside; `texc_<kernel>_infer(x, y)` called from C (examples/c/model_main.c)
/// gives ONNX Runtime's output.
#[test]
fn a_compiled_model_carries_its_weights_and_runs_from_c() {
    let Some(dir) = build("resnet18", &["--size", "32"]) else { return };
    let onnx = dir.join("resnet18.onnx").display().to_string();
    let lib = dir.join("resnet18.so");
    let o = texc(&["compile", &onnx, "--target", "x86-avx2", "-o", &lib.display().to_string()]);
    assert!(o.status.success(), "{}", text(&o));
    let header = std::fs::read_to_string(dir.join("resnet18.h")).expect("header");
    assert!(header.contains("int texc_resnet18_infer(const float *x, float *y);"), "{header}");
    let exe = dir.join("classify");
    let cc = Command::new("cc")
        .arg("-I")
        .arg(&dir)
        .args(["-DMODEL_H=\"resnet18.h\"", "-DINFER=texc_resnet18_infer", "-DN_IN=3072", "-DN_OUT=1000"])
        .arg(root().join("examples/c/model_main.c"))
        .arg(&lib)
        .arg(format!("-Wl,-rpath,{}", dir.display()))
        .arg("-o")
        .arg(&exe)
        .output()
        .expect("cc runs");
    assert!(cc.status.success(), "{}", text(&cc));
    let (_, x) = f32s(&dir.join("x.npy"));
    let raw: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(dir.join("x.f32"), raw).expect("write");
    let run = Command::new(&exe).arg(dir.join("x.f32")).arg(dir.join("y.f32")).output().expect("runs");
    assert!(run.status.success(), "{}", text(&run));
    assert!(text(&run).contains("class"), "{}", text(&run));
    let y: Vec<f32> = std::fs::read(dir.join("y.f32"))
        .expect("outputs")
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let (_, want) = f32s(&dir.join("expected.npy"));
    let diff: f64 = y.iter().zip(&want).map(|(a, b)| (*a as f64 - *b as f64).powi(2)).sum();
    let norm: f64 = want.iter().map(|b| (*b as f64).powi(2)).sum();
    assert!((diff / norm).sqrt() <= 1e-4, "error {:.3e}", (diff / norm).sqrt());
}

/// `analyze` counts every initializer a model's nodes read as a parameter,
/// also those an index expression reads (the decoder's Expand of `shift`).
#[test]
fn analyze_counts_the_models_initializers_as_parameters() {
    // Its own directory (`--seed 0` is the default seed): the decoder test builds "decoder" at the same time.
    let Some(dir) = build("decoder", &["--seed", "0"]) else { return };
    let onnx = dir.join("decoder.onnx").display().to_string();
    let o = texc(&["analyze", &onnx, "--target", "x86-avx2"]);
    assert!(o.status.success(), "{}", text(&o));
    let out = text(&o);
    let line = out.lines().find(|l| l.trim_start().starts_with("parameters")).expect("a parameters line");
    assert!(line.contains("1,059 (") && line.contains("shift_18 4"), "{line}");
    // The weight-only stages (batch-norm folding) are computed once, apart from the per-call total.
    assert!(out.contains("of which folded") && out.contains("total per call (without them)"), "{out}");
    let o = texc(&["analyze", &onnx, "--target", "x86-avx2", "--as-written"]);
    assert!(o.status.success() && !text(&o).contains("of which folded"), "{}", text(&o));
}

/// Models built here from texc-onnx's proto structs, without Python: the
/// tests of names and places (issue 35) need no ONNX Runtime.
mod built {
    use prost::Message;
    use texc_onnx::proto::*;

    pub fn value_info(name: &str, dims: &[i64]) -> ValueInfoProto {
        let dim = dims.iter().map(|&d| Dimension { value: Some(DimensionValue::DimValue(d)) }).collect();
        ValueInfoProto {
            name: name.into(),
            r#type: Some(TypeProto {
                tensor_type: Some(TypeProtoTensor {
                    elem_type: data_type::FLOAT,
                    shape: Some(TensorShapeProto { dim }),
                }),
            }),
        }
    }

    pub fn node(op: &str, inputs: &[&str], output: &str) -> NodeProto {
        NodeProto {
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: vec![output.into()],
            name: format!("/{op}_{output}"),
            op_type: op.into(),
            ..Default::default()
        }
    }

    pub fn weight(name: &str, dims: &[i64], values: &[f32]) -> TensorProto {
        TensorProto {
            dims: dims.to_vec(),
            data_type: data_type::FLOAT,
            raw_data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            name: name.into(),
            ..Default::default()
        }
    }

    pub fn model(
        name: &str,
        inputs: Vec<ValueInfoProto>,
        node: Vec<NodeProto>,
        initializer: Vec<TensorProto>,
        outputs: Vec<ValueInfoProto>,
    ) -> ModelProto {
        ModelProto {
            ir_version: 8,
            opset_import: vec![OperatorSetIdProto { domain: String::new(), version: 17 }],
            producer_name: "texc-tests".into(),
            graph: Some(GraphProto {
                name: name.into(),
                node,
                initializer,
                input: inputs,
                output: outputs,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    pub fn save(m: &ModelProto, path: &std::path::Path) {
        std::fs::write(path, m.encode_to_vec()).expect("write the model");
    }

    /// `x[1, 4] + b -> y`, with `b` stored in the external file `location`.
    pub fn with_external_bias(location: &str) -> ModelProto {
        let mut b = weight("b", &[1, 4], &[1.0, 2.0, 3.0, 4.0]);
        b.raw_data.clear();
        b.data_location = 1;
        b.external_data = vec![StringStringEntryProto { key: "location".into(), value: location.into() }];
        model(
            "ext",
            vec![value_info("x", &[1, 4])],
            vec![node("Add", &["x", "b"], "y")],
            vec![b],
            vec![value_info("y", &[1, 4])],
        )
    }
}

/// `texc ARGS`, killed (and the test failed) after 60 s.
fn texc_within(args: &[&str]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_texc"))
        .args(args)
        .current_dir(root())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("texc runs");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while child.try_wait().expect("waits").is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("texc {args:?} did not finish in 60 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    child.wait_with_output().expect("output")
}

fn fresh_dir(name: &str) -> PathBuf {
    let dir = scratch(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("tmp");
    dir
}

/// Issue 35, items 5 and 6: external data that is a FIFO beside the model
/// is refused at once (`run` blocked forever), and a link beside the model
/// to `/etc/passwd` or through a linked directory is refused by `run`,
/// `import` and `compile` (which would embed its bytes); a link that stays
/// inside reads.
#[test]
fn external_data_is_a_regular_file_inside_the_models_directory() {
    let dir = fresh_dir("external");
    let model = dir.join("m.onnx");
    let m = model.display().to_string();
    let bias: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0].iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(dir.join("b.bin"), &bias).expect("write");
    std::os::unix::fs::symlink("b.bin", dir.join("alias.bin")).expect("symlink");
    built::save(&built::with_external_bias("alias.bin"), &model);
    let o = texc_within(&["run", &m]);
    assert_eq!(o.status.code(), Some(0), "a link inside reads: {}", text(&o));
    assert!(Command::new("mkfifo").arg(dir.join("fifo.bin")).status().expect("mkfifo runs").success());
    std::os::unix::fs::symlink("/etc/passwd", dir.join("passwd.bin")).expect("symlink");
    std::os::unix::fs::symlink("/etc", dir.join("etc")).expect("symlink");
    let cases = [
        ("fifo.bin", "fifo.bin is a FIFO, not a regular file"),
        ("passwd.bin", "external data `passwd.bin` resolves to /etc/passwd, outside the model's directory"),
        ("etc/passwd", "external data `etc/passwd` resolves to /etc/passwd, outside the model's directory"),
    ];
    for (location, want) in cases {
        built::save(&built::with_external_bias(location), &model);
        let lib = dir.join("m.so").display().to_string();
        let tex = dir.join("m.tex").display().to_string();
        for args in
            [vec!["run", &m], vec!["compile", &m, "--target", "x86-avx2", "-o", &lib], vec!["import", &m, "-o", &tex]]
        {
            let o = texc_within(&args);
            assert_eq!(o.status.code(), Some(1), "{location} {args:?}: {}", text(&o));
            assert!(
                text(&o).contains("initializer `b`: external data") && text(&o).contains(want),
                "{location} {args:?}: {}",
                text(&o)
            );
            assert!(!dir.join("m.so").exists() && !dir.join("m.tex").exists(), "nothing written");
        }
    }
}

/// `input.1 @ fc.weight -> 190`, `relu(190) -> 191`: torchvision's names.
fn torch_named() -> texc_onnx::proto::ModelProto {
    let w: Vec<f32> = (0..16).map(|i| if i % 5 == 0 { 1.0 } else { 0.0 }).collect();
    built::model(
        "r18",
        vec![built::value_info("input.1", &[1, 4])],
        vec![built::node("MatMul", &["input.1", "fc.weight"], "190"), built::node("Relu", &["190"], "191")],
        vec![built::weight("fc.weight", &[4, 4], &w)],
        vec![built::value_info("191", &[1, 4])],
    )
}

/// Issue 35, item 9: running an `.onnx` file, `--input` and `--output`
/// take the model's own names (`input.1`, `191`) and texc's (`input_1`,
/// `t_191`); archives and messages use the model's; an unknown name's
/// error lists the names there are.
#[test]
fn a_models_own_names_are_accepted_and_written() {
    let dir = fresh_dir("names");
    let model = dir.join("r18.onnx");
    built::save(&torch_named(), &model);
    let m = model.display().to_string();
    let x = dir.join("x.npy");
    let input = texc_runtime::Tensor::from_f64(texc_runtime::DType::F32, vec![1, 4], &[1.0, -2.0, 3.0, -4.0]);
    texc_runtime::write_npy(&x, &input).expect("write");
    let all = dir.join("all.npz");
    for (target, given, output) in [
        ("interp", "input.1", "191"),
        ("interp", "input_1", "t_191"),
        ("x86-avx2", "input.1", "t_191"),
        ("cranelift", "input_1", "191"),
    ] {
        let y = dir.join(format!("y-{target}-{given}.npz"));
        let args = [
            "run",
            &m,
            "--target",
            target,
            "--input",
            &format!("{given}={}", x.display()),
            "--output",
            &format!("{output}={}", y.display()),
            "--output",
            &all.display().to_string(),
        ];
        let o = texc(&args);
        assert_eq!(o.status.code(), Some(0), "{target} {given} {output}: {}", text(&o));
        assert!(text(&o).contains("  191: f32[1, 4]") && text(&o).contains("wrote `191` to"), "{}", text(&o));
        for archive in [&y, &all] {
            let arrays = texc_runtime::read_npz_limited(archive, u64::MAX).expect("an archive");
            let names: Vec<&str> = arrays.iter().map(|(n, _)| n.as_str()).collect();
            assert_eq!(names, ["191"], "{}", archive.display());
            assert_eq!(arrays[0].1.to_f64(), [1.0, 0.0, 3.0, 0.0], "relu(x): the given input was used");
        }
    }
    // An archive of inputs by their ONNX names feeds the model.
    let inputs = dir.join("inputs.npz");
    texc_runtime::write_npz(&inputs, &[("input.1", &input)]).expect("write");
    let o = texc(&[
        "bench",
        &m,
        "--target",
        "x86-avx2",
        "--repeat",
        "1",
        "--input",
        &inputs.display().to_string(),
        "--check",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    // The printed nest names the model (not `r18.onnx.tex`, which is no
    // file), and runs checked against it, with its names and weights.
    let o = texc(&["emit", &m, "--stage", "loops", "--target", "x86-avx2"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let nest = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(nest.contains(&format!("  source \"{m}\"\n")), "{nest}");
    let loops = dir.join("r18.loops");
    std::fs::write(&loops, nest).expect("write");
    let given = format!("input.1={}", x.display());
    let o = texc(&["run", &loops.display().to_string(), "--target", "x86-avx2", "--check", "--input", &given]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        text(&o).contains("check `191` against interp") && text(&o).contains("first [1.000000, 0.000000, 3.000000"),
        "{}",
        text(&o)
    );
    // Unknown names: status 1, the names there are listed.
    let o = texc(&["run", &m, "--input", &format!("input={}", x.display())]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("`input` is not an input of the model")
            && text(&o).contains("its inputs: `input.1` (or `input_1`); its weight may be given by name too"),
        "{}",
        text(&o)
    );
    let o = texc(&["run", &m, "--output", &format!("192={}", dir.join("z.npy").display())]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("`192` is not an output of kernel") && text(&o).contains("its outputs: `191` (or `t_191`)"),
        "{}",
        text(&o)
    );
    // Both names of one input: misuse.
    let o = texc(&[
        "run",
        &m,
        "--input",
        &format!("input.1={}", x.display()),
        "--input",
        &format!("input_1={}", x.display()),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("both name the parameter `input_1`"), "{}", text(&o));
}

/// Issue 35, item 9: a graph output listed twice is an error that names the
/// model and the output, not a place in the generated `m.onnx.tex`.
#[test]
fn a_graph_output_listed_twice_names_the_model() {
    let dir = fresh_dir("twice");
    let mut m = torch_named();
    let g = m.graph.as_mut().expect("graph");
    g.output.push(g.output[0].clone());
    let model = dir.join("dup.onnx");
    built::save(&m, &model);
    let shown = model.display().to_string();
    let tex = dir.join("dup.tex").display().to_string();
    for args in [vec!["run", &shown], vec!["check", &shown], vec!["import", &shown, "-o", &tex]] {
        let o = texc(&args);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", text(&o));
        assert!(text(&o).contains(&format!("{shown}: graph output `191` is listed twice")), "{args:?}: {}", text(&o));
        assert!(!text(&o).contains(".onnx.tex"), "{args:?}: {}", text(&o));
    }
}

/// Build `model` quantized by ONNX Runtime's own tools
/// (`tests/onnx/quantized.py MODEL MODE`), with ORT's output for the
/// quantized model and the output's quantization step; `None` (the reason
/// printed) when Python lacks the packages.
fn build_quantized(model: &str, mode: &str, extra: &[&str]) -> Option<PathBuf> {
    let name = ["q", model, mode].iter().chain(extra).copied().collect::<Vec<_>>().join("_").replace('-', "");
    let dir = scratch(&name);
    let _ = std::fs::remove_dir_all(&dir);
    let out = Command::new("python3")
        .arg(root().join("tests/onnx/quantized.py"))
        .args([model, mode])
        .arg(&dir)
        .args(extra)
        .output()
        .expect("python3 runs");
    if out.status.success() {
        return Some(dir);
    }
    let why = text(&out);
    if why.contains("No module named") && std::env::var_os("CI").is_none() {
        eprintln!("skipped: Python lacks onnx or onnxruntime (scripts/bootstrap.sh installs them): {why}");
        return None;
    }
    panic!("tests/onnx/quantized.py {model} {mode} failed:\n{why}");
}

/// Import a quantized model, run it on each target, and compare with ONNX
/// Runtime running the same quantized model; returns the imported text.
///
/// Tolerance: where the output is quantized (QDQ models end in a
/// DequantizeLinear), every element within one quantization step of ORT's.
/// texc computes the products in integers with exact 32-bit sums and
/// requantizes `round(f32(acc) · s_a·s_w/s_y)`, ORT (graph optimizations
/// off: the model as written) dequantizes and convolves in f32 and divides
/// by `s_y`; the two can round a value that falls within an f32 rounding of
/// a half step differently, one step. Where the output is f32 (dynamic
/// quantization: the i32 product scaled by run-time scales), normwise 1e-5:
/// the integer parts are exact and DynamicQuantizeLinear rounds as ORT's, so
/// what differs is f32 rounding in the float operators.
fn quantized_model_matches_onnx_runtime(model: &str, mode: &str, extra: &[&str], targets: &[&str]) -> Option<String> {
    let dir = build_quantized(model, mode, extra)?;
    let s = |p: PathBuf| p.display().to_string();
    let onnx = s(dir.join(format!("{model}.onnx")));
    let tex = s(dir.join(format!("{model}.tex")));
    let o = texc(&["import", &onnx, "-o", &tex]);
    assert!(o.status.success(), "{}", text(&o));
    let npz = s(dir.join(format!("{model}.npz")));
    let x = format!("x={}", s(dir.join("x.npy")));
    let step: f64 = std::fs::read_to_string(dir.join("step.txt")).expect("step").trim().parse().expect("a number");
    let (_, want) = f32s(&dir.join("expected.npy"));
    for target in targets {
        if !runs_here(target) {
            continue;
        }
        let y = dir.join(format!("y_{target}.npy"));
        let out = format!("y={}", s(y.clone()));
        // x86-avx2 and AMX run the .onnx file (weight-only stages folded), the others the imported text.
        let o = if ["x86-avx2", "x86-avx512-amx"].contains(target) {
            texc(&["run", &onnx, "--input", &x, "--output", &out, "--target", target])
        } else {
            texc(&["run", &tex, "--input", &npz, "--input", &x, "--output", &out, "--target", target])
        };
        assert!(o.status.success(), "{model} ({mode} {extra:?}) on {target}: {}", text(&o));
        let what = format!("{model} ({mode} {extra:?}) on {target}");
        if step > 0.0 {
            let (_, got) = f32s(&y);
            let worst = got.iter().zip(&want).map(|(g, w)| (*g as f64 - *w as f64).abs()).fold(0.0, f64::max);
            let differ = got.iter().zip(&want).filter(|(g, w)| g != w).count();
            eprintln!(
                "{what}: {differ} of {} outputs differ from ONNX Runtime's, by at most {:.2} steps",
                got.len(),
                worst / step
            );
            assert!(worst <= step * 1.001, "{what}: {worst} is more than one step ({step}) from ONNX Runtime");
        } else {
            let e = normwise_error(&y, &dir.join("expected.npy"));
            eprintln!("{what}: normwise relative error {e:.3e} against ONNX Runtime");
            assert!(e <= 1e-5, "{what}: error {e:.3e} against ONNX Runtime");
        }
    }
    Some(std::fs::read_to_string(&tex).expect("tex"))
}

/// `x86-avx512-amx` where the CPU has AMX-INT8: matrix products on tiles, the rest as on `x86-avx512-vnni`.
const ALL_CPU: &[&str] = &["interp", "x86-avx2", "x86-avx512", "x86-avx512-amx", "cranelift"];

/// The integer product as texc writes it: `sum[...](i32(A[..]) * i32(W[j, ..]))`.
fn integer_products(tex: &str) -> usize {
    tex.lines().filter(|l| l.contains("](i32(") && l.contains(") * i32(")).count()
}

/// A CNN (convolution, depthwise and grouped convolutions, max pooling,
/// Clip, global pooling, Gemm) quantized by `quantize_static` (QDQ, u8
/// activations, i8 weights per channel): every convolution and the Gemm
/// run as integer products with their requantization in one statement.
#[test]
fn static_quantized_cnn_runs_in_integers_and_matches_onnx_runtime() {
    let Some(tex) = quantized_model_matches_onnx_runtime("cnn", "static", &["--per-channel"], ALL_CPU) else {
        return;
    };
    assert_eq!(integer_products(&tex), 5, "{tex}");
    assert!(!tex.contains("conv2d") && !tex.contains("dense("), "no f32 product is left: {tex}");
    // DQ → MaxPool → Q pools the integers; the pair around it cancels.
    assert!(!tex.contains("max_pool2d") && tex.contains("= max[r0 in 0..2, r1 in 0..2](relu_"), "{tex}");
    // Depthwise (one channel per group) and grouped (4 per group) reductions.
    assert!(tex.contains("sum[r0 in 0..1, r1 in 0..3, r2 in 0..3](i32("), "{tex}");
    assert!(tex.contains("(i1 / 8) * 4 + r0"), "{tex}");
}

/// i8 activations, per-tensor weights, opset 21; and u8 at opset 19.
#[test]
fn static_quantized_cnn_with_i8_activations_matches_onnx_runtime() {
    let Some(tex) = quantized_model_matches_onnx_runtime("cnn", "static", &["--act", "i8", "--opset", "21"], ALL_CPU)
    else {
        return;
    };
    assert_eq!(integer_products(&tex), 5, "{tex}");
    assert!(tex.contains("i8(clamp("), "i8 requantization: {tex}");
    quantized_model_matches_onnx_runtime("cnn", "static", &["--opset", "19"], &["interp"]);
}

/// A transformer encoder block (attention, GELU feed-forward, LayerNormalization)
/// quantized by `quantize_static`: the projections with constant weights are
/// integer products in the canonical form, the products of two u8
/// activations (QKᵀ, attention·V) unsigned times signed bytes (`B − 128`)
/// with the row sums of one and the column sums of the other for the zero
/// points (with i8 activations, sums with both zero points); softmax, layer
/// norm and GELU run in f32 between their DequantizeLinear and QuantizeLinear.
#[test]
fn static_quantized_encoder_matches_onnx_runtime() {
    let Some(tex) = quantized_model_matches_onnx_runtime("encoder", "static", &["--per-channel"], ALL_CPU) else {
        return;
    };
    // (Row and column sums only where the other operand's zero point is not
    // 128 and 0: a softmax's output has zero point 0.)
    assert_eq!(tex.matches("_bsigned[i0 in 0..").count(), 2, "{tex}");
    assert!(tex.contains("_arows[i0 in 0..") && tex.contains("_bcols[i0 in 0.."), "{tex}");
    assert_eq!(tex.matches("layer_norm(").count(), 2, "{tex}");
    assert!(integer_products(&tex) >= 6, "{tex}");
    quantized_model_matches_onnx_runtime("encoder", "static", &["--act", "i8", "--opset", "21"], ALL_CPU);
}

/// Products of two u8 activations written by hand (`tests/onnx/quantized.py
/// qmm`): unsigned times signed bytes, the first operand's row sums only
/// where the second's zero point is not 128, the second's column sums only
/// where the first's is not 0, batch dimensions that broadcast.
#[test]
fn products_of_two_activations_match_onnx_runtime() {
    let Some(tex) = quantized_model_matches_onnx_runtime("qmm", "none", &[], ALL_CPU) else {
        return;
    };
    assert_eq!(tex.matches("_bsigned[i0 in 0..").count(), 2, "{tex}");
    assert_eq!(tex.matches("_arows[i0 in 0..").count(), 1, "{tex}");
    assert_eq!(tex.matches("_bcols[i0 in 0..").count(), 1, "{tex}");
    assert_eq!(integer_products(&tex), 2, "{tex}");
}

/// `quantize_dynamic`: DynamicQuantizeLinear, MatMulInteger and
/// ConvInteger with run-time zero points, then f32 scaling.
#[test]
fn dynamically_quantized_models_match_onnx_runtime() {
    quantized_model_matches_onnx_runtime("cnn", "dynamic", &[], ALL_CPU);
    quantized_model_matches_onnx_runtime("encoder", "dynamic", &["--per-channel"], ALL_CPU);
}

/// QLinearConv (per-channel weights, i32 bias), QLinearMatMul with a weight
/// zero point, MatMulInteger and ConvInteger (u8 weights, asymmetric
/// padding, stride 2) written by hand.
#[test]
fn qoperator_forms_match_onnx_runtime() {
    quantized_model_matches_onnx_runtime("qop", "none", &[], ALL_CPU);
}

/// ResNet-18 quantized with `reduce_range` (7-bit weights, what ORT
/// recommends for CPUs without VNNI): every product on AVX2 and AVX-512
/// without VNNI runs on `@dot4sat` (`vpmaddubsw`: the weights prove no pair
/// sum saturates), and the outputs match ORT's as the full-range model's
/// do; full-range weights keep `@dot2` there.
#[test]
fn reduced_range_weights_run_on_byte_products_without_vnni() {
    let targets = ["interp", "x86-avx2", "x86-avx512"];
    if quantized_model_matches_onnx_runtime("resnet18", "static", &["--per-channel", "--reduce-range"], &targets)
        .is_none()
    {
        return;
    }
    let emitted = |extra: &str| {
        let dir = scratch(&["q_resnet18_static_perchannel", extra].concat());
        let onnx = dir.join("resnet18.onnx").display().to_string();
        let o = texc(&["emit", &onnx, "--stage", "loops", "--target", "x86-avx2"]);
        assert!(o.status.success(), "{}", text(&o));
        String::from_utf8(o.stdout).expect("utf-8")
    };
    let nest = emitted("_reducerange");
    assert!(nest.contains("@dot4sat(") && !nest.contains("@dot2("), "{nest}");
    // Another seed than the test above: the two must not share a directory.
    if quantized_model_matches_onnx_runtime("resnet18", "static", &["--per-channel", "--seed", "1"], &["interp"])
        .is_some()
    {
        let nest = emitted("_seed_1");
        assert!(nest.contains("@dot2(") && !nest.contains("@dot4sat("), "{nest}");
    }
}

/// ResNet-18 and MobileNetV2 (at 32×32) as ORT quantizes them after its
/// pre-processing (batch norm folded): every convolution is integer. On
/// AMX tiles too, where the CPU has them: the classifier's product runs on
/// tiles beside convolutions whose loops share its loops' names.
#[test]
fn static_quantized_resnet18_and_mobilenetv2_match_onnx_runtime() {
    for (model, convs) in [("resnet18", 21), ("mobilenetv2", 53)] {
        let targets = ["interp", "x86-avx2", "x86-avx512", "x86-avx512-amx"];
        let Some(tex) = quantized_model_matches_onnx_runtime(model, "static", &["--per-channel"], &targets) else {
            return;
        };
        assert_eq!(integer_products(&tex), convs, "{model}");
        assert!(!tex.contains("conv2d"), "{model}: no f32 convolution is left");
    }
}
