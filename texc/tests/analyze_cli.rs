//! `texc analyze` describes the plan that runs (or, asked, the graph as
//! written) with the kernel's sizing figures; `texc emit --stage egraph`
//! says what really runs when no e-graph plan is used.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("parent").to_path_buf()
}

fn texc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_texc"))
        .args(args)
        .env("TEXC_ROOFLINE", "130,37")
        .current_dir(root())
        .output()
        .expect("texc runs")
}

fn stdout(o: &Output) -> String {
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).to_string()
}

/// The operator rows of an analyze report (between the header and the total).
fn operator_rows(out: &str) -> Vec<String> {
    out.lines()
        .skip_while(|l| !l.trim_start().starts_with("operator"))
        .skip(1)
        .take_while(|l| !l.trim_start().starts_with("total"))
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .collect()
}

#[test]
fn analyze_describes_the_plan_that_runs_by_default() {
    let out = stdout(&texc(&["analyze", "examples/conv_bn_relu.tex", "--target", "x86-avx2"]));
    assert!(
        out.contains(
            "plan that runs on x86-avx2: the e-graph's rewrite, 3 operators: bn_fold_weight, bn_fold_bias, \
             conv2d_bias_relu (as written: 3 operators: conv2d, batch_norm, relu; see --as-written)"
        ),
        "{out}"
    );
    // One fused convolution; the other two operators fold the batch norm into its weights.
    assert_eq!(operator_rows(&out), ["_r1 = bn_fold_weight", "_r2 = bn_fold_bias", "Y = conv2d_bias_relu"], "{out}");
    // conv2d_bias_relu: 2·144 + bias add + max per output element, 6272 of them;
    // X + folded weights + bias + Y = 12544 + 18432 + 128 + 25088 bytes.
    assert!(
        out.contains("  Y = conv2d_bias_relu                        1.819         56.2     32.37  compute"),
        "{out}"
    );
    // Wt 32·16·9 + gamma, beta, mean, var of 32 each.
    assert!(out.contains("    parameters   4,736 (Wt 4,608, gamma 32, beta 32, mean 32, var 32)\n"), "{out}");
    // While bn_fold_bias runs: X 12544 + Wt 18432 + 4·128 + Y 25088 + _r1 18432 + _r2 128 bytes.
    assert!(
        out.contains(
            "    peak memory  75,136 bytes (75.1 KB) while `_r2 = bn_fold_bias` runs: \
             X, Wt, gamma, beta, mean, var, Y, _r1, _r2\n"
        ),
        "{out}"
    );
}

#[test]
fn analyze_as_written_shows_the_three_operators() {
    let out = stdout(&texc(&["analyze", "examples/conv_bn_relu.tex", "--target", "x86-avx2", "--as-written"]));
    assert!(
        out.contains(
            "plan: the graph as written, 3 operators: conv2d, batch_norm, relu (--as-written); on x86-avx2 the \
             e-graph's plan runs instead"
        ),
        "{out}"
    );
    assert_eq!(operator_rows(&out), ["_conv2d0 = conv2d", "_batch_norm1 = batch_norm", "Y = relu"], "{out}");
    assert!(out.contains("    FLOPs        1,850,240 (1.850 MFLOP)\n"), "{out}");
    assert!(out.contains("    bytes moved  156.9 KB (operators run one by one)\n"), "{out}");
    // While batch_norm runs, conv's result and its own are both live: 2 · 25088 bytes on top of
    // the caller's 56576.
    assert!(out.contains("    peak memory  106,752 bytes (106.8 KB) while `_batch_norm1 = batch_norm` runs"), "{out}");
    // --no-rewrite runs the graph as written: analyze says so, and its figures are the same.
    let plain = stdout(&texc(&["analyze", "examples/conv_bn_relu.tex", "--target", "x86-avx2", "--no-rewrite"]));
    assert!(
        plain.contains(
            "plan that runs on x86-avx2: the graph as written, 3 operators: conv2d, batch_norm, relu \
             (--no-rewrite: no rewriting happens)"
        ),
        "{plain}"
    );
    assert_eq!(operator_rows(&plain), operator_rows(&out));
}

