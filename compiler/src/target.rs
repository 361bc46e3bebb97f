//! Targets: one description per target texc knows, resolved once.
//!
//! A [`Target`] says everything the rest of the compiler asks about where
//! code will run: its kind, the backend that compiles for it, its vector
//! width per element type and register count (default schedules), the
//! loop kinds and memory scopes its schedules may use, the intrinsics passes
//! may introduce, its LLVM triple/CPU/features, and a nominal roofline (the
//! e-graph's cost model). Nothing else in texc compares target names.
//!
//! `host` is built at first use from the CPU texc runs on (AVX-512 lanes on
//! an AVX-512 machine). Unknown names and targets texc describes but cannot
//! compile for yet are rejected by [`lookup`] / [`Target::backend`] with one
//! message each.
//!
//! Adding a target: push one more [`Target`] in [`build_registry`]; adding
//! a backend: a [`BackendKind`] variant and an implementation of
//! `texc_codegen::Backend` (see docs/backends.md).

use crate::ops::Intrinsic;
use crate::types::ElemType;
use std::fmt;
use std::sync::OnceLock;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TargetKind {
    /// The reference interpreter.
    Interp,
    Cpu,
    Gpu,
}

/// The code generator that compiles for a target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BackendKind {
    /// No code: the reference interpreter runs the tensor IR.
    Interp,
    /// LLVM 19 through inkwell (x86-64).
    Llvm,
    /// Cranelift (x86-64, 128-bit SIMD): compiles fast.
    Cranelift,
    /// LLVM 19's NVPTX backend through inkwell: PTX for NVIDIA GPUs.
    Nvptx,
}

impl BackendKind {
    /// Every backend; the conformance tests run each one (tests/tests/backends.rs).
    pub const ALL: [BackendKind; 4] =
        [BackendKind::Interp, BackendKind::Llvm, BackendKind::Cranelift, BackendKind::Nvptx];

    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Interp => "interp",
            BackendKind::Llvm => "llvm",
            BackendKind::Cranelift => "cranelift",
            BackendKind::Nvptx => "nvptx",
        }
    }
}

/// Kinds of loops a schedule may ask for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LoopKind {
    Serial,
    /// Iterations on the CPU thread pool.
    Parallel,
    /// Iterations become vector lanes.
    Vectorized,
    Unrolled,
    /// Bound to GPU blocks (`bind ... to block.x`).
    GpuBlock,
    /// Bound to GPU threads (`bind ... to thread.x`).
    GpuThread,
    /// The elements of one asynchronous global-to-shared copy (`cp.async`).
    AsyncCopy,
}

/// Where a buffer may live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemScope {
    /// Main memory: inputs, outputs, temporaries.
    Global,
    /// Private to one iteration of a loop (`compute_at`, `cache_read`,
    /// `cache_write ... local`): the stack on CPUs, registers on GPUs.
    Local,
    /// GPU shared memory of one block.
    Shared,
}

/// A CPU for LLVM: a named CPU with features, or the machine texc runs on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LlvmCpu {
    Named {
        cpu: &'static str,
        features: &'static str,
    },
    /// LLVM's own host detection (`LLVMGetHostCPUName`/`Features`).
    Host,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LlvmTarget {
    pub triple: &'static str,
    pub cpu: LlvmCpu,
}

/// What a GPU allows one launch (CUDA's limits for the compute capability).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuSpec {
    /// Compute capability times ten (80 for sm_80).
    pub sm: u32,
    pub max_threads_per_block: i64,
    /// Largest block extent per dimension (x, y, z).
    pub max_block: [i64; 3],
    /// Largest grid extent per dimension (x, y, z).
    pub max_grid: [i64; 3],
    /// Shared memory one block may use, in bytes (with the opt-in carve-out).
    pub shared_bytes_per_block: i64,
    /// Shared memory a kernel may declare statically (the rest is dynamic).
    pub static_shared_bytes: i64,
    pub warp_size: i64,
    /// 32-bit registers one thread may have, and one block's threads together.
    pub registers_per_thread: i64,
    pub registers_per_block: i64,
}

/// A machine's roofline: f32 peak and memory bandwidth.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Roofline {
    pub peak_gflops: f64,
    pub bandwidth_gbs: f64,
}

#[derive(Clone, Debug)]
pub struct Target {
    pub name: &'static str,
    pub kind: TargetKind,
    /// `None`: texc knows the target (schedules for it are accepted and
    /// checked) but cannot compile for it yet.
    backend: Option<BackendKind>,
    pub summary: &'static str,
    /// Width of a vector register in bits (0 for targets without vectors).
    pub vector_bits: u32,
    /// Vector registers available to a kernel (register blocking).
    pub vector_registers: u32,
    pub llvm: Option<LlvmTarget>,
    /// GPU launch limits (GPU targets only).
    pub gpu: Option<GpuSpec>,
    pub loops: &'static [LoopKind],
    pub scopes: &'static [MemScope],
    pub intrinsics: Vec<Intrinsic>,
    /// Nominal machine (two cores of the project's reference machine, or the
    /// GPU's data sheet): the same on every machine, so plans are reproducible.
    pub nominal: Roofline,
    /// CPU features (`is_x86_feature_detected!` names) its code needs to run.
    pub requires: &'static [&'static str],
    /// The target this one extends: its machines run that target's code, so a
    /// kernel with no `schedule` block for this target uses that target's.
    pub extends: Option<&'static str>,
    /// Caches and cores the CPU default schedule sizes its blocks by (CPU
    /// targets): read from the machine for `host` and `cranelift`, nominal
    /// for named targets, so that their code is the same on every machine.
    pub caches: Option<CpuCaches>,
}

