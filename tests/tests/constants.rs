//! Constant stages (`texc_compiler::constants`): the stages that read only
//! constants split off into a prologue; the prologue's results fed to what is
//! left give the program's outputs, on the interpreter and compiled.

use std::collections::HashMap;
use texc_compiler::constants::split;
use texc_compiler::interp::{self, Arg};
use texc_compiler::tir::{Program, TensorRole};
use texc_compiler::Bindings;
use texc_runtime::{DType, SplitMix64, Tensor};

const SRC: &str = "
kernel k(X: f32[5, 7], W: f32[7, 3], b: f32[3], s: f32 = 2.0) -> Y: f32[5, 3] {
    Wt[j, i] = W[i, j] * s;
    Big[i, j, r in 0..4096] = W[i, j] + 1.0;
    T[i, j] = X[i, j] + 1.0;
    Y[i, j] = sum[k](T[i, k] * Wt[j, k]) + b[j] + Big[0, j, 5];
}";

fn program() -> Program {
    let (mut pl, k) = texc_tests::load_text("interp", "k.tex", SRC, None).unwrap_or_else(|e| panic!("{e}"));
    texc_tests::specialize(&mut pl, k, &Bindings::default())
}

fn random(shape: Vec<usize>, rng: &mut SplitMix64) -> Tensor {
    let n = shape.iter().product();
    let v: Vec<f64> = (0..n).map(|_| rng.next_f64() * 2.0 - 1.0).collect();
    Tensor::from_f64(DType::F32, shape, &v)
}

fn names(p: &Program) -> Vec<String> {
    p.param_names()
}

/// W, b and s are constants: `Wt` folds (it reads W and s); `Big` would be
/// 4096× larger than W and stays; `T` reads X; the output never folds.
#[test]
fn constant_stages_split_off_and_give_the_same_outputs() {
    let p = program();
    let s = split(&p, &|n| n == "W" || n == "b", &|n| n == "s").expect("Wt folds");
    let staged = |q: &Program| q.stages.iter().map(|st| q.tensor(st.tensor).name.clone()).collect::<Vec<_>>();
    assert_eq!(staged(&s.prologue), ["Wt"]);
    assert_eq!(staged(&s.main), ["Big", "T", "Y"]);
    assert_eq!(names(&s.prologue), ["W", "s"]);
    // W is still read by `Big`; the folded tensor comes last.
    assert_eq!(names(&s.main), ["X", "W", "b", "s", "Wt"]);
    assert_eq!(s.main.tensor(s.frontier[0]).role, TensorRole::Input);
    texc_compiler::verify::verify(&s.prologue).expect("prologue verifies");
    texc_compiler::verify::verify(&s.main).expect("main verifies");

    let mut rng = SplitMix64::new(7);
    let (x, w, b) = (random(vec![5, 7], &mut rng), random(vec![7, 3], &mut rng), random(vec![3], &mut rng));
    let want =
        interp::run(&p, vec![Arg::Tensor(x.clone()), Arg::Tensor(w.clone()), Arg::Tensor(b.clone()), Arg::Scalar(2.0)])
            .expect("the program runs");
    let folded = interp::run(&s.prologue, vec![Arg::Tensor(w.clone()), Arg::Scalar(2.0)]).expect("the prologue runs");
    let args = vec![Arg::Tensor(x), Arg::Tensor(w), Arg::Tensor(b), Arg::Scalar(2.0), Arg::Tensor(folded[0].clone())];
    assert_eq!(interp::run(&s.main, args.clone()).expect("main runs"), want, "interpreted");
    let (targets, _) = texc_tests::runnable_targets();
    for t in targets {
        let f = texc_tests::default_lowered(t.name, &s.main);
        let got = texc_tests::compile_loops(t, &f).expect("compiles").run(args.clone()).expect("runs");
        let err = texc_pipeline::oracle::compare(&["Y".into()], &got, &want, None);
        assert!(err[0].passed(), "{t}: relative error {}", err[0].error);
    }
}

/// Nothing folds without constants, nor a stage reading a scalar of unknown
/// value (`Wt`), nor one much larger than its constant sources (`Big`).
#[test]
fn what_does_not_fold() {
    let p = program();
    assert!(split(&p, &|_| false, &|_| true).is_none(), "no constants");
    assert!(split(&p, &|n| n == "W", &|_| false).is_none(), "Wt reads s; Big grows 4096-fold");
}

