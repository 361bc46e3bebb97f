//! The loop IR: a kernel as nested loops over buffers.
//!
//! A [`LoopFunc`] keeps the specialized [`Program`] for its tensors, scalars,
//! parameters and expression arena (expressions are TIR expressions without
//! reductions, whose `Var`s are loop variables of [`LoopFunc::vars`]), and
//! adds a statement tree. Reductions have become explicit accumulation:
//! an init nest stores the identity, an update nest folds into the buffer.
//!
//! Invariants (checked by [`crate::verify`]): every `Var` is bound by an
//! enclosing `For`, each loop variable is bound once, loads and stores have
//! one index per dimension, and no expression contains a reduction.

use std::collections::BTreeSet;
use std::fmt::Write;
use texc_compiler::ops::ReduceOp;
use texc_compiler::target::LoopKind;
use texc_compiler::tir::{Program, ProgramParam, TExpr, TExprId, TensorId, TensorRole, VarDecl, VarId};
use texc_compiler::types::ElemType;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ForKind {
    Serial,
    /// Iterations run on the thread pool.
    Parallel,
    /// Iterations become vector lanes.
    Vectorized,
    /// The loop is unrolled.
    Unrolled,
    /// Iterations are GPU blocks along one grid dimension (`bind ... to block.x`).
    Block(GpuDim),
    /// Iterations are GPU threads of a block along one dimension (`bind ... to thread.x`).
    Thread(GpuDim),
    /// GPU targets: iterations are the elements of one asynchronous copy
    /// from global memory into a shared buffer (`cp.async`, 4, 8 or 16
    /// bytes); its body is one store of a global load. The copy belongs to
    /// the thread's open group ([`AsyncStep::Commit`] closes it) and has
    /// landed once an [`AsyncStep::Wait`] retires that group (made by the
    /// `pipeline` primitive, `crate::multistage`).
    Async,
}

/// GPU targets: the steps that order a thread's asynchronous copies
/// ([`ForKind::Async`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AsyncStep {
    /// Close the thread's open group of copies (`cp.async.commit_group`).
    Commit,
    /// Wait until at most this many of the thread's groups are in flight
    /// (`cp.async.wait_group n`): the older ones have landed, for this
    /// thread; a barrier after it shows them to the block.
    Wait(i64),
}

/// GPU targets: a reduction across the lanes of warps (`shfl.sync.bfly`)
/// of a buffer held in registers ([`LoopFunc::registers`]), element `t`
/// in thread `t`. Each group of `lanes` consecutive elements (a warp, or
/// the first `lanes` threads of one) gets, in every element, the group's
/// combination by `op`, made as a butterfly: at each step `d` of
/// `lanes / 2, …, 2, 1`, every element is combined with the one whose
/// index differs from its own in bit `d` (the two results are equal: the
/// operations are commutative). `lanes` is a power of two from 2 to 32
/// and divides the buffer's length, and the launch's block is `thread.x`
/// only, so that the groups are warps or their first lanes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WarpReduce {
    pub tensor: TensorId,
    pub lanes: i64,
    pub op: ReduceOp,
}

impl WarpReduce {
    /// The butterfly's steps, largest first.
    pub fn steps(self) -> impl Iterator<Item = i64> {
        std::iter::successors(Some(self.lanes / 2), |d| Some(d / 2)).take_while(|&d| d >= 1)
    }
}

/// A tensor-core operation (PTX `mma.sync`): its tile shape and types.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MmaOp {
    /// `mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32`: f16 × f16 → f32.
    M16n8k16F16F32,
    /// `mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32`: bf16 × bf16 → f32.
    M16n8k16Bf16F32,
    /// `mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32`: f32 inputs
    /// rounded to TF32 (10-bit mantissa, to nearest, ties away) → f32.
    M16n8k8Tf32F32,
    /// `mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32`: i8 × i8 → i32
    /// (exact products, sums wrapping in 32 bits).
    M16n8k32S8S32,
    /// `mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32`: u8 × i8 → i32
    /// (a quantized model's unsigned activations times signed weights).
    M16n8k32U8S8S32,
    /// `mma.sync.aligned.m16n8k32.row.col.s32.s8.u8.s32`: i8 × u8 → i32
    /// (signed filters times an unsigned image's columns: `crate::im2col`).
    M16n8k32S8U8S32,
}

impl MmaOp {
    pub const ALL: [MmaOp; 6] = [
        MmaOp::M16n8k16F16F32,
        MmaOp::M16n8k16Bf16F32,
        MmaOp::M16n8k8Tf32F32,
        MmaOp::M16n8k32S8S32,
        MmaOp::M16n8k32U8S8S32,
        MmaOp::M16n8k32S8U8S32,
    ];

    /// The name in schedules (`tensorize ... with mma_m16n8k16_f16f32`).
    pub fn schedule_name(self) -> &'static str {
        match self {
            MmaOp::M16n8k16F16F32 => "mma_m16n8k16_f16f32",
            MmaOp::M16n8k16Bf16F32 => "mma_m16n8k16_bf16f32",
            MmaOp::M16n8k8Tf32F32 => "mma_m16n8k8_tf32f32",
            MmaOp::M16n8k32S8S32 => "mma_m16n8k32_s8s32",
            MmaOp::M16n8k32U8S8S32 => "mma_m16n8k32_u8s8s32",
            MmaOp::M16n8k32S8U8S32 => "mma_m16n8k32_s8u8s32",
        }
    }

    /// The name in the loop IR (`mma m16n8k16.f16.f32 ...`).
    pub fn name(self) -> &'static str {
        match self {
            MmaOp::M16n8k16F16F32 => "m16n8k16.f16.f32",
            MmaOp::M16n8k16Bf16F32 => "m16n8k16.bf16.f32",
            MmaOp::M16n8k8Tf32F32 => "m16n8k8.tf32.f32",
            MmaOp::M16n8k32S8S32 => "m16n8k32.s8.s32",
            MmaOp::M16n8k32U8S8S32 => "m16n8k32.u8.s8.s32",
            MmaOp::M16n8k32S8U8S32 => "m16n8k32.s8.u8.s32",
        }
    }

    /// Tile extents (m, n, k): `c` is m × n, `a` m × k, `b` k × n.
    pub fn shape(self) -> (i64, i64, i64) {
        match self {
            MmaOp::M16n8k16F16F32 | MmaOp::M16n8k16Bf16F32 => (16, 8, 16),
            MmaOp::M16n8k8Tf32F32 => (16, 8, 8),
            MmaOp::M16n8k32S8S32 | MmaOp::M16n8k32U8S8S32 | MmaOp::M16n8k32S8U8S32 => (16, 8, 32),
        }
    }

    /// Where each lane of a warp holds the elements of each operand (PTX ISA
    /// §9.7.13.4.8, `m16n8k16` with `.f16` inputs, and §9.7.13.4.7,
    /// `m16n8k8` with `.tf32`; lane `l` is in group `g = l / 4` at position
    /// `t = l % 4`), in register order: f16 `a` as 8 halves (4 pairs), `b` as
    /// 4 halves (2 pairs); TF32 `a` as 4 values, `b` as 2; `c` and `d` as 4
    /// floats; 8-bit `a` as 16 bytes (4 registers of 4 consecutive `k`), `b`
    /// as 8 (2 registers), `c` and `d` as 4 `i32` (§9.7.13.4.10, `m16n8k32`).
    pub fn fragments(self) -> Fragments {
        match self {
            // bf16 fragments are laid out as f16's (PTX ISA §9.7.13.4.8).
            MmaOp::M16n8k16F16F32 | MmaOp::M16n8k16Bf16F32 => {
                Fragments { a: &M16N8K16_A, b: &M16N8K16_B, c: &M16N8K16_C }
            }
            MmaOp::M16n8k8Tf32F32 => Fragments { a: &M16N8K8_TF32_A, b: &M16N8K8_TF32_B, c: &M16N8K16_C },
            // The accumulators as f16's (§9.7.13.4.10).
            MmaOp::M16n8k32S8S32 | MmaOp::M16n8k32U8S8S32 | MmaOp::M16n8k32S8U8S32 => {
                Fragments { a: &M16N8K32_I8_A, b: &M16N8K32_I8_B, c: &M16N8K16_C }
            }
        }
    }

    /// Element types of `a`, and of `c` (`b`'s: [`MmaOp::b_type`]).
    pub fn types(self) -> (ElemType, ElemType) {
        match self {
            MmaOp::M16n8k16F16F32 => (ElemType::F16, ElemType::F32),
            MmaOp::M16n8k16Bf16F32 => (ElemType::BF16, ElemType::F32),
            MmaOp::M16n8k8Tf32F32 => (ElemType::F32, ElemType::F32),
            MmaOp::M16n8k32S8S32 => (ElemType::I8, ElemType::I32),
            MmaOp::M16n8k32U8S8S32 => (ElemType::U8, ElemType::I32),
            MmaOp::M16n8k32S8U8S32 => (ElemType::I8, ElemType::I32),
        }
    }

    /// Element type of `b`: `a`'s, but for the mixed 8-bit operations.
    pub fn b_type(self) -> ElemType {
        match self {
            MmaOp::M16n8k32U8S8S32 => ElemType::I8,
            MmaOp::M16n8k32S8U8S32 => ElemType::U8,
            _ => self.types().0,
        }
    }

    /// Whether the operation multiplies integers (exactly, into `i32` sums
    /// that wrap), rather than floats.
    pub fn is_integer(self) -> bool {
        self.types().1 == ElemType::I32
    }

    /// Whether the inputs are rounded to TF32 first (results differ from
    /// f32 arithmetic by about 1e-3 relative: the user asks for it by name).
    pub fn rounds_to_tf32(self) -> bool {
        self == MmaOp::M16n8k8Tf32F32
    }
}