/// A CPU's data caches and cores, as the default schedule's blocking uses
/// them (sizes in bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CpuCaches {
    /// One core's L1 data cache.
    pub l1d: i64,
    /// One core's L2.
    pub l2: i64,
    /// One L3 (0: none), shared by `l3_cores` cores.
    pub l3: i64,
    pub l3_cores: i64,
    /// Cores texc's threads may run on.
    pub cores: i64,
    pub source: CacheSource,
}

/// Where a target's [`CpuCaches`] come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CacheSource {
    /// Fixed values: the named targets'.
    Nominal,
    /// Read from the machine (Linux sysfs, the cores texc may use).
    Machine,
    /// The machine's caches were unreadable: the nominal values, the machine's cores.
    Fallback,
    /// Set (in part) by `TEXC_HOST_CACHES`.
    Env,
}

impl CpuCaches {
    /// The machine the CPU default schedule's constants were measured on: two
    /// cores of a Zen 4 (32 KiB L1d, 1 MiB L2 per core, a 32 MiB L3), the
    /// cores of the named targets' nominal roofline. Its derived blocking is
    /// the blocking measured there.
    pub const NOMINAL: CpuCaches =
        CpuCaches { l1d: 32 << 10, l2: 1 << 20, l3: 32 << 20, l3_cores: 2, cores: 2, source: CacheSource::Nominal };

    /// One core's share of the L3.
    pub fn l3_per_core(&self) -> i64 {
        self.l3 / self.l3_cores.clamp(1, self.cores.max(1))
    }

    /// What tuning records and `texc targets` say of them: `l1d=48K,l2=1M,l3=32M/2,cores=2`.
    pub fn describe(&self) -> String {
        format!(
            "l1d={},l2={},l3={}/{},cores={}",
            size_text(self.l1d),
            size_text(self.l2),
            size_text(self.l3),
            self.l3_cores,
            self.cores
        )
    }
}

