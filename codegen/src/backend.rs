//! The interface every code generator implements, and the runnable kernel
//! they all produce.
//!
//! A backend turns a legalized loop nest ([`LoopFunc`] after the pipeline's
//! *legalize* pass) into:
//! - code in this process ([`Backend::jit`]): the entry function of
//!   [`crate::abi`] plus whatever keeps it alive;
//! - text ([`Backend::emit_text`]) for `texc emit --stage S`, for the stages
//!   it lists in [`Backend::text_stages`];
//! - an object file ([`Backend::emit_object`]) with the same entry and the
//!   typed C entry described by [`CEntry`].
//!
//! Everything around the code — argument checks, buffers, calling, the C
//! header — is here and in [`crate::abi`], written once for all backends.

use crate::abi::{self, CEntry, Layout};
use crate::device::{DeviceBuffers, DeviceCode, GpuBackend, TensorMemory};
use crate::CodegenError;
use std::borrow::Cow;
use std::time::{Duration, Instant};
use texc_compiler::interp::Arg;
use texc_compiler::target::{BackendKind, Target};
use texc_compiler::tir::{TensorDecl, TensorId};
use texc_compiler::types::ElemType;
use texc_runtime::{AlignedBuf, DType, Tensor};
use texc_schedules::LoopFunc;

/// `entry(bufs, scalars)`: `bufs[t]` is the buffer of tensor `t`,
/// `scalars[s]` the 8-byte slot of scalar `s` (see [`crate::abi`]).
pub type EntryFn = unsafe extern "C" fn(*const *mut u8, *const u64);

/// Whatever keeps a kernel's machine code alive (an execution engine, a JIT
/// module). Dropping it frees the code. It must allow the code to be called
/// from any thread, and to move to another thread.
pub trait Artifact: Send + Sync {}

/// Machine code in this process.
pub struct Code {
    pub entry: Entry,
    pub owner: Box<dyn Artifact>,
    /// For code compiled nest by nest: what was compiled and what was cached.
    pub nests: Option<NestStats>,
}

/// What a kernel compiled nest by nest was made of.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NestStats {
    /// Top-level loop nests.
    pub nests: usize,
    /// Distinct nests (equal up to their buffers): the functions linked.
    pub distinct: usize,
    /// Distinct nests whose code came from the compile cache.
    pub cached: usize,
}

/// How a kernel's code is entered.
pub enum Entry {
    /// One function for the whole kernel.
    One(EntryFn),
    /// One function per top-level loop nest, called in order, each with the
    /// buffers of its own tensors (`texc_schedules::nest`): nests equal up to
    /// their buffers share a function.
    Nests(Vec<NestCall>),
}

/// A call of a nest's function.
pub struct NestCall {
    pub entry: EntryFn,
    /// The kernel's tensor behind each of the nest's tensors.
    pub tensors: Vec<usize>,
}

impl Code {
    /// Run the kernel on `ptrs` (a buffer per tensor of the kernel) and `scalars`.
    ///
    /// # Safety
    /// As for calling an [`EntryFn`]: every tensor the kernel touches has a
    /// buffer of its size in `ptrs`, and `scalars` holds every scalar's slot.
    pub unsafe fn call(&self, ptrs: &[*mut u8], scalars: *const u64) {
        match &self.entry {
            Entry::One(f) => f(ptrs.as_ptr(), scalars),
            Entry::Nests(calls) => {
                let mut mine = Vec::new();
                for c in calls {
                    mine.clear();
                    mine.extend(c.tensors.iter().map(|&t| ptrs[t]));
                    (c.entry)(mine.as_ptr(), scalars)
                }
            }
        }
    }
}

/// A code generator. Implementations are stateless (`Sync`): every call
/// builds what it needs, so compiles may run on several threads at once.
pub trait Backend: Sync {
    fn kind(&self) -> BackendKind;

