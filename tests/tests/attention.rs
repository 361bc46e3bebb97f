//! Attention as one operator (`texc_schedules::flash`): the five attention
//! statements — `std.nn`'s `scaled_dot_product_attention` and hand-written
//! variants (scale as a product, split onto Q and K, additive padding
//! masks, causal `select`) — are fused by the CPU preparation and computed
//! flash-style, and every compiled CPU target that runs here matches the
//! interpreter on random inputs at sizes no block or vector divides,
//! including rows whose keys are all masked (NaN, as the interpreter has
//! them). The fused nest holds no more scores than one block of keys for
//! one block of queries.

use std::collections::HashMap;
use texc_compiler::interp;
use texc_compiler::target::{Target, TargetKind};
use texc_compiler::{Bindings, Program};
use texc_runtime::{DType, Tensor};
use texc_schedules::ir::Stmt;
use texc_schedules::LoopFunc;

/// CPU targets whose code runs here (the others are named, with why they are skipped).
fn cpu_targets() -> Vec<&'static Target> {
    let (run, skipped) = texc_tests::runnable_targets();
    for why in skipped {
        eprintln!("skipped: {why}");
    }
    run.into_iter().filter(|t| t.kind == TargetKind::Cpu).collect()
}

fn program(name: &str, text: &str) -> Program {
    let (mut pl, k) = texc_tests::load_text("interp", name, text, None).unwrap_or_else(|e| panic!("{e}"));
    texc_tests::specialize(&mut pl, k, &Bindings::default())
}

/// Elements of every buffer the nest allocates inside its loops, and of every temporary it keeps whole.
fn buffers(f: &LoopFunc) -> Vec<(String, usize)> {
    fn walk(f: &LoopFunc, s: &[Stmt], out: &mut Vec<(String, usize)>) {
        for st in s {
            match st {
                Stmt::Alloc { tensor, body } => {
                    out.push((f.p.tensor(*tensor).name.clone(), f.p.tensor(*tensor).len() as usize));
                    walk(f, body, out);
                }
                Stmt::For { body, .. } | Stmt::If { then: body, .. } => walk(f, body, out),
                _ => {}
            }
        }
    }
    let mut out: Vec<(String, usize)> =
        f.live_temps().into_iter().map(|t| (f.p.tensor(t).name.clone(), f.p.tensor(t).len() as usize)).collect();
    walk(f, &f.body, &mut out);
    out
}

/// Same NaNs, and max |got − want| / max |want| over the rest within 1e-5.
fn assert_close(name: &str, got: &Tensor, want: &Tensor) {
    let (g, w) = (got.to_f64(), want.to_f64());
    assert_eq!(g.len(), w.len());
    let (mut diff, mut scale) = (0f64, 0f64);
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        assert_eq!(a.is_nan(), b.is_nan(), "{name}: element {i} is {a}, the interpreter's {b}");
        if !b.is_nan() {
            diff = diff.max((a - b).abs());
            scale = scale.max(b.abs());
        }
    }
    let err = diff / scale.max(f64::MIN_POSITIVE);
    assert!(err <= 1e-5, "{name}: relative error {err:e}");
}