/// `48K`, `1M`, `1536K`: the largest unit that divides the size.
fn size_text(bytes: i64) -> String {
    for (unit, shift) in [("G", 30), ("M", 20), ("K", 10)] {
        if bytes > 0 && bytes % (1 << shift) == 0 {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

/// Why a target name cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    #[error("unknown target `{name}`; targets: {known}")]
    Unknown { name: String, known: String },
    #[error("target `{name}` is not built yet: texc describes it (schedules for it are checked) but cannot compile for it; targets that run: {runnable}")]
    NotBuilt { name: String, runnable: String },
    #[error("target `{name}` cannot run on this machine: {why}")]
    CannotRun { name: String, why: String },
    #[error("TEXC_HOST_CACHES: {why} (expected comma-separated `l1d=48K,l2=1M,l3=32M,l3cores=8,cores=2`, any of them; sizes in bytes or with K, M, G)")]
    HostCaches { why: String },
}

const CPU_LOOPS: &[LoopKind] = &[LoopKind::Serial, LoopKind::Parallel, LoopKind::Vectorized, LoopKind::Unrolled];
const GPU_LOOPS: &[LoopKind] = &[
    LoopKind::Serial,
    LoopKind::Unrolled,
    LoopKind::Vectorized,
    LoopKind::GpuBlock,
    LoopKind::GpuThread,
    LoopKind::AsyncCopy,
];
const CPU_SCOPES: &[MemScope] = &[MemScope::Global, MemScope::Local];
const GPU_SCOPES: &[MemScope] = &[MemScope::Global, MemScope::Local, MemScope::Shared];
const X86_TRIPLE: &str = "x86_64-unknown-linux-gnu";

impl Target {
    /// The caches and cores a CPU default schedule sizes its blocks by:
    /// this target's, or [`CpuCaches::NOMINAL`] where it has none.
    pub fn cpu_caches(&self) -> CpuCaches {
        self.caches.unwrap_or(CpuCaches::NOMINAL)
    }

    /// The backend that compiles for this target, or why there is none.
    pub fn backend(&self) -> Result<BackendKind, TargetError> {
        self.backend.ok_or_else(|| TargetError::NotBuilt { name: self.name.into(), runnable: runnable_names() })
    }

    /// Whether texc compiles code for this target (not the interpreter, not a described-only target).
    pub fn is_compiled(&self) -> bool {
        matches!(self.backend, Some(b) if b != BackendKind::Interp)
    }

    /// Whether this target's code takes software prefetches (the loop IR's
    /// `prefetch`): CPU code from LLVM does; the loop-nest evaluator runs
    /// one as the nothing it computes; Cranelift has no prefetch
    /// instruction and GPU code no such statement.
    pub fn prefetches(&self) -> bool {
        self.gpu.is_none() && matches!(self.backend, Some(BackendKind::Llvm | BackendKind::Interp))
    }

    /// Why this target cannot run tensors of element type `e`, if it cannot
    /// (the backends refuse them at code generation; `texc check` reports
    /// them at the declaration first).
    pub fn unsupported_elem(&self, e: ElemType) -> Option<&'static str> {
        match (self.backend, e) {
            // The LLVM backends (x86, NVPTX) move and convert bf16 but compute in f32 (a code-generation error otherwise).
            (Some(BackendKind::Cranelift), ElemType::BF16) => Some("the Cranelift backend does not support bf16 yet"),
            _ => None,
        }
    }

    /// Lanes of one vector register for element type `e` (1 without vectors).
    pub fn lanes(&self, e: ElemType) -> u32 {
        let bits = (e.size() * 8) as u32;
        (self.vector_bits / bits).max(1)
    }

    /// Vector width a default schedule uses for a stage producing `e`:
    /// values of 8-byte types fill a register with fewer lanes; narrower
    /// types are computed at least 32 bits wide, so they use the f32 width.
    pub fn compute_lanes(&self, e: ElemType) -> i64 {
        let wide = if e.size() == 8 { e } else { ElemType::F32 };
        self.lanes(wide) as i64
    }

    /// How many times its f32 peak (in FLOP/s) this target's 8-bit integer
    /// products reach in operations per second: `vpdpbusd` does a lane's four
    /// multiply-adds where an FMA does one (4); without it, `vpmaddwd` does
    /// two (2); AMX's `tdpbusd` does 16 × 16 × 64 in 16 cycles, 1024 a
    /// cycle where two 16-lane FMA units do 32 (32).
    pub fn int8_speedup(&self) -> f64 {
        if self.has_amx_int8() {
            32.0
        } else if self.has_vnni() {
            4.0
        } else {
            2.0
        }
    }

    /// Whether this target's `@dot4` is one instruction (either VNNI), not
    /// `vpmaddwd` on widened bytes.
    pub fn has_vnni(&self) -> bool {
        self.requires.contains(&"avx512vnni") || self.requires.contains(&"avxvnni")
    }

    /// Whether this target multiplies 8-bit integer tiles with AMX
    /// (`tdpbusd`: 16 × 64 bytes by 16 × 64 bytes into 16 × 16 `i32`).
    pub fn has_amx_int8(&self) -> bool {
        self.requires.contains(&"amx-int8")
    }

    pub fn supports_loop(&self, k: LoopKind) -> bool {
        self.loops.contains(&k)
    }

    pub fn supports_scope(&self, s: MemScope) -> bool {
        self.scopes.contains(&s)
    }

    pub fn has_intrinsic(&self, i: Intrinsic) -> bool {
        self.intrinsics.contains(&i)
    }

    /// This target, then the targets it extends, nearest first.
    pub fn lineage(&self) -> Vec<&Target> {
        let mut out = vec![self];
        while let Some(parent) = out.last().and_then(|t| t.extends).and_then(|n| lookup(n).ok()) {
            out.push(parent);
        }
        out
    }

    /// Whether code for this target can run on this machine (emitting it never needs that).
    pub fn check_runs_here(&self) -> Result<(), TargetError> {
        if let Some(spec) = self.gpu {
            let why = match texc_runtime::cuda::device() {
                Ok(d) if d.sm >= spec.sm => return Ok(()),
                Ok(d) => format!("its GPU ({}) is sm_{}, older than sm_{}", d.name, d.sm, spec.sm),
                Err(e) => e,
            };
            return Err(TargetError::CannotRun {
                name: self.name.into(),
                why: format!(
                    "{why}; `run --emulate-gpu` runs the GPU kernels on this CPU, and `emit --stage ptx` and \
                     `compile -o k.ptx` need no GPU"
                ),
            });
        }
        let missing: Vec<&str> = self.requires.iter().copied().filter(|f| !cpu_has(f)).collect();
        if missing.is_empty() {
            return Ok(());
        }
        Err(TargetError::CannotRun { name: self.name.into(), why: format!("this CPU lacks {}", missing.join(", ")) })
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name)
    }
}

/// Features this process pretends the CPU lacks: `TEXC_CPU_LACKS=avx512f`
/// (comma-separated `is_x86_feature_detected!` names) makes texc behave as on
/// a machine without them — targets needing them cannot run, `host` is the
/// widest ISA left, and its LLVM code avoids them — so that the tests of an
/// AVX2-only machine can be run on a wider one.
pub fn masked_features() -> &'static [String] {
    static MASK: OnceLock<Vec<String>> = OnceLock::new();
    MASK.get_or_init(|| {
        std::env::var("TEXC_CPU_LACKS")
            .map(|v| v.split(',').map(|f| f.trim().to_string()).filter(|f| !f.is_empty()).collect())
            .unwrap_or_default()
    })
}

