//! Constant stages (`texc_compiler::constants`): the stages that read only
//! constants split off into a prologue; the prologue's results fed to what is
//! left give the program's outputs, on the interpreter and compiled.

use std::collections::HashMap;
use texc_compiler::constants::split;
use texc_compiler::interp::{self, Arg};
use texc_compiler::tir::{Program, ProgramParam, TensorRole};
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
    p.params
        .iter()
        .map(|q| match q {
            ProgramParam::Tensor(t) => p.tensor(*t).name.clone(),
            ProgramParam::Scalar(s) => p.scalars[*s as usize].name.clone(),
        })
        .collect()
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