/// The whole pipeline on an imported-model-like program: `Pipeline::prepare`
/// folds only for models, so a plain kernel keeps its parameters.
#[test]
fn plain_kernels_are_not_folded() {
    let (mut pl, k) = texc_tests::load_text("x86-avx2", "k.tex", SRC, None).unwrap_or_else(|e| panic!("{e}"));
    let prep = pl.prepare(k, &Bindings::default(), HashMap::new(), &[], 0, false).expect("prepares");
    assert_eq!(names(&prep.built.runs), ["X", "W", "b", "s"]);
    assert!(prep.run_args.is_none(), "the compiled loops take the arguments as written");
    assert_eq!(prep.compiled_args().len(), prep.args.len());
}

/// A long product whose vector operand is a constant (`W`, an imported
/// model's weights) reads it from panels made once: the panels' stage
/// (`W.panels`, the default schedule's panel width) folds into the
/// prologue, and the product's loops pack nothing on every call. Against
/// the program as written, interpreted and compiled. Columns the panel
/// width does not divide (520) get a last panel padded with zeros; a `W`
/// that is not constant keeps the per-call packing.
#[test]
fn constant_operands_are_packed_once() {
    let src = |n: i64| {
        format!(
            "kernel mm(X: f32[M = 29, K = 600], W: f32[K, N = {n}]) -> Y: f32[M, N] {{
    Y[i, j] = sum[k](X[i, k] * W[k, j]);
}}"
        )
    };
    for t in ["x86-avx2", "x86-avx512"] {
        let (p, packed, made) = prepacked(t, &src(512), true);
        assert_eq!(made, 1, "{t}");
        let width = if t == "x86-avx2" { 16 } else { 32 };
        let panels = packed.tensors.iter().find(|d| d.name == "W.panels").expect("panels");
        assert_eq!(panels.shape, [512 / width, 600, width], "{t}");
        let text = folded_matches_interpreter(t, &p, &packed, "W_panels", [vec![29, 600], vec![600, 512]]);
        assert!(!text.contains("packed"), "{t}: packs on every call:\n{text}");
        // Not constant.
        assert_eq!(prepacked(t, &src(512), false).2, 0);
        // Columns the panels do not divide: the last panel padded.
        let (p, packed, made) = prepacked(t, &src(520), true);
        assert_eq!(made, 1, "{t}: 520 columns");
        let panels = packed.tensors.iter().find(|d| d.name == "W.panels").expect("panels");
        assert_eq!(panels.shape, [(520 + width - 1) / width, 600, width], "{t}");
        let text = folded_matches_interpreter(t, &p, &packed, "W_panels", [vec![29, 600], vec![600, 520]]);
        assert!(!text.contains("packed"), "{t}: 520 columns pack on every call:\n{text}");
    }
}

/// A product whose sum preparation splits off its epilogue (`Y.r0`, the
/// sum; `Y`, its bias and activation: a `Gemm` with a bias, a convolution
/// with its ReLU) is packed once too: the schedule packs `Y.r0`'s operand,
/// a stage only the copy it runs on has, and the panels go to the stage of
/// the program that reads the operand (ViT-B/32's attention projections
/// packed their 768 × 768 weights on every call: 0.90 → 0.76 ms a layer,
/// Zen 3, 1 thread).
#[test]
fn constant_operands_of_products_with_epilogues_are_packed_once() {
    let src = "kernel mm(X: f32[M = 29, K = 600], W: f32[K, N = 520]) -> Y: f32[M, N] {
    Y[i, j] = max(sum[k](X[i, k] * W[k, j]) * 0.5 + 1.0, 0.0);
}";
    for t in ["x86-avx2", "x86-avx512"] {
        let (p, packed, made) = prepacked(t, src, true);
        assert_eq!(made, 1, "{t}");
        let text = folded_matches_interpreter(t, &p, &packed, "W_panels", [vec![29, 600], vec![600, 520]]);
        assert!(text.contains("W_panels["), "{t}: the product does not read the panels:\n{text}");
        assert!(!text.contains("packed"), "{t}: packs on every call:\n{text}");
        assert_eq!(prepacked(t, src, false).2, 0, "{t}: not constant");
    }
}