    /// The `emit --stage` names this backend prints, e.g. `["llvm", "asm"]`.
    fn text_stages(&self) -> &'static [&'static str];

    /// Compile a legalized kernel into code that runs in this process.
    fn jit(&self, f: &LoopFunc, target: &Target) -> Result<Code, CodegenError>;

    /// One of [`Backend::text_stages`] of a legalized kernel.
    fn emit_text(&self, f: &LoopFunc, target: &Target, stage: &str) -> Result<String, CodegenError>;

    /// An ELF object with the entry of [`crate::abi`], the typed C entry `c`,
    /// and a weak serial `texc_parallel_for`.
    fn emit_object(&self, f: &LoopFunc, target: &Target, c: &CEntry) -> Result<Vec<u8>, CodegenError>;

    /// The device half of a GPU backend: its kernels run on a device, not
    /// through [`Backend::jit`] (see [`crate::device`]).
    fn gpu(&self) -> Option<&dyn GpuBackend> {
        None
    }
}

/// Where a compiled kernel's code runs.
enum Exec {
    /// Machine code in this process.
    Host(Code),
    /// Kernels loaded on a device.
    Device(Box<dyn DeviceCode>),
}

/// A compiled kernel, ready to run on host tensors. It can be built on one
/// thread and run on another (`Send + Sync`).
pub struct Compiled {
    exec: Exec,
    /// For code compiled nest by nest: what was compiled and what was cached.
    pub nests: Option<NestStats>,
    layout: Layout,
    pub backend: BackendKind,
    /// Wall time spent in the backend (building, optimizing, machine code).
    pub compile_time: Duration,
    /// Device code: for each output, whether a read of it may come before
    /// its stores (`texc_schedules::zeroing::covered` cannot prove
    /// otherwise), so that a run on the caller's memory zeroes it first as
    /// the buffers `prepare` makes are. Empty for host code.
    read_first: Vec<bool>,
}

impl Compiled {
    /// The bytes of the one arena the temporaries share on the host (the
    /// memory plan's peak); a GPU run gives each its own buffer instead.
    pub fn arena_bytes(&self) -> u64 {
        self.layout.plan.arena_bytes
    }

    /// JIT-compile `f` for `target` with `backend`.
    pub fn new(backend: &dyn Backend, f: &LoopFunc, target: &Target) -> Result<Compiled, CodegenError> {
        let start = Instant::now();
        let code = backend.jit(f, target)?;
        Ok(Compiled {
            nests: code.nests,
            exec: Exec::Host(code),
            layout: Layout::of(f),
            backend: backend.kind(),
            compile_time: start.elapsed(),
            read_first: Vec::new(),
        })
    }

    /// Compile `f`'s GPU kernels for this CPU (GPU target `target`) with
    /// the emulation of `backend`'s [`GpuBackend`]: each launch's blocks run
    /// on the thread pool, each block's threads in order.
    pub fn emulated(backend: &dyn Backend, f: &LoopFunc, target: &Target) -> Result<Compiled, CodegenError> {
        let start = Instant::now();
        let code = device_half(backend, target)?.emulate(f, target)?;
        let layout = Layout::of(f);
        Ok(Compiled {
            exec: Exec::Host(code),
            nests: None,
            layout,
            backend: backend.kind(),
            compile_time: start.elapsed(),
            read_first: Vec::new(),
        })
    }

    /// Compile `f` for GPU target `target` and load it on this machine's device.
    pub fn on_device(backend: &dyn Backend, f: &LoopFunc, target: &Target) -> Result<Compiled, CodegenError> {
        let start = Instant::now();
        let code = device_half(backend, target)?.load(f, target)?;
        let layout = Layout::of(f);
        let read_first = layout.outputs.iter().map(|o| !texc_schedules::zeroing::covered(f, o.id, &f.body)).collect();
        Ok(Compiled {
            exec: Exec::Device(code),
            nests: None,
            layout,
            backend: backend.kind(),
            compile_time: start.elapsed(),
            read_first,
        })
    }

    /// Check and copy arguments (in parameter order) into aligned buffers.
    /// Each argument is dropped once copied: a model's weights are held
    /// once and a tensor, not twice.
    pub fn prepare(&self, args: Vec<Arg>) -> Result<Buffers, CodegenError> {
        abi::check_args(&self.layout, &args).map_err(CodegenError::Run)?;
        self.prepare_checked(args.into_iter().map(Cow::Owned), false)
    }

