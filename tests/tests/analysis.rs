//! The sizing figures of `texc analyze` (`compiler/src/graph.rs`): weights,
//! parameter count and peak memory against hand counts, and which plan the
//! pipeline says runs (`Pipeline::rewrite_skipped`).

use texc_compiler::graph::{summary, weights};
use texc_compiler::nn::TABLE;
use texc_compiler::{Bindings, KernelRef};
use texc_pipeline::NoRewrite;

/// Every weight position of the operator table is a tensor parameter of
/// every overload of that std.nn kernel, named as weights are named there;
/// every non-negative position names its parameter.
#[test]
fn weight_positions_name_weights_of_the_standard_library() {
    let (pl, _) = texc_tests::load_text(
        "interp",
        "w.tex",
        "import std.nn;\nkernel f(X: f32[N = 2]) -> Y: f32[N] { Y = relu(X); }",
        None,
    )
    .expect("loads");
    let std = pl.session.modules.iter().find(|m| m.path.is_none() && m.kernels.iter().any(|k| k.name == "conv2d"));
    let std = std.expect("std.nn is loaded");
    for row in TABLE {
        let (name, positions) = (&row.name, &row.weights);
        let overloads: Vec<_> = std.kernels.iter().filter(|k| k.name == *name).collect();
        assert!(!overloads.is_empty(), "`{name}` is not a std.nn kernel");
        for k in overloads {
            for &at in *positions {
                let p = &k.params[at];
                assert!(
                    matches!(p.info, texc_compiler::kernel::ParamInfo::Tensor(_)),
                    "{name} parameter {at} is not a tensor"
                );
                assert!(
                    ["Wt", "W", "b", "gamma", "beta", "mean", "var", "slope"].contains(&p.name.as_str()),
                    "{name} parameter {at} is `{}`, not a weight",
                    p.name
                );
            }
            for &(at, param) in row.non_negative {
                assert_eq!(k.params[at].name, param, "{name} parameter {at}");
            }
        }
    }
}

const CHAIN: &str = "import std.nn;
kernel chain(X: f32[N = 2, C = 8], W1: f32[M = 64, C], b1: f32[M], W2: f32[P = 4, M], b2: f32[P],
             S: f32[N, P]) -> Y: f32[N, P] {
    H = dense(X, W1, b1);
    R = relu(H);
    Z = dense(R, W2, b2);
    Y[n, p] = Z[n, p] * S[n, p];
}";

#[test]
fn parameters_and_peak_memory_of_a_chain_match_hand_counts() {
    let (mut pl, k) = texc_tests::load_text("x86-avx2", "chain.tex", CHAIN, None).expect("loads");
    let p = texc_tests::specialize(&mut pl, k, &Bindings::default());
    let names = |ts: &[texc_compiler::tir::TensorId]| ts.iter().map(|&t| p.tensor(t).name.clone()).collect::<Vec<_>>();
    // X feeds dense as its data; S is read by a definition: activations both.
    assert_eq!(names(&weights(&p)), ["W1", "b1", "W2", "b2"]);
    let s = summary(&p);
    // W1 64·8 + b1 64 + W2 4·64 + b2 4.
    assert_eq!(s.parameters, 512 + 64 + 256 + 4);
    // Caller's buffers, live throughout: X 2·8, W1 512, b1 64, W2 256, b2 4,
    // S 2·4, Y 2·4 floats = 868 floats = 3472 bytes. Between operators:
    // H (2·64) while dense and relu run, R (2·64) from relu to the second
    // dense, Z (2·4) from it to the product. While relu runs: H + R = 256
    // floats = 1024 bytes, the most.
    assert_eq!(s.peak_bytes, 3472 + 1024);
    assert_eq!(s.peak_op, Some(1));
    assert_eq!(names(&s.peak_live), ["X", "W1", "b1", "W2", "b2", "S", "Y", "H", "R"]);
    // dense: 2·N·M·C + N·M; relu N·M; dense 2·N·P·M + N·P; product N·P.
    assert_eq!(s.flops, (2 * 2 * 64 * 8 + 2 * 64 + 2 * 64 + 2 * 2 * 4 * 64 + 2 * 4 + 2 * 4) as f64);
}

fn skipped(target: &str, file: &str, rewrite: bool) -> (Option<NoRewrite>, Option<String>) {
    let (mut pl, k): (_, KernelRef) = texc_tests::load_file(target, file, None).expect("loads");
    pl.options.rewrite = rewrite;
    let built = pl.program(k, &Bindings::default()).expect("builds");
    (pl.rewrite_skipped(k), built.plan.map(|p| p.source))
}

/// `program` (what `run` runs) and `rewrite_skipped` (what `emit --stage
/// egraph` and `analyze` report) agree: no e-graph plan where none is used.
#[test]
fn the_plan_that_runs_is_named_with_its_reason() {
    let (skip, plan) = skipped("x86-avx2", "examples/conv_bn_relu.tex", true);
    assert_eq!(skip, None);
    assert!(plan.expect("rewritten").contains("conv2d_bias_relu"));
    assert_eq!(skipped("interp", "examples/conv_bn_relu.tex", true), (Some(NoRewrite::Interpreter), None));
    assert_eq!(skipped("x86-avx2", "examples/conv_bn_relu.tex", false), (Some(NoRewrite::Disabled), None));
    // x86-avx512 runs the kernel's x86-avx2 schedule.
    let (skip, plan) = skipped("x86-avx512", "examples/conv_resnet.tex", true);
    let own = NoRewrite::OwnSchedule { kernel: "conv3x3".into(), schedule_target: "x86-avx2".into() };
    assert_eq!((skip, plan), (Some(own.clone()), None));
    assert_eq!(
        own.to_string(),
        "kernel `conv3x3` has its own schedule for x86-avx2, which pins the graph as written; \
         an e-graph plan would not be used"
    );
}
