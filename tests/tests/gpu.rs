//! GPU targets without a GPU: every std operator and example, with the
//! default GPU schedule and with random GPU schedules, compiles to PTX that
//! `ptxas` assembles for sm_80 and sm_90 (registers and spills reported);
//! GPU schedules that break a launch rule are spanned errors; PTX snapshots.
//! (Their results against the interpreter, through the CPU emulation of the
//! kernels, are in tests/backends.rs with every other backend.)

use texc_compiler::Bindings;
use texc_runtime::SplitMix64;
use texc_schedules::LoopFunc;
use texc_tests::rendered;

const GPUS: [&str; 2] = ["nvptx-sm80", "nvptx-sm90"];

/// Kernel `src` (file `name`) on nvptx-sm90 at sizes `b`: its pipeline,
/// specialized program and legal loop nests.
fn gpu_loops(name: &str, src: &str, b: &Bindings) -> (texc_pipeline::Pipeline, texc_compiler::Program, LoopFunc) {
    gpu_loops_with(name, src, b, &[])
}

/// [`gpu_loops`] with the default schedule's `knobs`.
fn gpu_loops_with(
    name: &str,
    src: &str,
    b: &Bindings,
    knobs: &[(&str, i64)],
) -> (texc_pipeline::Pipeline, texc_compiler::Program, LoopFunc) {
    let (mut pl, k) = texc_tests::load_text("nvptx-sm90", name, src, None).expect("loads");
    pl.options.knobs.extend(knobs.iter().map(|&(n, v)| (n.to_string(), v)));
    let p = texc_tests::specialize(&mut pl, k, b);
    let f = texc_tests::loops(&mut pl, k, &p);
    (pl, p, f)
}

/// `ptxas` for Hopper: sm_90a where the module has warpgroup operations.
fn assemble_sm90(ptx: &str) -> Result<(Vec<u8>, Vec<texc_codegen::cuda::KernelResources>), String> {
    texc_codegen::cuda::assemble(ptx, if ptx.contains(".target sm_90a") { "sm_90a" } else { "sm_90" })
}

/// Relative error of `f`'s kernels (emulated, or on the GPU) against the interpreter, on inputs of `seed`.
fn error_vs_interp(pl: &mut texc_pipeline::Pipeline, p: &texc_compiler::Program, f: &LoopFunc, seed: u64) -> f64 {
    let args = || texc_compiler::interp::bind_args(p, Default::default(), &[], seed).expect("binds");
    let want = texc_compiler::interp::run(p, args()).expect("interp");
    let got = pl.compile(f).expect("compiles").run(args()).expect("runs");
    texc_tests::rel_error(&got[0], &want[0])
}

/// Relative error of the loop-IR evaluator's run of `f` against the interpreter's of `p`.
fn eval_error(p: &texc_compiler::Program, f: &LoopFunc, seed: u64) -> f64 {
    let args = || texc_compiler::interp::bind_args(p, Default::default(), &[], seed).expect("binds");
    let want = texc_compiler::interp::run(p, args()).expect("interp");
    let got = texc_schedules::eval::run(f, args()).expect("evaluates");
    texc_tests::rel_error(&got[0], &want[0])
}

/// Each source of `cases` is rejected by `texc check` with its message, at a place in `file`.
fn assert_spanned_errors(file: &str, cases: &[(String, &str)]) {
    for (src, want) in cases {
        let err = texc_tests::check_text(file, src).expect_err("rejected");
        assert!(err.contains(want), "expected `{want}` in\n{err}");
        assert!(err.contains(&format!("{file}:")), "spanned: {err}");
    }
}

/// `--shape`'s `N=2,C=32,...` as bindings.
fn sizes(text: &str) -> Bindings {
    let shapes = text.split(',').map(|kv| {
        let (n, v) = kv.split_once('=').expect("name=value");
        (n.to_string(), v.parse().expect("a number"))
    });
    Bindings { shapes: shapes.collect(), ..Default::default() }
}

fn sm(target: &str) -> String {
    format!("sm_{}", texc_compiler::target::lookup(target).expect("registered").gpu.expect("a GPU").sm)
}

/// PTX of legal GPU loop nests `f` for `target`, assembled by `ptxas`:
/// (kernels, their largest register count, total spill bytes).
fn assemble(name: &str, f: &LoopFunc, target: &str) -> (usize, u32, u32) {
    let mut pl = texc_tests::pipeline(target);
    let legal = pl.legalize(f.clone()).unwrap_or_else(|e| panic!("{name}: {}", rendered(&pl, e)));
    let (ptx, header) = pl.emit_gpu(&[&legal]).unwrap_or_else(|e| panic!("{name} on {target}: {}", rendered(&pl, e)));
    assert!(header.contains("texc_launch"), "{name}: the header describes the launches");
    let (cubin, res) = texc_codegen::cuda::assemble(&ptx, &sm(target))
        .unwrap_or_else(|e| panic!("{name} on {target}: {e}\n{}\n{ptx}", texc_schedules::ir::print(f)));
    assert!(cubin.starts_with(b"\x7fELF"), "{name}: a cubin is an ELF file");
    let launches = texc_schedules::gpu::launches(&legal, pl.target()).expect("legal");
    assert_eq!(res.len(), launches.len(), "{name}: one kernel per launch");
    let regs = res.iter().map(|r| r.registers).max().unwrap_or(0);
    let spills = res.iter().map(|r| r.spill_stores + r.spill_loads).sum();
    (res.len(), regs, spills)
}

fn require_ptxas() {
    assert!(
        texc_codegen::cuda::ptxas().is_some(),
        "ptxas not found ({}); scripts/bootstrap.sh installs it",
        texc_codegen::cuda::searched()
    );
}

#[test]
fn every_example_and_std_operator_assembles_for_sm80_and_sm90() {
    require_ptxas();
    let mut programs = texc_tests::example_programs(2e8);
    programs.extend(texc_tests::std_op_programs(11));
    for target in GPUS {
        let mut table = Vec::new();
        for (name, p) in &programs {
            let f = texc_tests::default_lowered(target, p);
            let (kernels, regs, spills) = assemble(name, &f, target);
            table.push(format!("{name:<48} {kernels:>2} kernels {regs:>4} registers {spills:>6} spill bytes"));
        }
        eprintln!("ptxas -arch={} ({} programs):\n{}", sm(target), table.len(), table.join("\n"));
    }
}

#[test]
fn random_gpu_schedules_assemble() {
    require_ptxas();
    let mut rng = SplitMix64::new(11);
    let (mut bound, mut cross) = (0, 0);
    for (file, kernel, shapes) in texc_tests::RANDOM_SCHEDULE_CASES {
        let base = texc_tests::random_case_program(file, kernel, shapes);
        for trial in 0..4 {
            let f = texc_tests::randomly_gpu_scheduled(&base, &mut rng);
            bound += usize::from(texc_schedules::gpu::has_bound_loops(&f));
            cross += usize::from(!f.shared.is_empty() || !f.registers.is_empty());
            for target in GPUS {
                assemble(&format!("{file} trial {trial}"), &f, target);
            }
        }
    }
    assert!(bound >= 4, "random GPU schedules bind loops ({bound} did)");
    assert!(cross >= 1, "random GPU schedules reduce over threads ({cross} did)");
}

/// The error `texc check` gives for a GPU schedule of a matrix product.
fn schedule_error(schedule: &str) -> String {
    let src = format!(
        "kernel mm(A: f32[M = 40, K = 24], B: f32[K, N = 72]) -> C: f32[M, N] {{\n    \
         C[i, j] = sum[k](A[i, k] * B[k, j]);\n}}\nschedule mm for nvptx-sm90 {{\n{schedule}\n}}\n"
    );
    texc_tests::check_text("mm.tex", &src).expect_err("the schedule is rejected")
}

#[test]
fn gpu_schedules_that_break_a_rule_are_spanned_errors() {
    let cases = [
        ("    bind C.k to thread.y;", "cannot bind `k`: it is a reduction axis"),
        (
            "    bind C.i to thread.y;\n    bind C.k to thread.x;",
            "`k` is a reduction bound to thread.x, so `C`'s other loops are not bound to threads",
        ),
        ("    bind C.i to block.x;\n    bind C.j to block.x;", "`j` is a second loop bound to block.x"),
        ("    bind C.j to block.x;", "`j` is bound to a block but `i` is outside it"),
        ("    bind C.i to thread.x;\n    bind C.j to thread.y;", "2880 threads per block, more than the target's 1024"),
        ("    bind C.j to thread.z;", "72 threads per block along z, more than the target's 64"),
        ("    bind C.i to warp.x;", "unknown GPU unit `warp`"),
        ("    bind C.i to block.w;", "unknown GPU dimension `w`"),
        ("    tensorize C(i, j, k) with mma_m16n8k16_f16f32;", "tiles are 16 long along `i`, which has 40 iterations"),
    ];
    for (schedule, want) in cases {
        let err = schedule_error(schedule);
        assert!(err.contains(want), "{schedule}: expected `{want}` in\n{err}");
        assert!(err.contains("mm.tex:"), "{schedule}: the error has a position\n{err}");
    }
}

#[test]
fn a_good_gpu_schedule_checks_and_runs_like_the_interpreter() {
    let src = "kernel mm(A: f32[M = 37, K = 19], B: f32[K, N = 70]) -> C: f32[M, N] {\n    \
               C[i, j] = sum[k](A[i, k] * B[k, j]);\n}\nschedule mm for nvptx-sm90 {\n    \
               tile C(i, j) by (8, 32) -> (io, jo, ii, ji);\n    reorder C(io, jo, ii, k, ji);\n    \
               bind C.io to block.y;\n    bind C.jo to block.x;\n    bind C.ii to thread.y;\n    \
               bind C.ji to thread.x;\n}\n";
    texc_tests::check_text("mm.tex", src).expect("a legal GPU schedule checks");
    let (mut pl, p, f) = gpu_loops("mm.tex", src, &Bindings::default());
    let launches = texc_schedules::gpu::launches(&f, pl.target()).expect("legal");
    let shapes: Vec<_> = launches.iter().map(|l| (l.grid, l.block)).collect();
    // The zeroing nest and the product, each on a 3×5 grid of 32×8 blocks.
    assert_eq!(shapes, vec![([3, 5, 1], [32, 8, 1]); 2]);
    assert!(error_vs_interp(&mut pl, &p, &f, 3) < 1e-6);
}

/// GPU code is reached through the `GpuBackend` interface only: a CPU
/// target has none, NVPTX's writes PTX as it is and a cubin through
/// `ptxas` (a note per kernel), refuses other formats, and its emulation
/// runs like the interpreter.
#[test]
fn gpu_code_goes_through_the_gpu_backend_interface() {
    let cpu = texc_compiler::target::lookup("x86-avx2").expect("registered");
    let refused = texc_codegen::gpu_backend_for(cpu).err().expect("a CPU target has no device code").to_string();
    assert!(refused.contains("not a GPU"), "{refused}");
    let cpu_pl = texc_tests::pipeline("x86-avx2");
    assert!(matches!(cpu_pl.gpu_formats(), Err(texc_pipeline::Error::Usage(_))));

    let src = "kernel scale(X: f32[N = 1000]) -> Y: f32[N] {\n    Y[i] = 2.0 * X[i] + 1.0;\n}\n";
    let (mut pl, p, f) = gpu_loops("scale.tex", src, &Bindings::default());
    let t = pl.target();
    let gpu = texc_codegen::gpu_backend_for(t).expect("NVPTX has device code");
    assert_eq!(gpu.formats(), ["ptx", "cubin"]);
    let legal = pl.legalize(f.clone()).expect("legal");
    let (text, header) = pl.emit_gpu(&[&legal]).expect("PTX");
    assert!(text.contains(".entry") && header.contains("texc_launch"), "{text}");
    let ptx = pl.encode_gpu(&text, "ptx").expect("PTX as it is");
    assert_eq!(ptx.bytes, text.as_bytes());
    assert!(ptx.notes.is_empty());
    let other = pl.encode_gpu(&text, "o").map(|_| ()).expect_err("not a device format");
    assert!(rendered(&pl, other).contains(".ptx or .cubin"));
    if texc_codegen::cuda::ptxas().is_some() {
        let cubin = pl.encode_gpu(&text, "cubin").expect("ptxas assembles it");
        assert!(cubin.bytes.starts_with(b"\x7fELF"));
        let launches = texc_schedules::gpu::launches(&legal, t).expect("legal").len();
        assert_eq!(cubin.notes.len(), launches, "a note per kernel: {:?}", cubin.notes);
        assert!(cubin.notes.iter().all(|n| n.contains("registers") && n.contains("(sm_90)")), "{:?}", cubin.notes);
    }
    let backend = texc_codegen::backend_for(t).expect("NVPTX");
    let args = || texc_compiler::interp::bind_args(&p, Default::default(), &[], 5).expect("binds");
    let want = texc_compiler::interp::run(&p, args()).expect("interp");
    let got = texc_codegen::Compiled::emulated(backend, &legal, t).expect("emulates").run(args()).expect("runs");
    assert!(texc_tests::rel_error(&got[0], &want[0]) < 1e-6);
    let cpu_backend = texc_codegen::backend_for(cpu).expect("LLVM");
    let no_device =
        texc_codegen::Compiled::emulated(cpu_backend, &legal, t).err().expect("LLVM x86 has no device half");
    assert!(no_device.to_string().contains("has no device code"), "{no_device}");
}