    /// [`Compiled::prepare`] from borrowed arguments (copied once, into the
    /// aligned buffers, not cloned first).
    pub fn prepare_from(&self, args: &[Arg]) -> Result<Buffers, CodegenError> {
        abi::check_args(&self.layout, args).map_err(CodegenError::Run)?;
        self.prepare_checked(args.iter().map(Cow::Borrowed), false)
    }

    /// With `take`, an owned tensor argument is used where it is, not
    /// copied: for one call (its memory is not advised to huge pages as
    /// [`AlignedBuf`]s are, which calls made repeatedly gain from). Without,
    /// an owned one is copied and its pages given back as they are
    /// ([`AlignedBuf::from_owned_tensor`]).
    fn prepare_checked<'a>(
        &self,
        args: impl Iterator<Item = Cow<'a, Arg>>,
        take: bool,
    ) -> Result<Buffers, CodegenError> {
        let l = &self.layout;
        let mut bufs = Vec::new();
        let mut ptrs = vec![std::ptr::null_mut(); l.n_tensors];
        let mut scalars = vec![0u64; l.scalars.len()];
        for (param, arg) in l.params.iter().zip(args) {
            match (param, arg.as_ref()) {
                (abi::Param::Tensor(t), Arg::Tensor(_)) if matches!(arg, Cow::Owned(_)) => {
                    let Cow::Owned(Arg::Tensor(x)) = arg else { unreachable!("matched above") };
                    let buf = match take {
                        true => HostBuf::Taken(x),
                        false => HostBuf::Own(AlignedBuf::from_owned_tensor(x).map_err(oom)?),
                    };
                    bufs.push((*t, buf));
                }
                (abi::Param::Tensor(t), Arg::Tensor(x)) => {
                    bufs.push((*t, HostBuf::Own(AlignedBuf::from_tensor(x).map_err(oom)?)))
                }
                (abi::Param::Scalar(s), Arg::Scalar(v)) => {
                    scalars[*s as usize] = abi::scalar_slot(l.scalars[*s as usize], *v)
                }
                _ => return Err(CodegenError::Run("a tensor and a scalar argument are swapped".into())),
            }
        }
        for t in &l.outputs {
            // A call made once writes its outputs where they are returned.
            let buf = if take && matches!(self.exec, Exec::Host(_)) {
                HostBuf::Taken(Tensor::zeros(t.elem, t.shape.clone()).map_err(oom)?)
            } else {
                HostBuf::Own(AlignedBuf::zeroed(t.elem, t.shape.clone()).map_err(oom)?)
            };
            bufs.push((t.id, buf));
        }
        // On the host the temporaries share one arena (the memory plan); a
        // GPU gets a buffer for each, as its launches take them one by one.
        let mut arena = None;
        match &self.exec {
            Exec::Host(_) => arena = self.host_arena(&mut ptrs)?,
            _ => {
                for t in &l.temps {
                    bufs.push((t.id, HostBuf::Own(AlignedBuf::zeroed(t.elem, t.shape.clone()).map_err(oom)?)));
                }
            }
        }
        for (t, b) in bufs.iter_mut() {
            ptrs[t.0 as usize] = b.as_mut_ptr();
        }
        let device = match &self.exec {
            Exec::Host(_) => None,
            Exec::Device(g) => {
                let host: Vec<&[u8]> = g
                    .tensors()
                    .iter()
                    .map(|id| {
                        bufs.iter().find(|(t, _)| t == id).map(|(_, b)| b.bytes()).expect("every tensor has a buffer")
                    })
                    .collect();
                Some(g.upload(&host)?)
            }
        };
        Ok(Buffers { bufs, _arena: arena, ptrs, scalars, device })
    }

    /// Run on prepared buffers (may be called repeatedly, e.g. by `bench`).
    /// On a GPU the buffers stay on the device between calls; [`Compiled::outputs`] copies them back.
    pub fn call(&self, b: &mut Buffers) -> Result<(), CodegenError> {
        match &self.exec {
            // SAFETY: every tensor the kernel touches has a buffer of its declared
            // size (prepare), the kernel stays inside them (bounds checking), and
            // the code is alive while `self` is.
            Exec::Host(code) => unsafe { code.call(&b.ptrs, b.scalars.as_ptr()) },
            Exec::Device(g) => {
                let scalars: Vec<(ElemType, u64)> =
                    self.layout.scalars.iter().copied().zip(b.scalars.clone()).collect();
                let bufs = b.device.as_ref().expect("prepared for the device");
                g.launch(bufs, &scalars)?;
            }
        }
        Ok(())
    }

    pub fn outputs(&self, b: &Buffers) -> Result<Vec<Tensor>, CodegenError> {
        let find = |id| b.bufs.iter().find(|(t, _)| *t == id).map(|(_, buf)| buf);
        let mut out = Vec::new();
        for o in &self.layout.outputs {
            let host = find(o.id).expect("outputs have buffers");
            match (&self.exec, &b.device) {
                (Exec::Device(g), Some(dev)) => {
                    let i = g.tensors().iter().position(|&t| t == o.id).expect("the kernels take every output");
                    let mut copy = AlignedBuf::zeroed(o.elem, o.shape.clone()).map_err(oom)?;
                    g.download(dev, i, copy.bytes_mut())?;
                    out.push(copy.to_tensor());
                }
                _ => out.push(host.to_tensor()),
            }
        }
        Ok(out)
    }

    /// Prepare, call once, return the outputs. The tensor arguments are
    /// used where they are, not copied (a model's weights are held once).
    pub fn run(&self, args: Vec<Arg>) -> Result<Vec<Tensor>, CodegenError> {
        abi::check_args(&self.layout, &args).map_err(CodegenError::Run)?;
        let mut b = self.prepare_checked(args.into_iter().map(Cow::Owned), true)?;
        self.call(&mut b)?;
        self.into_outputs(b)
    }

    /// [`Compiled::outputs`] of host code, the other buffers freed first and
    /// each output's freed once copied out (a model's folded constants are
    /// held once and a tensor at a time, not twice).
    fn into_outputs(&self, mut b: Buffers) -> Result<Vec<Tensor>, CodegenError> {
        let ids: Vec<_> = self.layout.outputs.iter().map(|o| o.id).collect();
        let distinct = ids.iter().collect::<std::collections::HashSet<_>>().len() == ids.len();
        if !matches!(self.exec, Exec::Host(_)) || !distinct {
            return self.outputs(&b);
        }
        b._arena = None;
        b.bufs.retain(|(t, _)| ids.contains(t));
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            let i = b.bufs.iter().position(|(t, _)| *t == id).expect("outputs have buffers");
            out.push(b.bufs.swap_remove(i).1.into_tensor());
        }
        Ok(out)
    }

    /// [`Compiled::run`] on borrowed arguments.
    pub fn run_from(&self, args: &[Arg]) -> Result<Vec<Tensor>, CodegenError> {
        let mut b = self.prepare_from(args)?;
        self.call(&mut b)?;
        self.outputs(&b)
    }
}

