//! `texc check` without sizes and the schedule fixes it brought: readers
//! attached inside an attached producer's loop, and hoisted reduction
//! stages (`T.r0`) named in schedules, keep results (loop-nest evaluator
//! against the interpreter, at sizes no factor divides).

use std::collections::HashMap;
use texc_compiler::interp::{self, Arg};
use texc_compiler::Program;
use texc_schedules::eval;
use texc_tests::{check_report, rel_error};

fn random_args(p: &Program, seed: u64) -> Vec<Arg> {
    interp::bind_args(p, HashMap::new(), &[], seed).expect("binds")
}

fn assert_same(name: &str, src: &str) {
    let (p, f) = texc_tests::own_schedule("x86-avx2", name, src).unwrap_or_else(|e| panic!("{e}"));
    let want = interp::run(&p, random_args(&p, 7)).expect("interp");
    let got = eval::run(&f, random_args(&p, 7)).expect("loop eval");
    for (w, g) in want.iter().zip(&got) {
        let err = rel_error(g, w);
        assert!(err <= 1e-6, "{name}: differs from interp by {err:e}\n{}", texc_schedules::ir::print(&f));
    }
}

/// `Q` is attached at `Y.r`, inside `Y.k` where its producer `P` is
/// attached: it runs inside `Y.k`, so this is legal (it used to be refused
/// with "does not run inside `Y.k`"), and `P`'s box covers all the rows `Q`
/// reads during one iteration of `k`.
#[test]
fn readers_attached_inside_the_producers_loop_keep_results() {
    let src = "kernel f(X: f32[N = 18, M = 13]) -> Y: f32[N, M] {
    P[n, m] = X[n, m] * 2.0;
    Q[n, m] = P[n, m] + 1.0;
    Y[n, m] = Q[n, m] * Q[n, m] + P[n, m];
}
schedule f for x86-avx2 { split Y.n by 4 -> (k, r); compute_at P Y.k; compute_at Q Y.r; }";
    assert_same("inner_reader.tex", src);
    let (_, f) = texc_tests::own_schedule("x86-avx2", "inner_reader.tex", src).expect("legal");
    let text = texc_schedules::ir::print(&f);
    assert!(text.contains("local P: f32[4, 13]"), "P's box is the 4 rows of one `k`:\n{text}");
}

/// Hoisted reductions are stages named `T.r0`: schedules can split and
/// vectorize them (and `compute_at` them) by that name.
#[test]
fn hoisted_reduction_stages_can_be_scheduled() {
    let src = "kernel center(X: f32[N = 7, D = 19]) -> Y: f32[N, D] {
    Y[n, d] = X[n, d] - sum[e](X[n, e]) / D;
}
schedule center for x86-avx2 { split Y.r0.e by 4 -> (eo, ei); reorder Y.r0(eo, ei); unroll Y.r0.ei; split Y.d by 8 -> (do, di); vectorize Y.di; }";
    assert_same("hoisted.tex", src);
}

/// Without sizes, `check` validates every block for the target it names
/// (the interpreter and GPUs included) and says which; with all sizes known
/// it specializes too.
#[test]
fn check_without_sizes_says_what_it_verified() {
    let src = "kernel add(A: f32[N], B: f32[N]) -> C: f32[N] { C[i] = A[i] + B[i]; }
schedule add for nvptx-sm90 { split C.i by 256 -> (b, t); bind C.b to block.x; bind C.t to thread.x; }
schedule add for interp { split C.i by 4 -> (o, i4); }";
    let out = check_report("add.tex", src).expect("passes");
    assert!(out.contains("ok: 1 kernel checked: add"), "{out}");
    assert!(out.contains("2 indices proven in bounds"), "{out}");
    assert!(out.contains("at concrete sizes: none"), "{out}");
    assert!(out.contains("2 blocks validated (add for nvptx-sm90, add for interp)"), "{out}");

    let bad = src.replace("thread.x", "thread.w");
    let err = check_report("add.tex", &bad).expect_err("unknown GPU dimension");
    assert!(err.contains("unknown GPU dimension `w`") && err.contains("add.tex:2:"), "{err}");
}

/// A condition on the sizes is a warning, not an error; out of bounds for
/// every size is an error, even with no sizes given.
#[test]
fn symbolic_bounds_decide_per_access() {
    let ok = check_report("t.tex", "kernel t(X: f32[N, M]) -> Y: f32[M, N] { Y[j, i] = X[i, j]; }").expect("ok");
    assert!(ok.contains("2 indices proven in bounds") && !ok.contains("warning"), "{ok}");
    let cond = check_report("c.tex", "kernel c(X: f32[N]) -> Y: f32[M] { Y[i] = X[i]; }").expect("a warning");
    assert!(cond.contains("warning: this access is in bounds only when M <= N"), "{cond}");
    assert!(cond.contains("1 valid only when M <= N"), "{cond}");
    let err = check_report("e.tex", "kernel e(X: f32[N]) -> Y: f32[N] { Y[i] = X[2 * i + 1]; }").expect_err("never");
    assert!(err.contains("index out of bounds for every size") && err.contains("e.tex:1:45"), "{err}");
    // Guarded accesses are left to concrete sizes, never reported as conditions.
    let pad = "kernel p(X: f32[N]) -> Y: f32[N] { Y[i] = select(i >= 1, X[i - 1], 0.0); }";
    let out = check_report("p.tex", pad).expect("guarded");
    assert!(out.contains("1 index guarded or not affine") && !out.contains("warning"), "{out}");
}