/// Whether this CPU has a feature (names as `is_x86_feature_detected!` spells
/// them), unless [`masked_features`] hides it.
pub fn cpu_has(feature: &str) -> bool {
    !masked_features().iter().any(|m| m == feature) && detected(feature)
}

fn detected(feature: &str) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        match feature {
            "sse4.1" => std::arch::is_x86_feature_detected!("sse4.1"),
            "avx" => std::arch::is_x86_feature_detected!("avx"),
            "avx2" => std::arch::is_x86_feature_detected!("avx2"),
            "fma" => std::arch::is_x86_feature_detected!("fma"),
            "f16c" => std::arch::is_x86_feature_detected!("f16c"),
            "avx512f" => std::arch::is_x86_feature_detected!("avx512f"),
            "avx512vl" => std::arch::is_x86_feature_detected!("avx512vl"),
            "avx512bw" => std::arch::is_x86_feature_detected!("avx512bw"),
            "avx512dq" => std::arch::is_x86_feature_detected!("avx512dq"),
            "avx512vnni" => std::arch::is_x86_feature_detected!("avx512vnni"),
            "avxvnni" => std::arch::is_x86_feature_detected!("avxvnni"),
            // Not in `is_x86_feature_detected!` on stable Rust; also needs the OS's permission.
            "amx-int8" => texc_runtime::amx::amx_int8(),
            _ => false,
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = feature;
        false
    }
}

const AVX2: &[&str] = &["avx2", "fma", "f16c"];
const AVX512: &[&str] = &["avx512f", "avx512vl", "avx512bw", "avx512dq", "avx2", "fma", "f16c"];
const AVX2_VNNI: &[&str] = &["avxvnni", "avx2", "fma", "f16c"];
const AVX512_VNNI: &[&str] = &["avx512vnni", "avx512f", "avx512vl", "avx512bw", "avx512dq", "avx2", "fma", "f16c"];
/// AVX-512 VNNI and the tiles of AMX-INT8 (Sapphire Rapids and later).
const AVX512_AMX: &[&str] =
    &["amx-int8", "avx512vnni", "avx512f", "avx512vl", "avx512bw", "avx512dq", "avx2", "fma", "f16c"];
const AVX2_ROOF: Roofline = Roofline { peak_gflops: 239.0, bandwidth_gbs: 31.0 };
const AVX512_ROOF: Roofline = Roofline { peak_gflops: 444.0, bandwidth_gbs: 31.0 };

fn x86(
    name: &'static str,
    summary: &'static str,
    vector_bits: u32,
    cpu: LlvmCpu,
    requires: &'static [&'static str],
) -> Target {
    let wide = vector_bits >= 512;
    Target {
        name,
        kind: TargetKind::Cpu,
        backend: Some(BackendKind::Llvm),
        summary,
        vector_bits,
        vector_registers: if wide { 32 } else { 16 },
        llvm: Some(LlvmTarget { triple: X86_TRIPLE, cpu }),
        gpu: None,
        loops: CPU_LOOPS,
        scopes: CPU_SCOPES,
        intrinsics: intrinsics_of(requires),
        nominal: if wide { AVX512_ROOF } else { AVX2_ROOF },
        requires,
        extends: None,
        caches: Some(CpuCaches::NOMINAL),
    }
}

/// The target intrinsics of an x86 target needing `requires`: `fma` with
/// FMA3; with AVX2, `dot4` — one `vpdpbusd` with either VNNI, without it
/// `vpmaddwd` on the bytes widened to 16 bits in the loop (exact: nothing
/// saturates) — `dot2` (`vpmaddwd` on words widened when packed: what
/// integer products use without VNNI) and `dot4sat` (`vpmaddubsw`: what
/// they use without VNNI where constant weights cannot saturate it).
fn intrinsics_of(requires: &[&str]) -> Vec<Intrinsic> {
    let mut out = Vec::new();
    if requires.contains(&"fma") {
        out.push(Intrinsic::Fma);
    }
    if requires.contains(&"avx2") {
        out.extend([Intrinsic::Dot4, Intrinsic::Dot2, Intrinsic::Dot4Sat]);
    }
    out
}

/// The ISA of the machine texc runs on: the widest of AVX-512, AVX2, SSE4.1,
/// with VNNI where the CPU has it.
fn host() -> Target {
    let summary = "the CPU texc runs on (LLVM, its own ISA)";
    let has = |fs: &[&str]| fs.iter().all(|f| cpu_has(f));
    let (bits, requires): (u32, &'static [&'static str]) = match () {
        _ if has(AVX512_AMX) => (512, AVX512_AMX),
        _ if has(AVX512_VNNI) => (512, AVX512_VNNI),
        _ if has(AVX512) => (512, AVX512),
        _ if has(AVX2_VNNI) => (256, AVX2_VNNI),
        _ if has(AVX2) => (256, AVX2),
        _ => (128, &["sse4.1"]),
    };
    let mut t = x86("host", summary, bits, LlvmCpu::Host, requires);
    // Kernels' schedule blocks are written for the named targets.
    t.extends = match bits {
        512 if requires == AVX512_AMX => Some("x86-avx512-amx"),
        512 if requires == AVX512_VNNI => Some("x86-avx512-vnni"),
        512 => Some("x86-avx512"),
        256 if requires == AVX2_VNNI => Some("x86-avx2-vnni"),
        256 => Some("x86-avx2"),
        _ => None,
    };
    if bits == 128 {
        t.nominal = Roofline { peak_gflops: AVX2_ROOF.peak_gflops / 2.0, ..AVX2_ROOF };
    }
    t.caches = Some(host_caches().unwrap_or(CpuCaches::NOMINAL));
    t
}

