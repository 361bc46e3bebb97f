//! Generated code reads and writes only its tensors' elements: each tensor
//! is placed so that it ends where an inaccessible region begins (and
//! starts right after an inaccessible page), and the kernel runs on that
//! memory in place. A vector access past a row's end, a tail iteration
//! reading rows that do not exist, or a masked load the backend split into
//! unmasked halves (LLVM 19 did, on AVX2: a packed panel's last partial
//! column in a reduction slice's tail read up to a megabyte past `B`)
//! faults here instead of reading a neighbour's memory.

use std::collections::HashMap;
use texc_codegen::{ArgRef, Compiled, TensorMut, TensorRef};
use texc_compiler::interp;
use texc_compiler::target::{Target, TargetKind};
use texc_compiler::{Bindings, Program};
use texc_runtime::Tensor;

const PAGE: usize = 4096;
/// Inaccessible bytes after each tensor: more than a reduction slice of rows
/// past the end (a wild tail read lands in it, not in mapped memory).
const AFTER: usize = 4 << 20;

/// `len` bytes ending at an inaccessible region, starting after an inaccessible page.
struct Fenced {
    base: *mut u8,
    total: usize,
    len: usize,
}

impl Fenced {
    fn new(len: usize) -> Fenced {
        let data = len.div_ceil(PAGE) * PAGE;
        let total = PAGE + data + AFTER;
        // SAFETY: a fresh anonymous mapping, then protections on its own pages.
        unsafe {
            let base = libc::mmap(
                std::ptr::null_mut(),
                total,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(base, libc::MAP_FAILED, "mmap");
            let base = base.cast::<u8>();
            assert_eq!(libc::mprotect(base.cast(), PAGE, libc::PROT_NONE), 0);
            assert_eq!(libc::mprotect(base.add(PAGE + data).cast(), AFTER, libc::PROT_NONE), 0);
            Fenced { base, total, len }
        }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        let data = self.len.div_ceil(PAGE) * PAGE;
        // SAFETY: the `len` bytes before the trailing fence are mapped read-write and ours.
        unsafe { std::slice::from_raw_parts_mut(self.base.add(PAGE + data - self.len), self.len) }
    }
}

impl Drop for Fenced {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, no longer borrowed.
        unsafe { libc::munmap(self.base.cast(), self.total) };
    }
}

/// `k` run in place on fenced copies of `args` and fenced outputs; its
/// outputs must be those of an ordinary run, byte for byte.
fn run_fenced(name: &str, k: &Compiled, args: &[interp::Arg]) {
    let want = k.run(args.to_vec()).unwrap_or_else(|e| panic!("{name}: {e}"));
    let mut inputs: Vec<(Fenced, &Tensor)> = Vec::new();
    for a in args {
        if let interp::Arg::Tensor(t) = a {
            let mut f = Fenced::new(t.bytes().len());
            f.bytes_mut().copy_from_slice(t.bytes());
            inputs.push((f, t));
        }
    }
    let mut ins = inputs.iter_mut();
    let mut held = Vec::new();
    for a in args {
        held.push(match a {
            interp::Arg::Tensor(_) => {
                let (f, t) = ins.next().expect("one fence per tensor");
                let bytes: &[u8] = f.bytes_mut();
                ArgRef::Tensor(TensorRef { dtype: t.dtype(), shape: &t.shape, bytes })
            }
            interp::Arg::Scalar(v) => ArgRef::Scalar(*v),
        });
    }
    let shapes = k.output_shapes();
    let mut outs: Vec<Fenced> =
        shapes.iter().map(|(d, s)| Fenced::new(d.size() * s.iter().product::<usize>())).collect();
    let mut refs: Vec<TensorMut<'_>> = Vec::new();
    for (f, (dtype, shape)) in outs.iter_mut().zip(&shapes) {
        refs.push(TensorMut { dtype: *dtype, shape, bytes: f.bytes_mut() });
    }
    k.run_in_place(&held, &mut refs).unwrap_or_else(|e| panic!("{name}: {e}"));
    drop(refs);
    for (i, (f, w)) in outs.iter_mut().zip(&want).enumerate() {
        assert!(f.bytes_mut() == w.bytes(), "{name}: output {i} differs from an ordinary run");
    }
}