/// A tensor in memory the caller owns: its elements in row-major order,
/// stored as generated code stores them (f16/bf16 as their bits, bools as
/// bytes 0/1), aligned to the element's size.
pub struct TensorRef<'a> {
    pub dtype: DType,
    pub shape: &'a [usize],
    pub bytes: &'a [u8],
}

impl<'a> TensorRef<'a> {
    /// The memory of `t`, where it is.
    pub fn of(t: &'a Tensor) -> TensorRef<'a> {
        TensorRef { dtype: t.dtype(), shape: &t.shape, bytes: t.bytes() }
    }
}

impl<'a> ArgRef<'a> {
    /// Argument `a` borrowed: a tensor where it is, or a scalar.
    pub fn of(a: &'a Arg) -> ArgRef<'a> {
        match a {
            Arg::Tensor(t) => ArgRef::Tensor(TensorRef::of(t)),
            Arg::Scalar(v) => ArgRef::Scalar(*v),
        }
    }
}

/// An output tensor in memory the caller owns (as [`TensorRef`]).
pub struct TensorMut<'a> {
    pub dtype: DType,
    pub shape: &'a [usize],
    pub bytes: &'a mut [u8],
}

/// An argument of [`Compiled::run_in_place`].
pub enum ArgRef<'a> {
    Tensor(TensorRef<'a>),
    Scalar(f64),
}

impl Compiled {
    /// The element type and shape of each output, in order.
    pub fn output_shapes(&self) -> Vec<(DType, Vec<usize>)> {
        self.layout.outputs.iter().map(|o| (o.elem, o.shape.clone())).collect()
    }