/// `.loops` text for a GPU target: parsed, then checked against the launch rules.
fn loops_error(body: &str) -> String {
    let text = format!("func k [N=64]\n  input A: f32[64]\n  output B: f32[64]\n  temp T: f32[64]\n{body}");
    let mut pl = texc_tests::pipeline("nvptx-sm90");
    let dir = texc_tests::scratch("gpu-loops");
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join(format!("k{}.loops", text.len()));
    std::fs::write(&path, &text).expect("write");
    let r = pl.load_loops(&path).map(|_| ()).map_err(|e| rendered(&pl, e));
    let _ = std::fs::remove_file(&path);
    match r {
        Ok(()) => String::new(),
        Err(e) => e,
    }
}

/// A block of 64 threads that fills registers buffer `P` (`fill`, by
/// thread `t`), takes `between` and reads it back (`read`, by thread `u`).
fn warp_nest(fill: &str, between: &str, read: &str) -> String {
    format!(
        "  for b in 0..1 block.x:\n    registers P: f32[64]:\n      for t in 0..64 thread.x:\n        {fill}\n      \
         {between}\n      for u in 0..64 thread.x:\n        {read}\n"
    )
}

#[test]
fn loop_nests_that_break_a_launch_rule_are_rejected() {
    let cases = [
        (
            "  for b in 0..2 block.x:\n    for t in 0..32 thread.x:\n      B[t] = A[t]\n",
            "the store to `B` may write an element that another block writes: no index tells block.x apart",
        ),
        // Every index mentions the thread, yet threads share elements (issue 35).
        (
            "  for b in 0..1 block.x:\n    for t in 0..64 thread.x:\n      B[b + t / 64] = B[b + t / 64] + A[b * 64 + t]\n",
            "the store to `B` may write an element that another thread writes: no index tells thread.x apart",
        ),
        (
            "  for b in 0..2 block.x:\n    for jo in 0..2 thread.y:\n      for ji in 0..16 thread.x:\n        \
             B[b * 32 + jo * 16 + ji / 2] = A[jo * 16 + ji]\n",
            "the store to `B` may write an element that another thread writes: no index tells thread.x apart",
        ),
        (
            "  for b in 0..2 block.x:\n    for t in 0..32 thread.x:\n      B[b * 32 + t] = A[t]\n    \
             for u in 0..32 thread.x:\n      B[b * 32 + 31 - u] = A[u]\n",
            "the store to `B` may write an element that another thread writes",
        ),
        // Fused loops, a serial loop inside the threads, a guard that picks one thread of a warp: distinct elements.
        ("  for f in 0..2 block.x:\n    for t in 0..32 thread.x:\n      B[(f * 32 + t) / 8 % 8 * 8 + (f * 32 + t) % 8] = A[t]\n", ""),
        ("  for k in 0..2:\n    for t in 0..32 thread.x:\n      B[k * 32 + t] = A[t]\n", ""),
        ("  for t in 0..64 thread.x:\n    if t % 32 == 0:\n      B[t / 32] = A[t]\n", ""),
        ("  for t in 0..64 thread.x:\n    if t % 32 == 1:\n      B[t / 32] = A[t]\n    if t % 32 == 0:\n      B[2 + t / 32] = A[t]\n", ""),
        (
            "  for b in 0..2 block.x:\n    B[b] = A[b]\n    for t in 0..32 thread.x:\n      B[b * 32 + t] = A[t]\n",
            "the store to `B` is outside the thread.x loops",
        ),
        (
            "  for i in 0..2:\n    for b in 0..32 block.x:\n      B[i * 32 + b] = A[b]\n",
            "`b` is bound to block.x but is not one of the loops that open its launch",
        ),
        (
            "  for t in 0..8 thread.x:\n    for u in 0..8 thread.x:\n      B[t * 8 + u] = A[u]\n",
            "`u` is bound to thread.x inside another thread.x loop",
        ),
        (
            "  for b in 0..2 block.x:\n    for t in 0..32 thread.x:\n      T[b * 32 + t] = A[t]\n    for u in 0..32 thread.x:\n      B[b * 32 + u] = T[63 - b * 32 - u]\n",
            "`T` is written and read by different iterations of one launch",
        ),
        (
            "  for b in 0..64 block.x:\n    local L: f32[1]:\n      for t in 0..1 thread.x:\n        L[0] = A[b]\n      for u in 0..1 thread.x:\n        B[b + u] = L[0]\n",
            "local buffer `L` is outside the thread.x loops",
        ),
        ("  for i in 0..64 parallel:\n    B[i] = A[i]\n", "loop `i` is parallel, which target `nvptx-sm90` does not have"),
        // Asynchronous copies: elements of a global tensor, unchanged, 4, 8 or 16 bytes, into shared memory.
        ("  for b in 0..1 block.x:\n    shared S: f32[64]:\n      for t in 0..16 thread.x:\n        for v in 0..4 async:\n          S[t * 4 + v] = A[t * 4 + v] * 2.0f32\n      async commit\n      async wait 0\n      barrier\n      for u in 0..64 thread.x:\n        B[b * 64 + u] = S[63 - u]\n", "`async` loop `v`: it stores a computed value"),
        ("  for b in 0..1 block.x:\n    shared S: f32[64]:\n      for t in 0..16 thread.x:\n        for v in 0..3 async:\n          S[t * 4 + v] = A[t * 4 + v]\n      async commit\n      async wait 0\n      barrier\n      for u in 0..64 thread.x:\n        B[b * 64 + u] = S[63 - u]\n", "it copies 12 bytes of f32 into f32"),
        (
            "  for b in 0..1 block.x:\n    for t in 0..16 thread.x:\n      for v in 0..4 async:\n        \
             B[b * 64 + t * 4 + v] = A[t * 4 + v]\n",
            "asynchronous copies go from global to shared memory",
        ),
        ("  for b in 0..1 block.x:\n    shared S: f32[64]:\n      for t in 0..16 thread.x:\n        for v in 0..4 async:\n          S[t * 4 + v] = A[t * 4 + v]\n        async commit\n      async commit\n      async wait 0\n      barrier\n      for u in 0..64 thread.x:\n        B[b * 64 + u] = S[63 - u]\n", "an `async commit` or `async wait` inside a thread loop"),
        // Registers: a thread's own element; warp reductions between thread loops, warps along x.
        (&warp_nest("P[t] = A[t]", "warp_reduce sum P by 32", "B[b * 64 + u] = P[u]"), ""),
        (&warp_nest("P[t] = A[t]", "warp_reduce sum P by 32", "B[b * 64 + u] = P[0]"), "`P` is held in registers, an element per thread"),
        (&warp_nest("P[63 - t] = A[t]", "warp_reduce sum P by 32", "B[b * 64 + u] = P[u]"), "`P` is held in registers"),
        (&warp_nest("P[t] = A[t]\n        warp_reduce sum P by 32", "barrier", "B[b * 64 + u] = P[u]"), "the warp reduction of `P` is inside a thread loop"),
        (&warp_nest("P[t] = A[t]", "warp_reduce sum P by 32\n      for y in 0..2 thread.y:\n        B[b * 64 + y] = A[y]", "B[b * 64 + u] = P[u]"), "its launch has threads along y or z"),
        (&warp_nest("P[t] = A[t]", "warp_reduce sum P by 32", "B[b * 64 + u] = P[u]").replace("P: f32[64]", "P: f32[128]"), "it has more elements than the block has threads"),
        (&warp_nest("P[t] = A[t]", "warp_reduce sum P by 32\n      registers Q: f32[128]:\n        warp_reduce sum Q by 32", "B[b * 64 + u] = P[u]"), "the warp reduction of `Q`: it has more elements than the block"),
        ("  for b in 0..1 block.x:\n    local P: f32[64]:\n      for t in 0..64 thread.x:\n        B[t] = A[t]\n      warp_reduce sum P by 32\n", "`P` is not a buffer declared `registers`"),
        (&warp_nest("P[t] = A[t]", "warp_reduce sum P by 64", "B[b * 64 + u] = P[u]"), "a warp reduction is by 2, 4, 8, 16 or 32 lanes"),
        // A thread's local buffers are its registers: 255 a thread, 65536 a block.
        ("  for b in 0..2 block.x:\n    for t in 0..32 thread.x:\n      local L: f32[300]:\n        L[0] = A[t]\n        B[b * 32 + t] = L[0]\n", "`L`) take 300 32-bit registers, more than the 255 a thread has"),
        ("  for t in 0..1024 thread.x:\n    local L: f32[65]:\n      L[0] = A[t % 64]\n      T[t % 64] = L[0]\n", "1024 threads need 66560, more than the 65536 of a block"),
    ];
    for (body, want) in cases {
        let err = loops_error(body);
        if want.is_empty() {
            assert_eq!(err, "", "{body}");
            continue;
        }
        assert!(err.contains(want), "expected `{want}` for\n{body}\ngot: {err}");
        // The loop, buffer or store at fault is shown.
        assert!(err.contains(".loops:"), "{err}");
    }
    // Each thread accumulating into its own element is fine, and so is one launch per statement.
    let ok = "  for b in 0..2 block.x:\n    for t in 0..32 thread.x:\n      T[b * 32 + t] = A[b * 32 + t]\n      \
              T[b * 32 + t] = T[b * 32 + t] + 1.0f32\n  for i in 0..64:\n    B[i] = T[63 - i]\n";
    assert_eq!(loops_error(ok), "");
}

#[test]
fn bound_loops_print_and_parse_back() {
    let text = "func k [N=64]\n  input A: f32[64]\n  output B: f32[64]\n  for b in 0..2 block.x:\n    \
                for t in 0..32 thread.x:\n      B[b * 32 + t] = A[b * 32 + t]\n";
    let parsed = texc_schedules::text::parse(text, texc_grammar::FileId(0)).expect("parses");
    assert_eq!(texc_schedules::ir::print(&parsed.func), text);
}

#[test]
fn cpu_targets_reject_bound_loops() {
    let src = "kernel e(X: f32[N = 64]) -> Y: f32[N] {\n    Y[i] = X[i];\n}\n\
               schedule e for x86-avx2 {\n    bind Y.i to block.x;\n}\n";
    let err = texc_tests::check_text("e.tex", src).expect_err("rejected");
    assert!(err.contains("`bind` is a GPU primitive; target `x86-avx2` is a CPU"), "{err}");
}

/// PTX of a few kernels, pinned: element-wise with a libdevice call, a
/// matrix product, and softmax's rows (three launches).
#[test]
fn ptx_snapshots() {
    let cases = [
        ("gelu", "examples/gelu.tex", vec![("N", 3), ("D", 257)]),
        ("matmul", "examples/matmul.tex", vec![("M", 37), ("K", 19), ("N", 70)]),
        ("softmax", "examples/softmax.tex", vec![("N", 5), ("D", 100)]),
    ];
    for (name, file, shapes) in cases {
        let b = Bindings { shapes: shapes.iter().map(|(n, v)| (n.to_string(), *v)).collect(), ..Default::default() };
        let (mut pl, k) = texc_tests::load_file("nvptx-sm90", file, None).expect("loads");
        let p = texc_tests::specialize(&mut pl, k, &b);
        let f = texc_tests::loops(&mut pl, k, &p);
        let (ptx, _) = pl.emit_gpu(&[&f]).expect("PTX");
        insta::assert_snapshot!(format!("ptx_{name}"), ptx);
    }
}