const M16N8K16_A: [Coord; 8] = [
    Coord::new(0, 1, 0, 0, 0, 2),
    Coord::new(0, 1, 0, 1, 0, 2),
    Coord::new(8, 1, 0, 0, 0, 2),
    Coord::new(8, 1, 0, 1, 0, 2),
    Coord::new(0, 1, 0, 8, 0, 2),
    Coord::new(0, 1, 0, 9, 0, 2),
    Coord::new(8, 1, 0, 8, 0, 2),
    Coord::new(8, 1, 0, 9, 0, 2),
];
const M16N8K16_B: [Coord; 4] = [
    Coord::new(0, 0, 2, 0, 1, 0),
    Coord::new(1, 0, 2, 0, 1, 0),
    Coord::new(8, 0, 2, 0, 1, 0),
    Coord::new(9, 0, 2, 0, 1, 0),
];
const M16N8K8_TF32_A: [Coord; 4] = [
    Coord::new(0, 1, 0, 0, 0, 1),
    Coord::new(8, 1, 0, 0, 0, 1),
    Coord::new(0, 1, 0, 4, 0, 1),
    Coord::new(8, 1, 0, 4, 0, 1),
];
const M16N8K8_TF32_B: [Coord; 2] = [Coord::new(0, 0, 1, 0, 1, 0), Coord::new(4, 0, 1, 0, 1, 0)];
/// 8-bit `a` (16 × 32): registers of 4 consecutive `k` — rows `g` and
/// `g + 8`, columns `4t..4t + 4`, then the same 16 columns on.
const M16N8K32_I8_A: [Coord; 16] = [
    Coord::new(0, 1, 0, 0, 0, 4),
    Coord::new(0, 1, 0, 1, 0, 4),
    Coord::new(0, 1, 0, 2, 0, 4),
    Coord::new(0, 1, 0, 3, 0, 4),
    Coord::new(8, 1, 0, 0, 0, 4),
    Coord::new(8, 1, 0, 1, 0, 4),
    Coord::new(8, 1, 0, 2, 0, 4),
    Coord::new(8, 1, 0, 3, 0, 4),
    Coord::new(0, 1, 0, 16, 0, 4),
    Coord::new(0, 1, 0, 17, 0, 4),
    Coord::new(0, 1, 0, 18, 0, 4),
    Coord::new(0, 1, 0, 19, 0, 4),
    Coord::new(8, 1, 0, 16, 0, 4),
    Coord::new(8, 1, 0, 17, 0, 4),
    Coord::new(8, 1, 0, 18, 0, 4),
    Coord::new(8, 1, 0, 19, 0, 4),
];
/// 8-bit `b` (32 × 8): rows (`k`) `4t..4t + 4`, then 16 on; column `g`.
const M16N8K32_I8_B: [Coord; 8] = [
    Coord::new(0, 0, 4, 0, 1, 0),
    Coord::new(1, 0, 4, 0, 1, 0),
    Coord::new(2, 0, 4, 0, 1, 0),
    Coord::new(3, 0, 4, 0, 1, 0),
    Coord::new(16, 0, 4, 0, 1, 0),
    Coord::new(17, 0, 4, 0, 1, 0),
    Coord::new(18, 0, 4, 0, 1, 0),
    Coord::new(19, 0, 4, 0, 1, 0),
];
const M16N8K16_C: [Coord; 4] = [
    Coord::new(0, 1, 0, 0, 0, 2),
    Coord::new(0, 1, 0, 1, 0, 2),
    Coord::new(8, 1, 0, 0, 0, 2),
    Coord::new(8, 1, 0, 1, 0, 2),
];

/// The fragment layouts of a tensor-core operation (see [`MmaOp::fragments`]).
#[derive(Clone, Copy, Debug)]
pub struct Fragments {
    pub a: &'static [Coord],
    pub b: &'static [Coord],
    pub c: &'static [Coord],
}

/// A fragment element's place in its tile, for the lane in group `g` at
/// position `t` of warp `w` (of a warpgroup; 0 for `mma.sync`): row
/// `r0 + rw·w + rg·g + rt·t`, column `c0 + cg·g + ct·t`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Coord {
    pub r0: i64,
    pub rg: i64,
    pub rt: i64,
    pub rw: i64,
    pub c0: i64,
    pub cg: i64,
    pub ct: i64,
}

impl Coord {
    const fn new(r0: i64, rg: i64, rt: i64, c0: i64, cg: i64, ct: i64) -> Coord {
        Coord { r0, rg, rt, rw: 0, c0, cg, ct }
    }

    /// (row, column) for lane `lane` (of a warp, or of a warpgroup's 128).
    pub fn at(self, lane: i64) -> (i64, i64) {
        let (w, g, t) = (lane / 32, lane % 32 / 4, lane % 4);
        (self.r0 + self.rw * w + self.rg * g + self.rt * t, self.c0 + self.cg * g + self.ct * t)
    }
}

