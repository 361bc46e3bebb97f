//! Products that read their vector operand across its rows
//! (`texc_schedules::transpose`): `x · Wᵀ`, batched and converted forms
//! match the interpreter on every CPU target here at sizes no vector or
//! block divides, and the transposed copy is made only where rows are many.

use texc_compiler::interp;
use texc_compiler::target::{Target, TargetKind};
use texc_compiler::{Bindings, Program};

fn program(text: &str) -> Program {
    let (mut pl, k) = texc_tests::load_text("interp", "t.tex", text, None).unwrap_or_else(|e| panic!("{e}"));
    texc_tests::specialize(&mut pl, k, &Bindings::default())
}

fn loops_text(target: &str, p: &Program) -> (String, texc_schedules::LoopFunc) {
    let mut pl = texc_tests::pipeline(target);
    let f = pl.default_loops(p.clone()).unwrap_or_else(|e| panic!("{}", texc_tests::rendered(&pl, e))).legal;
    (texc_schedules::ir::print(&f), f)
}

fn check(name: &str, text: &str, transposed: bool) {
    check_layout(name, text, "W.t", &|_| transposed);
}

/// `text` matches the interpreter on every CPU target here, and its loops
/// hold `marker` (a tensor the layout pass made) where `made` says.
fn check_layout(name: &str, text: &str, marker: &str, made: &dyn Fn(&Target) -> bool) {
    on_every_cpu(name, &program(text), 1e-5, &|target, loops| {
        assert_eq!(loops.contains(marker), made(target), "{name} on {target}:\n{loops}");
    });
}

/// `p` within relative error `tolerance` of the interpreter on every CPU
/// target here, its loops on each first given to `check`.
fn on_every_cpu(name: &str, p: &Program, tolerance: f64, check: &dyn Fn(&Target, &str)) {
    let args = || interp::bind_args(p, Default::default(), &[], 5).expect("binds");
    let want = interp::run(p, args()).expect("interp");
    let (run, skipped) = texc_tests::runnable_targets();
    for why in skipped {
        eprintln!("skipped: {why}");
    }
    for target in run.into_iter().filter(|t| t.kind == TargetKind::Cpu) {
        let (text, f) = loops_text(target.name, p);
        check(target, &text);
        let k = texc_tests::compile_loops(target, &f).unwrap_or_else(|e| panic!("{name} on {target}: {e}"));
        let got = k.run(args()).expect("runs");
        for (g, w) in got.iter().zip(&want) {
            let (g, w) = (g.to_f64(), w.to_f64());
            let scale = w.iter().fold(0f64, |m, x| m.max(x.abs())).max(f64::MIN_POSITIVE);
            let err = g.iter().zip(&w).fold(0f64, |m, (a, b)| m.max((a - b).abs())) / scale;
            assert!(err <= tolerance, "{name} on {target}: relative error {err:e}");
        }
        eprintln!("{name} on {target}: matches");
    }
}

#[test]
fn transposed_products_match_the_interpreter() {
    for (m, k, n) in [(17, 13, 21), (64, 70, 33), (16, 1, 5)] {
        let text = format!(
            "kernel l(X: f32[{m}, {k}], W: f32[{n}, {k}]) -> Y: f32[{m}, {n}] {{\n\
             \x20   Y[i, j] = max(sum[k](X[i, k] * W[j, k]) + 0.5, 0.0);\n}}\n"
        );
        check(&format!("x·Wᵀ {m}×{k}×{n}"), &text, true);
    }
    let batched = "kernel l(X: f32[3, 20, 9], W: f32[3, 11, 9]) -> Y: f32[3, 20, 11] {\n\
                   \x20   Y[b, i, j] = sum[k](X[b, i, k] * W[b, j, k]);\n}\n";
    check("batched", batched, true);
    let half = "kernel l(X: f32[18, 24], W: f16[10, 24]) -> Y: f32[18, 10] {\n\
                \x20   Y[i, j] = sum[k](X[i, k] * f32(W[j, k]));\n}\n";
    check("f16 weights", half, true);
}

#[test]
fn few_rows_keep_reading_along_rows() {
    let gemv = "kernel l(X: f32[1, 40], W: f32[30, 40]) -> Y: f32[1, 30] {\n\
                \x20   Y[i, j] = sum[k](X[i, k] * W[j, k]);\n}\n";
    check("matrix-vector", gemv, false);
}