/// On a machine with an NVIDIA GPU, the examples and std operators run on
/// it and match the interpreter (tests/tests/backends.rs runs the whole
/// conformance set there too); elsewhere this test says why it skipped.
#[test]
fn kernels_run_on_the_gpu_when_there_is_one() {
    let device = match texc_runtime::cuda::device() {
        Ok(d) => d,
        Err(why) => {
            eprintln!("skipped: {why}");
            return;
        }
    };
    eprintln!("running on {} (sm_{})", device.name, device.sm);
    let target = if device.sm >= 90 { "nvptx-sm90" } else { "nvptx-sm80" };
    let mut programs = texc_tests::example_programs(2e8);
    programs.extend(texc_tests::std_op_programs(11));
    for (name, p) in &programs {
        let mut pl = texc_tests::pipeline(target);
        assert!(!pl.options.emulate_gpu, "a GPU is present: no emulation");
        let f = texc_tests::default_lowered(target, p);
        let legal = pl.legalize(f).unwrap_or_else(|e| panic!("{name}: {}", rendered(&pl, e)));
        let k = pl.compile(&legal).unwrap_or_else(|e| panic!("{name}: {}", rendered(&pl, e)));
        let args = || texc_compiler::interp::bind_args(p, Default::default(), &[], 1).expect("binds");
        let want = texc_compiler::interp::run(p, args()).expect("interp");
        let got = k.run(args()).unwrap_or_else(|e| panic!("{name}: {e}"));
        for (g, w) in got.iter().zip(&want) {
            let tol = if w.dtype().is_float() { 1e-5 } else { 0.0 };
            let err = texc_tests::rel_error(g, w);
            assert!(err <= tol, "{name} on {}: error {err:e}", device.name);
        }
    }
}

/// A matrix product tiled through shared memory: each block stages tiles of
/// `A` and `B` in shared buffers that its threads load together between two
/// barriers, then reads them; at tile sizes and shapes that divide nothing.
fn shared_matmul(tile: i64, kt: i64) -> String {
    format!(
        "kernel mm(A: f32[M = 37, K = 21], B: f32[K, N = 45]) -> C: f32[M, N] {{\n    \
         C[i, j] = sum[k](A[i, k] * B[k, j]);\n}}\nschedule mm for nvptx-sm90 {{\n    \
         tile C(i, j) by ({tile}, {tile}) -> (io, jo, ii, ji);\n    split C.k by {kt} -> (ko, ki);\n    \
         reorder C(io, jo, ko, ii, ji, ki);\n    cache_read A for C at C.ko in shared -> As;\n    \
         cache_read B for C at C.ko in shared -> Bs;\n    bind C.io to block.y;\n    bind C.jo to block.x;\n    \
         bind C.ii to thread.y;\n    bind C.ji to thread.x;\n    bind As.i to thread.y;\n    bind As.k to thread.x;\n    \
         bind Bs.k to thread.y;\n    bind Bs.j to thread.x;\n}}\n"
    )
}

#[test]
fn shared_memory_tiles_run_like_the_interpreter_and_assemble() {
    require_ptxas();
    for (tile, kt, shapes) in [
        (16, 16, [("M", 37), ("K", 21), ("N", 45)]),
        (8, 4, [("M", 64), ("K", 64), ("N", 64)]),
        (16, 8, [("M", 1), ("K", 1), ("N", 1)]),
        (4, 16, [("M", 9), ("K", 70), ("N", 13)]),
    ] {
        let src = shared_matmul(tile, kt);
        texc_tests::check_text("mm.tex", &src).unwrap_or_else(|e| panic!("{e}"));
        let b = Bindings { shapes: shapes.iter().map(|(n, v)| (n.to_string(), *v)).collect(), ..Default::default() };
        let (mut pl, p, f) = gpu_loops("mm.tex", &src, &b);
        assert!(!f.shared.is_empty(), "the tiles are shared buffers");
        let err = error_vs_interp(&mut pl, &p, &f, 4);
        assert!(err < 1e-5, "tile {tile}, k {kt}, {shapes:?}: error {err}");
        for target in GPUS {
            let mut gpl = texc_tests::pipeline(target);
            let (ptx, _) = gpl.emit_gpu(&[&f]).expect("PTX");
            assert!(ptx.contains("bar.sync") && ptx.contains("ld.shared") && ptx.contains("st.shared"), "{ptx}");
            texc_codegen::cuda::assemble(&ptx, &sm(target)).unwrap_or_else(|e| panic!("{e}"));
        }
    }
}

#[test]
fn shared_memory_rules() {
    let big = |kt: i64| {
        shared_matmul(128, kt)
            .replace("M = 37, K = 21", "M = 256, K = 256")
            .replace("N = 45", "N = 256")
            .replace("bind C.ii to thread.y;", "")
            .replace("bind As.i to thread.y;", "")
            .replace("bind Bs.k to thread.y;", "")
    };
    // 2 × 128 × 128 f32 tiles: 128 KiB, more than a kernel may declare
    // statically, is dynamic shared memory (sized at launch).
    let src = big(128);
    texc_tests::check_text("mm.tex", &src).unwrap_or_else(|e| panic!("{e}"));
    let (mut pl, _, f) = gpu_loops("mm.tex", &src, &Bindings::default());
    let (ptx, header) = pl.emit_gpu(&[&f]).expect("PTX");
    assert!(ptx.contains(".extern .shared .align 16 .b8 texc_dynamic_shared[];"), "{ptx}");
    assert!(ptx.contains(", 131072>>>(A, B, C)"), "the launch comment says how much: {ptx}");
    assert!(header.contains(", 131072}"), "{header}");
    // 2 × 128 × 256: 256 KiB, more than an H100's block may have.
    let err = texc_tests::check_text("mm.tex", &big(256)).expect_err("too much shared memory");
    assert!(err.contains("262144 bytes of shared memory, more than the 232448 a block may have"), "{err}");
    let cases = [
        (
            "  for b in 0..2 block.x:\n    shared S: f32[32]:\n      for t in 0..32 thread.x:\n        S[t] = A[b * 32 + t]\n      \
             for u in 0..32 thread.x:\n        B[b * 32 + u] = S[31 - u]\n",
            "shared buffer `S` is written by one statement and used by another with no barrier between them",
        ),
        (
            "  for b in 0..2 block.x:\n    for k in 0..2:\n      shared S: f32[32]:\n        for t in 0..32 thread.x:\n          \
             S[t] = A[b * 32 + t]\n        barrier\n        for u in 0..32 thread.x:\n          T[b * 32 + u] = S[31 - u] + \
             f32(k)\n",
            "shared buffer `S` is written by one statement and used by another with no barrier between them",
        ),
        (
            "  for b in 0..2 block.x:\n    shared S: f32[32]:\n      for t in 0..32 thread.x:\n        S[t] = A[b * 32 + t]\n        \
             barrier\n",
            "a barrier inside a thread loop",
        ),
        (
            "  for b in 0..2 block.x:\n    if b > 0:\n      barrier\n    for t in 0..32 thread.x:\n      B[b * 32 + t] = A[t]\n",
            "a barrier under an `if`",
        ),
        (
            "  for b in 0..2 block.x:\n    for t in 0..32 thread.x:\n      shared S: f32[1]:\n        S[0] = A[t]\n        \
             B[b * 32 + t] = S[0]\n",
            "shared buffer `S` is inside a thread loop",
        ),
        (
            "  shared S: f32[64]:\n    for b in 0..2 block.x:\n      for t in 0..32 thread.x:\n        S[b * 32 + t] = A[t]\n",
            "`b` is bound to block.x but is not one of the loops that open its launch",
        ),
        (
            "  for b in 0..2 block.x:\n    shared S: f32[32]:\n      for t in 0..32 thread.x:\n        S[t] = A[b * 32 + t]\n        \
             B[b * 32 + t] = S[31 - t]\n",
            "written and read by the threads of one statement",
        ),
        // A step of a reduction tree reads `S[t + h]`, which no thread of the
        // loop writes when `h` is at least its extent; a shorter shift races.
        (
            "  for b in 0..2 block.x:\n    shared S: f32[32]:\n      for t in 0..32 thread.x:\n        S[t] = A[b * 32 + t]\n      \
             barrier\n      for h in 0..16 thread.x:\n        S[h] = S[h] + S[h + 8]\n      barrier\n      \
             for u in 0..32 thread.x:\n        B[b * 32 + u] = S[u]\n",
            "written and read by the threads of one statement",
        ),
    ];
    let tree = "  for b in 0..2 block.x:\n    shared S: f32[32]:\n      for t in 0..32 thread.x:\n        S[t] = A[b * 32 + t]\n      \
                barrier\n      for h in 0..16 thread.x:\n        S[h] = S[h] + S[h + 16]\n      barrier\n      \
                for u in 0..32 thread.x:\n        B[b * 32 + u] = S[u]\n";
    assert_eq!(loops_error(tree), "", "a tree step");
    for (body, want) in cases {
        let err = loops_error(body);
        assert!(err.contains(want), "expected `{want}` for\n{body}\ngot: {err}");
    }
    // With barriers, the same nests are fine, in a loop too.
    let ok = "  for b in 0..2 block.x:\n    for k in 0..2:\n      shared S: f32[32]:\n        barrier\n        \
              for t in 0..32 thread.x:\n          S[t] = A[b * 32 + t]\n        barrier\n        \
              for u in 0..32 thread.x:\n          T[b * 32 + u] = S[31 - u] + f32(k)\n  for i in 0..64:\n    B[i] = T[i]\n";
    assert_eq!(loops_error(ok), "");
    // The loop-IR text keeps shared buffers and barriers.
    let text = format!("func k [N=64]\n  input A: f32[64]\n  output B: f32[64]\n  temp T: f32[64]\n{ok}");
    let parsed = texc_schedules::text::parse(&text, texc_grammar::FileId(0)).expect("parses");
    assert_eq!(texc_schedules::ir::print(&parsed.func), text);
}

/// A mixed-precision matrix product on tensor cores: 16×8 tiles of `C`, one
/// per warp (four warps per block along `thread.y`), `k` in slices of 16.
fn tensor_core_gemm(target: &str, extra: &str) -> String {
    format!(
        "kernel hgemm(A: f16[M = 64, K = 48], B: f16[K, N = 32]) -> C: f32[M, N] {{\n    \
         C[i, j] = sum[k](f32(A[i, k]) * f32(B[k, j]));\n}}\nschedule hgemm for {target} {{\n    \
         tile C(i, j) by (16, 8) -> (io, jo, ii, ji);\n    split C.k by 16 -> (ko, ki);\n    \
         split C.io by 4 -> (ib, iw);\n    reorder C(ib, jo, iw, ko, ii, ji, ki);\n    bind C.ib to block.y;\n    \
         bind C.jo to block.x;\n    bind C.iw to thread.y;\n{extra}    tensorize C(ii, ji, ki) with mma_m16n8k16_f16f32;\n}}\n"
    )
}

#[test]
fn tensor_cores_run_like_the_interpreter_and_assemble_to_hmma() {
    require_ptxas();
    for target in GPUS {
        let src = tensor_core_gemm(target, "");
        texc_tests::check_text("hgemm.tex", &src).unwrap_or_else(|e| panic!("{e}"));
        for shapes in
            [[("M", 64), ("K", 48), ("N", 32)], [("M", 16), ("K", 16), ("N", 8)], [("M", 128), ("K", 80), ("N", 40)]]
        {
            let b =
                Bindings { shapes: shapes.iter().map(|(n, v)| (n.to_string(), *v)).collect(), ..Default::default() };
            let (mut pl, k) = texc_tests::load_text(target, "hgemm.tex", &src, None).expect("loads");
            let p = texc_tests::specialize(&mut pl, k, &b);
            let lowered =
                pl.schedule(k, p.clone()).and_then(|s| pl.lower(s)).unwrap_or_else(|e| panic!("{}", rendered(&pl, e)));
            let text = texc_schedules::ir::print(&lowered);
            assert!(text.contains("mma m16n8k16.f16.f32"), "tensorized");
            let again = texc_schedules::text::parse(&text, texc_grammar::FileId(0)).expect("the loop IR text parses");
            assert_eq!(texc_schedules::ir::print(&again.func), text, "and prints back the same");
            let args = || texc_compiler::interp::bind_args(&p, Default::default(), &[], 6).expect("binds");
            let want = texc_compiler::interp::run(&p, args()).expect("interp");
            // The loop IR, warp fragments and all, and the compiled kernels (emulated or on the GPU).
            let eval = texc_schedules::eval::run(&lowered, args()).expect("evaluates");
            assert!(texc_tests::rel_error(&eval[0], &want[0]) < 1e-6, "{shapes:?}: loop IR");
            let legal = pl.legalize(lowered).expect("legal");
            let got = pl.compile(&legal).expect("compiles").run(args()).expect("runs");
            assert!(texc_tests::rel_error(&got[0], &want[0]) < 1e-5, "{shapes:?} on {target}");
            let (ptx, _) = pl.emit_gpu(&[&legal]).expect("PTX");
            assert!(ptx.contains("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"), "{ptx}");
            let (cubin, _) = texc_codegen::cuda::assemble(&ptx, &sm(target)).unwrap_or_else(|e| panic!("{e}"));
            match texc_codegen::cuda::disassemble(&cubin) {
                Ok(sass) => assert!(sass.contains("HMMA.16816.F32"), "{target}: no HMMA in\n{sass}"),
                Err(why) => eprintln!("not disassembled: {why}"),
            }
        }
    }
}