/// A warpgroup's tensor-core operation (PTX `wgmma.mma_async`, sm_90a):
/// `m64nNk16`, A and B read from shared memory through matrix descriptors
/// ([`SmemMatrix`]), the accumulators in the 128 lanes' registers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WgmmaOp {
    /// The tile's columns: a multiple of 8 from 8 to 256.
    pub n: i64,
    /// The inputs' type: f16 or bf16 (the accumulators are f32).
    pub ab: ElemType,
}

impl WgmmaOp {
    /// Rows of the tile: 16 per warp of the warpgroup.
    pub const M: i64 = 64;
    pub const K: i64 = 16;
    /// Threads of a warpgroup: four warps.
    pub const LANES: i64 = 128;

    /// The op a schedule names (`wgmma_m64n128k16_f16f32`, `..._bf16f32`).
    pub fn parse_schedule_name(s: &str) -> Option<WgmmaOp> {
        let rest = s.strip_prefix("wgmma_m64n")?;
        let (n, ty) = rest.split_once("k16_")?;
        let n: i64 = n.parse().ok()?;
        let ab = match ty {
            "f16f32" => ElemType::F16,
            "bf16f32" => ElemType::BF16,
            _ => return None,
        };
        (n % 8 == 0 && (8..=256).contains(&n)).then_some(WgmmaOp { n, ab })
    }

    pub fn schedule_name(self) -> String {
        format!("wgmma_m64n{}k16_{}f32", self.n, self.ab)
    }

    /// The name in the loop IR (`wgmma m64n128k16.f16.f32 ...`).
    pub fn name(self) -> String {
        format!("m64n{}k16.{}.f32", self.n, self.ab)
    }

    pub fn shape(self) -> (i64, i64, i64) {
        (WgmmaOp::M, self.n, WgmmaOp::K)
    }

    /// Where each of the warpgroup's 128 lanes holds the accumulators, in
    /// register order (PTX ISA, "Register fragments" of `wgmma` `m64nNk16`,
    /// the D matrix): warp `w` owns rows `16w..16w + 16`; within them the
    /// lane in group `g` at position `t` holds, for every 8 columns `8j`,
    /// registers `4j..4j + 4` at (g, 8j + 2t), (g, 8j + 2t + 1), (g + 8, 8j + 2t),
    /// (g + 8, 8j + 2t + 1) — `mma.sync`'s m16n8 accumulator layout, N / 8 times.
    pub fn d_fragment(self) -> Vec<Coord> {
        (0..self.n / 2)
            .map(|i| Coord { r0: 8 * ((i / 2) % 2), rg: 1, rt: 0, rw: 16, c0: 8 * (i / 4) + i % 2, cg: 0, ct: 2 })
            .collect()
    }
}

/// The operation a `tensorize` names: a warp's `mma.sync`, a warpgroup's
/// `wgmma`, or a CPU's integer tile product ([`TileDot`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TensorOp {
    Mma(MmaOp),
    Wgmma(WgmmaOp),
    /// Intel AMX's `tdpbusd` over a block of tiles: `tensorize S(m, n, k) with amx_dpbusd`.
    TileDot,
}

impl TensorOp {
    pub fn parse_schedule_name(s: &str) -> Option<TensorOp> {
        if s == TileDot::SCHEDULE_NAME {
            return Some(TensorOp::TileDot);
        }
        MmaOp::ALL
            .into_iter()
            .find(|o| o.schedule_name() == s)
            .map(TensorOp::Mma)
            .or_else(|| WgmmaOp::parse_schedule_name(s).map(TensorOp::Wgmma))
    }

    /// The names schedules may give, for messages.
    pub fn known_names() -> Vec<String> {
        let mut v: Vec<String> = MmaOp::ALL.iter().map(|o| o.schedule_name().to_string()).collect();
        v.push("wgmma_m64n{8, 16, .., 256}k16_f16f32 (sm_90a)".into());
        v.push("wgmma_m64n{8, 16, .., 256}k16_bf16f32 (sm_90a)".into());
        v.push(format!("{} (x86 with AMX-INT8)", TileDot::SCHEDULE_NAME));
        v
    }

    pub fn schedule_name(self) -> String {
        match self {
            TensorOp::Mma(o) => o.schedule_name().to_string(),
            TensorOp::Wgmma(o) => o.schedule_name(),
            TensorOp::TileDot => TileDot::SCHEDULE_NAME.to_string(),
        }
    }

    /// Tile extents (m, n, k); for [`TensorOp::TileDot`] the largest block
    /// along m and n, and the step of k (its loops may be shorter along m
    /// and n, and any multiple of the step along k).
    pub fn shape(self) -> (i64, i64, i64) {
        match self {
            TensorOp::Mma(o) => o.shape(),
            TensorOp::Wgmma(o) => o.shape(),
            TensorOp::TileDot => (TileDot::MAX_ROWS, TileDot::MAX_COLS, TileDot::K_STEP),
        }
    }

    /// Element types of `a` (and `b`, but see [`TensorOp::b_type`]), and of `c`.
    pub fn types(self) -> (ElemType, ElemType) {
        match self {
            TensorOp::Mma(o) => o.types(),
            TensorOp::Wgmma(o) => (o.ab, ElemType::F32),
            // Four bytes of `k` to an `i32` (`crate::dot4`'s packing), sums in `i32`.
            TensorOp::TileDot => (ElemType::I32, ElemType::I32),
        }
    }

    /// Element type of `b` (see [`MmaOp::b_type`]).
    pub fn b_type(self) -> ElemType {
        match self {
            TensorOp::Mma(o) => o.b_type(),
            _ => self.types().0,
        }
    }
}

/// CPU targets with AMX-INT8: `c[r, q] += Σ_{k < k} @dot4(0, a[r, k], b[k, q])`
/// (`=` where [`TileDot::zero`]: the sum alone, `c` not read)
/// for `r < m`, `q < n` — a block of `i32` accumulators summing products of
/// `u8` (`a`) and `i8` (`b`) bytes packed four to an `i32` element, as
/// [`crate::dot4`] packs them (byte `t` of element `k` is `k`'s byte `4k + t`).
/// Each [`Tile`] names the dimensions its rows and columns run along;
/// columns must be the tensor's last dimension (contiguous), as the tile
/// loads read rows of up to 64 contiguous bytes. The code generator runs
/// it on AMX tiles of 16 rows × 16 `i32` (`tdpbusd`: 16 × 64 bytes times
/// 16 × 64 bytes, row `k` of `b` holding 16 columns' four bytes of `k`),
/// at most [`TileDot::MAX_ROWS`] × [`TileDot::MAX_COLS`] accumulators in
/// four tiles held across the whole sum, `k` by [`TileDot::K_STEP`].
#[derive(Clone, Debug, PartialEq)]
pub struct TileDot {
    pub c: Tile,
    pub a: Tile,
    pub b: Tile,
    pub m: i64,
    pub n: i64,
    pub k: i64,
    /// The accumulators start from zero (`tilezero`), not from `c`.
    pub zero: bool,
}