/// The caches and cores of the machine texc runs on, with `TEXC_HOST_CACHES`
/// applied; its error where that variable is malformed (`lookup` then
/// refuses `host` and `cranelift` with it).
pub fn host_caches() -> Result<CpuCaches, TargetError> {
    static HOST: OnceLock<Result<CpuCaches, TargetError>> = OnceLock::new();
    HOST.get_or_init(|| {
        let machine = machine_caches();
        match std::env::var("TEXC_HOST_CACHES") {
            Ok(spec) => override_caches(machine, &spec).map_err(|why| TargetError::HostCaches { why }),
            Err(_) => Ok(machine),
        }
    })
    .clone()
}

/// This machine's caches from Linux sysfs, and the cores texc may use
/// (`available_parallelism`: the affinity mask and cgroup quota); the
/// nominal caches where sysfs cannot be read. Each cache is the smallest
/// among the CPUs this process may run on (`Cpus_allowed_list`), not
/// cpu0's: on a CPU whose cores differ (a hybrid's performance and
/// efficiency cores) blocks sized so fit whichever core a thread lands
/// on, and under `taskset` cpu0 may be none of them.
fn machine_caches() -> CpuCaches {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get() as i64);
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let allowed = status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).map(cpu_list);
    let cpus = allowed.filter(|c| !c.is_empty()).unwrap_or_else(|| vec![0]);
    smallest_caches(std::path::Path::new("/sys/devices/system/cpu"), &cpus, cores)
}

/// The smallest of each cache among `cpus` (their sysfs directories under
/// `root`): L1 data, L2, and the L3 that gives a core the least of it; the
/// nominal caches with `cores` where no CPU's L1 and L2 can be read.
fn smallest_caches(root: &std::path::Path, cpus: &[usize], cores: i64) -> CpuCaches {
    let found: Vec<CpuCaches> = cpus.iter().filter_map(|&cpu| cpu_caches(root, cpu)).collect();
    let least = |f: fn(&CpuCaches) -> i64| found.iter().map(f).min();
    let (Some(l1d), Some(l2)) = (least(|c| c.l1d), least(|c| c.l2)) else {
        return CpuCaches { cores, source: CacheSource::Fallback, ..CpuCaches::NOMINAL };
    };
    let l3 = found.iter().min_by_key(|c| if c.l3 > 0 { c.l3 / c.l3_cores } else { 0 }).expect("one CPU");
    CpuCaches { l1d, l2, l3: l3.l3, l3_cores: l3.l3_cores, cores, source: CacheSource::Machine }
}

/// CPU `cpu`'s caches from sysfs under `root` (`cpuN/cache/indexI`); `None`
/// where its L1 data cache or L2 cannot be read.
fn cpu_caches(root: &std::path::Path, cpu: usize) -> Option<CpuCaches> {
    let mut c = CpuCaches { l3: 0, l3_cores: 1, ..CpuCaches::NOMINAL };
    let (mut l1d, mut l2) = (None, None);
    for i in 0.. {
        let dir = root.join(format!("cpu{cpu}/cache/index{i}"));
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).ok().map(|s| s.trim().to_string());
        let Some(level) = read("level") else { break };
        let kind = read("type").unwrap_or_default();
        let Some(size) = read("size").and_then(|s| parse_size(&s).ok()) else { continue };
        match (level.as_str(), kind.as_str()) {
            ("1", "Data" | "Unified") => l1d = Some(size),
            ("2", "Data" | "Unified") => l2 = Some(size),
            ("3", "Data" | "Unified") => {
                c.l3 = size;
                c.l3_cores = read("shared_cpu_list").map_or(1, |l| cpu_list_len(&l)).max(1);
            }
            _ => {}
        }
    }
    Some(CpuCaches { l1d: l1d?, l2: l2?, ..c })
}

/// The CPUs a list such as `0-3,8,10-11` names, in order; at most
/// [`MAX_CPUS`] of them (a malformed range names none).
fn cpu_list(list: &str) -> Vec<usize> {
    let mut cpus = Vec::new();
    for r in list.split(',').map(str::trim).filter(|r| !r.is_empty()) {
        let (a, b) = r.split_once('-').unwrap_or((r, r));
        let (Ok(a), Ok(b)) = (a.trim().parse::<usize>(), b.trim().parse::<usize>()) else { continue };
        cpus.extend((a..=b).take(MAX_CPUS - cpus.len().min(MAX_CPUS)));
    }
    cpus
}