#[test]
fn tensorize_errors_are_spanned() {
    let gemm = tensor_core_gemm("nvptx-sm90", "");
    let cases = [
        (gemm.replace("by (16, 8)", "by (32, 8)"), "tiles are 16 long along `ii`, which has 32 iterations"),
        (gemm.replace("mma_m16n8k16_f16f32", "mma_m8n8k4"), "unknown tensor-core operation `mma_m8n8k4`"),
        (gemm.replace("tensorize C(ii, ji, ki)", "tensorize C(ii, ki, ji)"), "`ki` is not a spatial axis"),
        (
            gemm.replace("f16[M = 64, K = 48], B: f16", "f32[M = 64, K = 48], B: f32"),
            "`A` is f32, but the operation multiplies f16",
        ),
        (gemm.replace("M = 64", "M = 72"), "the tiles must divide the tensors"),
        (
            gemm.replace("reorder C(ib, jo, iw, ko, ii, ji, ki);", "reorder C(ib, jo, iw, ii, ko, ji, ki);"),
            "`ii` is tensorized but is not one of the three innermost loops",
        ),
        (
            tensor_core_gemm("nvptx-sm90", "    bind C.jo to thread.x;\n").replace("bind C.jo to block.x;\n", ""),
            "inside a thread.x loop",
        ),
    ];
    assert_spanned_errors("hgemm.tex", &cases);
}

/// Without a schedule, an f16 matrix product whose sizes the tiles divide
/// runs on tensor cores; one they do not divide, on plain threads.
#[test]
fn the_default_gpu_schedule_uses_tensor_cores_where_the_tiles_fit() {
    let src = "kernel hgemm(A: f16[M, K], B: f16[K, N]) -> C: f32[M, N] {\n    \
               C[i, j] = sum[k](f32(B[k, j]) * f32(A[i, k]));\n}\n";
    for (m, k, n, tensor_cores) in [(64, 48, 32, true), (48, 32, 24, true), (16, 16, 8, true), (48, 40, 33, false)] {
        let b = Bindings { shapes: vec![("M".into(), m), ("K".into(), k), ("N".into(), n)], ..Default::default() };
        let (mut pl, p, f) = gpu_loops("hgemm.tex", src, &b);
        let (ptx, _) = pl.emit_gpu(&[&f]).expect("PTX");
        assert_eq!(ptx.contains("mma.sync"), tensor_cores, "{m}×{k}×{n}");
        assert!(error_vs_interp(&mut pl, &p, &f, 8) < 1e-5, "{m}×{k}×{n}");
    }
}

/// A warp's tiles of tensor-core operations (here 2×2 of them, the
/// reduction in slices of 32 with two operations each) keep their
/// accumulators in registers through the reduction loop: the loop's PTX
/// loads and stores no `C`. Against the interpreter on the GPU (the
/// emulation computes each operation in memory); the `mma.sync` default
/// schedule's warp tiles (through shared memory) do the same, and assemble
/// without spills.
#[test]
fn warp_tiles_keep_their_accumulators_in_registers() {
    require_ptxas();
    let src = "kernel hgemm(A: f16[M = 64, K = 96], B: f16[K, N = 48]) -> C: f32[M, N] {\n    \
               C[i, j] = sum[k](f32(A[i, k]) * f32(B[k, j]));\n}\nschedule hgemm for nvptx-sm90 {\n    \
               tile C(i, j) by (32, 16) -> (iwt, jwt, i2, j2);\n    tile C(i2, j2) by (16, 8) -> (mi, nj, ii, ji);\n    \
               split C.k by 32 -> (ko, k2);\n    split C.k2 by 16 -> (kk, ki);\n    \
               reorder C(iwt, jwt, ko, kk, mi, nj, ii, ji, ki);\n    bind C.iwt to block.y;\n    \
               bind C.jwt to thread.y;\n    tensorize C(ii, ji, ki) with mma_m16n8k16_f16f32;\n}\n";
    texc_tests::check_text("hgemm.tex", src).unwrap_or_else(|e| panic!("{e}"));
    let (mut pl, p, f) = gpu_loops("hgemm.tex", src, &Bindings::default());
    assert!(error_vs_interp(&mut pl, &p, &f, 5) < 1e-5);
    let default = "kernel hgemm(A: f16[M = 128, K = 64], B: f16[K, N = 256]) -> C: f32[M, N] {\n    \
                   C[i, j] = sum[k](f32(A[i, k]) * f32(B[k, j]));\n}\n";
    // (The `mma.sync` default of sm_80, which sm_90 keeps under `--knob wgmma=0`.)
    let (mut dpl, dp, df) = gpu_loops_with("hgemm.tex", default, &Bindings::default(), &[("wgmma", 0)]);
    assert!(error_vs_interp(&mut dpl, &dp, &df, 6) < 1e-5, "the default schedule");
    let (ptx, _) = pl.emit_gpu(&[&f]).expect("PTX");
    let kernel = &ptx[ptx.rfind(".entry").expect("kernels")..];
    let label = kernel.find("$L__BB").expect("a loop");
    let back = kernel.rfind("bra").expect("its branch back");
    let body = &kernel[label..back];
    assert_eq!(body.matches("mma.sync").count(), 8, "{kernel}");
    assert!(!body.contains("ld.global.f32") && !body.contains("st.global.f32"), "C in the loop:\n{kernel}");
    // (ptxas spills 4 bytes of the small hand-written kernel: a choice of its own.)
    texc_codegen::cuda::assemble(&ptx, "sm_90").unwrap_or_else(|e| panic!("{e}"));
    // The default's warps (64×64 of C: 4×8 tiles of four accumulators per
    // lane) load C once and store it once, around the pipelined k loop.
    let (ptx, _) = dpl.emit_gpu(&[&df]).expect("PTX");
    let kernel = &ptx[ptx.rfind(".entry").expect("kernels")..];
    assert_eq!(kernel.matches("ld.global.f32").count(), 128, "{kernel}");
    assert_eq!(kernel.matches("st.global.f32").count(), 128, "{kernel}");
    assert!(kernel.contains("cp.async.cg.shared.global") && kernel.contains("ldmatrix"), "{kernel}");
    let (_, res) = texc_codegen::cuda::assemble(&ptx, "sm_90").unwrap_or_else(|e| panic!("{e}"));
    assert!(res.iter().all(|r| r.spill_stores + r.spill_loads == 0), "no spills: {res:?}");
}

/// Operands staged in shared memory for tensor cores (benches/hgemm_shared.tex
/// at sizes the tiles divide): the block's threads load slices of `A` and
/// `B` between barriers, the warps take their fragments with `ldmatrix`
/// (`.trans` for `B`), and the accumulators stay in registers through the
/// `k` loop that holds the loads and barriers: `C` is read and written once.
#[test]
fn shared_tiles_feed_tensor_cores_through_ldmatrix() {
    require_ptxas();
    let (mut pl, k) = texc_tests::load_file("nvptx-sm90", "benches/hgemm_shared.tex", None).expect("loads");
    let b = Bindings {
        shapes: [("M", 256), ("K", 96), ("N", 384)].iter().map(|(n, v)| (n.to_string(), *v)).collect(),
        ..Default::default()
    };
    let p = texc_tests::specialize(&mut pl, k, &b);
    let f = texc_tests::loops(&mut pl, k, &p);
    assert!(error_vs_interp(&mut pl, &p, &f, 7) < 1e-5);
    let (ptx, _) = pl.emit_gpu(&[&f]).expect("PTX");
    let kernel = &ptx[ptx.rfind(".entry").expect("kernels")..];
    assert!(kernel.contains("ldmatrix.sync.aligned.m8n8.x4.shared.b16"), "{kernel}");
    assert!(kernel.contains("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16"), "{kernel}");
    // 4×8 tiles of four accumulators per lane: loaded once, stored once.
    assert_eq!(kernel.matches("ld.global.f32").count(), 128, "{kernel}");
    assert_eq!(kernel.matches("st.global.f32").count(), 128, "{kernel}");
    let (_, res) = texc_codegen::cuda::assemble(&ptx, "sm_90").unwrap_or_else(|e| panic!("{e}"));
    assert!(res.iter().all(|r| r.spill_stores + r.spill_loads == 0), "no spills: {res:?}");
}

/// `vectorize` on a GPU: a thread's contiguous elements are one access of
/// up to 16 bytes where the first one's offset is provably aligned (8
/// halves in, 2×4 floats out), else element by element; the same results
/// as the interpreter either way.
#[test]
fn vectorized_gpu_accesses_are_16_bytes_where_aligned() {
    require_ptxas();
    let src = |shift: &str| {
        format!(
            "kernel cp(A: f16[M = 16, K = 72]) -> B: f32[M, 64] {{\n    B[i, k] = f32(A[i, k{shift}]) * 2.0;\n}}\n\
             schedule cp for nvptx-sm90 {{\n    split B.k by 8 -> (ko, kv);\n    bind B.i to block.x;\n    \
             bind B.ko to thread.x;\n    vectorize B.kv;\n}}\n"
        )
    };
    for (shift, wide_loads) in [("", true), (" + 1", false), (" + 8", true)] {
        let text = src(shift);
        texc_tests::check_text("cp.tex", &text).unwrap_or_else(|e| panic!("{e}"));
        let (mut pl, p, f) = gpu_loops("cp.tex", &text, &Bindings::default());
        assert_eq!(error_vs_interp(&mut pl, &p, &f, 3), 0.0, "A[i, k{shift}]");
        let (ptx, _) = pl.emit_gpu(&[&f]).expect("PTX");
        assert_eq!(ptx.contains("ld.global.nc.v4.u32"), wide_loads, "A[i, k{shift}]:\n{ptx}");
        assert!(ptx.contains("st.global.v4.f32"), "the output's offsets are aligned:\n{ptx}");
        texc_codegen::cuda::assemble(&ptx, "sm_90").unwrap_or_else(|e| panic!("{e}"));
    }
}

/// Reductions over a block's threads (`bind S.r to thread.x`): every
/// reduction operator, thread counts that fill whole warps, part of one,
/// and several with a part of the last, against the interpreter; the
/// parts meet in warp shuffles (`shfl.sync.bfly`, 8-byte elements as two
/// words), else (bytes, one thread) in a tree in shared memory; and the
/// default schedule's block per row.
#[test]
fn reductions_over_a_blocks_threads() {
    require_ptxas();
    let cases = [(100, 64), (64, 32), (1, 32), (300, 256), (33, 8), (200, 200), (40, 3)];
    for (op, init) in [("sum", ""), ("max", ""), ("min", ""), ("prod", "0.5 + 0.25 * ")] {
        for (elem, (d, split)) in ["f32", "f64", "i32", "i8"].into_iter().flat_map(|e| cases.map(|c| (e, c))) {
            let init = if elem.starts_with('i') { "" } else { init };
            let src = format!(
                "kernel r(X: {elem}[N = 5, D = {d}]) -> Y: {elem}[N] {{\n    Y[n] = {op}[d]({init}X[n, d]);\n}}\n\
                 schedule r for nvptx-sm90 {{\n    split Y.d by {split} -> (dout, din);\n    bind Y.n to block.x;\n    \
                 bind Y.din to thread.x;\n}}\n"
            );
            let what = format!("{op} of {elem} over {d} by {split}");
            texc_tests::check_text("r.tex", &src).unwrap_or_else(|e| panic!("{what}: {e}"));
            let (mut pl, p, f) = gpu_loops("r.tex", &src, &Bindings::default());
            let shuffles = elem != "i8" && split.min(d) > 1;
            assert_eq!(!f.registers.is_empty(), shuffles, "{what}: parts in registers");
            assert_eq!(!f.shared.is_empty(), !shuffles || split.min(d) > 32, "{what}: parts in shared memory");
            let err = error_vs_interp(&mut pl, &p, &f, 2);
            assert!(err < 1e-5, "{what}: error {err}");
            // The loop IR's own evaluator, on the nest as printed and parsed back.
            let text = texc_schedules::ir::print(&f);
            let again = texc_schedules::text::parse(&text, texc_grammar::FileId(0)).expect("parses");
            assert_eq!(texc_schedules::ir::print(&again.func), text, "{what}: prints back the same");
            assert!(eval_error(&p, &again.func, 4) < 1e-5, "{what}: loop-IR evaluator");
            let (ptx, _) = pl.emit_gpu(&[&f]).expect("PTX");
            assert_eq!(ptx.contains("shfl.sync.bfly.b32"), shuffles, "{what}");
            texc_codegen::cuda::assemble(&ptx, "sm_90").unwrap_or_else(|e| panic!("{what}: {e}"));
        }
    }
    // A split of the reduction around the threads' loop: its tail is guarded, not copied.
    let src = "kernel r(X: f32[N = 5, D = 100]) -> Y: f32[N] {\n    Y[n] = sum[d](X[n, d]);\n}\n\
               schedule r for nvptx-sm90 {\n    split Y.d by 32 -> (dout, din);\n    split Y.dout by 3 -> (da, db);\n    \
               reorder Y(n, da, din, db);\n    bind Y.n to block.x;\n    bind Y.din to thread.x;\n}\n";
    let (mut pl, p, f) = gpu_loops("r.tex", src, &Bindings::default());
    assert!(error_vs_interp(&mut pl, &p, &f, 2) < 1e-5);
    // The default schedule: a block per row of a softmax.
    let (mut pl, k) = texc_tests::load_file("nvptx-sm90", "examples/softmax.tex", None).expect("loads");
    let p = texc_tests::specialize(&mut pl, k, &Bindings::default());
    let f = texc_tests::loops(&mut pl, k, &p);
    let text = texc_schedules::ir::print(&f);
    assert!(text.contains("registers m.part") && text.contains("warp_reduce sum s.part by 32"), "{text}");
}