impl TileDot {
    pub const SCHEDULE_NAME: &'static str = "amx_dpbusd";
    /// Rows of one AMX tile, and `i32` columns of one (64 bytes).
    pub const TILE: i64 = 16;
    /// Two tiles of rows and two of columns: four accumulator tiles, two of
    /// `a` and two of `b` are AMX's eight tile registers.
    pub const MAX_ROWS: i64 = 32;
    pub const MAX_COLS: i64 = 32;
    /// Packed `k` per `tdpbusd`: 16 `i32` of four bytes, 64 bytes.
    pub const K_STEP: i64 = 16;

    /// The element `(r, q)` of tile `t` whose origin evaluated to `origin`.
    pub fn at(origin: &[i64], t: &Tile, (r, q): (i64, i64)) -> Vec<i64> {
        let mut idx = origin.to_vec();
        idx[t.rows] += r;
        idx[t.cols] += q;
        idx
    }

    /// The operands' origins' index expressions.
    pub fn origins(&self) -> impl Iterator<Item = &TExprId> {
        self.c.origin.iter().chain(&self.a.origin).chain(&self.b.origin)
    }

    /// [`TileDot::origins`], to change.
    pub fn origins_mut(&mut self) -> impl Iterator<Item = &mut TExprId> {
        self.c.origin.iter_mut().chain(&mut self.a.origin).chain(&mut self.b.origin)
    }

    /// The operands with the extents of their rows and columns: `c` is
    /// `m × n`, `a` is `m × k`, `b` is `k × n`.
    pub fn tiles(&self) -> [(&Tile, i64, i64); 3] {
        [(&self.c, self.m, self.n), (&self.a, self.m, self.k), (&self.b, self.k, self.n)]
    }
}

/// Which way a wgmma operand's core matrices run: each is 8 × 8 elements
/// of 2 bytes, 128 contiguous bytes in 8 rows of 16.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Major {
    /// A row is 8 elements along K (the operand's M or N indexes the rows):
    /// the buffer `[K / 8, MN, 8]`, element (mn, k) at `[k / 8, mn, k % 8]`.
    K,
    /// A row is 8 elements along M or N (K indexes the rows; the
    /// operation's transpose bit is set): the buffer `[K / 8, MN / 8, 8, 8]`,
    /// element (mn, k) at `[k / 8, mn / 8, k % 8, mn % 8]`.
    Mn,
}

/// A wgmma operand in shared memory, as its matrix descriptor gives it
/// (the ISA's canonical layouts; CUTLASS `make_gmma_desc`), at
/// [`canonical_offset`]:
///
/// - without swizzling (*interleave*): core matrices of 128 contiguous
///   bytes ([`Major`]), the one holding element (mn, k) `lbo` bytes apart
///   per 8 of `k` (the leading dimension) and `sbo` bytes per 8 of `mn`
///   (the stride dimension);
/// - with the 128-byte swizzle (`swizzled`): rows of 128 bytes — 64
///   elements along K (K-major, `A`) or along M or N (MN-major, `B`) — 8
///   rows (1024 bytes) a group, `sbo` bytes apart per 8 of the rows'
///   other dimension; MN-major, 64-wide atoms `lbo` bytes apart along N.
///   The hardware permutes each row's 16-byte chunks by the row
///   ([`swizzle128`] of the address), so a buffer read so is 1024-byte
///   aligned and written through the same permutation.
///
/// `crate::tensorize` lays the buffer `tensor` out so; `origin` indexes
/// the tile's first element.
#[derive(Clone, Debug, PartialEq)]
pub struct SmemMatrix {
    pub tensor: TensorId,
    pub origin: Vec<TExprId>,
    pub major: Major,
    pub lbo: i64,
    pub sbo: i64,
    pub swizzled: bool,
}

/// The byte of element (mn, k) of an operand from its start, in the
/// canonical layout of `major` with byte offsets `lbo` and `sbo` — before
/// the 128-byte swizzle where `swizzled` ([`swizzle128`] of the address).
pub fn canonical_offset(major: Major, lbo: i64, sbo: i64, swizzled: bool, mn: i64, k: i64) -> i64 {
    match (major, swizzled) {
        (Major::K, false) => (mn / 8) * sbo + (k / 8) * lbo + (mn % 8) * 16 + (k % 8) * 2,
        (Major::Mn, false) => (mn / 8) * sbo + (k / 8) * lbo + (k % 8) * 16 + (mn % 8) * 2,
        (Major::K, true) => (mn / 8) * sbo + (mn % 8) * 128 + k * 2,
        (Major::Mn, true) => (mn / 64) * lbo + (mn % 64) * 2 + (k / 8) * sbo + (k % 8) * 128,
    }
}

/// The 128-byte swizzle of a shared-memory byte offset (from a 1024-byte
/// aligned base): the 16-byte chunk within a 128-byte row exclusive-or the
/// row within its 8 (CUTLASS `Swizzle<3, 4, 3>`). Its own inverse.
pub fn swizzle128(byte: i64) -> i64 {
    byte ^ ((byte >> 3) & 0x70)
}

/// The shared buffers `wgmma` reads with the 128-byte swizzle: stored
/// through [`swizzle128`] of their byte offsets, and 1024-byte aligned.
pub fn swizzled_buffers(f: &LoopFunc) -> BTreeSet<TensorId> {
    fn walk(body: &[Stmt], out: &mut BTreeSet<TensorId>) {
        for s in body {
            if let Stmt::Wgmma(w) = s {
                out.extend([&w.a, &w.b].into_iter().filter(|m| m.swizzled).map(|m| m.tensor));
            }
            walk(s.body(), out);
        }
    }
    let mut out = BTreeSet::new();
    walk(&f.body, &mut out);
    out
}

impl SmemMatrix {
    /// How far past `origin` the operand reaches in each dimension of its
    /// buffer, for an operand of `mn` × `k` elements.
    /// (The layout's dimensions are the buffer's last three; a pipeline's
    /// slot index may come first.)
    pub fn reach(&self, mn: i64, k: i64) -> Vec<i64> {
        let own = match (self.major, self.swizzled) {
            (Major::K, false) => vec![k / 8 - 1, mn - 1, 7],
            (Major::Mn, false) => vec![k / 8 - 1, mn / 8 - 1, 7, 7],
            (Major::K, true) => vec![mn - 1, k - 1],
            (Major::Mn, true) => vec![(mn - 1) / 64, k - 1, 63],
        };
        let mut r = vec![0; self.origin.len().saturating_sub(own.len())];
        r.extend(own);
        r
    }
}

impl Wgmma {
    /// `a` and `b` with their extents along M or N, and K.
    pub fn operands(&self) -> [(&SmemMatrix, i64, i64); 2] {
        [(&self.a, WgmmaOp::M, WgmmaOp::K), (&self.b, self.op.n, WgmmaOp::K)]
    }

    pub fn origins(&self) -> impl Iterator<Item = &TExprId> {
        self.c.origin.iter().chain(&self.a.origin).chain(&self.b.origin)
    }

    pub fn origins_mut(&mut self) -> impl Iterator<Item = &mut TExprId> {
        self.c.origin.iter_mut().chain(self.a.origin.iter_mut()).chain(self.b.origin.iter_mut())
    }
}