/// A float convolution over rows too short for the vectors (`filters_last`):
/// 7-wide rows of 16-lane vectors, 576 products per output, filters read
/// `f` last — computed as `Y.t[n, y, x, f]` wherever the row idles an
/// eighth of its lanes or more (7 of 16, 7 of 8), bit for bit the same
/// sums. (On AVX2 this layer, its filters an argument, measured slower so,
/// 0.037 → 0.050 ms; with constant filters, as models have them, such
/// layers ran faster: `filters_last::FLOAT_FILL`.) Shallow sums stay as
/// written. A 1×1 convolution's 4×5 map, which the schedule fuses into rows
/// of 20 (20 of 32 AVX-512 lanes, 20 of 24 AVX2's), is computed
/// filters-last too, its map one axis (`Y.t[n, p, k]`: rows of the block
/// over the whole map), and so is a 7×7 map (49 of 64, 49 of 56); with
/// 128 filters (AVX2: rows of 16 vectors, a GEMM's blocking) its sum of
/// 600 is cut into slices that keep the 49 rows in L1 (5 of 120 on a 32
/// KiB L1: `LongBlocking::whole_rows_slice`), and on AVX-512, whose
/// blocks' steps do not wait on L2, is one slice (`step_outruns_l2`) —
/// 960 deep over 320 filters in two blocks of 5 panels, one a core
/// (`balanced_blocks`). A map that fills more than 7/8 of its lanes is
/// taken where its channels' rows are not whole cache lines (14×14: 196
/// of 208 lanes, 784 bytes a row, so the in-place panel's vectors straddle
/// lines: `filters_last::map_bytes_split_lines`), and so is `cranelift`'s
/// 4-lane row of 49 (196 bytes: 16-byte vectors straddle lines), not its
/// rows of 20 or 196 (80 and 784 bytes, whole vectors); one of whole lines
/// stays as written (16×16: 1024 bytes, 28×28: 3136).
#[test]
fn short_float_rows_run_along_the_filters_where_the_sums_are_deep() {
    let conv = |c: i64, f: i64| {
        format!(
            "kernel c(X: f32[1, {c}, 9, 9], W: f32[{c}, 3, 3, {f}]) -> Y: f32[1, {f}, 7, 7] {{\n\
             \x20   Y[n, k, y, x] = max(sum[c, r, s](X[n, c, y + r, x + s] * W[c, r, s, k]), 0.0);\n}}\n"
        )
    };
    let avx512 = |text: &str| loops_text("x86-avx512", &program(text)).0.contains("Y.t");
    assert!(avx512(&conv(64, 48)), "576 products per output");
    assert!(!avx512(&conv(8, 48)), "72 products per output");
    assert!(loops_text("x86-avx2", &program(&conv(64, 48))).0.contains("Y.t"), "7 of 8 lanes");
    let pointwise = |h: i64, w: i64| {
        format!(
            "kernel c(X: f32[1, 600, {h}, {w}], W: f32[600, 40]) -> Y: f32[1, 40, {h}, {w}] {{\n\
             \x20   Y[n, k, y, x] = max(sum[c](X[n, c, y, x] * W[c, k]), 0.0);\n}}\n"
        )
    };
    let (text, _) = loops_text("x86-avx512", &program(&pointwise(4, 5)));
    // (`Y.t.r0`: the sums, before the activation.)
    assert!(text.contains("temp Y.t.r0: f32[1, 20, 40]"), "a 4×5 map is one axis:\n{text}");
    let (text, _) = loops_text("x86-avx2", &program(&pointwise(7, 7)));
    assert!(text.contains("temp Y.t.r0: f32[1, 49, 40]"), "49 of 56 lanes:\n{text}");
    // 128 filters: rows of 16 vectors, blocked as a GEMM's, their sum sliced.
    let wide = pointwise(7, 7).replace("40", "128");
    let (text, _) = loops_text("x86-avx2", &program(&wide));
    assert!(text.contains("c.o * 120 + c.i"), "slices of 120 keep 49 rows in L1:\n{text}");
    // AVX-512's steps of 7 rows × 32 lanes do not wait on L2: one slice,
    // unless the rows and a panel over the whole sum outgrow L2 (4096 deep:
    // 1.3 MB against the nominal 1 MiB).
    let (text, _) = loops_text("x86-avx512", &program(&wide));
    assert!(text.contains("for c in 0..600:") && !text.contains("c.o"), "one slice:\n{text}");
    let (text, _) = loops_text("x86-avx512", &program(&wide.replace("600", "4096")));
    assert!(text.contains("c.o *"), "sliced beyond L2:\n{text}");
    // 320 filters 960 deep: 10 panels, 4 in half of L2; blocks of 5 give
    // each of the 2 cores one, not 4 + 2 and 4 (the 2 blocks, their 5
    // panels and the 7 row blocks fused into the parallel loop).
    let deep = pointwise(7, 7).replace("600", "960").replace("40", "320");
    let (text, _) = loops_text("x86-avx512", &program(&deep));
    assert!(text.contains("for k.oo.n.k.oi.y.x.b in 0..70 parallel:"), "two blocks of 5 panels:\n{text}");
    assert!(avx512(&pointwise(7, 7)), "49 of 64 lanes");
    assert!(avx512(&pointwise(14, 14)), "196 of 208 lanes, 784-byte rows");
    assert!(!avx512(&pointwise(16, 16)), "256 of 256 lanes, 1024-byte rows");
    assert!(!avx512(&pointwise(28, 28)), "784 of 784 lanes, 3136-byte rows");
    assert!(!loops_text("x86-avx2", &program(&pointwise(28, 28))).0.contains("Y.t"), "3136-byte rows on AVX2");
    check_layout("filters-last 1×1 on 14×14", &pointwise(14, 14), "Y.t", &|t| lanes(t) >= 8);
    check_layout("filters-last 3×3", &conv(64, 48), "Y.t", &|t| idles_an_eighth(t, 7));
    check_layout("filters-last 1×1 on 4×5", &pointwise(4, 5), "Y.t", &|t| idles_an_eighth(t, 20));
    check_layout("filters-last 1×1 on 7×7", &pointwise(7, 7), "Y.t", &|_| true);
    check_layout("filters-last 1×1 on 7×7, sliced", &wide, "Y.t", &|_| true);
    check_layout("filters-last 1×1 on 7×7, 960 deep", &deep, "Y.t", &|_| true);
}