/// Row kernels (softmax, layer_norm, their [B, N, D] forms) are one launch
/// by default: a block per row, whose max, sum, mean and variance are
/// computed where the block opens (over its threads, by warp shuffles)
/// before the row's outputs; at sizes no block divides,
/// against the interpreter.
#[test]
fn row_kernels_are_one_launch_a_block_per_row() {
    let std_rows = "import std.nn;\n\
        kernel ln(X: f32[N, D], g: f32[D], b: f32[D]) -> Y: f32[N, D] {\n    Y = layer_norm(X, g, b);\n}\n\
        kernel ln3(X: f32[B, N, D], g: f32[D], b: f32[D]) -> Y: f32[B, N, D] {\n    Y = layer_norm(X, g, b);\n}\n\
        kernel sm(X: f32[N, D]) -> Y: f32[N, D] {\n    Y = softmax(X);\n}\n";
    type Case = (&'static str, &'static str, Vec<(&'static str, i64)>);
    let cases: [Case; 5] = [
        ("sm", "examples/softmax.tex", vec![("N", 7), ("D", 1000)]),
        ("ln", "", vec![("N", 5), ("D", 333)]),
        ("ln3", "", vec![("B", 2), ("N", 3), ("D", 65)]),
        ("sm", "", vec![("N", 3), ("D", 4097)]),
        ("ln", "", vec![("N", 4), ("D", 64)]),
    ];
    for (kernel, file, shapes) in cases {
        let b = Bindings { shapes: shapes.iter().map(|(n, v)| (n.to_string(), *v)).collect(), ..Default::default() };
        let (mut pl, k) = if file.is_empty() {
            texc_tests::load_text("nvptx-sm90", "rows.tex", std_rows, Some(kernel)).expect("loads")
        } else {
            texc_tests::load_file("nvptx-sm90", file, None).expect("loads")
        };
        let p = texc_tests::specialize(&mut pl, k, &b);
        let f = texc_tests::loops(&mut pl, k, &p);
        let launches = texc_schedules::gpu::launches(&f, pl.target()).expect("legal");
        assert_eq!(launches.len(), 1, "{kernel} {shapes:?}: one launch\n{}", texc_schedules::ir::print(&f));
        let err = error_vs_interp(&mut pl, &p, &f, 3);
        assert!(err < 1e-5, "{kernel} {shapes:?}: error {err}");
        let (ptx, _) = pl.emit_gpu(&[&f]).expect("PTX");
        texc_codegen::cuda::assemble(&ptx, "sm_90").unwrap_or_else(|e| panic!("{e}"));
    }
}

/// TF32 tensor cores for an f32 product, asked for by name: inputs rounded
/// to TF32 (so about 1e-3 from f32 arithmetic), in the loop-IR evaluator and
/// in the compiled kernels alike.
#[test]
fn tf32_tensor_cores_round_their_inputs() {
    require_ptxas();
    let src = "kernel sgemm(A: f32[M = 64, K = 48], B: f32[K, N = 32]) -> C: f32[M, N] {\n    \
               C[i, j] = sum[k](A[i, k] * B[k, j]);\n}\nschedule sgemm for nvptx-sm80 {\n    \
               tile C(i, j) by (16, 8) -> (io, jo, ii, ji);\n    split C.k by 8 -> (ko, ki);\n    \
               reorder C(io, jo, ko, ii, ji, ki);\n    bind C.io to block.y;\n    bind C.jo to block.x;\n    \
               tensorize C(ii, ji, ki) with mma_m16n8k8_tf32f32;\n}\n";
    texc_tests::check_text("sgemm.tex", src).unwrap_or_else(|e| panic!("{e}"));
    let (mut pl, k) = texc_tests::load_text("nvptx-sm80", "sgemm.tex", src, None).expect("loads");
    let p = texc_tests::specialize(&mut pl, k, &Bindings::default());
    let lowered = pl.schedule(k, p.clone()).and_then(|s| pl.lower(s)).expect("lowers");
    let args = || texc_compiler::interp::bind_args(&p, Default::default(), &[], 9).expect("binds");
    let exact = texc_compiler::interp::run(&p, args()).expect("interp");
    let eval = texc_schedules::eval::run(&lowered, args()).expect("evaluates");
    let legal = pl.legalize(lowered).expect("legal");
    let got = pl.compile(&legal).expect("compiles").run(args()).expect("runs");
    for (what, x) in [("loop IR", &eval[0]), ("kernels", &got[0])] {
        let err = texc_tests::rel_error(x, &exact[0]);
        assert!(err > 1e-5 && err < 2e-3, "{what}: TF32 error {err}");
    }
    assert!(texc_tests::rel_error(&got[0], &eval[0]) < 1e-5, "both round the same inputs");
    let (ptx, _) = pl.emit_gpu(&[&legal]).expect("PTX");
    assert!(ptx.contains("cvt.rna.tf32.f32") && ptx.contains("m16n8k8.row.col.f32.tf32.tf32.f32"), "{ptx}");
    let (cubin, _) = texc_codegen::cuda::assemble(&ptx, "sm_80").unwrap_or_else(|e| panic!("{e}"));
    if let Ok(sass) = texc_codegen::cuda::disassemble(&cubin) {
        assert!(sass.contains("HMMA.1688.F32.TF32"), "{sass}");
    }
}

/// `pipeline C.ko by n` on the shared-memory GEMM: the copies become
/// `cp.async` groups `n - 1` slices ahead, in `n` slots per buffer.
/// Against the interpreter for 2 to 4 stages and 1 to 5 slices of k (fewer
/// slices than stages too): on the CPU emulation (or the GPU), and in the
/// loop-IR evaluator, whose copies land only at the `async wait` that
/// retires them — so a wait too few or too late would read stale slots.
/// The PTX has the copies, the groups and `ldmatrix` from padded rows.
#[test]
fn pipelined_copies_feed_the_tensor_cores() {
    require_ptxas();
    let text = |stages: i64, k: i64| {
        let src = std::fs::read_to_string(texc_tests::root().join("benches/hgemm_pipelined.tex")).expect("bench file");
        let src = src.replace("M = 4096, K = 4096", &format!("M = 128, K = {k}")).replace("N = 4096", "N = 256");
        let i = src.rfind("pipeline C.ko by").expect("pipelined");
        let j = i + src[i..].find(';').expect("statement");
        format!("{}pipeline C.ko by {stages}{}", &src[..i], &src[j..])
    };
    for (stages, slices) in [(2, 1), (2, 4), (3, 1), (3, 2), (3, 5)] {
        let src = text(stages, 32 * slices);
        texc_tests::check_text("hp.tex", &src).unwrap_or_else(|e| panic!("{e}"));
        let (mut pl, p, f) = gpu_loops("hp.tex", &src, &Bindings::default());
        let what = format!("{stages} stages, {slices} slices");
        assert!(error_vs_interp(&mut pl, &p, &f, 11) < 1e-5, "{what}");
        assert!(eval_error(&p, &f, 11) < 1e-5, "loop-IR evaluator, {what}");
        let (ptx, _) = pl.emit_gpu(&[&f]).expect("PTX");
        let kernel = &ptx[ptx.rfind(".entry").expect("kernels")..];
        assert!(kernel.contains("cp.async.cg.shared.global"), "{what}:\n{kernel}");
        assert!(kernel.contains(&format!("cp.async.wait_group {}", stages - 2)), "{what}:\n{kernel}");
        assert!(kernel.contains("ldmatrix.sync.aligned.m8n8.x4.shared.b16"), "{what}");
        texc_codegen::cuda::assemble(&ptx, "sm_90").unwrap_or_else(|e| panic!("{what}: {e}"));
    }
}

/// The evaluator's copies land at their wait: loop nests that read a slot
/// before waiting for it compute something else, and the launch rules
/// reject them (a wait for too few groups; no barrier after the wait).
#[test]
fn reading_a_copy_before_it_lands_is_refused() {
    let src = std::fs::read_to_string(texc_tests::root().join("benches/hgemm_pipelined.tex")).expect("bench");
    let src = src.replace("M = 4096, K = 4096", "M = 128, K = 96").replace("N = 4096", "N = 128");
    let src = src.replace("pipeline C.ko by 2;", "pipeline C.ko by 3;");
    let (_, p, f) = gpu_loops("hp.tex", &src, &Bindings::default());
    let text = texc_schedules::ir::print(&f);
    assert!(text.contains("async wait 1\n"), "{text}");
    let t = texc_compiler::target::lookup("nvptx-sm90").expect("target");
    let parsed = texc_schedules::text::parse(&text, texc_grammar::FileId(0)).expect("parses");
    assert!(eval_error(&p, &parsed.func, 5) < 1e-5, "as printed");
    let args = || texc_compiler::interp::bind_args(&p, Default::default(), &[], 5).expect("binds");
    let want = texc_compiler::interp::run(&p, args()).expect("interp");
    for (broken, why) in [
        (text.replacen("async wait 1\n", "async wait 2\n", 1), "used while an asynchronous copy into it is in flight"),
        (text.replacen("async wait 1\n            barrier\n", "async wait 1\n", 1), "in flight"),
    ] {
        assert_ne!(broken, text);
        let parsed = texc_schedules::text::parse(&broken, texc_grammar::FileId(0)).expect("parses");
        let err = texc_schedules::gpu::launches(&parsed.func, t).expect_err("refused");
        assert!(err.message.contains(why), "{}", err.message);
        // Run anyway, a wait for too few groups reads slots not yet copied
        // (never written: an error; or stale: other numbers).
        if broken.contains("async wait 2") {
            let wrong = texc_schedules::eval::run(&parsed.func, args())
                .map_or(true, |got| texc_tests::rel_error(&got[0], &want[0]) > 1e-2);
            assert!(wrong, "a late wait reads what is not there yet");
        }
    }
}

/// Without a schedule, an f16 convolution whose sizes the shared-memory
/// product's tiles divide becomes a tensor-core product
/// (`schedules/src/im2col.rs`) whose columns are gathered from the image
/// into shared memory (an implicit im2col: synchronous copies, the
/// filters' by `cp.async`), or with `--knob gather=0` written out first —
/// on Hopper's warpgroups, or `mma.sync` warps with `--knob wgmma=0`;
/// others keep the direct schedule. Against the interpreter either way (on
/// the GPU where there is one).
#[test]
fn the_default_gpu_schedule_runs_convolutions_as_tensor_core_products() {
    require_ptxas();
    for (shape, products, gather, wgmma) in [
        ("N=2,C=32,H=18,W=34,K=64", true, true, false),
        ("N=2,C=32,H=18,W=34,K=64", true, false, true),
        ("N=1,C=32,H=10,W=10,K=128", true, true, true),
        ("N=1,C=32,H=10,W=10,K=128", true, false, false),
        ("N=2,C=32,H=18,W=20,K=48", false, true, true),
        ("N=1,C=7,H=10,W=10,K=64", false, true, false),
    ] {
        let (mut pl, k) = texc_tests::load_file("nvptx-sm90", "benches/conv_f16.tex", None).expect("loads");
        pl.options.knobs.insert("gather".into(), i64::from(gather));
        pl.options.knobs.insert("wgmma".into(), i64::from(wgmma));
        let b = sizes(shape);
        let p = texc_tests::specialize(&mut pl, k, &b);
        let f = texc_tests::loops(&mut pl, k, &p);
        let temps: Vec<String> = f.live_temps().iter().map(|&t| f.p.tensor(t).name.clone()).collect();
        let shape = format!("{shape}, gather={gather}, wgmma={wgmma}");
        assert_eq!(temps.contains(&"Y.cols".to_string()), products && !gather, "{shape}: {temps:?}");
        assert_eq!(temps.contains(&"Y.gemm".to_string()), products, "{shape}: {temps:?}");
        let text = texc_schedules::ir::print(&f);
        let gathered = text.lines().any(|l| l.contains("Y.gemm.Bs[") && l.contains("= X["));
        assert_eq!(gathered, products && gather, "{shape}: the columns' copy reads the image");
        assert!(error_vs_interp(&mut pl, &p, &f, 3) < 1e-5, "{shape}");
        assert!(eval_error(&p, &f, 3) < 1e-5, "{shape}: loop-IR evaluator");
        let (ptx, _) = pl.emit_gpu(&[&f]).expect("PTX");
        let op = if wgmma { "wgmma.mma_async" } else { "mma.sync" };
        assert_eq!(ptx.contains(op) && ptx.contains("cp.async"), products, "{shape}");
        assemble_sm90(&ptx).unwrap_or_else(|e| panic!("{shape}: {e}"));
    }
}

/// The default GPU schedule's own knobs (`texc_schedules::knobs`, family GPU) are
/// what `tune` searches there, and each reaches the shared-memory product:
/// `gtile` its block tile, `gslice` its slice of the reduction, `stages` the
/// slots of its buffers, `wgmma` (0) the `mma.sync` product on sm_90. Against the interpreter at each (on the GPU where
/// there is one).
#[test]
fn the_default_gpu_schedules_knobs_set_its_tiles_slices_and_stages() {
    require_ptxas();
    let (pl, k) = texc_tests::load_file("nvptx-sm90", "examples/gemm_f16.tex", None).expect("loads");
    let names: Vec<String> = pl.tunables(k).into_iter().map(|t| t.name).collect();
    assert_eq!(names, ["gather", "gtile", "gslice", "stages", "wgmma", "rewrite", "winograd", "im2col"]);
    // Below sm_90 `wgmma` changes nothing: not tried there.
    let (pl80, k80) = texc_tests::load_file("nvptx-sm80", "examples/gemm_f16.tex", None).expect("loads");
    let names80: Vec<String> = pl80.tunables(k80).into_iter().map(|t| t.name).collect();
    assert_eq!(names80, ["gather", "gtile", "gslice", "stages", "rewrite", "winograd", "im2col"]);
    let cases = [(128, 64, 3, 1), (64, 32, 2, 1), (128, 32, 4, 0), (64, 64, 3, 0), (128, 64, 3, 0), (64, 32, 4, 1)];
    for (tile, slice, stages, wgmma) in cases {
        let (mut pl, k) = texc_tests::load_file("nvptx-sm90", "examples/gemm_f16.tex", None).expect("loads");
        for (n, v) in [("gtile", tile), ("gslice", slice), ("stages", stages), ("wgmma", wgmma)] {
            pl.options.knobs.insert(n.into(), v);
        }
        let p = texc_tests::specialize(&mut pl, k, &sizes("M=128,K=192,N=256"));
        let f = texc_tests::loops(&mut pl, k, &p);
        let text = texc_schedules::ir::print(&f);
        let what = format!("gtile={tile}, gslice={slice}, stages={stages}, wgmma={wgmma}");
        let a = if wgmma == 1 && slice == 64 {
            // Rows of 128 bytes, swizzled.
            format!("shared C.As: f16[{stages}, {tile}, 64]")
        } else if wgmma == 1 {
            // The descriptors' layout without swizzling: 8 × 8 core matrices, K-major.
            format!("shared C.As: f16[{stages}, {}, {tile}, 8]", slice / 8)
        } else {
            // Rows padded by 8 halves against bank conflicts.
            format!("shared C.As: f16[{stages}, {tile}, {}]", slice + 8)
        };
        assert!(text.contains(&a), "{what}: no `{a}`:\n{text}");
        assert!(text.contains(&format!("for ib in 0..{} block.y", 128 / tile)), "{what}:\n{text}");
        assert!(error_vs_interp(&mut pl, &p, &f, 4) < 1e-5, "{what}");
        let (ptx, _) = pl.emit_gpu(&[&f]).expect("PTX");
        assert_eq!(ptx.contains("wgmma.mma_async"), wgmma == 1, "{what}");
        assemble_sm90(&ptx).unwrap_or_else(|e| panic!("{what}: {e}"));
    }
}

/// `pipeline` errors point at the schedule, with the reason.
#[test]
fn pipeline_errors_are_spanned() {
    let src = std::fs::read_to_string(texc_tests::root().join("benches/hgemm_pipelined.tex")).expect("bench");
    let src = src.replace("M = 4096, K = 4096", "M = 128, K = 96").replace("N = 4096", "N = 128");
    let cases = [
        (src.replace("pipeline C.ko by 2;", "pipeline C.ko by 9;"), "a pipeline has 2 to 8 stages, not 9"),
        (src.replace("pipeline C.ko by 2;", "pipeline C.kk by 2;"), "no shared buffer is computed at it"),
        (src.replace("    vectorize As.akv;\n", ""), "each thread copies 2 bytes of `As` at a time"),
        (src.replace("pipeline C.ko by 2;", "pipeline C.iw by 2;"), "`iw` is thread.z: only a serial loop"),
        (src.replace("pipeline C.ko by 2;", "pipeline C.ko by 2;\n    pipeline C.kk by 2;"), "already has a pipelined"),
        (
            "kernel mm(A: f32[M = 8, K = 8], B: f32[K, N = 8]) -> C: f32[M, N] {\n    \
             C[i, j] = sum[k](A[i, k] * B[k, j]);\n}\nschedule mm for x86-avx2 {\n    \
             split C.k by 4 -> (ko, ki);\n    pipeline C.ko by 2;\n}\n"
                .to_string(),
            "`pipeline` is a GPU primitive",
        ),
    ];
    assert_spanned_errors("hp.tex", &cases);
}

/// Without a schedule, an element-wise stage of 4-byte elements whose reads
/// walk the innermost axis densely (or not at all) moves 16 bytes per
/// thread access (4 lanes, `ld.global.nc.v4` / `st.global.v4`); a read
/// across rows, or a count of elements the vectors do not divide, keeps
/// element accesses. Against the interpreter either way, libdevice calls
/// (`erf`) lane by lane.
#[test]
fn the_default_gpu_schedule_moves_16_bytes_per_access_in_element_wise_stages() {
    require_ptxas();
    let kernel = |d: i64, body: &str| {
        format!(
            "kernel ew(X: f32[N = 64, D = {d}], T: f32[D, N], g: f32[D], b: f32[N]) -> Y: f32[N, D] {{\n    \
             Y[n, d] = {body};\n}}\n"
        )
    };
    for (d, body, wide) in [
        (256, "0.5 * X[n, d] * (1.0 + erf(X[n, d] / sqrt(2.0)))", true),
        (256, "X[n, d] * g[d] + b[n]", true),
        (257, "X[n, d] * g[d] + b[n]", false),
        (256, "X[n, d] + T[d, n]", false),
    ] {
        let src = kernel(d, body);
        let (mut pl, p, f) = gpu_loops("ew.tex", &src, &Bindings::default());
        assert!(error_vs_interp(&mut pl, &p, &f, 4) < 1e-6, "{body} at D = {d}");
        let (ptx, _) = pl.emit_gpu(&[&f]).expect("PTX");
        assert_eq!(ptx.contains("st.global.v4.f32"), wide, "{body} at D = {d}:\n{ptx}");
        assert_eq!(ptx.contains("ld.global.nc.v4.f32"), wide, "{body} at D = {d}");
        texc_codegen::cuda::assemble(&ptx, "sm_90").unwrap_or_else(|e| panic!("{e}"));
    }
}

/// bf16 products on tensor cores (`mma.sync ... bf16.bf16.f32`): the default
/// schedule's pipelined product through shared memory (`ldmatrix` of bf16
/// rows; on sm_90 `wgmma ... bf16.bf16` unless `--knob wgmma=0`), its
/// product from global memory at sizes the shared tiles do not divide, and
/// a hand schedule's `tensorize ... with mma_m16n8k16_bf16f32`.
/// Against the interpreter (bf16 is exact in f32, so only the order of the
/// f32 sums differs), assembled by ptxas.
#[test]
fn bf16_products_run_on_tensor_cores() {
    require_ptxas();
    let default = "kernel g(A: bf16[M, K], B: bf16[K, N]) -> C: f32[M, N] {\n    \
                   C[i, j] = sum[k](f32(A[i, k]) * f32(B[k, j]));\n}\n";
    let mma = "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32";
    let wgmma = "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16";
    for (m, k, n, wgmma_knob, op, shared) in
        [(128, 96, 256, 0, mma, true), (48, 32, 24, 1, mma, false), (128, 96, 256, 1, wgmma, true)]
    {
        let b = Bindings { shapes: vec![("M".into(), m), ("K".into(), k), ("N".into(), n)], ..Default::default() };
        let (mut pl, p, f) = gpu_loops_with("g.tex", default, &b, &[("wgmma", wgmma_knob)]);
        assert!(error_vs_interp(&mut pl, &p, &f, 9) < 1e-5, "{m}×{k}×{n}");
        let (ptx, _) = pl.emit_gpu(&[&f]).expect("PTX");
        assert!(ptx.contains(op), "{m}×{k}×{n}");
        // `wgmma` reads its operands from shared memory itself: no `ldmatrix`.
        assert_eq!(ptx.contains("ldmatrix") && ptx.contains("cp.async"), shared && op == mma, "{m}×{k}×{n}");
        assemble_sm90(&ptx).unwrap_or_else(|e| panic!("{e}"));
    }
    let hand = tensor_core_gemm("nvptx-sm90", "")
        .replace("f16[M = 64, K = 48], B: f16", "bf16[M = 64, K = 48], B: bf16")
        .replace("mma_m16n8k16_f16f32", "mma_m16n8k16_bf16f32");
    texc_tests::check_text("hgemm.tex", &hand).unwrap_or_else(|e| panic!("{e}"));
    let (mut pl, p, f) = gpu_loops("hgemm.tex", &hand, &Bindings::default());
    assert!(error_vs_interp(&mut pl, &p, &f, 2) < 1e-5);
    // The loop-IR evaluator assembles the warp's fragments from the same layouts.
    let args = || texc_compiler::interp::bind_args(&p, Default::default(), &[], 2).expect("binds");
    let want = texc_compiler::interp::run(&p, args()).expect("interp");
    let got = texc_schedules::eval::run(&f, args()).expect("evaluates");
    assert!(texc_tests::rel_error(&got[0], &want[0]) < 1e-5);
    let err = texc_tests::check_text("hgemm.tex", &hand.replace("mma_m16n8k16_bf16f32", "mma_m16n8k16_f16f32"))
        .expect_err("f16 operation on bf16 operands");
    assert!(err.contains("`A` is bf16, but the operation multiplies f16"), "{err}");
    // Arithmetic on bf16 values is refused by name, for the GPU and its emulation alike.
    let arith = "kernel s(X: bf16[N = 64]) -> Y: bf16[N] {\n    Y[i] = X[i] * X[i];\n}\n";
    let (mut pl, _, f) = gpu_loops("s.tex", arith, &Bindings::default());
    let err = pl.emit_gpu(&[&f]).map(|_| ()).expect_err("bf16 arithmetic");
    assert!(format!("{err:?}").contains("computes on bf16 values"), "{err:?}");
    assert!(pl.compile(&f).is_err(), "the emulation refuses it too");
}

/// 8-bit products on tensor cores (`mma.sync ... m16n8k32 ... s8.s8` and
/// `u8.s8`, exact into i32): the default schedule's pipelined product
/// through shared memory (`ldmatrix` of `A`'s rows, and of a weight
/// `W[j, k]`'s, whose 4 consecutive `k` make a register; a `B[k, j]` read
/// byte by byte), its product from global memory where the shared tiles do
/// not divide, plain threads where the operation's do not, an 8-bit
/// convolution as an implicit product (`crate::im2col`), and a hand
/// schedule's `tensorize ... with mma_m16n8k32_s8s32` — all equal to the
/// interpreter, on both GPU targets, assembled by ptxas to `IMMA`.
#[test]
fn int8_products_run_on_tensor_cores() {
    require_ptxas();
    let weights = |a: &str| {
        format!(
            "kernel g(A: {a}[M, K], W: i8[N, K]) -> C: i32[M, N] {{\n    \
             C[i, j] = sum[k](i32(A[i, k]) * i32(W[j, k]));\n}}\n"
        )
    };
    let rows = "kernel g(A: i8[M, K], B: i8[K, N]) -> C: i32[M, N] {\n    \
                C[i, j] = sum[k](i32(A[i, k]) * i32(B[k, j]));\n}\n";
    let s8 = ("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32", "IMMA.16832.S8.S8");
    let u8 = ("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32", "IMMA.16832.U8.S8");
    // (source, M, K, N, instruction and SASS, `ldmatrix` of A and of B)
    let cases = [
        (weights("i8"), 128, 256, 128, Some(s8), [true, true]),
        (weights("u8"), 256, 128, 128, Some(u8), [true, true]),
        (rows.to_string(), 128, 128, 256, Some(s8), [true, false]),
        (weights("i8"), 48, 64, 24, Some(s8), [false, false]),
        (weights("u8"), 100, 40, 72, None, [false, false]),
    ];
    for target in GPUS {
        for (src, m, k, n, op, ldmatrix) in &cases {
            let what = format!("{target} {m}×{k}×{n}: {src}");
            let b = sizes(&format!("M={m},K={k},N={n}"));
            let (mut pl, k) = texc_tests::load_text(target, "g.tex", src, None).expect("loads");
            let p = texc_tests::specialize(&mut pl, k, &b);
            let f = texc_tests::loops(&mut pl, k, &p);
            assert_eq!(error_vs_interp(&mut pl, &p, &f, 5), 0.0, "{what}");
            assert_eq!(eval_error(&p, &f, 5), 0.0, "{what}: loop-IR evaluator");
            let (ptx, _) = pl.emit_gpu(&[&f]).expect("PTX");
            assert_eq!(ptx.contains("mma.sync"), op.is_some(), "{what}");
            assert_eq!(ptx.contains("ldmatrix.sync.aligned.m8n8.x4"), ldmatrix[0], "{what}");
            assert_eq!(ptx.contains("ldmatrix.sync.aligned.m8n8.x2"), ldmatrix[1], "{what}");
            let (cubin, _) = texc_codegen::cuda::assemble(&ptx, &sm(target)).unwrap_or_else(|e| panic!("{e}"));
            let Some((instruction, sass)) = op else { continue };
            assert!(ptx.contains(instruction), "{what}");
            match texc_codegen::cuda::disassemble(&cubin) {
                Ok(text) => assert!(text.contains(sass), "{what}: no {sass} in\n{text}"),
                Err(why) => eprintln!("not disassembled: {why}"),
            }
        }
        // An 8-bit convolution: an implicit product on the same operations.
        let conv =
            "kernel c(X: i8[N, C, H, W], F: i8[K, C, R = 3, S = 3]) -> Y: i32[N, K, H - R + 1, W - S + 1] {\n    \
                    Y[n, k, h, w] = sum[c, r, s](i32(X[n, c, h + r, w + s]) * i32(F[k, c, r, s]));\n}\n";
        let (mut pl, k) = texc_tests::load_text(target, "c.tex", conv, None).expect("loads");
        let p = texc_tests::specialize(&mut pl, k, &sizes("N=2,C=32,H=18,W=20,K=64"));
        let f = texc_tests::loops(&mut pl, k, &p);
        assert_eq!(error_vs_interp(&mut pl, &p, &f, 7), 0.0, "{target}: 8-bit convolution");
        let (ptx, _) = pl.emit_gpu(&[&f]).expect("PTX");
        assert!(ptx.contains(s8.0), "{target}: the convolution's product on tensor cores");
        texc_codegen::cuda::assemble(&ptx, &sm(target)).unwrap_or_else(|e| panic!("{e}"));
        // A warp's 64 × 64 accumulators (128 registers a lane) and its
        // fragments fit without spills where the reduction is long.
        let (mut pl, k) = texc_tests::load_text(target, "g.tex", &weights("i8"), None).expect("loads");
        let p = texc_tests::specialize(&mut pl, k, &sizes("M=4096,K=4096,N=4096"));
        let f = texc_tests::loops(&mut pl, k, &p);
        let (ptx, _) = pl.emit_gpu(&[&f]).expect("PTX");
        let (_, res) = texc_codegen::cuda::assemble(&ptx, &sm(target)).unwrap_or_else(|e| panic!("{e}"));
        assert!(res.iter().all(|r| r.spill_stores + r.spill_loads == 0), "{target}: no spills at 4096³: {res:?}");
    }
    // Rows of 34 bytes: 4 bytes of a row are not one aligned word for every
    // lane (rows `g` and `g + 8`), however the tile starts: read byte by byte.
    let odd = "kernel g(A: i8[M = 16, L = 34], W: i8[N = 8, L]) -> C: i32[M, N] {\n    \
               C[i, j] = sum[k in 0..32](i32(A[i, k]) * i32(W[j, k]));\n}\n";
    let (mut pl, p, f) = gpu_loops("odd.tex", odd, &Bindings::default());
    assert_eq!(error_vs_interp(&mut pl, &p, &f, 4), 0.0);
    let (ptx, _) = pl.emit_gpu(&[&f]).expect("PTX");
    assert!(ptx.contains(s8.0) && ptx.contains("ld.global.nc.u8") && !ptx.contains("ld.global.nc.u32"), "{ptx}");
    let hand = "kernel igemm(A: i8[M = 64, K = 96], W: i8[N = 48, K]) -> C: i32[M, N] {\n    \
                C[i, j] = sum[k](i32(A[i, k]) * i32(W[j, k]));\n}\nschedule igemm for nvptx-sm80 {\n    \
                tile C(i, j) by (16, 8) -> (io, jo, ii, ji);\n    split C.k by 32 -> (ko, ki);\n    \
                reorder C(io, jo, ko, ii, ji, ki);\n    bind C.io to block.y;\n    bind C.jo to block.x;\n    \
                tensorize C(ii, ji, ki) with mma_m16n8k32_s8s32;\n}\n";
    texc_tests::check_text("igemm.tex", hand).unwrap_or_else(|e| panic!("{e}"));
    let (mut pl, k) = texc_tests::load_text("nvptx-sm80", "igemm.tex", hand, None).expect("loads");
    let p = texc_tests::specialize(&mut pl, k, &Bindings::default());
    let lowered =
        pl.schedule(k, p.clone()).and_then(|s| pl.lower(s)).unwrap_or_else(|e| panic!("{}", rendered(&pl, e)));
    let text = texc_schedules::ir::print(&lowered);
    assert!(text.contains("mma m16n8k32.s8.s32 C[io * 16 + 0, jo * 8 + 0] @ (0, 1)"), "{text}");
    assert!(text.contains("W[jo * 8 + 0, ko * 32 + 0] @ (1, 0)"), "the weight's tile runs along its rows: {text}");
    let again = texc_schedules::text::parse(&text, texc_grammar::FileId(0)).expect("the loop IR text parses");
    assert_eq!(texc_schedules::ir::print(&again.func), text, "and prints back the same");
    assert_eq!(eval_error(&p, &lowered, 3), 0.0, "loop IR");
    let legal = pl.legalize(lowered).expect("legal");
    assert_eq!(error_vs_interp(&mut pl, &p, &legal, 3), 0.0);
    let cases = [
        (hand.replace("A: i8", "A: f16"), "`A` is f16, but the operation multiplies i8"),
        (hand.replace("W: i8", "W: u8"), "`W` is u8, but the operation multiplies i8"),
        (hand.replace("mma_m16n8k32_s8s32", "mma_m16n8k32_u8s8s32"), "`A` is i8, but the operation multiplies u8"),
        (hand.replace("split C.k by 32", "split C.k by 16"), "tiles are 32 long along `ki`, which has 16 iterations"),
    ];
    assert_spanned_errors("igemm.tex", &cases);
}

/// Contractions that tensor cores do not run (f32 products, batched
/// products, direct convolutions and Winograd's batched products): by
/// default each thread computes 4×4 of the result with its accumulators in
/// registers; at sizes the tiles do not divide, against the interpreter
/// (the loop IR's evaluator and the kernels), and PTX without spills.
#[test]
fn the_default_gpu_schedule_keeps_a_threads_products_in_registers() {
    require_ptxas();
    let cases = [
        ("examples/matmul.tex", "M=37,K=19,N=70", "local C.acc: f32[4, 4]"),
        ("examples/matmul.tex", "M=130,K=33,N=257", "local C.acc: f32[4, 4]"),
        ("benches/conv_layer.tex", "C=16,H=14,W=14,K=32", "local Y.acc: f32[4, 4]"),
        ("benches/conv_layer.tex", "C=16,H=24,W=24,K=48", "local Y.acc: f32[4, 4]"),
        // Winograd F(4×4, 3×3) (`--knob winograd=4`: the cost model does not
        // choose it on GPUs): its batched product over the 36 transform positions (block.z).
        ("benches/conv_layer.tex", "C=64,H=28,W=28,K=64", "for n.i.j in 0..36 block.z:"),
    ];
    for (file, shapes, local) in cases {
        let (mut pl, k) = texc_tests::load_file("nvptx-sm90", file, None).expect("loads");
        pl.options.rewrite = true;
        if local.contains("0..36") {
            pl.options.knobs.insert(texc_pipeline::KNOB_WINOGRAD.into(), 4);
        }
        let b = sizes(shapes);
        // The e-graph's plan (Winograd where it pays), against the graph as written.
        let (built, loops) = pl.build(k, &b).unwrap_or_else(|e| panic!("{}", rendered(&pl, e)));
        let (p, f) = (built.written, loops.legal);
        let text = texc_schedules::ir::print(&f);
        let what = format!("{file} {:?}", b.shapes);
        assert!(text.contains(local) && text.contains(".acc: f32[4, 4]"), "{what}:\n{text}");
        assert!(error_vs_interp(&mut pl, &p, &f, 4) < 1e-5, "{what}");
        assert!(eval_error(&p, &f, 4) < 1e-5, "{what}: loop-IR evaluator");
        let (ptx, _) = pl.emit_gpu(&[&f]).expect("PTX");
        let (_, res) = texc_codegen::cuda::assemble(&ptx, "sm_90").unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(res.iter().all(|r| r.spill_stores + r.spill_loads == 0), "{what}: no spills: {res:?}");
    }
}

/// Attention scores and their softmax: the product on tensor cores, then
/// the rows in one launch whose max and sum are warp shuffles (the row
/// group's stages are found before the product's operand stages are
/// inserted), against the interpreter.
#[test]
fn a_product_then_a_softmax_of_its_rows() {
    require_ptxas();
    let src = "kernel att(Q: f16[M = 64, K = 64], Kt: f16[K, N = 256]) -> Y: f32[M, N] {\n    \
               S[i, j] = sum[k](f32(Q[i, k]) * f32(Kt[k, j]));\n    m[i] = max[j](S[i, j]);\n    \
               e[i, j] = exp(S[i, j] - m[i]);\n    s[i] = sum[j](e[i, j]);\n    Y[i, j] = e[i, j] / s[i];\n}\n";
    let (mut pl, p, f) = gpu_loops("att.tex", src, &Bindings::default());
    assert!(error_vs_interp(&mut pl, &p, &f, 8) < 1e-5);
    let (ptx, _) = pl.emit_gpu(&[&f]).expect("PTX");
    let launches: Vec<&str> = ptx.lines().filter(|l| l.starts_with("// texc: att_k")).collect();
    assert_eq!(launches.len(), 3, "zero the scores, the product, the rows:\n{}", launches.join("\n"));
    assert!(ptx.contains("wgmma.mma_async") && ptx.contains("shfl.sync.bfly"), "{ptx}");
    assemble_sm90(&ptx).unwrap_or_else(|e| panic!("{e}"));
}

/// On sm_90 the default schedule runs f16 products that its tiles divide
/// on Hopper's warpgroups (as `benches/hgemm_wgmma.tex`): two
/// warpgroups of 64 × 128 per block, the operands in rows of 128 bytes with
/// the 128-byte swizzle, the accumulators in registers — `C`
/// loaded once and stored once, 64 values a lane — and each slice of `k`
/// issued as its four operations behind one `wgmma.fence`, left in flight
/// until one `wgmma.wait_group` before the next slice's copies. Against the
/// interpreter (the loop-IR evaluator and the emulation, or the GPU),
/// assembled for sm_90a without spills, `HGMMA` in its SASS.
#[test]
fn the_sm90_default_runs_products_on_warpgroups_in_flight_through_a_slice() {
    require_ptxas();
    for shape in ["M=256,K=192,N=256", "M=128,K=128,N=384", "M=64,K=128,N=64"] {
        let (mut pl, k) = texc_tests::load_file("nvptx-sm90", "examples/gemm_f16.tex", None).expect("loads");
        let p = texc_tests::specialize(&mut pl, k, &sizes(shape));
        let f = texc_tests::loops(&mut pl, k, &p);
        let text = texc_schedules::ir::print(&f);
        assert!(text.contains("wgmma m64n"), "{shape}:\n{text}");
        // Slices of 64: both operands in rows of 128 bytes, swizzled.
        assert_eq!(text.matches("swizzle 128, ").count(), 2, "{shape}:\n{text}");
        if shape.contains("K=192") {
            // (At K = 128 the pipeline's copy two slices ahead is under a guard
            // no iteration passes, `if ko + 2 < 2`, whose reads the text's
            // bounds check does not prove.)
            let again = texc_schedules::text::parse(&text, texc_grammar::FileId(0)).expect("the loop IR text parses");
            assert_eq!(texc_schedules::ir::print(&again.func), text, "and prints back the same");
            // The verifier holds a swizzled operand to the layout and its pattern's start.
            for (from, to, why) in [
                ("desc(mn-major, swizzle 128, lbo 8192", "desc(mn-major, swizzle 128, lbo 4096", "8192 and 1024"),
                ("kk * 16 + 0] desc(swizzle", "kk * 16 + 4] desc(swizzle", "where the swizzle's pattern does"),
            ] {
                assert!(text.contains(from), "{text}");
                let err = texc_schedules::text::parse(&text.replacen(from, to, 1), texc_grammar::FileId(0))
                    .map(|_| ())
                    .expect_err(why);
                assert!(format!("{err:?}").contains(why), "{why}: {err:?}");
            }
        }
        assert!(eval_error(&p, &f, 5) < 1e-5, "{shape}: loop-IR evaluator");
        assert!(error_vs_interp(&mut pl, &p, &f, 5) < 1e-5, "{shape}");
        let (ptx, _) = pl.emit_gpu(&[&f]).expect("PTX");
        let kernel = &ptx[ptx.rfind(".entry").expect("kernels")..];
        let steps = 4;
        let lanes = if shape.contains("N=64") { 32 } else { 64 };
        // The descriptors' constant fields: the 128-byte swizzle (bit 62), SBO
        // 1024; `A` K-major (LBO 16, unused), `B` MN-major (LBO 64 rows × 128 bytes).
        for fields in [4611686293305360384u64, 4611686293338849280] {
            assert!(kernel.contains(&format!(", {fields};")), "{shape}: no descriptor {fields:#x}\n{kernel}");
        }
        for (what, n) in [
            ("wgmma.fence", 1),
            ("wgmma.mma_async", steps),
            ("wgmma.commit_group", steps),
            ("wgmma.wait_group", 1),
            ("ld.global.f32", lanes),
            ("st.global.f32", lanes),
        ] {
            assert_eq!(kernel.matches(what).count(), n, "{shape}: {what}\n{kernel}");
        }
        let (cubin, res) = assemble_sm90(&ptx).unwrap_or_else(|e| panic!("{shape}: {e}"));
        assert!(res.iter().all(|r| r.spill_stores + r.spill_loads == 0), "{shape}: no spills: {res:?}");
        // Nor did ptxas serialize the operations left in flight (it warns when it does).
        assert!(res.iter().all(|r| r.warnings.is_empty()), "{shape}: {res:?}");
        match texc_codegen::cuda::disassemble(&cubin) {
            Ok(sass) => assert!(sass.contains("HGMMA.64x"), "{shape}: no HGMMA in\n{sass}"),
            Err(e) => eprintln!("skipping the SASS check: {e}"),
        }
    }
}

/// An f16 (or bf16) product on one warpgroup per block with
/// `wgmma_m64n{n}k16`: 64×`n` of `C` per block, its operands staged in
/// shared memory by the block's 128 threads, `k` in slices of 16.
fn wgmma_gemm(n: i64, ab: &str, extra: &str) -> String {
    format!(
        "kernel hgemm(A: {ab}[M = 128, K = 48], B: {ab}[K, N = {n2}]) -> C: f32[M, N] {{\n    \
         C[i, j] = sum[k](f32(A[i, k]) * f32(B[k, j]));\n}}\nschedule hgemm for nvptx-sm90 {{\n    \
         tile C(i, j) by (64, {n}) -> (ib, jb, ii, ji);\n    split C.k by 16 -> (ko, ki);\n    \
         reorder C(ib, jb, ko, ii, ji, ki);\n    cache_read A for C at C.ko in shared -> As;\n    \
         cache_read B for C at C.ko in shared -> Bs;\n    fuse As(i, k) -> aik;\n    \
         split As.aik by 128 -> (aio, ait);\n    bind As.ait to thread.x;\n    fuse Bs(k, j) -> bkj;\n    \
         split Bs.bkj by 128 -> (bko, bkt);\n    bind Bs.bkt to thread.x;\n    bind C.ib to block.y;\n    \
         bind C.jb to block.x;\n{extra}    tensorize C(ii, ji, ki) with wgmma_m64n{n}k16_{ab}f32;\n}}\n",
        n2 = 2 * n
    )
}

/// `wgmma` against the interpreter: the loop-IR evaluator (the 128 lanes'
/// accumulator fragments by the ISA's table, `A` and `B` read where their
/// descriptors' canonical layout puts each element — so a wrong table or a
/// buffer filled in another layout gives wrong products) and the CPU
/// emulation (which reads the operands by the descriptor too), at several
/// N and K; `ptxas` assembles the kernels for sm_90a, and their SASS has `HGMMA`.
#[test]
fn wgmma_runs_like_the_interpreter_and_assembles_to_hgmma() {
    require_ptxas();
    for (n, ab) in [(64, "f16"), (8, "f16"), (128, "bf16"), (256, "f16"), (24, "bf16")] {
        let src = wgmma_gemm(n, ab, "");
        texc_tests::check_text("hgemm.tex", &src).unwrap_or_else(|e| panic!("{e}"));
        for (m, k) in [(128, 48), (64, 16), (192, 80)] {
            let shapes = [("M", m), ("K", k), ("N", 2 * n)];
            let b =
                Bindings { shapes: shapes.iter().map(|(n, v)| (n.to_string(), *v)).collect(), ..Default::default() };
            let (mut pl, kn) = texc_tests::load_text("nvptx-sm90", "hgemm.tex", &src, None).expect("loads");
            let p = texc_tests::specialize(&mut pl, kn, &b);
            let lowered =
                pl.schedule(kn, p.clone()).and_then(|s| pl.lower(s)).unwrap_or_else(|e| panic!("{}", rendered(&pl, e)));
            let text = texc_schedules::ir::print(&lowered);
            assert!(text.contains(&format!("wgmma m64n{n}k16.{ab}.f32")), "tensorized:\n{text}");
            assert!(text.contains("desc(lbo"), "{text}");
            let again = texc_schedules::text::parse(&text, texc_grammar::FileId(0)).expect("the loop IR text parses");
            assert_eq!(texc_schedules::ir::print(&again.func), text, "and prints back the same");
            let args = || texc_compiler::interp::bind_args(&p, Default::default(), &[], 6).expect("binds");
            let want = texc_compiler::interp::run(&p, args()).expect("interp");
            let eval = texc_schedules::eval::run(&lowered, args()).expect("evaluates");
            assert!(texc_tests::rel_error(&eval[0], &want[0]) < 1e-6, "{n} {ab} {shapes:?}: loop IR");
            let legal = pl.legalize(lowered).expect("legal");
            let got = pl.compile(&legal).expect("compiles").run(args()).expect("runs");
            assert!(texc_tests::rel_error(&got[0], &want[0]) < 1e-5, "{n} {ab} {shapes:?}: emulation");
            let (ptx, _) = pl.emit_gpu(&[&legal]).expect("PTX");
            let op = format!("wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ab}.{ab}");
            assert!(ptx.contains(&op) && ptx.contains(".target sm_90a") && ptx.contains(".version 8.0"), "{ptx}");
            let (cubin, _) = texc_codegen::cuda::assemble(&ptx, "sm_90a").unwrap_or_else(|e| panic!("{e}"));
            match texc_codegen::cuda::disassemble(&cubin) {
                Ok(sass) => assert!(sass.contains("HGMMA.64x"), "no HGMMA in\n{sass}"),
                Err(why) => eprintln!("not disassembled: {why}"),
            }
        }
    }
}

#[test]
fn wgmma_errors_are_spanned() {
    let gemm = wgmma_gemm(64, "f16", "");
    let cases = [
        (gemm.replace("for nvptx-sm90", "for nvptx-sm80"), "is a warpgroup operation of Hopper (sm_90a)"),
        (gemm.replace("wgmma_m64n64k16", "wgmma_m64n12k16"), "unknown tensor-core operation `wgmma_m64n12k16_f16f32`"),
        (gemm.replace("wgmma_m64n64k16", "wgmma_m64n32k16"), "tiles are 32 long along `ji`, which has 64 iterations"),
        (
            gemm.replace("    cache_read A for C at C.ko in shared -> As;\n", "").replace(
                "    fuse As(i, k) -> aik;\n    split As.aik by 128 -> (aio, ait);\n    bind As.ait to thread.x;\n",
                "",
            ),
            "`wgmma` reads `A` from shared memory through a matrix descriptor",
        ),
        (gemm.replace("split As.aik by 128", "split As.aik by 256"), "has `wgmma` and 256 threads along x"),
        (
            gemm.replace("f16[M = 128, K = 48], B: f16", "f32[M = 128, K = 48], B: f32"),
            "`As` is f32, but the operation multiplies f16",
        ),
    ];
    assert_spanned_errors("hgemm.tex", &cases);
}

/// benches/hgemm_wgmma.tex (two warpgroups per block, `m64n128k16`, slices
/// of 64 of k, 3 stages of `cp.async`) at sizes its tiles divide: the
/// emulation and the loop IR (whose copies land at their `async wait`)
/// match the interpreter, the copies are 16-byte `cp.async` into the
/// descriptors' layouts, each warpgroup's 64 accumulators per thread are
/// loaded and stored once around the k loop, and at 4096³ `ptxas`
/// assembles it for sm_90a without spills.
#[test]
fn the_wgmma_bench_schedule_matches_the_interpreter_and_assembles() {
    require_ptxas();
    let (mut pl, k) = texc_tests::load_file("nvptx-sm90", "benches/hgemm_wgmma.tex", None).expect("loads");
    let b = Bindings {
        shapes: [("M", 256), ("K", 192), ("N", 384)].iter().map(|(n, v)| (n.to_string(), *v)).collect(),
        ..Default::default()
    };
    let p = texc_tests::specialize(&mut pl, k, &b);
    let f = texc_tests::loops(&mut pl, k, &p);
    assert!(error_vs_interp(&mut pl, &p, &f, 7) < 1e-5);
    assert!(eval_error(&p, &f, 7) < 1e-6);
    let (ptx, _) = pl.emit_gpu(&[&f]).expect("PTX");
    let kernel = &ptx[ptx.rfind(".entry").expect("kernels")..];
    assert_eq!(kernel.matches("wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16").count(), 4, "{kernel}");
    assert!(kernel.contains("cp.async.cg.shared.global") && !kernel.contains("st.shared"), "{kernel}");
    assert_eq!(kernel.matches("ld.global.f32").count(), 64, "{kernel}");
    assert_eq!(kernel.matches("st.global.f32").count(), 64, "{kernel}");
    let (mut pl, k) = texc_tests::load_file("nvptx-sm90", "benches/hgemm_wgmma.tex", None).expect("loads");
    let p = texc_tests::specialize(&mut pl, k, &Bindings::default());
    let f = texc_tests::loops(&mut pl, k, &p);
    let (ptx, _) = pl.emit_gpu(&[&f]).expect("PTX");
    let (_, res) = texc_codegen::cuda::assemble(&ptx, "sm_90a").unwrap_or_else(|e| panic!("{e}"));
    assert!(res.iter().all(|r| r.spill_stores + r.spill_loads == 0), "no spills: {res:?}");
}

/// A call on the caller's device memory (Python's CUDA tensors,
/// `Compiled::run_on_device`) zeroes an output first only where a read of
/// it may precede its stores: the default GPU schedules' outputs — stored
/// only, or zeroed by a fill nest of their own before a product
/// accumulates into them — are proven stored before read
/// (`zeroing::covered`), so no call pays a memset of its outputs (0.06 ms
/// of a softmax's 0.21 over 16384 × 4096 on an H200).
#[test]
fn default_gpu_outputs_are_stored_before_they_are_read() {
    for (src, shapes) in [
        ("examples/softmax.tex", "N=1000,D=4097"),
        ("examples/gemm_f16.tex", "M=512,K=320,N=384"),
        ("benches/gemm_s8.tex", "M=256,K=256,N=256"),
        ("examples/matmul.tex", "M=37,K=19,N=70"),
        ("benches/layer_norm.tex", "N=999,D=4096"),
        ("benches/conv_f16.tex", "N=2,C=32,H=18,W=20,K=48"),
    ] {
        let (mut pl, k) = texc_tests::load_file("nvptx-sm90", src, None).expect("loads");
        let p = texc_tests::specialize(&mut pl, k, &sizes(shapes));
        let f = texc_tests::loops(&mut pl, k, &p);
        for &o in &f.p.outputs {
            let name = &f.p.tensor(o).name;
            assert!(texc_schedules::zeroing::covered(&f, o, &f.body), "{src}: `{name}` may be read before stored");
        }
    }
}