    /// Whether [`Compiled::run_in_place`] can run this kernel (host code).
    pub fn runs_in_place(&self) -> bool {
        matches!(self.exec, Exec::Host(_))
    }

    /// Run on the caller's memory without copying: inputs are read where
    /// they are and outputs written where they are (zeroed first, as
    /// [`Compiled::prepare`] zeroes its buffers); only the temporaries are
    /// allocated. Host code only (a device needs its own copies).
    ///
    /// Generated host code needs no more alignment than the element's size
    /// (vector accesses are unaligned loads and stores) and never writes a
    /// parameter, so borrowed inputs stay as they were.
    pub fn run_in_place(&self, args: &[ArgRef<'_>], outputs: &mut [TensorMut<'_>]) -> Result<(), CodegenError> {
        let Exec::Host(code) = &self.exec else {
            return Err(CodegenError::Unsupported("running a device kernel on host memory in place".into()));
        };
        let l = &self.layout;
        let mut ptrs = vec![std::ptr::null_mut(); l.n_tensors];
        // First, as `prepare` does: the parameters' and outputs' own memory
        // replaces any slot the plan gives them.
        let _arena = self.host_arena(&mut ptrs)?;
        let scalar_of = |a: &ArgRef<'_>| match a {
            ArgRef::Scalar(v) => Some(*v),
            ArgRef::Tensor(_) => None,
        };
        let scalars = self.bind_params(args, scalar_of, |t, decl, want, arg| {
            let ArgRef::Tensor(x) = arg else { unreachable!("a tensor argument") };
            check_memory(&decl.name, decl.elem, want, x.dtype, x.shape, x.bytes)?;
            // The code only reads parameters (see above).
            ptrs[t.0 as usize] = x.bytes.as_ptr().cast_mut();
            Ok(())
        })?;
        if outputs.len() != l.outputs.len() {
            return Err(CodegenError::Run(format!("expected {} outputs, got {}", l.outputs.len(), outputs.len())));
        }
        // A tensor returned twice is written in its first output and copied to the others.
        let mut copies = Vec::new();
        for (i, (o, y)) in l.outputs.iter().zip(outputs.iter_mut()).enumerate() {
            check_memory("an output", o.elem, &o.shape, y.dtype, y.shape, y.bytes)?;
            y.bytes.fill(0);
            match l.outputs[..i].iter().position(|p| p.id == o.id) {
                Some(first) => copies.push((first, i)),
                None => ptrs[o.id.0 as usize] = y.bytes.as_mut_ptr(),
            }
        }
        // SAFETY: every tensor the kernel touches has memory of its declared
        // size and type (checked above, or the arena of its memory plan), the
        // kernel stays inside it (bounds checking), outputs are exclusive
        // borrows, and the code is alive while `self` is.
        unsafe { code.call(&ptrs, scalars.as_ptr()) };
        for (first, i) in copies {
            let (head, tail) = outputs.split_at_mut(i);
            tail[0].bytes.copy_from_slice(head[first].bytes);
        }
        Ok(())
    }

    /// Whether [`Compiled::run_on_device`] can run this kernel (loaded on a device).
    pub fn runs_on_device(&self) -> bool {
        matches!(self.exec, Exec::Device(_))
    }