/// A 7 × 1 convolution (a window along the image's columns only, as
/// Inception-v3's at 17²) over an input without padding along its rows:
/// the default schedule fuses its map into one row (289 elements, which
/// fill the vectors), whose in-place operand `X[n, c, y + r, x]` lies 68
/// bytes a tap and 1564 a channel apart (23 × 17 floats), so that its
/// vectors straddle lines; it is computed filters-last, as 1 × 1
/// convolutions over such maps are (`filters_last::map_bytes_split_lines`,
/// `window_lines_split`), its rows the image's rows of 17. Over a 16 × 16
/// map (64 bytes a tap, 1408 a channel: whole vectors) it stays as
/// written. Each matches the interpreter on every CPU target here.
#[test]
fn fused_maps_of_windows_along_columns_run_along_the_filters() {
    let conv = |h: i64, w: i64| {
        let hp = h + 6;
        format!(
            "kernel c(X: f32[1, 24, {hp}, {w}], W: f32[24, 7, 32]) -> Y: f32[1, 32, {h}, {w}] {{\n\
             \x20   Y[n, k, y, x] = max(sum[c, r](X[n, c, y + r, x] * W[c, r, k]), 0.0);\n}}\n"
        )
    };
    let (text, _) = loops_text("x86-avx2", &program(&conv(17, 17)));
    assert!(text.contains("temp Y.t.r0: f32[1, 17, 17, 32]"), "rows of 17 along the filters:\n{text}");
    check_layout("filters-last 7 × 1 on 17 × 17", &conv(17, 17), "Y.t", &|_| true);
    check_layout("7 × 1 on 16 × 16", &conv(16, 16), "Y.t", &|_| false);
}

