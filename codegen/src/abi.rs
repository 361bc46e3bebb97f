//! How compiled kernels are called, the same for every backend.
//!
//! **Entry** (JIT and objects): `void texc_<kernel>(void **bufs, const
//! uint64_t *scalars)`. `bufs[t]` is the 64-byte-aligned buffer of tensor `t`
//! (inputs, outputs and live temporaries; other slots are unused);
//! `scalars[s]` is an 8-byte slot holding scalar `s` as an f64 (float
//! scalars) or an i64 (integer and bool scalars), so that no value is lost.
//!
//! **C entry** (objects, declared by [`crate::header`]): `int
//! texc_<kernel>_run(inputs and scalars in parameter order, then outputs)`,
//! described by [`CEntry`]. It returns [`STATUS_NULL`] if a pointer is NULL,
//! allocates the temporaries ([`STATUS_NO_MEMORY`] if that fails, freeing
//! what it got), fills the two arrays, calls the entry, frees the
//! temporaries and returns [`STATUS_OK`]. Half-precision scalars are passed
//! as `float`.

use texc_compiler::interp::{check_tensor_arg, Arg};
use texc_compiler::semantics::{self, V};
use texc_compiler::tir::{ProgramParam, TensorDecl, TensorId, Ty};
use texc_compiler::types::ElemType;
use texc_schedules::LoopFunc;

pub const ENTRY_PREFIX: &str = "texc_";
/// The C entry returned normally.
pub const STATUS_OK: i32 = 0;
/// A temporary could not be allocated.
pub const STATUS_NO_MEMORY: i32 = 1;
/// A pointer argument was NULL.
pub const STATUS_NULL: i32 = 2;
/// The sized entry (`texc_<kernel>_run_sized`, in the header) was given an element count that differs from the compiled size.
pub const STATUS_BAD_SIZE: i32 = 3;

/// The entry's symbol: `texc_<kernel>`.
pub fn entry_name(f: &LoopFunc) -> String {
    entry_name_of(&f.p.name)
}

/// The entry's name of a kernel named `name`.
pub fn entry_name_of(name: &str) -> String {
    format!("{ENTRY_PREFIX}{name}")
}

/// Tensors whose buffers the entry receives, in increasing id order:
/// inputs, outputs and live temporaries.
pub fn used_tensors(f: &LoopFunc) -> Vec<TensorId> {
    let mut used: Vec<TensorId> =
        f.p.input_tensors().chain(f.p.outputs.iter().copied()).chain(f.live_temps()).collect();
    used.sort();
    used.dedup();
    used
}

/// Whether scalar slots of this type hold an f64 (else an i64).
pub fn float_slot(e: ElemType) -> bool {
    e.is_float()
}

/// The slot of a scalar of type `e` given as `v`, converted as the interpreter does.
pub fn scalar_slot(e: ElemType, v: f64) -> u64 {
    match semantics::cast(V::F(v), Ty::Elem(e)) {
        V::F(x) => x.to_bits(),
        other => other.i() as u64,
    }
}

/// A tensor a call provides or receives.
#[derive(Clone, Debug)]
pub struct TensorDesc {
    pub id: TensorId,
    pub elem: ElemType,
    pub shape: Vec<usize>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Param {
    Tensor(TensorId),
    Scalar(u32),
}

/// What a caller needs to know to call a compiled kernel.
#[derive(Clone, Debug)]
pub struct Layout {
    pub n_tensors: usize,
    pub params: Vec<Param>,
    /// Declarations of tensor parameters, in parameter order.
    pub inputs: Vec<TensorDecl>,
    pub scalars: Vec<ElemType>,
    pub outputs: Vec<TensorDesc>,
    pub temps: Vec<TensorDesc>,
    /// Where the temporaries live in one arena on the host.
    pub plan: texc_schedules::memory_plan::MemoryPlan,
}

fn desc(f: &LoopFunc, t: TensorId) -> TensorDesc {
    let d = f.p.tensor(t);
    TensorDesc { id: t, elem: d.elem, shape: d.shape.iter().map(|&s| s as usize).collect() }
}

impl Layout {
    pub fn of(f: &LoopFunc) -> Layout {
        let p = &f.p;
        let params = p
            .params
            .iter()
            .map(|x| match x {
                ProgramParam::Tensor(t) => Param::Tensor(*t),
                ProgramParam::Scalar(s) => Param::Scalar(*s),
            })
            .collect();
        Layout {
            n_tensors: p.tensors.len(),
            params,
            inputs: p.input_tensors().map(|t| p.tensor(t).clone()).collect(),
            scalars: p.scalars.iter().map(|s| s.elem).collect(),
            outputs: p.outputs.iter().map(|&t| desc(f, t)).collect(),
            temps: f.live_temps().into_iter().map(|t| desc(f, t)).collect(),
            plan: texc_schedules::memory_plan::plan(f),
        }
    }