/// Run `p` with its default schedule on every CPU target here against the
/// interpreter; inputs from `files` where given, random otherwise. Asserts
/// the attention was fused: no buffer of `l * s` scores or more.
fn check(name: &str, p: &Program, files: &HashMap<String, Tensor>, l: usize, s: usize) {
    let args = || interp::bind_args(p, files.clone(), &[], 7).expect("binds");
    let want = interp::run(p, args()).expect("interp");
    for target in cpu_targets() {
        let f = texc_tests::default_lowered(target.name, p);
        let text = texc_schedules::ir::print(&f);
        // Scores: a block of 64 keys for a block of 32 queries. The keys laid
        // out transposed (`.kt`: D × min(S, 64) a block, or D × S rounded up to an
        // odd number of lines a row; D ≤ 128 here), the lanes' partial
        // maxima and sums (`.part`) and the register tile of `O` (`.pvt`)
        // are no scores.
        let row_keys = (s.div_ceil(16) | 1) * 16;
        let mut scores = 0;
        for (buf, len) in buffers(&f) {
            if buf.ends_with(".scores") {
                scores += 1;
                assert!(len <= 32 * 64, "{name} on {target}: `{buf}` holds {len} scores\n{text}");
            } else if buf.ends_with(".kt") {
                let rows_of = |keys: usize| len % keys == 0 && len / keys <= 128;
                assert!(
                    rows_of(s.min(64)) || rows_of(row_keys),
                    "{name} on {target}: `{buf}` holds {len} keys\n{text}"
                );
            } else if ![".part", ".pvt"].iter().any(|t| buf.ends_with(t)) {
                assert!(len < l * s || len < 64, "{name} on {target}: `{buf}` holds {len} elements\n{text}");
            }
        }
        assert_eq!(scores, 1, "{name} on {target}: one block of scores\n{text}");
        let k = texc_tests::compile_loops(target, &f).unwrap_or_else(|e| panic!("{name} on {target}: {e}\n{text}"));
        let got = k.run(args()).expect("runs");
        for (g, w) in got.iter().zip(&want) {
            assert_close(&format!("{name} on {target}"), g, w);
        }
        eprintln!("{name} on {target}: matches the interpreter");
    }
}

fn std_call(op: &str, (b, h, l, s, d, e): (i64, i64, i64, i64, i64, i64)) -> String {
    format!(
        "import std.nn;\n\
         kernel att(Q: f32[{b}, {h}, {l}, {d}], K: f32[{b}, {h}, {s}, {d}], V: f32[{b}, {h}, {s}, {e}])\n\
         -> Y: f32[{b}, {h}, {l}, {e}] {{\n    Y = {op}(Q, K, V);\n}}\n"
    )
}

/// Shapes: L and S not multiples of the 64-key block or the vector, D = 64, 80, 17;
/// four heads of 70 queries lay out each head's keys once (see below).
const SHAPES: [(i64, i64, i64, i64, i64, i64); 5] = [
    (1, 2, 37, 45, 17, 17),
    (1, 2, 70, 130, 64, 64),
    (2, 1, 9, 197, 80, 80),
    (1, 1, 3, 64, 64, 24),
    (1, 4, 70, 130, 32, 32),
];

/// With rows enough for the threads (four heads, two cores) and several
/// blocks of queries per head, a head's keys are laid out transposed once,
/// in rows an odd number of cache lines apart (130 keys → 144), and its
/// blocks of queries run inside the head's iteration; with one head, per
/// block of keys as before.
#[test]
fn a_heads_keys_are_laid_out_once_for_its_blocks_of_queries() {
    let whole = program("att.tex", &std_call("scaled_dot_product_attention", (1, 4, 70, 130, 32, 32)));
    let f = texc_tests::default_lowered("x86-avx2", &whole);
    let text = texc_schedules::ir::print(&f);
    let kt: Vec<usize> = buffers(&f).into_iter().filter(|(b, _)| b.ends_with(".kt")).map(|(_, n)| n).collect();
    assert_eq!(kt, vec![32 * 144], "{text}");
    assert!(text.contains("for Y.rb in 0..4 parallel:") && text.contains("for Y.qb in 0..2:"), "{text}");
    let one = program("att.tex", &std_call("scaled_dot_product_attention", (1, 1, 70, 130, 32, 32)));
    let f = texc_tests::default_lowered("x86-avx2", &one);
    let text = texc_schedules::ir::print(&f);
    let kt: Vec<usize> = buffers(&f).into_iter().filter(|(b, _)| b.ends_with(".kt")).map(|(_, n)| n).collect();
    assert_eq!(kt, vec![32 * 64], "{text}");
    assert!(text.contains("for Y.rb in 0..3 parallel:"), "{text}");
}