    /// Run loaded device code on device memory the caller owns (PyTorch's
    /// CUDA tensors): inputs read where they are, outputs written where they
    /// are (zeroed first where a read of one may precede its stores: every
    /// element of an output is stored, so one that is only stored needs no
    /// zeroing), temporaries allocated for the call; queued
    /// on `stream` (the device API's handle, 0 its default stream) without
    /// waiting, so the caller's later work on that stream sees the results.
    ///
    /// # Safety
    /// Each tensor's `ptr` is device memory of texc's device holding its
    /// dtype and shape (the shapes and dtypes are checked here, the memory
    /// cannot be), alive until the queued work is done; `stream` is a live
    /// stream of that device's context (or 0).
    pub unsafe fn run_on_device(
        &self,
        args: &[DeviceArgRef<'_>],
        outputs: &[DeviceTensorRef<'_>],
        stream: u64,
    ) -> Result<(), CodegenError> {
        let Exec::Device(g) = &self.exec else {
            return Err(CodegenError::Unsupported("running host code on device memory".into()));
        };
        let l = &self.layout;
        if outputs.len() != l.outputs.len() {
            return Err(CodegenError::Run(format!("expected {} outputs, got {}", l.outputs.len(), outputs.len())));
        }
        let mut given: Vec<(TensorId, u64, bool)> = Vec::new();
        let scalar_of = |a: &DeviceArgRef<'_>| match a {
            DeviceArgRef::Scalar(v) => Some(*v),
            DeviceArgRef::Tensor(_) => None,
        };
        let scalars = self.bind_params(args, scalar_of, |t, decl, want, arg| {
            let DeviceArgRef::Tensor(x) = arg else { unreachable!("a tensor argument") };
            check_device_memory(&decl.name, decl.elem, want, &x)?;
            given.push((t, x.ptr, false));
            Ok(())
        })?;
        let tensors = g.tensors();
        let position = |id: TensorId| tensors.iter().position(|&t| t == id).expect("the kernels take every output");
        // A tensor returned twice is written in its first output and copied to the others.
        let mut copies = Vec::new();
        for (i, (o, y)) in l.outputs.iter().zip(outputs).enumerate() {
            check_device_memory("an output", o.elem, &o.shape, y)?;
            let zero = self.read_first.get(i).copied().unwrap_or(true);
            match l.outputs[..i].iter().any(|p| p.id == o.id) {
                true => copies.push((position(o.id), y.ptr, o.bytes())),
                false => given.push((o.id, y.ptr, zero)),
            }
        }
        // Temporaries are not zeroed: the `zero` pass stores whatever of
        // them is read before it is stored (as `call` on `prepare`'s
        // buffers, run again and again, relies on too).
        let memory: Vec<TensorMemory> = tensors
            .iter()
            .map(|id| {
                let bytes = l.tensor_bytes(*id);
                match given.iter().find(|(t, _, _)| t == id) {
                    Some(&(_, ptr, zero)) => TensorMemory { ptr: Some(ptr), bytes, zero },
                    None => TensorMemory { ptr: None, bytes, zero: false },
                }
            })
            .collect();
        let scalars: Vec<(ElemType, u64)> = l.scalars.iter().copied().zip(scalars).collect();
        // SAFETY: the caller's promise; the shapes and dtypes checked above.
        unsafe { g.launch_on(&memory, &scalars, stream, &copies) }
    }

    /// Walk the parameters beside `args` (a call's, in parameter order):
    /// each tensor argument handed to `tensor` with its id, declaration
    /// and shape; each scalar converted into its slot. The scalars' slots.
    fn bind_params<A>(
        &self,
        args: &[A],
        scalar_of: impl Fn(&A) -> Option<f64>,
        mut tensor: impl FnMut(TensorId, &TensorDecl, &[usize], &A) -> Result<(), CodegenError>,
    ) -> Result<Vec<u64>, CodegenError> {
        let l = &self.layout;
        if args.len() != l.params.len() {
            return Err(CodegenError::Run(format!("expected {} arguments, got {}", l.params.len(), args.len())));
        }
        let mut scalars = vec![0u64; l.scalars.len()];
        let mut inputs = l.inputs.iter();
        for (param, arg) in l.params.iter().zip(args) {
            match (param, scalar_of(arg)) {
                (abi::Param::Tensor(t), None) => {
                    let decl = inputs.next().expect("one declaration per tensor parameter");
                    let want: Vec<usize> = decl.shape.iter().map(|&d| d as usize).collect();
                    tensor(*t, decl, &want, arg)?;
                }
                (abi::Param::Scalar(s), Some(v)) => scalars[*s as usize] = abi::scalar_slot(l.scalars[*s as usize], v),
                _ => return Err(CodegenError::Run("a tensor and a scalar argument are swapped".into())),
            }
        }
        Ok(scalars)
    }

    /// The temporaries of a host kernel in one zeroed arena at the offsets
    /// of its memory plan, their pointers set in `ptrs`.
    fn host_arena(&self, ptrs: &mut [*mut u8]) -> Result<Option<AlignedBuf>, CodegenError> {
        let l = &self.layout;
        if l.temps.is_empty() {
            return Ok(None);
        }
        let mut a = AlignedBuf::zeroed(DType::U8, vec![l.plan.arena_bytes as usize]).map_err(oom)?;
        for s in &l.plan.slots {
            // SAFETY: the plan keeps every slot inside the arena.
            ptrs[s.tensor.0 as usize] = unsafe { a.as_mut_ptr().add(s.offset as usize) };
        }
        Ok(Some(a))
    }
}

/// Caller-owned memory must hold the tensor's type and shape exactly, and be
/// aligned to its element's size.
fn check_memory(
    name: &str,
    elem: ElemType,
    want: &[usize],
    dtype: DType,
    shape: &[usize],
    bytes: &[u8],
) -> Result<(), CodegenError> {
    if dtype != elem || shape != want {
        return Err(CodegenError::Run(format!("{name}: expected {elem}{want:?}, got {dtype}{shape:?}")));
    }
    let size = want.iter().try_fold(elem.size(), |a, &d| a.checked_mul(d));
    if size != Some(bytes.len()) {
        return Err(CodegenError::Run(format!("{name}: {} bytes for {elem}{want:?}", bytes.len())));
    }
    if !(bytes.as_ptr() as usize).is_multiple_of(elem.size()) {
        return Err(CodegenError::Run(format!("{name}: memory not aligned to its {}-byte elements", elem.size())));
    }
    Ok(())
}

/// A tensor in device memory the caller owns ([`Compiled::run_on_device`]):
/// its address, in row-major order, aligned to its elements.
pub struct DeviceTensorRef<'a> {
    pub ptr: u64,
    pub dtype: DType,
    pub shape: &'a [usize],
}