/// CPU targets this machine runs (the others are skipped, with the reason printed).
fn cpu_targets() -> Vec<&'static Target> {
    let (run, skipped) = texc_tests::runnable_targets();
    for s in skipped {
        println!("skipped: {s}");
    }
    run.into_iter().filter(|t| t.kind == TargetKind::Cpu).collect()
}

fn program(file: &str, shapes: &[(&str, i64)]) -> Program {
    let b = Bindings { shapes: shapes.iter().map(|(n, v)| (n.to_string(), *v)).collect(), ..Bindings::default() };
    texc_tests::compile(file, None, &b).expect("specializes")
}

fn check_default(name: &str, p: &Program, t: &'static Target) {
    let f = texc_tests::default_lowered_on(t, p);
    let k = texc_tests::compile_loops(t, &f).unwrap_or_else(|e| panic!("{name} on {t}: {e}"));
    let args = interp::bind_args(p, HashMap::new(), &[], 7).expect("binds");
    run_fenced(&format!("{name} on {t}"), &k, &args);
}

/// Products at sizes whose last column panel and last reduction slice are
/// partial (the shapes the AVX2 over-read showed on), on every CPU target.
#[test]
fn products_stay_inside_their_tensors() {
    for shape in
        [[("M", 197), ("K", 768), ("N", 1000)], [("M", 5), ("K", 1100), ("N", 2100)], [("M", 7), ("K", 13), ("N", 29)]]
    {
        let p = program("examples/matmul.tex", &shape);
        for t in cpu_targets() {
            check_default(&format!("matmul {shape:?}"), &p, t);
        }
    }
}

/// Every std operator at an odd size, with the host's default schedule.
#[test]
fn std_operators_stay_inside_their_tensors() {
    let t = texc_compiler::target::lookup("host").expect("a target");
    if let Err(e) = t.check_runs_here() {
        println!("skipped: {e}");
        return;
    }
    for (name, p) in texc_tests::std_op_programs(13) {
        check_default(&name, &p, t);
    }
}

/// Windows over bytes with a padded border — a `u8` 3 × 3 max pool of
/// stride 2 (a strided masked load) and one of stride 1 (a contiguous
/// one), odd sizes — on every CPU target: where masked byte loads are not
/// instructions (AVX2), a full vector is loaded only where every lane is
/// on, so the border's lanes never read outside `X`; and the results are
/// the interpreter's.
#[test]
fn byte_windows_stay_inside_their_tensors() {
    let src = "kernel pool(X: u8[1, 3, 23, 37]) -> (Y: u8[1, 3, 12, 19], Z: u8[1, 3, 23, 37]) {\n\
               \x20   Y[n, c, y, x] = max[r in 0..3, s in 0..3](select(2 * y + r >= 1 && 2 * y + r < 24 && 2 * x + s >= 1 && 2 * x + s < 38, X[n, c, 2 * y + r - 1, 2 * x + s - 1], u8(0)));\n\
               \x20   Z[n, c, y, x] = max[r in 0..3, s in 0..3](select(y + r >= 1 && y + r < 24 && x + s >= 1 && x + s < 38, X[n, c, y + r - 1, x + s - 1], u8(0)));\n}\n";
    check_text_fenced("pool", src, 5);
}