/// A register block's broadcast operand (a 1×1 convolution's filters,
/// `W[k, c]` read for `rows` filters at once) is packed once into
/// `W.rows[k / rows, c, k % rows]`: the block reads one contiguous stream
/// instead of `rows` strided ones. Not for an operand that is not constant.
#[test]
fn broadcast_constant_operands_are_packed_by_rows() {
    let src = "kernel pw(X: f32[C = 40, P = 49], W: f32[K = 160, C]) -> Y: f32[K, P] {
    Y[k, p] = sum[c](W[k, c] * X[c, p]);
}";
    for t in ["x86-avx2", "x86-avx512"] {
        let (p, packed, made) = prepacked(t, src, true);
        assert_eq!(made, 1, "{t}");
        let rows = packed.tensors.iter().find(|d| d.name == "W.rows").expect("rows");
        let r = rows.shape[2];
        // AVX2's blocks of 6 filters leave 4 in the last, which reads zeros past them.
        assert!(r > 1 && rows.shape == [(160 + r - 1) / r, 40, r], "{t}: {:?}", rows.shape);
        let text = folded_matches_interpreter(t, &p, &packed, "W_rows", [vec![40, 49], vec![160, 40]]);
        // `(k.b·r + k.r) / r` and `% r` taken apart (`guards::decided_division`).
        assert!(text.contains("W_rows[k.b, c, k.r]"), "{t}:\n{text}");
        assert_eq!(prepacked(t, src, false).2, 0, "{t}: not constant");
    }
}

/// A matrix-vector product's register block reads `width` lanes of each of
/// the constant operand's rows, a row apart: the product is too short to
/// pack per call, so the pack is made once, padded past the last column
/// (1000 columns, no block width divides them), and the block streams one
/// contiguous panel. Also where the product reads a transpose of the
/// weights (`Wt`, folded), which preparation would otherwise inline back.
#[test]
fn matrix_vector_constants_stream_panels() {
    let plain = "kernel mv(X: f32[M = 1, K = 300], W: f32[K, N = 1000]) -> Y: f32[M, N] {
    Y[i, j] = sum[k](X[i, k] * W[k, j]);
}";
    let transposed = "kernel mv(X: f32[M = 1, K = 300], W: f32[N = 1000, K]) -> Y: f32[M, N] {
    Wt[k, j] = W[j, k];
    Y[i, j] = sum[k](X[i, k] * Wt[k, j]);
}";
    for t in ["x86-avx2", "x86-avx512"] {
        for (src, name, w_shape) in [(plain, "W_panels", vec![300, 1000]), (transposed, "Wt_panels", vec![1000, 300])] {
            let (p, packed, made) = prepacked(t, src, true);
            assert_eq!(made, 1, "{t}");
            let panels = packed.tensors.iter().find(|d| d.name.ends_with(".panels")).expect("panels");
            let w = panels.shape[2];
            assert!(w > 16 && w < 1000 && 1000 % w != 0, "{t}: panels {:?}", panels.shape);
            assert_eq!(panels.shape, [(1000 + w - 1) / w, 300, w], "{t}");
            let text = folded_matches_interpreter(t, &p, &packed, name, [vec![1, 300], w_shape]);
            assert!(text.contains(&format!("{name}[")), "{t}: the product does not read the panels:\n{text}");
            assert_eq!(prepacked(t, src, false).2, 0, "{t}: not constant");
        }
    }
}

/// A long product of few columns (200: too few panels for the schedule's
/// blocks of them, the only products it packs per call) whose reduction is
/// cut into slices, its register block resumed per slice: each row block
/// re-reads its slice of the constant operand a row apart per step, so the
/// operand is packed once into panels (the last padded) that every slice
/// streams. Rows of odd count (49: a shorter last block of 5 on AVX2) and a
/// last, shorter slice (1100 deep).
#[test]
fn sliced_products_of_few_columns_stream_constant_panels() {
    let src = "kernel p(X: f32[M = 49, K = 1100], W: f32[K, N = 200]) -> Y: f32[M, N] {
    Y[i, j] = sum[k](X[i, k] * W[k, j]);
}";
    for t in ["x86-avx2", "x86-avx512"] {
        let (p, packed, made) = prepacked(t, src, true);
        assert_eq!(made, 1, "{t}");
        let panels = packed.tensors.iter().find(|d| d.name.ends_with(".panels")).expect("panels");
        let w = panels.shape[2];
        assert!(200 % w != 0 && (200 + w - 1) / w < 16, "{t}: panels {:?}", panels.shape);
        assert_eq!(panels.shape, [(200 + w - 1) / w, 1100, w], "{t}");
        let text = folded_matches_interpreter(t, &p, &packed, "W_panels", [vec![49, 1100], vec![1100, 200]]);
        assert!(text.contains("W_panels["), "{t}: the product does not read the panels:\n{text}");
        assert!(text.contains("k.o in"), "{t}: the reduction is not cut into slices:\n{text}");
        let resumed = text.lines().any(|l| l.trim_start().starts_with("Y.acc[") && l.contains(" > 0, Y["));
        assert!(resumed, "{t}: the register block does not resume its sums per slice:\n{text}");
        assert_eq!(prepacked(t, src, false).2, 0, "{t}: not constant");
    }
}