/// The most CPUs whose caches are read (each a handful of small files).
const MAX_CPUS: usize = 1024;

/// The number of CPUs in a sysfs list such as `0-3,8`.
fn cpu_list_len(list: &str) -> i64 {
    list.split(',')
        .filter(|r| !r.trim().is_empty())
        .map(|r| match r.trim().split_once('-') {
            Some((a, b)) => b.parse::<i64>().unwrap_or(0) - a.parse::<i64>().unwrap_or(0) + 1,
            None => 1,
        })
        .sum()
}

/// A size in bytes: `49152`, `48K`, `1M`, `1G` (binary units, as sysfs writes them).
fn parse_size(text: &str) -> Result<i64, String> {
    let t = text.trim();
    let (digits, shift) = match t.char_indices().last() {
        Some((i, 'K' | 'k')) => (&t[..i], 10),
        Some((i, 'M' | 'm')) => (&t[..i], 20),
        Some((i, 'G' | 'g')) => (&t[..i], 30),
        _ => (t, 0),
    };
    match digits.parse::<i64>() {
        Ok(n) if n > 0 && n < (1 << (62 - shift)) => Ok(n << shift),
        _ => Err(format!("`{text}` is not a positive size")),
    }
}

/// `machine` with the values `spec` sets (`l2=512K,cores=8`): every key
/// known, every value positive.
pub fn override_caches(machine: CpuCaches, spec: &str) -> Result<CpuCaches, String> {
    let mut c = CpuCaches { source: CacheSource::Env, ..machine };
    let (mut l3_cores, mut l3_or_cores) = (None, false);
    for item in spec.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let Some((key, value)) = item.split_once('=') else {
            return Err(format!("`{item}` is not KEY=VALUE"));
        };
        let count = |v: &str| match v.trim().parse::<i64>() {
            Ok(n) if (1..=4096).contains(&n) => Ok(n),
            _ => Err(format!("`{key}={v}`: a count from 1 to 4096")),
        };
        let size = |v: &str| parse_size(v).map_err(|e| format!("`{key}`: {e}"));
        match key.trim() {
            "l1d" => c.l1d = size(value)?,
            "l2" => c.l2 = size(value)?,
            "l3" => (c.l3, l3_or_cores) = (size(value)?, true),
            "l3cores" => l3_cores = Some(count(value)?),
            "cores" => (c.cores, l3_or_cores) = (count(value)?, true),
            other => return Err(format!("unknown key `{other}`")),
        }
    }
    // An L3 set without its sharers is shared by all the cores.
    c.l3_cores = l3_cores.unwrap_or(if l3_or_cores { c.cores } else { c.l3_cores });
    Ok(c)
}

const NVPTX_TRIPLE: &str = "nvptx64-nvidia-cuda";

fn gpu(name: &'static str, summary: &'static str, cpu: &'static str, spec: GpuSpec, nominal: Roofline) -> Target {
    Target {
        name,
        kind: TargetKind::Gpu,
        backend: Some(BackendKind::Nvptx),
        summary,
        vector_bits: 128,
        vector_registers: 255,
        // PTX ISA 7.8 (CUDA 11.8) is the oldest that knows both sm_80 and sm_90.
        llvm: Some(LlvmTarget { triple: NVPTX_TRIPLE, cpu: LlvmCpu::Named { cpu, features: "+ptx78" } }),
        gpu: Some(spec),
        loops: GPU_LOOPS,
        scopes: GPU_SCOPES,
        intrinsics: vec![Intrinsic::Fma],
        nominal,
        requires: &[],
        extends: None,
        caches: None,
    }
}

/// Launch limits every GPU since compute capability 3.0 shares.
const CUDA_LIMITS: GpuSpec = GpuSpec {
    sm: 0,
    max_threads_per_block: 1024,
    max_block: [1024, 1024, 64],
    max_grid: [(1 << 31) - 1, 65535, 65535],
    shared_bytes_per_block: 48 * 1024,
    static_shared_bytes: 48 * 1024,
    warp_size: 32,
    registers_per_thread: 255,
    registers_per_block: 65536,
};