/// A grouped 3 × 3 convolution over short rows (RegNetX's, 16 channels a
/// group) whose groups are whole vectors of filters is computed
/// filters-last: its input reads a filter only through its group (`X[n, k
/// / Kg · 16 + c, ..]`), one element for a vector of a group's filters, a
/// broadcast as an ungrouped input's is. The vectors stay within a group:
/// one vector of 16 on AVX-512, the micro-kernel's two of 8 over a long
/// row on AVX2 (80 filters), one of 8 in groups of three (24 filters on
/// AVX2: `(8·o + v) / 24` is `o / 3`, the same for every lane), never two
/// across groups; groups that are not whole vectors (24 on AVX-512, 12 on
/// AVX2) stay as written, and the product is not computed a filter at a
/// time inside its copy back (one lane a vector). Rows of 56 (whole
/// vectors of AVX2) stay as written there. Each matches the interpreter on
/// every CPU target here.
#[test]
fn grouped_convolutions_over_short_rows_run_along_each_groups_filters() {
    let conv = |groups: i64, kg: i64, h: i64, w: i64| {
        let (c, k, hp, wp) = (groups * 16, groups * kg, h + 2, w + 2);
        format!(
            "kernel g(X: f32[1, {c}, {hp}, {wp}], W: f32[16, 3, 3, {k}]) -> Y: f32[1, {k}, {h}, {w}] {{\n\
             \x20   Y[n, k, y, x] = max(sum[c, r, s](X[n, k / {kg} * 16 + c, y + r, x + s] * W[c, r, s, k]), 0.0);\n}}\n"
        )
    };
    // The input's index never moves with a vector's lanes (`k.v`): each
    // vector of filters broadcasts one element; and the filters-last
    // product's buffer holds whole groups.
    let broadcasts = |text: &str| {
        let reads: Vec<&str> =
            text.lines().filter_map(|l| l.split_once("(X[").map(|(_, r)| r.split(']').next().unwrap_or(""))).collect();
        !reads.is_empty() && reads.iter().all(|i| !i.contains(".v"))
    };
    let whole_groups = |text: &str, kg: i64| {
        let last = |l: &str| {
            l.split_once("Y.t.r0: f32[")
                .and_then(|(_, r)| r.split(']').next()?.rsplit(", ").next()?.parse::<i64>().ok())
        };
        text.lines().filter_map(last).all(|filters| filters >= kg)
    };
    for (target, groups, kg, h, w) in [
        ("x86-avx512", 5, 16, 7, 7),
        ("x86-avx512", 10, 16, 14, 14),
        ("x86-avx512", 2, 16, 7, 7),
        ("x86-avx512", 3, 32, 7, 7),
        ("x86-avx2", 5, 16, 7, 7),
        ("x86-avx2", 3, 24, 7, 7),
        ("x86-avx2", 7, 24, 14, 14),
    ] {
        let (text, _) = loops_text(target, &program(&conv(groups, kg, h, w)));
        assert!(
            text.contains("Y.t") && broadcasts(&text) && whole_groups(&text, kg),
            "{groups} groups of {kg} at {h}×{w} on {target}, vectors within a group:\n{text}"
        );
    }
    for (target, kg) in [("x86-avx512", 24), ("x86-avx2", 12)] {
        assert!(
            !loops_text(target, &program(&conv(3, kg, 7, 7))).0.contains("Y.t"),
            "{kg} filters a group on {target}"
        );
    }
    let within = |kg: i64, w: i64| move |t: &Target| kg % lanes(t) == 0 && idles_an_eighth(t, w);
    check_layout("grouped 3×3 on 7×7, 16 a group", &conv(5, 16, 7, 7), "Y.t", &within(16, 7));
    check_layout("grouped 3×3 on 7×7, 24 a group", &conv(3, 24, 7, 7), "Y.t", &within(24, 7));
    check_layout("grouped 3×3 on 14×14, 24 a group", &conv(7, 24, 14, 14), "Y.t", &within(24, 14));
    check_layout("grouped 3×3 on 11×13, 32 a group", &conv(4, 32, 11, 13), "Y.t", &within(32, 13));
    check_layout("grouped 3×3 on 5×56, 16 a group", &conv(2, 16, 5, 56), "Y.t", &within(16, 56));
}