/// A batch of products whose constant operand is read at the batch's own
/// axis (Winograd's products per tile position: `U[i, j, c, k]`) has its
/// panels after the batch axis, `W.panels[b, q, k, r]`: the parallel loop
/// walks the batch outside the column blocks, so the panels one iteration
/// after another reads lie one after another, and the prefetch pass takes
/// them in runs (with the panel index first, `W.panels[q, b, k, r]`, the
/// next iteration's panel was a whole batch of panels away, and no plan was
/// made). Against the program as written, interpreted and compiled.
#[test]
fn batched_constant_operands_have_their_panels_after_the_batch() {
    let src = "kernel bm(X: f32[B = 4, M = 20, K = 160], W: f32[B, K, N = 96]) -> Y: f32[B, M, N] {
    Y[b, i, j] = sum[k](X[b, i, k] * W[b, k, j]);
}";
    for t in ["x86-avx2", "x86-avx512"] {
        let (p, packed, made) = prepacked(t, src, true);
        assert_eq!(made, 1, "{t}");
        let panels = packed.tensors.iter().find(|d| d.name == "W.panels").expect("panels");
        let w = panels.shape[3];
        assert_eq!(panels.shape, [4, 96 / w, 160, w], "{t}");
        let s = split(&packed, &|n| n == "W", &|_| false).expect("the packed tensor folds");
        let f = texc_tests::default_lowered(t, &s.main);
        let target = texc_compiler::target::lookup(t).expect("target");
        let plans = texc_schedules::prefetch::plans(&f, &target.cpu_caches(), 14.3);
        let text = folded_matches_interpreter(t, &p, &packed, "W_panels", [vec![4, 20, 160], vec![4, 160, 96]]);
        assert!(text.contains("W_panels[b"), "{t}: the product does not read the panels by batch:\n{text}");
        let on_panels: Vec<_> = plans.iter().filter(|pl| s.main.tensor(pl.tensor).name == "W_panels").collect();
        assert!(
            matches!(on_panels[..], [pl] if pl.slice % (160 * w) == 0),
            "{t}: no prefetch of the next panels: {plans:?}\n{text}"
        );
    }
}

/// `src` specialized for target `t`, and after `prepack_constant_operands`
/// with `W` constant (or nothing, unless `constant`): both programs, and the
/// number of packed tensors made.
fn prepacked(t: &str, src: &str, constant: bool) -> (Program, Program, usize) {
    let target = texc_compiler::target::lookup(t).expect("target");
    let (mut pl, k) = texc_tests::load_text(t, "k.tex", src, None).unwrap_or_else(|e| panic!("{e}"));
    let p = texc_tests::specialize(&mut pl, k, &Bindings::default());
    let mut packed = p.clone();
    let knobs = texc_schedules::knobs::DefaultKnobs::default();
    let w = |n: &str| constant && n == "W";
    let made = texc_schedules::prepack::prepack_constant_operands(&mut packed, target, knobs, &w, &|_| false);
    texc_compiler::verify::verify(&packed).expect("verifies");
    (p, packed, made)
}

/// Fold `packed` (`W` constant): its main program takes `X` and the packed
/// tensor `name`, and gives `p`'s output `Y` on random inputs of `shapes`
/// (`X`, `W`) — interpreted, and compiled for `t` where it runs. The main
/// program's loop nests, printed.
fn folded_matches_interpreter(t: &str, p: &Program, packed: &Program, name: &str, shapes: [Vec<usize>; 2]) -> String {
    let s = split(packed, &|n| n == "W", &|_| false).expect("the packed tensor folds");
    assert_eq!(names(&s.main), ["X", name], "{t}");
    let f = texc_tests::default_lowered(t, &s.main);
    let [xs, ws] = shapes;
    let mut rng = SplitMix64::new(3);
    let (x, wv) = (random(xs, &mut rng), random(ws, &mut rng));
    let want = interp::run(p, vec![Arg::Tensor(x.clone()), Arg::Tensor(wv.clone())]).expect("runs");
    let folded = interp::run(&s.prologue, vec![Arg::Tensor(wv)]).expect("the prologue runs");
    let args = vec![Arg::Tensor(x), Arg::Tensor(folded[0].clone())];
    assert_eq!(interp::run(&s.main, args.clone()).expect("main runs"), want, "{t}: interpreted");
    let (targets, _) = texc_tests::runnable_targets();
    if targets.iter().any(|r| r.name == t) {
        let target = texc_compiler::target::lookup(t).expect("target");
        let got = texc_tests::compile_loops(target, &f).expect("compiles").run(args).expect("runs");
        let err = texc_pipeline::oracle::compare(&["Y".into()], &got, &want, None);
        assert!(err[0].passed(), "{t}: relative error {}", err[0].error);
    }
    texc_schedules::ir::print(&f)
}