/// The 64-bit wgmma matrix descriptor (PTX ISA "Matrix Descriptor Format";
/// CUTLASS `GmmaDescriptor`): bits 0–13 the start address, 16–29 the
/// leading-dimension byte offset, 32–45 the stride-dimension byte offset,
/// each in 16-byte units; bits 49–51 the base offset (0: no swizzle), bits
/// 62–63 the swizzle mode (0: none, 1: 128 bytes, 2: 64, 3: 32).
pub fn wgmma_descriptor(start_bytes: u64, lbo: i64, sbo: i64, swizzled: bool) -> u64 {
    let field = |bytes: u64| (bytes >> 4) & 0x3fff;
    // Bits 62–63, the layout: 0 interleave, 1 the 128-byte swizzle.
    field(start_bytes) | field(lbo as u64) << 16 | field(sbo as u64) << 32 | u64::from(swizzled) << 62
}

/// The fields of a descriptor: start address, leading and stride byte
/// offsets (bytes), swizzle mode.
pub fn wgmma_descriptor_fields(d: u64) -> (u64, u64, u64, u64) {
    ((d & 0x3fff) << 4, (d >> 16 & 0x3fff) << 4, (d >> 32 & 0x3fff) << 4, d >> 62)
}

/// A warpgroup's `wgmma` ([`WgmmaOp`]): `c += a × b` on a 64×N tile of `c`
/// (f32, in memory; the lanes load and store their fragments), `a` 64×16
/// and `b` 16×N in shared memory.
#[derive(Clone, Debug, PartialEq)]
pub struct Wgmma {
    pub op: WgmmaOp,
    pub c: Tile,
    pub a: SmemMatrix,
    pub b: SmemMatrix,
}

/// A tile of a tensor: element (r, c) of the tile is the tensor's element
/// at `origin` plus `r` along dimension `rows` and `c` along `cols`.
#[derive(Clone, Debug, PartialEq)]
pub struct Tile {
    pub tensor: TensorId,
    pub origin: Vec<TExprId>,
    pub rows: usize,
    pub cols: usize,
}

/// A dimension of a GPU grid or block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GpuDim {
    X,
    Y,
    Z,
}

impl GpuDim {
    pub const ALL: [GpuDim; 3] = [GpuDim::X, GpuDim::Y, GpuDim::Z];

    pub fn index(self) -> usize {
        self as usize
    }

    pub fn name(self) -> &'static str {
        match self {
            GpuDim::X => "x",
            GpuDim::Y => "y",
            GpuDim::Z => "z",
        }
    }

    pub fn parse(s: &str) -> Option<GpuDim> {
        GpuDim::ALL.into_iter().find(|d| d.name() == s)
    }
}

impl ForKind {
    /// The kind of loop a target must support to run this one.
    pub fn loop_kind(self) -> LoopKind {
        match self {
            ForKind::Serial => LoopKind::Serial,
            ForKind::Parallel => LoopKind::Parallel,
            ForKind::Vectorized => LoopKind::Vectorized,
            ForKind::Unrolled => LoopKind::Unrolled,
            ForKind::Block(_) => LoopKind::GpuBlock,
            ForKind::Thread(_) => LoopKind::GpuThread,
            ForKind::Async => LoopKind::AsyncCopy,
        }
    }