/// A 3×3 convolution whose whole row is read through windows and idles
/// an eighth of its lanes or more (`filters_last::FLOAT_FILL`) is
/// computed filters-last from 128 products per output: 55-wide rows (55 of
/// 64 lanes on AVX-512), 16 → 24 filters (144 products), and a reader that
/// adds another tensor along its rows. Its copy back gathers from 27 × 55
/// lines, more than L1 holds: a pass of its own, not inlined into that
/// reader (which would read every line again for each channel); from a
/// 13×13 map's 169 lines it is inlined. At 8 channels (72 products) the
/// convolution stays as written, and so on 23-wide rows where vectors have
/// 4 or 8 lanes (23 of 24); 56-wide rows (56 of 64, an eighth idle) are
/// taken. Each matches the interpreter on every
/// CPU target here.
#[test]
fn windowed_rows_that_idle_lanes_run_along_the_filters() {
    let conv = |c: i64, h: i64, w: i64| {
        let (hp, wp) = (h + 2, w + 2);
        format!(
            "kernel c(X: f32[1, {c}, {hp}, {wp}], W: f32[{c}, 3, 3, 24], B: f32[1, 24, {h}, {w}]) -> Z: f32[1, 24, {h}, {w}] {{\n\
             \x20   Y[n, k, y in 0..{h}, x in 0..{w}] = max(sum[c, r, s](X[n, c, y + r, x + s] * W[c, r, s, k]), 0.0);\n\
             \x20   Z[n, k, y, x] = Y[n, k, y, x] + B[n, k, y, x];\n}}\n"
        )
    };
    let (text, _) = loops_text("x86-avx512", &program(&conv(16, 27, 55)));
    assert!(text.contains("Y.t"), "55 of 64 lanes, 144 products:\n{text}");
    let statements = |text: &str, t: &str| {
        text.lines().filter(|l| l.trim_start().starts_with(t)).map(str::to_string).collect::<Vec<_>>()
    };
    let copy = statements(&text, "Y[");
    assert!(!copy.is_empty() && copy.iter().all(|l| l.contains("Y.t")), "a copy of its own:\n{text}");
    assert!(statements(&text, "Z[").iter().all(|l| !l.contains("Y.t")), "{text}");
    let (small, _) = loops_text("x86-avx512", &program(&conv(16, 13, 13)));
    assert!(statements(&small, "Z[").iter().all(|l| l.contains("Y.t")), "169 lines stay in L1:\n{small}");
    assert!(!loops_text("x86-avx512", &program(&conv(8, 13, 13))).0.contains("Y.t"), "72 products");
    check_layout("filters-last 3×3 on 55-wide rows", &conv(16, 27, 55), "Y.t", &|t| idles_an_eighth(t, 55));
    check_layout("filters-last 3×3 on 13-wide rows", &conv(16, 13, 13), "Y.t", &|t| idles_an_eighth(t, 13));
    check_layout("3×3 on 23-wide rows", &conv(16, 13, 23), "Y.t", &|t| idles_an_eighth(t, 23));
    // Exactly an eighth idle over four vectors (56 of 64 lanes), as DenseNet-121's first block.
    assert!(loops_text("x86-avx512", &program(&conv(16, 13, 56))).0.contains("Y.t"), "56 of 64 lanes");
    check_layout("filters-last 3×3 on 56-wide rows", &conv(16, 13, 56), "Y.t", &|t| idles_an_eighth(t, 56));
    let avx2 = texc_compiler::target::lookup("x86-avx2").expect("a target");
    assert!(idles_an_eighth(avx2, 13) && !idles_an_eighth(avx2, 23) && !idles_an_eighth(avx2, 55));
}

/// The target's f32 vector lanes.
fn lanes(t: &Target) -> i64 {
    t.lanes(texc_compiler::types::ElemType::F32) as i64
}

/// Whether a row of `w` leaves an eighth of the target's f32 vector lanes idle, or more.
fn idles_an_eighth(t: &Target, w: i64) -> bool {
    let lanes = t.lanes(texc_compiler::types::ElemType::F32) as i64;
    let vectors = (w + lanes - 1) / lanes;
    8 * w <= 7 * vectors * lanes
}