fn build_registry() -> Vec<Target> {
    let cranelift_fma = cpu_has("fma");
    vec![
        Target {
            name: "interp",
            kind: TargetKind::Interp,
            backend: Some(BackendKind::Interp),
            summary: "the reference interpreter (the oracle); schedules are ignored",
            vector_bits: 0,
            vector_registers: 0,
            llvm: None,
            gpu: None,
            loops: CPU_LOOPS,
            scopes: CPU_SCOPES,
            intrinsics: vec![],
            nominal: AVX2_ROOF,
            requires: &[],
            extends: None,
            caches: None,
        },
        x86(
            "x86-avx2",
            "x86-64 with AVX2 and FMA (LLVM, Haswell and later)",
            256,
            LlvmCpu::Named { cpu: "haswell", features: "+avx2,+fma,+f16c" },
            AVX2,
        ),
        Target {
            extends: Some("x86-avx2"),
            ..x86(
                "x86-avx512",
                "x86-64 with AVX-512 (LLVM, Skylake-SP and later)",
                512,
                LlvmCpu::Named {
                    cpu: "skylake-avx512",
                    features: "+avx512f,+avx512vl,+avx512bw,+avx512dq,+avx2,+fma,+f16c",
                },
                AVX512,
            )
        },
        Target {
            extends: Some("x86-avx2"),
            ..x86(
                "x86-avx2-vnni",
                "x86-64 with AVX2 and AVX-VNNI (LLVM, Alder Lake, Zen 5 and later)",
                256,
                LlvmCpu::Named { cpu: "haswell", features: "+avx2,+fma,+f16c,+avxvnni" },
                AVX2_VNNI,
            )
        },
        Target {
            extends: Some("x86-avx512"),
            ..x86(
                "x86-avx512-vnni",
                "x86-64 with AVX-512 VNNI (LLVM, Cascade Lake, Zen 4 and later)",
                512,
                LlvmCpu::Named {
                    cpu: "skylake-avx512",
                    features: "+avx512f,+avx512vl,+avx512bw,+avx512dq,+avx512vnni,+avx2,+fma,+f16c",
                },
                AVX512_VNNI,
            )
        },
        Target {
            extends: Some("x86-avx512-vnni"),
            ..x86(
                "x86-avx512-amx",
                "x86-64 with AVX-512 VNNI and AMX-INT8 tiles (LLVM, Sapphire Rapids and later)",
                512,
                LlvmCpu::Named {
                    cpu: "skylake-avx512",
                    features: "+avx512f,+avx512vl,+avx512bw,+avx512dq,+avx512vnni,+avx2,+fma,+f16c,+amx-tile,+amx-int8",
                },
                AVX512_AMX,
            )
        },
        host(),
        Target {
            name: "cranelift",
            kind: TargetKind::Cpu,
            backend: Some(BackendKind::Cranelift),
            summary: "the CPU texc runs on through Cranelift: fast compiles, 128-bit SIMD",
            vector_bits: 128,
            vector_registers: 16,
            llvm: None,
            gpu: None,
            loops: CPU_LOOPS,
            scopes: CPU_SCOPES,
            intrinsics: if cranelift_fma { vec![Intrinsic::Fma] } else { vec![] },
            nominal: Roofline { peak_gflops: AVX2_ROOF.peak_gflops / 2.0, ..AVX2_ROOF },
            requires: &["sse4.1"],
            extends: None,
            caches: Some(host_caches().unwrap_or(CpuCaches::NOMINAL)),
        },
        gpu(
            "nvptx-sm80",
            "NVIDIA Ampere (A100) through LLVM NVPTX",
            "sm_80",
            GpuSpec { sm: 80, shared_bytes_per_block: 163 * 1024, ..CUDA_LIMITS },
            Roofline { peak_gflops: 19_500.0, bandwidth_gbs: 1555.0 },
        ),
        gpu(
            "nvptx-sm90",
            "NVIDIA Hopper (H100) through LLVM NVPTX",
            "sm_90",
            GpuSpec { sm: 90, shared_bytes_per_block: 227 * 1024, ..CUDA_LIMITS },
            Roofline { peak_gflops: 67_000.0, bandwidth_gbs: 3350.0 },
        ),
    ]
}

/// Every target texc knows, in a fixed order.
pub fn all() -> &'static [Target] {
    static REGISTRY: OnceLock<Vec<Target>> = OnceLock::new();
    REGISTRY.get_or_init(build_registry)
}

/// Names of all targets, for messages.
pub fn names() -> String {
    all().iter().map(|t| t.name).collect::<Vec<_>>().join(", ")
}

fn runnable_names() -> String {
    all().iter().filter(|t| t.backend.is_some()).map(|t| t.name).collect::<Vec<_>>().join(", ")
}

/// The target of this name; unknown names get the one message that lists them all.
pub fn lookup(name: &str) -> Result<&'static Target, TargetError> {
    let t = all()
        .iter()
        .find(|t| t.name == name)
        .ok_or_else(|| TargetError::Unknown { name: name.into(), known: names() })?;
    // The targets of this machine are refused while the variable that describes it is malformed.
    if matches!(t.name, "host" | "cranelift") {
        host_caches()?;
    }
    Ok(t)
}

/// `base` (a CPU target) made for a machine with `caches`: a target of
/// its own for the rest of the process (tests compile for simulated
/// machines with it; `TEXC_HOST_CACHES` does the same for `host`).
pub fn with_caches(base: &Target, caches: CpuCaches) -> &'static Target {
    Box::leak(Box::new(Target { caches: Some(caches), ..base.clone() }))
}