    /// The bytes of tensor `id`: a parameter, an output or a temporary.
    pub fn tensor_bytes(&self, id: TensorId) -> usize {
        let described = self.outputs.iter().chain(&self.temps).find(|d| d.id == id);
        if let Some(d) = described {
            return d.bytes();
        }
        let tensor_params = self.params.iter().filter_map(|p| match p {
            Param::Tensor(t) => Some(*t),
            Param::Scalar(_) => None,
        });
        let decl = tensor_params.zip(&self.inputs).find(|(t, _)| *t == id).map(|(_, d)| d);
        decl.map_or(0, |d| d.shape.iter().map(|&s| s as usize).product::<usize>() * d.elem.size())
    }
}

impl TensorDesc {
    pub fn bytes(&self) -> usize {
        self.shape.iter().product::<usize>() * self.elem.size()
    }
}

/// Arguments must match the parameters in number, kind, shape and type.
pub fn check_args(l: &Layout, args: &[Arg]) -> Result<(), String> {
    if args.len() != l.params.len() {
        return Err(format!("expected {} arguments, got {}", l.params.len(), args.len()));
    }
    let mut inputs = l.inputs.iter();
    for (param, arg) in l.params.iter().zip(args) {
        match (param, arg) {
            (Param::Tensor(_), Arg::Tensor(x)) => {
                let decl = inputs.next().expect("one declaration per tensor parameter");
                check_tensor_arg(decl, x).map_err(|e| e.to_string())?;
            }
            (Param::Scalar(_), Arg::Scalar(_)) => {}
            _ => return Err("a tensor and a scalar argument are swapped".into()),
        }
    }
    Ok(())
}

/// C type of a scalar parameter of the C entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CScalar {
    /// `float` (f32, and f16/bf16 scalars, converted inside).
    F32,
    F64,
    I8,
    /// `uint8_t` (u8 and bool).
    U8,
    I32,
    I64,
}

impl CScalar {
    pub fn of(e: ElemType) -> CScalar {
        match e {
            ElemType::F16 | ElemType::BF16 | ElemType::F32 => CScalar::F32,
            ElemType::F64 => CScalar::F64,
            ElemType::I8 => CScalar::I8,
            ElemType::U8 | ElemType::Bool => CScalar::U8,
            ElemType::I32 => CScalar::I32,
            ElemType::I64 => CScalar::I64,
        }
    }

    pub fn c_name(self) -> &'static str {
        match self {
            CScalar::F32 => "float",
            CScalar::F64 => "double",
            CScalar::I8 => "int8_t",
            CScalar::U8 => "uint8_t",
            CScalar::I32 => "int32_t",
            CScalar::I64 => "int64_t",
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, CScalar::F32 | CScalar::F64)
    }

    pub fn is_signed(self) -> bool {
        matches!(self, CScalar::I8 | CScalar::I32 | CScalar::I64)
    }
}

/// One parameter of the C entry.
#[derive(Clone, Debug)]
pub enum CParam {
    /// A pointer to tensor `t` (an input if `output` is false).
    Tensor { t: TensorId, output: bool },
    /// Scalar `s`, passed as `ty`.
    Scalar { s: u32, ty: CScalar },
}

/// The typed C entry of an object (see the module documentation).
#[derive(Clone, Debug)]
pub struct CEntry {
    /// `texc_<kernel>_run`.
    pub name: String,
    /// The entry it calls: `texc_<kernel>`.
    pub entry: String,
    pub params: Vec<CParam>,
    /// Temporaries: each tensor's offset in one arena of `arena_bytes`
    /// (the memory plan, `texc_schedules::memory_plan`), allocated per call.
    pub temps: Vec<(TensorId, u64)>,
    pub arena_bytes: u64,
    pub n_tensors: usize,
    pub n_scalars: usize,
}

impl CEntry {
    pub fn of(f: &LoopFunc) -> CEntry {
        let p = &f.p;
        let mut params: Vec<CParam> = p
            .params
            .iter()
            .map(|x| match x {
                ProgramParam::Tensor(t) => CParam::Tensor { t: *t, output: false },
                ProgramParam::Scalar(s) => CParam::Scalar { s: *s, ty: CScalar::of(p.scalars[*s as usize].elem) },
            })
            .collect();
        params.extend(p.outputs.iter().map(|&t| CParam::Tensor { t, output: true }));
        let plan = texc_schedules::memory_plan::plan(f);
        let temps = plan.slots.iter().map(|s| (s.tensor, s.offset)).collect();
        CEntry {
            name: format!("{}_run", entry_name(f)),
            entry: entry_name(f),
            params,
            temps,
            arena_bytes: plan.arena_bytes,
            n_tensors: p.tensors.len(),
            n_scalars: p.scalars.len(),
        }
    }
}

/// The serial stand-in for the runtime's pool that objects define weakly:
/// `texc_parallel_for(task, ctx, n)` runs `task(ctx, 0, n)`.
pub const PARALLEL_FOR: &str = "texc_parallel_for";

/// The address of the runtime's `texc_parallel_for`, for JIT backends.
pub fn runtime_parallel_for() -> *const u8 {
    texc_runtime::pool::texc_parallel_for as *const u8
}

/// `void *texc_local_alloc(uint64_t bytes)`: a 64-byte aligned buffer for a
/// local that CPU code takes from the heap
/// ([`LoopFunc::heap_locals`](texc_schedules::LoopFunc::heap_locals)),
/// never NULL. Objects define it weakly over `aligned_alloc` (aborting when
/// that fails); JIT code calls the runtime's.
pub const LOCAL_ALLOC: &str = "texc_local_alloc";
/// `void texc_local_free(void *p)`: gives back a [`LOCAL_ALLOC`] buffer.
pub const LOCAL_FREE: &str = "texc_local_free";

/// The runtime's [`LOCAL_ALLOC`] and [`LOCAL_FREE`], for JIT backends.
pub fn runtime_local_memory() -> [(&'static str, *const u8); 2] {
    [
        (LOCAL_ALLOC, texc_runtime::local::texc_local_alloc as *const u8),
        (LOCAL_FREE, texc_runtime::local::texc_local_free as *const u8),
    ]
}