    /// The suffix the printer writes after a loop's range (` parallel`, ` block.x`).
    pub fn name(self) -> &'static str {
        match self {
            ForKind::Serial => "",
            ForKind::Parallel => " parallel",
            ForKind::Vectorized => " vectorized",
            ForKind::Unrolled => " unrolled",
            ForKind::Block(GpuDim::X) => " block.x",
            ForKind::Block(GpuDim::Y) => " block.y",
            ForKind::Block(GpuDim::Z) => " block.z",
            ForKind::Thread(GpuDim::X) => " thread.x",
            ForKind::Thread(GpuDim::Y) => " thread.y",
            ForKind::Thread(GpuDim::Z) => " thread.z",
            ForKind::Async => " async",
        }
    }

    /// Whether the loop is bound to GPU blocks or threads.
    pub fn is_gpu(self) -> bool {
        matches!(self, ForKind::Block(_) | ForKind::Thread(_))
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Stmt {
    /// `var` takes the values `lo..lo + extent`.
    For {
        var: VarId,
        lo: i64,
        extent: i64,
        kind: ForKind,
        body: Vec<Stmt>,
    },
    /// Guard for the tails of splits that do not divide their extent.
    If {
        cond: TExprId,
        then: Vec<Stmt>,
    },
    /// A buffer private to each execution of `body`: a stack array, or a
    /// heap block on CPUs where [`LoopFunc::heap_locals`] says so.
    Alloc {
        tensor: TensorId,
        body: Vec<Stmt>,
    },
    Store {
        tensor: TensorId,
        indices: Vec<TExprId>,
        value: TExprId,
    },
    /// GPU targets: a warp's tensor-core operation `c += a × b` on one tile
    /// of each operand (`tensorize`). The warp's 32 lanes are the block's
    /// `thread.x`: it stands where a `thread.x` loop would.
    Mma {
        op: MmaOp,
        c: Tile,
        a: Tile,
        b: Tile,
    },
    /// GPU targets: a warpgroup's tensor-core operation ([`Wgmma`],
    /// `tensorize ... with wgmma_m64nNk16_f16f32`). The warpgroup's 128
    /// lanes are the block's `thread.x`: it stands where a `thread.x` loop
    /// would.
    Wgmma(Box<Wgmma>),
    /// CPU targets with AMX-INT8: a block of integer tile products ([`TileDot`],
    /// `tensorize ... with amx_dpbusd`), standing where its three loops stood.
    TileDot(Box<TileDot>),
    /// GPU targets: every thread of the block waits here until all have
    /// arrived (`bar.sync`), so that what threads stored to shared buffers
    /// before it is visible to all after it (see `crate::gpu`).
    Barrier,
    /// GPU targets: a step of the thread's asynchronous copies (uniform:
    /// every thread of the block takes it, like a barrier).
    Async(AsyncStep),
    /// GPU targets: a reduction across warp lanes (see [`WarpReduce`]). It
    /// stands where a `thread.x` loop over the buffer's elements would.
    WarpReduce(WarpReduce),
    /// CPU targets compiled by LLVM: a hint that the cache line holding
    /// element `offset` of `tensor` (counted in its row-major layout) will be
    /// read soon, to be brought into the L2 (`prefetcht1`). It reads and
    /// changes no value, so every analysis but code generation passes it
    /// by; `offset` stays within the tensor (`crate::prefetch` clamps it,
    /// a `.loops` file's is proven). Made by `crate::prefetch`.
    Prefetch {
        tensor: TensorId,
        offset: TExprId,
    },
}

impl Stmt {
    /// The statements this one contains — a loop's, a guard's or an
    /// allocation's body — and none for the others (a store, the GPU
    /// operations): walkers that only descend say so once, here.
    pub fn body(&self) -> &[Stmt] {
        match self {
            Stmt::For { body, .. } | Stmt::If { then: body, .. } | Stmt::Alloc { body, .. } => body,
            Stmt::Store { .. }
            | Stmt::Mma { .. }
            | Stmt::Wgmma(_)
            | Stmt::TileDot(_)
            | Stmt::Barrier
            | Stmt::Async(_)
            | Stmt::WarpReduce(_)
            | Stmt::Prefetch { .. } => &[],
        }
    }

    /// [`Stmt::body`], to change.
    pub fn body_mut(&mut self) -> &mut [Stmt] {
        match self {
            Stmt::For { body, .. } | Stmt::If { then: body, .. } | Stmt::Alloc { body, .. } => body,
            Stmt::Store { .. }
            | Stmt::Mma { .. }
            | Stmt::Wgmma(_)
            | Stmt::TileDot(_)
            | Stmt::Barrier
            | Stmt::Async(_)
            | Stmt::WarpReduce(_)
            | Stmt::Prefetch { .. } => &mut [],
        }
    }
}

#[derive(Clone, Debug)]
pub struct LoopFunc {
    pub p: Program,
    pub vars: Vec<VarDecl>,
    pub body: Vec<Stmt>,
    /// `Alloc`ated buffers that one GPU block's threads share (`in shared`);
    /// other `Alloc`s are private to whatever runs their body.
    pub shared: BTreeSet<TensorId>,
    /// `Alloc`ated buffers of a GPU block with one element per thread of
    /// its `thread.x` loops, held in that thread's registers (`registers`
    /// in the text): thread `t` touches only element `t`, and the threads'
    /// elements meet only in [`Stmt::WarpReduce`].
    pub registers: BTreeSet<TensorId>,
    /// Serial and parallel loops (by variable) whose step the backend emits
    /// once, not copied by its unroller (a parallel loop: each task's loop
    /// over its share; `rolled` in the text): where *keep-rolled*
    /// (`crate::keep_rolled`) found that a copy of their step would spill
    /// the register block inside them, or where a `.loops` file says so.
    /// LLVM's backends obey them (NVPTX too, on a file's GPU loops);
    /// Cranelift, which does not unroll, and the MLIR export ignore them.
    pub rolled: BTreeSet<VarId>,
}

impl LoopFunc {
    /// A new loop variable of `extent` iterations.
    pub fn new_var(&mut self, name: impl Into<String>, extent: i64) -> VarId {
        self.vars.push(VarDecl { name: name.into(), extent });
        (self.vars.len() - 1) as VarId
    }

    /// Temporaries that the body writes or reads and that live for the
    /// whole kernel (inlined stages and `Alloc`ated locals are not among
    /// them). In a whole kernel each one read is written too; a part of one
    /// (one loop nest, `texc bench --profile`) may read what others write.
    pub fn live_temps(&self) -> Vec<TensorId> {
        let mut seen = vec![false; self.p.tensors.len()];
        let mut local = vec![false; self.p.tensors.len()];
        let p = &self.p;
        let mut reads = |e: TExprId, seen: &mut [bool]| {
            let mut loads = Vec::new();
            crate::analysis::loads_in(p, e, &mut loads);
            for l in loads {
                if let TExpr::Load(t, _) = p.expr(l) {
                    seen[t.0 as usize] = true;
                }
            }
        };
        fn walk(s: &[Stmt], seen: &mut [bool], local: &mut [bool], reads: &mut dyn FnMut(TExprId, &mut [bool])) {
            for st in s {
                match st {
                    Stmt::For { body, .. } => walk(body, seen, local, reads),
                    Stmt::If { cond, then } => {
                        reads(*cond, seen);
                        walk(then, seen, local, reads)
                    }
                    Stmt::Alloc { tensor, body } => {
                        local[tensor.0 as usize] = true;
                        walk(body, seen, local, reads)
                    }
                    Stmt::Store { tensor, indices, value } => {
                        seen[tensor.0 as usize] = true;
                        indices.iter().chain([value]).for_each(|&e| reads(e, seen));
                    }
                    Stmt::Mma { c, a, b, .. } => {
                        for t in [c, a, b] {
                            seen[t.tensor.0 as usize] = true;
                        }
                    }
                    Stmt::Wgmma(w) => {
                        for t in [w.c.tensor, w.a.tensor, w.b.tensor] {
                            seen[t.0 as usize] = true;
                        }
                    }
                    Stmt::TileDot(d) => {
                        for t in [&d.c, &d.a, &d.b] {
                            seen[t.tensor.0 as usize] = true;
                        }
                    }
                    Stmt::Prefetch { tensor, offset } => {
                        seen[tensor.0 as usize] = true;
                        reads(*offset, seen);
                    }
                    Stmt::Barrier | Stmt::Async(_) | Stmt::WarpReduce(_) => {}
                }
            }
        }
        walk(&self.body, &mut seen, &mut local, &mut reads);
        (0..self.p.tensors.len())
            .map(|i| TensorId(i as u32))
            .filter(|t| seen[t.0 as usize] && !local[t.0 as usize] && self.p.tensor(*t).role == TensorRole::Temp)
            .collect()
    }

    /// The `Alloc`ated buffers that CPU code takes from the heap. A frame —
    /// the kernel's body, or the body of a parallel loop of two or more
    /// iterations (an outlined task) — gives each buffer it holds one stack
    /// array in its entry (unrolled copies and split tails share it), so its
    /// stack arrays take their buffers' sum, nested or not; where that is
    /// over [`crate::attach::MAX_STACK_BYTES`], its largest buffers go to the
    /// heap until the rest fit (of equal ones, the later first). Small ones
    /// — a register block's accumulators, which LLVM keeps in registers —
    /// stay on the stack. GPU block buffers (`shared`, `registers`) are not
    /// among them.
    pub fn heap_locals(&self) -> BTreeSet<TensorId> {
        /// Each frame's buffers, in order of first appearance, with their bytes.
        fn walk(f: &LoopFunc, s: &[Stmt], frame: usize, frames: &mut Vec<Vec<(TensorId, i64)>>) {
            for st in s {
                match st {
                    Stmt::For { kind: ForKind::Parallel, extent, body, .. } if *extent > 1 => {
                        frames.push(Vec::new());
                        walk(f, body, frames.len() - 1, frames)
                    }
                    Stmt::Alloc { tensor, body } => {
                        let t = *tensor;
                        let block = f.shared.contains(&t) || f.registers.contains(&t);
                        // Counted in every frame that holds it (a split's full
                        // tiles in a task, its tail in the body).
                        if !block && !frames[frame].iter().any(|&(u, _)| u == t) {
                            let d = f.p.tensor(t);
                            frames[frame].push((t, d.len().max(1) * d.elem.size() as i64));
                        }
                        walk(f, body, frame, frames)
                    }
                    st => walk(f, st.body(), frame, frames),
                }
            }
        }
        let mut frames = vec![Vec::new()];
        walk(self, &self.body, 0, &mut frames);
        let mut heap = BTreeSet::new();
        for frame in frames {
            let mut order: Vec<(usize, TensorId, i64)> =
                frame.into_iter().enumerate().map(|(i, (t, bytes))| (i, t, bytes)).collect();
            order.sort_by(|a, b| b.2.cmp(&a.2).then(b.0.cmp(&a.0)));
            let mut total: i64 = order.iter().filter(|(_, t, _)| !heap.contains(t)).map(|&(_, _, b)| b).sum();
            for (_, t, bytes) in order {
                if !crate::attach::on_heap(total) {
                    break;
                }
                if heap.insert(t) {
                    total -= bytes;
                }
            }
        }
        heap
    }
}

/// What a top-level loop nest computes, for profiles: the tensors it
/// writes, other than its local buffers, in order (`y0.r0 (init)` for a
/// nest that stores constants only, a reduction's init nest).
pub fn nest_label(f: &LoopFunc, s: &Stmt) -> String {
    fn walk(s: &Stmt, f: &LoopFunc, local: &mut Vec<TensorId>, out: &mut Vec<TensorId>, constant: &mut bool) {
        match s {
            Stmt::For { body, .. } | Stmt::If { then: body, .. } => {
                body.iter().for_each(|s| walk(s, f, local, out, constant))
            }
            Stmt::Alloc { tensor, body } => {
                local.push(*tensor);
                body.iter().for_each(|s| walk(s, f, local, out, constant))
            }
            Stmt::Store { tensor, value, .. } => {
                *constant &= matches!(f.p.expr(*value), TExpr::Int(_) | TExpr::Float(_));
                if !local.contains(tensor) && !out.contains(tensor) {
                    out.push(*tensor);
                }
            }
            Stmt::Mma { c: Tile { tensor, .. }, .. } => {
                *constant = false;
                if !local.contains(tensor) && !out.contains(tensor) {
                    out.push(*tensor);
                }
            }
            Stmt::Wgmma(w) => {
                *constant = false;
                if !local.contains(&w.c.tensor) && !out.contains(&w.c.tensor) {
                    out.push(w.c.tensor);
                }
            }
            Stmt::TileDot(d) => {
                *constant = false;
                if !local.contains(&d.c.tensor) && !out.contains(&d.c.tensor) {
                    out.push(d.c.tensor);
                }
            }
            Stmt::Barrier | Stmt::Async(_) | Stmt::WarpReduce(_) | Stmt::Prefetch { .. } => {}
        }
    }
    let (mut local, mut out, mut constant) = (Vec::new(), Vec::new(), true);
    walk(s, f, &mut local, &mut out, &mut constant);
    let names: Vec<&str> = out.iter().map(|&t| f.p.tensor(t).name.as_str()).collect();
    let names = if names.is_empty() { "(nothing)".to_string() } else { names.join(", ") };
    if constant && !out.is_empty() {
        format!("{names} (init)")
    } else {
        names
    }
}

/// Whether some loop of `s` runs on the thread pool.
pub fn has_parallel_loop(s: &Stmt) -> bool {
    match s {
        Stmt::For { kind: ForKind::Parallel, .. } => true,
        Stmt::For { body, .. } | Stmt::If { then: body, .. } | Stmt::Alloc { body, .. } => {
            body.iter().any(has_parallel_loop)
        }
        _ => false,
    }
}

/// Whether `f` has TF32 tensor-core operations, whose results differ from
/// f32 arithmetic by about 1e-3 relative (`MmaOp::rounds_to_tf32`).
pub fn rounds_to_tf32(f: &LoopFunc) -> bool {
    fn any(body: &[Stmt]) -> bool {
        body.iter().any(|s| match s {
            Stmt::Mma { op, .. } => op.rounds_to_tf32(),
            Stmt::For { body, .. } | Stmt::If { then: body, .. } | Stmt::Alloc { body, .. } => any(body),
            Stmt::Store { .. }
            | Stmt::Wgmma(_)
            | Stmt::TileDot(_)
            | Stmt::Barrier
            | Stmt::Async(_)
            | Stmt::WarpReduce(_)
            | Stmt::Prefetch { .. } => false,
        })
    }
    any(&f.body)
}

/// Whether `f` has AMX tile products ([`TileDot`]).
pub fn has_tile_dots(f: &LoopFunc) -> bool {
    fn any(body: &[Stmt]) -> bool {
        body.iter().any(|s| matches!(s, Stmt::TileDot(_)) || any(s.body()))
    }
    any(&f.body)
}

/// The tensors some statement of `f` reads and stores in place (`Y[i] =
/// Y[i] + ..`: a sum accumulated in memory, not in a local).
pub fn updated_in_place(f: &LoopFunc) -> BTreeSet<TensorId> {
    fn walk(f: &LoopFunc, body: &[Stmt], out: &mut BTreeSet<TensorId>) {
        for s in body {
            if let Stmt::Store { tensor, value, .. } = s {
                let mut loads = Vec::new();
                crate::analysis::loads_in(&f.p, *value, &mut loads);
                if loads.iter().any(|&l| matches!(f.p.expr(l), TExpr::Load(t, _) if t == tensor)) {
                    out.insert(*tensor);
                }
            }
            walk(f, s.body(), out);
        }
    }
    let mut out = BTreeSet::new();
    walk(f, &f.body, &mut out);
    out
}

/// Whether `f` has warpgroup operations (`wgmma`): its GPU code needs
/// sm_90a and PTX ISA 8.0.
pub fn has_wgmma(f: &LoopFunc) -> bool {
    fn any(body: &[Stmt]) -> bool {
        body.iter().any(|s| match s {
            Stmt::Wgmma(_) => true,
            Stmt::For { body, .. } | Stmt::If { then: body, .. } | Stmt::Alloc { body, .. } => any(body),
            Stmt::Store { .. }
            | Stmt::Mma { .. }
            | Stmt::TileDot(_)
            | Stmt::Barrier
            | Stmt::Async(_)
            | Stmt::WarpReduce(_)
            | Stmt::Prefetch { .. } => false,
        })
    }
    any(&f.body)
}

/// Deterministic printer (`texc emit --stage loops`).
pub fn print(f: &LoopFunc) -> String {
    let mut out = String::new();
    let b: Vec<String> = f.p.bindings.iter().map(|(n, v)| format!("{n}={v}")).collect();
    let _ = writeln!(out, "func {} [{}]", f.p.name, b.join(", "));
    let decl = |t: TensorId| {
        let d = f.p.tensor(t);
        let dims: Vec<String> = d.shape.iter().map(|x| x.to_string()).collect();
        format!("{}: {}[{}]", d.name, d.elem, dims.join(", "))
    };
    if let Some(src) = &f.p.source {
        let _ = writeln!(out, "  source {src:?}");
    }
    for param in &f.p.params {
        match param {
            ProgramParam::Tensor(t) => {
                let _ = writeln!(out, "  input {}", decl(*t));
            }
            ProgramParam::Scalar(s) => {
                let s = &f.p.scalars[*s as usize];
                let d = s.default.map(|d| format!(" = {d:?}")).unwrap_or_default();
                let _ = writeln!(out, "  scalar {}: {}{d}", s.name, s.elem);
            }
        }
    }
    for &t in &f.p.outputs {
        let _ = writeln!(out, "  output {}", decl(t));
    }
    for t in f.live_temps() {
        let _ = writeln!(out, "  temp {}", decl(t));
    }
    stmts(&Printer::new(f), &f.body, 1, &mut out);
    out
}

/// What printing `f`'s expressions needs once, not per expression: a
/// pseudo-stage whose variables are the loop variables (copying them for
/// each expression made printing quadratic in the loop nest's size).
struct Printer<'a> {
    f: &'a LoopFunc,
    st: texc_compiler::tir::Stage,
}