/// The reference interpreter's target.
pub fn interp() -> &'static Target {
    lookup("interp").expect("registered")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_caches_are_overridden_key_by_key() {
        let c = override_caches(CpuCaches::NOMINAL, "l1d=48K, l2=2M,l3=16M,cores=8").expect("valid");
        assert_eq!((c.l1d, c.l2, c.l3, c.l3_cores, c.cores), (48 << 10, 2 << 20, 16 << 20, 8, 8));
        assert_eq!((c.source, c.l3_per_core()), (CacheSource::Env, 2 << 20));
        // Keys left out keep the machine's values; an L3's sharers may be given.
        let c = override_caches(CpuCaches::NOMINAL, "l2=524288").expect("valid");
        assert_eq!((c.l1d, c.l2, c.l3_cores, c.cores), (32 << 10, 512 << 10, 2, 2));
        let c = override_caches(CpuCaches::NOMINAL, "cores=16,l3cores=8").expect("valid");
        assert_eq!((c.cores, c.l3_cores, c.describe()), (16, 8, "l1d=32K,l2=1M,l3=32M/8,cores=16".to_string()));
    }

    /// A fake sysfs tree: per CPU, its (L1d, L2, L3, L3's CPU list).
    fn sysfs(name: &str, cpus: &[(usize, &str, &str, &str, &str)]) -> std::path::PathBuf {
        let root = std::env::temp_dir().join(format!("texc-sysfs-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for &(cpu, l1d, l2, l3, l3_list) in cpus {
            for (i, (level, kind, size)) in
                [("1", "Data", l1d), ("1", "Instruction", "32K"), ("2", "Unified", l2), ("3", "Unified", l3)]
                    .into_iter()
                    .enumerate()
            {
                let dir = root.join(format!("cpu{cpu}/cache/index{i}"));
                std::fs::create_dir_all(&dir).expect("a temporary directory");
                for (file, text) in [("level", level), ("type", kind), ("size", size), ("shared_cpu_list", l3_list)] {
                    std::fs::write(dir.join(file), format!("{text}\n")).expect("writable");
                }
            }
        }
        root
    }

    #[test]
    fn host_caches_are_the_smallest_among_the_cpus_allowed() {
        // A hybrid: cpu0-1 performance cores (48K, 1.25M), cpu2-5 efficiency
        // cores (32K, 2M); one L3 of 24M shared by all six.
        let mut cpus = vec![(0, "48K", "1280K", "24M", "0-5"), (1, "48K", "1280K", "24M", "0-5")];
        cpus.extend((2..6).map(|c| (c, "32K", "2048K", "24M", "0-5")));
        let root = sysfs("hybrid", &cpus);
        let all = smallest_caches(&root, &cpu_list("0-5"), 6);
        assert_eq!((all.l1d, all.l2, all.l3, all.l3_cores, all.cores), (32 << 10, 1280 << 10, 24 << 20, 6, 6));
        assert_eq!(all.source, CacheSource::Machine);
        // `taskset -c 2-5`: cpu0's caches are not the ones texc runs on.
        let efficient = smallest_caches(&root, &cpu_list("2-5"), 4);
        assert_eq!((efficient.l1d, efficient.l2), (32 << 10, 2 << 20));
        // CPUs whose caches cannot be read are left out; with none, the nominal caches.
        let some = smallest_caches(&root, &[1, 40], 2);
        assert_eq!((some.l1d, some.l2, some.source), (48 << 10, 1280 << 10, CacheSource::Machine));
        let none = smallest_caches(&root, &[40, 41], 2);
        assert_eq!((none.l1d, none.cores, none.source), (CpuCaches::NOMINAL.l1d, 2, CacheSource::Fallback));
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn cpu_lists_are_parsed_boundedly() {
        assert_eq!(cpu_list("0-3,8, 10-11\n"), vec![0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(cpu_list("5"), vec![5]);
        assert!(cpu_list("").is_empty() && cpu_list("x-3,3-1").is_empty());
        assert_eq!(cpu_list("0-1000000").len(), MAX_CPUS);
    }

    #[test]
    fn malformed_host_caches_are_clear_errors() {
        for (spec, want) in [
            ("l2", "`l2` is not KEY=VALUE"),
            ("l2=0", "`l2`: `0` is not a positive size"),
            ("l2=1.5M", "`1.5M` is not a positive size"),
            ("l4=1M", "unknown key `l4`"),
            ("cores=0", "`cores=0`: a count from 1 to 4096"),
            ("cores=two", "a count from 1 to 4096"),
        ] {
            let e = override_caches(CpuCaches::NOMINAL, spec).expect_err(spec);
            assert!(e.contains(want), "{spec}: {e}");
        }
    }

    #[test]
    fn sysfs_lists_and_sizes_are_read() {
        assert_eq!((cpu_list_len("0-3,8-11"), cpu_list_len("0"), cpu_list_len("0-1\n")), (8, 1, 2));
        assert_eq!(
            (parse_size("48K"), parse_size("32768K"), parse_size("1G")),
            (Ok(48 << 10), Ok(32 << 20), Ok(1 << 30))
        );
        // Named targets do not depend on the machine: their code is the same everywhere.
        for name in ["x86-avx2", "x86-avx512"] {
            assert_eq!(lookup(name).expect("registered").caches, Some(CpuCaches::NOMINAL));
        }
        let host = lookup("host").expect("registered").caches.expect("a CPU");
        assert!(host.l1d > 0 && host.l2 > 0 && host.cores >= 1, "{host:?}");
    }
}