/// The copy back of a filters-last convolution read by a max pool is
/// computed whole before the pool, not a channel at a time inside the
/// pool's loops, where each part would gather a line of `Y.t` per element
/// and the parts together every line 16 times (`strategy::cpu::attach`,
/// `cuts_lines`): a source larger than L2 (the nominal 1 MiB: 128 filters on
/// a 55×55 map, 55 of 64 lanes) and one that fits (64 filters on 27×27,
/// 182 KiB, where the gathers cost more than the reads) alike; both match
/// the interpreter on every CPU target here.
#[test]
fn transposing_copies_are_not_computed_in_parts() {
    let pooled = |k: i64, w: i64| {
        let (wp, z) = (w + 2, (w - 3) / 2 + 1);
        format!(
            "kernel c(X: f32[1, 16, {wp}, {wp}], W: f32[16, 3, 3, {k}]) -> Z: f32[1, {k}, {z}, {z}] {{\n\
             \x20   Y[n, k, y in 0..{w}, x in 0..{w}] = max(sum[c, r, s](X[n, c, y + r, x + s] * W[c, r, s, k]), 0.0);\n\
             \x20   Z[n, k, y, x] = max[r in 0..3, s in 0..3](Y[n, k, 2 * y + r, 2 * x + s]);\n}}\n"
        )
    };
    for (k, w) in [(128, 55), (64, 27)] {
        let (loops, _) = loops_text("x86-avx512", &program(&pooled(k, w)));
        assert!(loops.contains("temp Y.t"), "{loops}");
        assert!(!loops.contains("local Y:"), "the copy of {k} filters on {w}×{w} computed in parts:\n{loops}");
    }
    check_layout("filters-last 3×3 before a max pool", &pooled(64, 27), "Y.t", &|t| idles_an_eighth(t, 27));
}

/// Element-wise stages that transpose (a filters-last product's copy back,
/// `Y[n, k, h, w] = T[n, h, w, k]`; a plain transpose, in `f32` and `i32`,
/// one with prefetches beside its blocks' vectors):
/// on `x86-avx512` each block of 16 × 16 elements is read as 16 vectors and
/// transposed in registers (`transposed_copies` in texc-codegen: shuffles,
/// no gathers in the unrolled loop; `x86-avx2`'s plain transposes in
/// blocks of 8 × 8), and every CPU target here matches the
/// interpreter exactly, at sizes whose rows and columns leave partial
/// blocks (which keep their gathers).
#[test]
fn transposing_stages_shuffle_blocks_in_registers() {
    let kernels = [
        (
            "copy back",
            "kernel c(T: f32[1, 23, 29, 40], b: f32[40]) -> Y: f32[1, 40, 23, 29] {\n\
          \x20   Y[n, k, h, w] = max(T[n, h, w, k] + b[k], 0.0);\n}\n",
        ),
        (
            "f32 transpose",
            "kernel t(X: f32[300, 200]) -> Y: f32[200, 300] {\n\
          \x20   Y[i, j] = X[j, i] * 2.0;\n}\n",
        ),
        (
            "i32 transpose",
            "kernel t(X: i32[301, 37]) -> Y: i32[37, 301] {\n\
          \x20   Y[i, j] = X[j, i] + 1;\n}\n",
        ),
        // Large enough for `prefetch` to put prefetches of the next lines
        // beside each block's vectors (x86-avx512): the block is still
        // transposed in registers (it was gathered: 0.21 → 0.07 ms, one
        // thread, ConvNeXt-T's layer-norm transposes at this size).
        (
            "prefetched transpose",
            "kernel t(A: f32[96, 56, 56]) -> Y: f32[56, 56, 96] {\n\
          \x20   Y[h, w, c] = A[c, h, w];\n}\n",
        ),
    ];
    for (name, text) in kernels {
        let p = program(text);
        let (loops, f) = loops_text("x86-avx512", &p);
        assert!(loops.contains(" unrolled:"), "{name}: no block unrolled along the gathered lines:\n{loops}");
        if name == "prefetched transpose" {
            assert!(loops.contains("prefetch A at"), "{name}: no prefetches beside the block:\n{loops}");
        }
        let shuffled = |target: &str, f: &texc_schedules::LoopFunc| {
            let mut pl = texc_tests::pipeline(target);
            let ir = pl.emit_text(f, "llvm").unwrap_or_else(|e| panic!("{}", texc_tests::rendered(&pl, e)));
            ir.contains("%tlo") && ir.contains("%thi")
        };
        assert!(shuffled("x86-avx512", &f), "{name}: no transposing shuffles in the LLVM IR");
        if name != "copy back" {
            assert!(shuffled("x86-avx2", &loops_text("x86-avx2", &p).1), "{name} on x86-avx2: no shuffles");
        }
        on_every_cpu(name, &p, 0.0, &|_, _| {});
    }
}