/// The kernel `src` with each CPU target's default schedule: its outputs
/// byte for byte the interpreter's on random inputs (`seed`), and within
/// its tensors when run fenced.
fn check_text_fenced(name: &str, src: &str, seed: u64) {
    let (mut pl, k) =
        texc_tests::load_text("interp", &format!("{name}.tex"), src, None).unwrap_or_else(|e| panic!("{e}"));
    let p = texc_tests::specialize(&mut pl, k, &Bindings::default());
    let args = interp::bind_args(&p, HashMap::new(), &[], seed).expect("binds");
    let want = interp::run(&p, args.clone()).expect("interp");
    for t in cpu_targets() {
        let f = texc_tests::default_lowered_on(t, &p);
        let k = texc_tests::compile_loops(t, &f).unwrap_or_else(|e| panic!("{name} on {t}: {e}"));
        for (got, w) in k.run(args.clone()).expect("runs").iter().zip(&want) {
            assert_eq!(got.bytes(), w.bytes(), "{name} on {t}: not the interpreter's");
        }
        run_fenced(&format!("{name} on {t}"), &k, &args);
    }
}

/// Index comparisons whose lanes move by constants, as the vectorized code
/// computes them (the lane-0 gap against each lane's move, in the narrowest
/// integer lanes: `codegen/src/llvm/expr.rs`, `lane_offset_compare`):
/// every predicate, moves of ±1, 2 and 3 per lane, gaps far beyond the
/// narrow lanes' range (clamped) and lane-uniform ones, at odd sizes on
/// every CPU target, fenced, against the interpreter — and byte rows of
/// stride 2 and 3 without padding (spans of 2·16 − 1 bytes, loaded as two
/// overlapping pieces), and guarded byte rows whose lanes on have holes
/// (where masked byte loads are not instructions, the span from the first
/// lane on to the last is copied through the stack: `bounced_load`).
#[test]
fn index_comparisons_in_lanes_match_the_interpreter() {
    let src = "kernel cmp(X: u8[5, 101], B: u8[5, 300]) -> (Y: i32[5, 101], Z: u8[5, 100], Z3: u8[5, 99], H: u8[5, 300]) {\n\
               \x20   Y[i, j] = i32(X[i, j]) + select(j == 17, 1, 0) + select(j != 3 * i, 2, 0) + select(i * 1000000000 + j < 2000000003, 4, 0)\n\
               \x20       + select(40 - j > i, 8, 0) + select(2 * j >= 3 * i + 9, 16, 0) + select(j - 5000000000 <= i, 32, 0) + select(i < 3, 64, 0)\n\
               \x20       + select(3 * j - 200 > 0 - 5000000000 * i, 128, 0);\n\
               \x20   Z[i, j] = max(B[i, 2 * j], B[i, 2 * j + 1]);\n\
               \x20   Z3[i, j] = B[i, 3 * j + 2];\n\
               \x20   H[i, j] = select(j % 3 != 1 && j > 2 * i + 1 && j < 297 - i, B[i, j], u8(7));\n}\n";
    check_text_fenced("cmp", src, 3);
}

/// Words of bytes read in place (`codegen/src/llvm/memory.rs`,
/// `byte_window`: one load of the span the lanes read and one shuffle): a
/// depthwise convolution's window rows (`texc_schedules::dot4`) at strides
/// 1 and 2, behind a padding stage and without, a hand-written word of
/// stride 3 with a byte missing, their rows ending at the fenced page, and
/// words with a 0-d tensor's byte, on every CPU target against the interpreter.
#[test]
fn window_words_match_the_interpreter() {
    let src = "kernel dw(X: u8[1, 3, 17, 21], W: i8[3, 1, 3, 3]) -> (Y: i32[1, 3, 15, 19], Z: i32[1, 3, 8, 10]) {\n\
               \x20   P[n, c, h in 0..19, w in 0..23] = select(h >= 1 && w >= 1 && h <= 17 && w <= 21, X[n, c, h - 1, w - 1], u8(0));\n\
               \x20   Y[n, c, y, x] = sum[r, s](i32(X[n, c, y + r, x + s]) * i32(W[c, 0, r, s]));\n\
               \x20   Z[n, c, y, x] = sum[r, s](i32(P[n, c, y * 2 + r, x * 2 + s]) * i32(W[c, 0, r, s]));\n}\n";
    check_text_fenced("dw", src, 5);
    let src = "kernel word(X: u8[3, 70]) -> B: i32[3, 23] {\n\
               \x20   B[i, j] = i32(X[i, 3 * j + 1]) + i32(X[i, 3 * j]) * 256 + i32(X[i, 3 * j + 3]) * 16777216;\n}\n";
    check_text_fenced("word", src, 7);
    // A 0-d tensor's byte has no row: the word is built as written.
    let src = "kernel zerod(S: u8[], X: u8[64]) -> (Y: i32[64], Z: i32[64]) {\n\
               \x20   Y[i] = i32(X[i]) * 256 + i32(S);\n\
               \x20   Z[i] = i32(S) + i32(S) * 256;\n}\n";
    check_text_fenced("zerod", src, 9);
}