/// An argument of [`Compiled::run_on_device`].
pub enum DeviceArgRef<'a> {
    Tensor(DeviceTensorRef<'a>),
    Scalar(f64),
}

/// Device code assumes its buffers start on 16 bytes (vector accesses and
/// `cp.async` copies of 16 bytes: `schedules::analysis::vector_alignment`),
/// as every allocator's blocks do: a view at another offset is refused.
pub const DEVICE_ALIGNMENT: u64 = 16;

fn check_device_memory(
    name: &str,
    elem: ElemType,
    want: &[usize],
    x: &DeviceTensorRef<'_>,
) -> Result<(), CodegenError> {
    if x.dtype != elem || x.shape != want {
        return Err(CodegenError::Run(format!("{name}: expected {elem}{want:?}, got {}{:?}", x.dtype, x.shape)));
    }
    if !x.ptr.is_multiple_of(DEVICE_ALIGNMENT) {
        return Err(CodegenError::Run(format!(
            "{name}: device memory at {:#x} does not start on {DEVICE_ALIGNMENT} bytes",
            x.ptr
        )));
    }
    Ok(())
}

/// One top-level loop nest of a host kernel, compiled as a kernel of its
/// own over the same tensors ([`Compiled::parts`]): it runs on the buffers
/// the whole kernel prepared, so that each nest can be timed alone
/// (`texc bench --profile`).
pub struct Part {
    /// What the nest computes: the tensors it writes (not its local buffers).
    pub label: String,
    /// Whether some loop of the nest runs on the thread pool.
    pub parallel: bool,
    code: Code,
}