/// A row's keys over the stack's share (128 × 600 keys → 128 × 624 floats,
/// 312 KiB, within half of `x86-avx2`'s nominal 1 MiB L2) are still laid out
/// once a row, in a buffer each task takes from the heap, and every CPU
/// target here matches the interpreter with it.
#[test]
fn a_rows_keys_over_the_stacks_share_come_from_the_heap() {
    let shape = (1, 4, 33, 600, 128, 8);
    let p = program("att.tex", &std_call("scaled_dot_product_attention", shape));
    let f = texc_tests::default_lowered("x86-avx2", &p);
    let text = texc_schedules::ir::print(&f);
    let kt: Vec<(String, usize)> = buffers(&f).into_iter().filter(|(b, _)| b.ends_with(".kt")).collect();
    assert_eq!(kt.iter().map(|(_, n)| *n).collect::<Vec<_>>(), vec![128 * 624], "{text}");
    assert!(128 * 624 * 4 > texc_schedules::attach::MAX_STACK_BYTES as usize);
    let heap: Vec<String> = f.heap_locals().into_iter().map(|t| f.p.tensor(t).name.clone()).collect();
    assert!(heap.contains(&kt[0].0), "`{}` is not on the heap: {heap:?}\n{text}", kt[0].0);
    check(&format!("attention {shape:?}"), &p, &HashMap::new(), shape.2 as usize, shape.3 as usize);
}

#[test]
fn std_attention_matches_the_interpreter() {
    for shape in SHAPES {
        let p = program("att.tex", &std_call("scaled_dot_product_attention", shape));
        check(&format!("attention {shape:?}"), &p, &HashMap::new(), shape.2 as usize, shape.3 as usize);
    }
}

#[test]
fn causal_attention_matches_the_interpreter() {
    // L > S too: rows past the keys see every key; L < S: the mask is aligned top-left.
    for shape in SHAPES.into_iter().chain([(1, 1, 100, 70, 32, 32)]) {
        let p = program("att.tex", &std_call("scaled_dot_product_attention_causal", shape));
        check(&format!("causal attention {shape:?}"), &p, &HashMap::new(), shape.2 as usize, shape.3 as usize);
    }
}

/// A hand-written attention: `score` is the first statement's right-hand
/// side; `M` an additive mask `[B, 1, 1, S]`.
fn hand_written(score: &str, product: &str, (b, h, l, s, d): (i64, i64, i64, i64, i64)) -> String {
    format!(
        "kernel att(Q: f32[{b}, {h}, {l}, {d}], K: f32[{b}, {h}, {s}, {d}], V: f32[{b}, {h}, {s}, {d}], \
         M: f32[{b}, 1, 1, {s}]) -> Y: f32[{b}, {h}, {l}, {d}] {{\n\
         \x20   sc[b, h, l, s] = {score};\n\
         \x20   m[b, h, l] = max[s](sc[b, h, l, s]);\n\
         \x20   p[b, h, l, s] = exp(sc[b, h, l, s] - m[b, h, l]);\n\
         \x20   z[b, h, l] = sum[s](p[b, h, l, s]);\n\
         \x20   Y[b, h, l, j] = sum[s]({product}) / z[b, h, l];\n}}\n"
    )
}

/// A padding mask: 0 for the first `valid[b]` keys of batch `b`, -inf after.
fn padding(b: usize, s: usize, valid: &[usize]) -> Tensor {
    let v: Vec<f64> = (0..b * s).map(|i| if i % s < valid[i / s] { 0.0 } else { f64::NEG_INFINITY }).collect();
    Tensor::from_f64(DType::F32, vec![b, 1, 1, s], &v)
}