#[test]
fn analyze_of_a_scheduled_kernel_says_the_schedule_pins_the_graph() {
    let out = stdout(&texc(&["analyze", "examples/conv_resnet.tex", "--target", "x86-avx2"]));
    assert!(
        out.contains(
            "plan that runs on x86-avx2: the graph as written, 2 operators: compute, compute (kernel `conv3x3` \
             has its own schedule for x86-avx2, which pins the graph as written; an e-graph plan would not be used)"
        ),
        "{out}"
    );
    // The hand-written convolution is recognized: its filter is a weight.
    assert!(out.contains("    parameters   36,864 (Wt 36,864)\n"), "{out}");
}

#[test]
fn analyze_plot_draws_the_plan_that_runs() {
    let svg = std::env::temp_dir().join(format!("texc-analyze-{}.svg", std::process::id()));
    let out = stdout(&texc(&[
        "analyze",
        "examples/conv_bn_relu.tex",
        "--target",
        "x86-avx2",
        "--plot",
        svg.to_str().expect("utf8"),
    ]));
    assert!(out.contains("wrote "), "{out}");
    let plot = std::fs::read_to_string(&svg).expect("plot written");
    let _ = std::fs::remove_file(&svg);
    assert_eq!(plot.matches("<circle").count(), 3);
    assert!(plot.contains("Y = conv2d_bias_relu") && !plot.contains("batch_norm"), "{plot}");
}

#[test]
fn emit_egraph_on_the_interpreter_says_it_runs_the_graph_as_written() {
    let out = stdout(&texc(&["emit", "examples/conv_bn_relu.tex", "--stage", "egraph", "--target", "interp"]));
    assert!(
        out.starts_with(
            "egraph for interp: not run: the interpreter runs the program as written; it does not rewrite\n  \
             what runs on interp is the graph as written:\n    graph conv_bn_relu [N=1, C=16, H=14, W=14, K=32]\n"
        ),
        "{out}"
    );
    assert!(out.contains("      Y: f32[1, 32, 14, 14] = relu(_batch_norm1)\n"), "{out}");
    assert!(!out.contains("x86-avx2") && !out.contains("chosen"), "{out}");
}

#[test]
fn emit_egraph_without_rewriting_prints_the_graph_as_written() {
    let out = stdout(&texc(&[
        "emit",
        "examples/conv_bn_relu.tex",
        "--stage",
        "egraph",
        "--target",
        "x86-avx2",
        "--no-rewrite",
    ]));
    assert!(
        out.starts_with(
            "egraph for x86-avx2: not run: --no-rewrite: no rewriting happens\n  \
             what runs on x86-avx2 is the graph as written:\n"
        ),
        "{out}"
    );
    assert!(out.contains("= batch_norm(") && !out.contains("chosen") && !out.contains("conv2d_bias_relu"), "{out}");
}

#[test]
fn emit_egraph_of_a_scheduled_kernel_shows_no_unused_plan() {
    // x86-avx512 runs the kernel's x86-avx2 schedule.
    let out = stdout(&texc(&["emit", "examples/conv_resnet.tex", "--stage", "egraph", "--target", "x86-avx512"]));
    assert!(
        out.starts_with(
            "egraph for x86-avx512: not run: kernel `conv3x3` has its own schedule for x86-avx2, which pins the \
             graph as written; an e-graph plan would not be used\n  what runs on x86-avx512 is the graph as written:\n"
        ),
        "{out}"
    );
    assert!(!out.contains("winograd"), "{out}");
}

#[test]
fn emit_egraph_names_the_cost_model_that_chose_the_plan() {
    for target in ["x86-avx2", "cranelift"] {
        let out = stdout(&texc(&["emit", "examples/conv_bn_relu.tex", "--stage", "egraph", "--target", target]));
        let head = format!("egraph for {target}: plans costed by the {target} cost model (nominal machine ");
        assert!(out.starts_with(&head), "{out}");
        assert!(out.contains(&format!("  chosen plan (what runs on {target}):\n")), "{out}");
    }
}