/// A transposing copy whose read is in a `select`'s branch: the padding
/// of a filters-last product's output, `Z[n, c, y, x] = select(y ≥ 1 && …,
/// X[n, (y - 1) * 14 + x - 1, c], 0)` (a 1 × 1 convolution at 14 × 14 read
/// by a 3 × 3 one), whose border lanes read nothing — its first image row
/// would read rows -15 to 0 of `X` (256 channels: a source larger than
/// L1, which the schedule copies in blocks of 16 × 16). The block of lanes × lanes that the
/// LLVM backend loads and transposes in registers (`codegen/src/llvm/transpose.rs`)
/// clamps such a read's rows into the tensor: fenced on every CPU target
/// (an unclamped row faults on the page before `X`), the interpreter's
/// bytes. (Found as a crash of Wide ResNet-50 once its 14 × 14 products
/// were computed filters-last: the padding copy read 30 KB before a
/// temporary.) A concatenation's `select` on the copies' own axis is read
/// as written.
#[test]
fn transposed_reads_in_a_select_stay_inside_their_tensors() {
    let src = "kernel pad(X: f32[1, 196, 256]) -> Z: f32[1, 256, 16, 16] {\n\
               \x20   Z[n, c, y, x] = select(y >= 1 && y < 15 && x >= 1 && x < 15, X[n, (y - 1) * 14 + x - 1, c], 0.0);\n}\n";
    check_text_fenced("pad", src, 11);
    // A condition on the copies' own axis (a concatenation's channels):
    // the block of channels 32..47 reads `B` from channel -8 at the first
    // position, so its row is partly outside `B` and partly the values the
    // lanes past `c = 40` take — read as written, not clamped (clamping
    // moved those lanes' values: ShuffleNetV2, 5e-4 off ORT).
    let src = "kernel cat(A: f32[1, 196, 40], B: f32[1, 196, 216]) -> Z: f32[1, 256, 14, 14] {\n\
               \x20   Z[n, c, y, x] = select(c < 40, A[n, y * 14 + x, c], B[n, y * 14 + x, c - 40]);\n}\n";
    check_text_fenced("cat", src, 13);
    // The right side of `&&` is read only where the left holds: the same
    // rows as the padding's, in a condition.
    let src = "kernel and(X: f32[1, 196, 256]) -> Z: f32[1, 256, 16, 16] {\n\
               \x20   Z[n, c, y, x] = select(y >= 1 && y < 15 && x >= 1 && x < 15 && X[n, (y - 1) * 14 + x - 1, c] > 0.0, 1.0, 0.0);\n}\n";
    check_text_fenced("and", src, 17);
    // A chain of a row condition (the same in every lane: a branch) and
    // column conditions (masks), the later column read guarded by the
    // earlier: `X[c, y, x]` is read only where `x < 21`, the last vector
    // of each row straddling it (`codegen/src/llvm/expr.rs`,
    // `select_in_branch`).
    let src = "kernel chain(X: f32[3, 9, 21]) -> (Y: f32[3, 9, 37], Z: f32[3, 9, 37]) {\n\
               \x20   Y[c, y, x] = select(y >= 1 && x < 21 && X[c, y, x] > 0.0, 1.0, -1.0);\n\
               \x20   Z[c, y, x] = select(y == 0 || x >= 21 || X[c, y, x] > 0.0, 1.0, -1.0);\n}\n";
    check_text_fenced("chain", src, 19);
}