#[test]
fn hand_written_variants_are_fused_and_match() {
    // Six rows of 40 queries: each row's keys laid out once (whole mode).
    let shape = (2, 3, 40, 150, 64);
    let pv = "p[b, h, l, s] * V[b, h, s, j]";
    let variants = [
        ("scale as a product, padding mask", "sum[d](Q[b, h, l, d] * K[b, h, s, d]) * 0.125 + M[b, 0, 0, s]", pv),
        (
            "scale split onto Q and K",
            "sum[d](Q[b, h, l, d] * 0.35355339 * (K[b, h, s, d] * 0.35355339)) + M[b, 0, 0, s]",
            "V[b, h, s, j] * p[b, h, l, s]",
        ),
        (
            "causal select and mask",
            "select(s <= l + 100, sum[d](Q[b, h, l, d] * K[b, h, s, d]) / 8.0, -inf) + M[b, 0, 0, s]",
            pv,
        ),
    ];
    let mask: HashMap<String, Tensor> = [("M".to_string(), padding(2, 150, &[150, 77]))].into();
    for (what, score, product) in variants {
        let p = program("att.tex", &hand_written(score, product, shape));
        check(what, &p, &mask, 40, 150);
    }
}

#[test]
fn fully_masked_rows_are_nan_as_in_the_interpreter() {
    // Batch 1 has no valid key at all: its rows are NaN; batch 0's first
    // block of keys is masked, the rest not (the running maximum starts at -inf).
    // Four rows (batch × heads) of 40 queries: whole mode.
    let shape = (2, 2, 40, 140, 16);
    let p = program(
        "att.tex",
        &hand_written(
            "sum[d](Q[b, h, l, d] * K[b, h, s, d]) / 4.0 + M[b, 0, 0, s]",
            "p[b, h, l, s] * V[b, h, s, j]",
            shape,
        ),
    );
    let mut v: Vec<f64> = vec![f64::NEG_INFINITY; 2 * 140];
    for (i, x) in v.iter_mut().enumerate().take(140).skip(70) {
        *x = (i % 3) as f64;
    }
    let mask: HashMap<String, Tensor> =
        [("M".to_string(), Tensor::from_f64(DType::F32, vec![2, 1, 1, 140], &v))].into();
    let want = interp::run(&p, interp::bind_args(&p, mask.clone(), &[], 7).expect("binds")).expect("interp");
    let y = want[0].to_f64();
    let batch = 2 * 40 * 16;
    assert!(y[..batch].iter().all(|x| x.is_finite()) && y[batch..].iter().all(|x| x.is_nan()), "the oracle's NaNs");
    check("fully masked rows", &p, &mask, 40, 140);
}

/// Attention as the ONNX importer writes a PyTorch export (`MatMul` with K
/// already transposed, `Div`, `Softmax`, `MatMul`; a batch of one indexed
/// by a constant 0): the product is taken into the scores and the softmax's
/// division after the weighted sum.
#[test]
fn imported_form_is_fused_and_matches() {
    let (h, l, s, d) = (3, 33, 90, 80);
    let text = format!(
        "import std.nn;\n\
         kernel att(Q: f32[1, {h}, {l}, {d}], KT: f32[1, {h}, {d}, {s}], V: f32[1, {h}, {s}, {d}]) -> Y: f32[1, {h}, {l}, {d}] {{\n\
         \x20   qk[i0 in 0..1, i1 in 0..{h}, i2 in 0..{l}, i3 in 0..{s}] = sum[r0 in 0..{d}](Q[0, i1, i2, r0] * KT[0, i1, r0, i3]);\n\
         \x20   sc[i0 in 0..1, i1 in 0..{h}, i2 in 0..{l}, i3 in 0..{s}] = qk[0, i1, i2, i3] / 8.944272;\n\
         \x20   sm = softmax(sc);\n\
         \x20   Y[i0, i1, i2, i3] = sum[r0 in 0..{s}](sm[0, i1, i2, r0] * V[0, i1, r0, i3]);\n}}\n"
    );
    let p = program("att.tex", &text);
    let mut fused = p.clone();
    texc_schedules::flash::fuse_attention(&mut fused);
    assert_eq!(fused.stages.len(), 1, "one stage");
    check("imported form", &p, &HashMap::new(), l, s);
}