impl Part {
    /// Run the nest on buffers the whole kernel prepared (the nests before it
    /// have run, or their results are stale: times, not results, are the point).
    pub fn call(&self, b: &mut Buffers) {
        // SAFETY: the part's tensors are the whole kernel's (the same
        // program), whose buffers `b` holds at the whole kernel's sizes; the
        // code is alive while `self` is.
        unsafe { self.code.call(&b.ptrs, b.scalars.as_ptr()) }
    }
}

impl Compiled {
    /// Each top-level loop nest of `f` compiled alone with `backend` (host
    /// targets), in program order, to run on [`Compiled::prepare`]'s buffers
    /// of the whole `f`.
    pub fn parts(&self, backend: &dyn Backend, f: &LoopFunc, target: &Target) -> Result<Vec<Part>, CodegenError> {
        if !matches!(self.exec, Exec::Host(_)) {
            return Err(CodegenError::Unsupported("timing loop nests one by one on a GPU".into()));
        }
        f.body
            .iter()
            .map(|s| {
                let one = LoopFunc {
                    p: f.p.clone(),
                    vars: f.vars.clone(),
                    body: vec![s.clone()],
                    shared: f.shared.clone(),
                    registers: f.registers.clone(),
                    rolled: f.rolled.clone(),
                };
                let code = backend.jit(&one, target)?;
                Ok(Part {
                    label: texc_schedules::ir::nest_label(f, s),
                    parallel: texc_schedules::ir::has_parallel_loop(s),
                    code,
                })
            })
            .collect()
    }
}

fn device_half<'b>(backend: &'b dyn Backend, target: &Target) -> Result<&'b dyn GpuBackend, CodegenError> {
    backend.gpu().ok_or_else(|| {
        CodegenError::Unsupported(format!("the {} backend of `{target}` has no device code", backend.kind().name()))
    })
}

fn oom(e: texc_runtime::OutOfMemory) -> CodegenError {
    CodegenError::Run(format!("the kernel's buffers do not fit in memory: {e}"))
}

/// The memory of one tensor for a call.
enum HostBuf {
    /// Aligned memory of its own: a copied input, an output, a temporary.
    Own(AlignedBuf),
    /// An input the call owns, read where it is (generated code reads
    /// memory aligned to the element's size, as a `Vec`'s is).
    Taken(Tensor),
}

impl HostBuf {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        match self {
            HostBuf::Own(b) => b.as_mut_ptr(),
            HostBuf::Taken(t) => t.as_mut_ptr(),
        }
    }

    fn bytes(&self) -> &[u8] {
        match self {
            HostBuf::Own(b) => b.bytes(),
            HostBuf::Taken(t) => t.bytes(),
        }
    }

    fn to_tensor(&self) -> Tensor {
        match self {
            HostBuf::Own(b) => b.to_tensor(),
            HostBuf::Taken(t) => t.clone(),
        }
    }

    fn into_tensor(self) -> Tensor {
        match self {
            HostBuf::Own(b) => b.to_tensor(),
            HostBuf::Taken(t) => t,
        }
    }
}

/// Buffers for one call: inputs copied in (or taken), outputs and temporaries zeroed.
pub struct Buffers {
    bufs: Vec<(texc_compiler::tir::TensorId, HostBuf)>,
    /// The temporaries of a host kernel, at the offsets of its memory plan.
    _arena: Option<AlignedBuf>,
    ptrs: Vec<*mut u8>,
    scalars: Vec<u64>,
    /// The same buffers on the device, for kernels that run there.
    device: Option<DeviceBuffers>,
}

// SAFETY: the raw pointers point into `bufs`, which the value owns; moving
// the whole value to another thread moves the buffers with them.
unsafe impl Send for Buffers {}