impl<'a> Printer<'a> {
    fn new(f: &'a LoopFunc) -> Printer<'a> {
        Printer { f, st: loop_stage(f, TExprId(0)) }
    }

    fn expr(&self, e: TExprId) -> String {
        debug_assert!(!matches!(self.f.p.expr(e), TExpr::Reduce(..)));
        texc_compiler::print::expr(&self.f.p, &self.st, e)
    }
}

/// A stage whose variables are `f`'s loop variables, valued `e`: how the
/// TIR printer reads loop variables by name.
fn loop_stage(f: &LoopFunc, e: TExprId) -> texc_compiler::tir::Stage {
    texc_compiler::tir::Stage {
        tensor: TensorId(0),
        vars: f.vars.clone(),
        n_axes: f.vars.len(),
        value: e,
        span: Default::default(),
    }
}

fn stmts(pr: &Printer, body: &[Stmt], depth: usize, out: &mut String) {
    let f = pr.f;
    let pad = "  ".repeat(depth);
    for s in body {
        match s {
            Stmt::For { var, lo, extent, kind, body } => {
                let rolled = if f.rolled.contains(var) { " rolled" } else { "" };
                let name = &f.vars[*var as usize].name;
                let _ = writeln!(out, "{pad}for {name} in {lo}..{}{}{rolled}:", lo + extent, kind.name());
                stmts(pr, body, depth + 1, out);
            }
            Stmt::If { cond, then } => {
                let _ = writeln!(out, "{pad}if {}:", pr.expr(*cond));
                stmts(pr, then, depth + 1, out);
            }
            Stmt::Alloc { tensor, body } => {
                let d = f.p.tensor(*tensor);
                let dims: Vec<String> = d.shape.iter().map(|x| x.to_string()).collect();
                let what = if f.shared.contains(tensor) {
                    "shared"
                } else if f.registers.contains(tensor) {
                    "registers"
                } else {
                    "local"
                };
                let _ = writeln!(out, "{pad}{what} {}: {}[{}]:", d.name, d.elem, dims.join(", "));
                stmts(pr, body, depth + 1, out);
            }
            Stmt::Store { tensor, indices, value } => {
                let idx: Vec<String> = indices.iter().map(|i| pr.expr(*i)).collect();
                let name = &f.p.tensor(*tensor).name;
                let lhs = if idx.is_empty() { name.clone() } else { format!("{name}[{}]", idx.join(", ")) };
                let _ = writeln!(out, "{pad}{lhs} = {}", pr.expr(*value));
            }
            Stmt::Barrier => {
                let _ = writeln!(out, "{pad}barrier");
            }
            Stmt::Async(AsyncStep::Commit) => {
                let _ = writeln!(out, "{pad}async commit");
            }
            Stmt::Async(AsyncStep::Wait(n)) => {
                let _ = writeln!(out, "{pad}async wait {n}");
            }
            Stmt::Prefetch { tensor, offset } => {
                let _ = writeln!(out, "{pad}prefetch {} at {}", f.p.tensor(*tensor).name, pr.expr(*offset));
            }
            Stmt::WarpReduce(w) => {
                let _ = writeln!(out, "{pad}warp_reduce {} {} by {}", w.op.name(), f.p.tensor(w.tensor).name, w.lanes);
            }
            Stmt::Mma { op, c, a, b } => {
                let _ = writeln!(out, "{pad}mma {} {} += {} * {}", op.name(), tile(pr, c), tile(pr, a), tile(pr, b));
            }
            Stmt::TileDot(d) => {
                let _ = writeln!(
                    out,
                    "{pad}{} {}x{}x{} {} {} {} * {}",
                    TileDot::SCHEDULE_NAME,
                    d.m,
                    d.n,
                    d.k,
                    tile(pr, &d.c),
                    if d.zero { "=" } else { "+=" },
                    tile(pr, &d.a),
                    tile(pr, &d.b)
                );
            }
            Stmt::Wgmma(w) => {
                let c = &w.c;
                let idx: Vec<String> = c.origin.iter().map(|&i| pr.expr(i)).collect();
                let c = format!("{}[{}] @ ({}, {})", f.p.tensor(c.tensor).name, idx.join(", "), c.rows, c.cols);
                let m = |m: &SmemMatrix| {
                    let idx: Vec<String> = m.origin.iter().map(|&i| pr.expr(i)).collect();
                    let major = match (m.major, m.swizzled) {
                        (Major::Mn, true) => "mn-major, swizzle 128, ",
                        (Major::Mn, false) => "mn-major, ",
                        (Major::K, true) => "swizzle 128, ",
                        (Major::K, false) => "",
                    };
                    let name = &f.p.tensor(m.tensor).name;
                    format!("{name}[{}] desc({major}lbo {}, sbo {})", idx.join(", "), m.lbo, m.sbo)
                };
                let _ = writeln!(out, "{pad}wgmma {} {c} += {} * {}", w.op.name(), m(&w.a), m(&w.b));
            }
        }
    }
}

/// A tile as the printer writes it: `T[origin] @ (rows, cols)`.
fn tile(pr: &Printer, t: &Tile) -> String {
    let f = pr.f;
    let idx: Vec<String> = t.origin.iter().map(|&i| pr.expr(i)).collect();
    format!("{}[{}] @ ({}, {})", f.p.tensor(t.tensor).name, idx.join(", "), t.rows, t.cols)
}

/// Print one expression (loop variables by name).
pub fn expr(f: &LoopFunc, e: TExprId) -> String {
    debug_assert!(!matches!(f.p.expr(e), TExpr::Reduce(..)));
    texc_compiler::print::expr(&f.p, &loop_stage(f, e), e)
}

/// The number of expression nodes code generation will emit for `f`: every
/// store's and guard's expression trees, times the copies that unrolled
/// loops make (vector lanes are one copy). Bounds compile time and code size.
pub fn emitted_size(f: &LoopFunc) -> u64 {
    fn tree(f: &LoopFunc, e: TExprId) -> u64 {
        1 + f.p.children(e).into_iter().map(|c| tree(f, c)).fold(0u64, u64::saturating_add)
    }
    fn walk(f: &LoopFunc, body: &[Stmt], copies: u64) -> u64 {
        body.iter()
            .map(|s| match s {
                Stmt::For { kind: ForKind::Unrolled, extent, body, .. } => {
                    walk(f, body, copies.saturating_mul((*extent).max(1) as u64))
                }
                Stmt::For { body, .. } | Stmt::Alloc { body, .. } => walk(f, body, copies),
                Stmt::If { cond, then } => copies.saturating_mul(tree(f, *cond)).saturating_add(walk(f, then, copies)),
                Stmt::Store { indices, value, .. } => {
                    let n = indices.iter().map(|&i| tree(f, i)).fold(tree(f, *value), u64::saturating_add);
                    copies.saturating_mul(n)
                }
                Stmt::Barrier | Stmt::Async(_) => copies,
                Stmt::Prefetch { offset, .. } => copies.saturating_mul(tree(f, *offset)),
                Stmt::WarpReduce(w) => copies.saturating_mul(f.p.tensor(w.tensor).len().max(1) as u64),
                Stmt::Mma { op, .. } => {
                    let (m, n, k) = op.shape();
                    copies.saturating_mul((m * n * k) as u64)
                }
                // One instruction; the lanes' accumulator loads and stores.
                Stmt::Wgmma(w) => copies.saturating_mul(w.op.n as u64),
                // A loop of `k / 16` steps of up to four `tdpbusd`, and the tiles' loads and stores.
                Stmt::TileDot(_) => copies.saturating_mul(16),
            })
            .fold(0u64, u64::saturating_add)
    }
    walk(f, &f.body, 1)
}