/// The causal form an exporter writes with a constant lower-triangular
/// mask (`Where(tril, scores, -inf)`) as a statement of its own after the
/// scale: every statement before the softmax is taken into the scores.
#[test]
fn imported_causal_where_is_fused_and_matches() {
    let (h, l, d) = (2, 75, 64);
    let text = format!(
        "import std.nn;\n\
         kernel att(Q: f32[1, {h}, {l}, {d}], KT: f32[1, {h}, {d}, {l}], V: f32[1, {h}, {l}, {d}], T: f32[{l}, {l}]) -> Y: f32[1, {h}, {l}, {d}] {{\n\
         \x20   qk[i0 in 0..1, i1 in 0..{h}, i2 in 0..{l}, i3 in 0..{l}] = sum[r0 in 0..{d}](Q[0, i1, i2, r0] * KT[0, i1, r0, i3]);\n\
         \x20   sc[i0 in 0..1, i1 in 0..{h}, i2 in 0..{l}, i3 in 0..{l}] = qk[0, i1, i2, i3] / 8.0;\n\
         \x20   w[i0 in 0..1, i1 in 0..{h}, i2 in 0..{l}, i3 in 0..{l}] = select(T[i2, i3] > 0.5, sc[0, i1, i2, i3], -inf);\n\
         \x20   sm = softmax(w);\n\
         \x20   Y[i0, i1, i2, i3] = sum[r0 in 0..{l}](sm[0, i1, i2, r0] * V[0, i1, r0, i3]);\n}}\n"
    );
    let p = program("att.tex", &text);
    let mut fused = p.clone();
    texc_schedules::flash::fuse_attention(&mut fused);
    assert_eq!(fused.stages.len(), 1, "one stage");
    let tril: Vec<f64> = (0..l * l).map(|i| if i % l <= i / l { 1.0 } else { 0.0 }).collect();
    let files: HashMap<String, Tensor> =
        [("T".to_string(), Tensor::from_f64(DType::F32, vec![l as usize, l as usize], &tril))].into();
    check("imported causal Where", &p, &files, l as usize, l as usize);
}

/// The five statements stay five where they are not an attention: a score
/// read elsewhere is not a temporary of the operator.
#[test]
fn scores_read_elsewhere_are_not_fused() {
    let text = "kernel att(Q: f32[1, 1, 8, 16], K: f32[1, 1, 8, 16], V: f32[1, 1, 8, 16]) -> (Y: f32[1, 1, 8, 16], S: f32[1, 1, 8, 8]) {\n\
        \x20   sc[b, h, l, s] = sum[d](Q[b, h, l, d] * K[b, h, s, d]);\n\
        \x20   m[b, h, l] = max[s](sc[b, h, l, s]);\n\
        \x20   p[b, h, l, s] = exp(sc[b, h, l, s] - m[b, h, l]);\n\
        \x20   z[b, h, l] = sum[s](p[b, h, l, s]);\n\
        \x20   Y[b, h, l, j] = sum[s](p[b, h, l, s] * V[b, h, s, j]) / z[b, h, l];\n\
        \x20   S[b, h, l, s] = sc[b, h, l, s] + 1.0;\n}\n";
    let mut p = program("att.tex", text);
    let before = p.stages.len();
    texc_schedules::flash::fuse_attention(&mut p);
    assert_eq!(p.stages.len(), before, "nothing fused");
    let text = std_call("scaled_dot_product_attention", (1, 2, 8, 8, 16, 16));
    let mut p = program("att.tex", &text);
    texc_schedules::flash::fuse_attention(&mut p);
    assert_eq!(p.stages.len(), 1, "the standard library's attention is one stage");
    assert!(texc_schedules::flash::is_attention(&p, 0));
}
