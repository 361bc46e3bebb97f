//! GPU kernels: each launch of a GPU loop nest (`texc_schedules::gpu`)
//! becomes one kernel function whose parameters are the tensors the kernel
//! uses (`noalias` pointers) and its scalars.
//!
//! A loop bound to `block.d` is no loop: its variable is `lo + blockIdx.d`
//! (the grid has exactly its extent); a loop bound to `thread.d` is
//! `lo + threadIdx.d`, guarded by `threadIdx.d < extent` when the block is
//! larger than the loop. Everything else is the CPU emitter's scalar code.
//!
//! The same kernels are built two ways:
//! - for PTX ([`Gen::build_ptx`]): block and thread indices are NVVM's
//!   special registers, kernels are marked in `!nvvm.annotations` with their
//!   exact block size (`reqntid`), and math built-ins call libdevice;
//!   shared buffers are `.shared` arrays and barriers `bar.sync`;
//! - for the CPU emulation ([`Gen::build_emulation`]): the block index is
//!   three extra parameters, thread loops are loops, shared buffers stack
//!   arrays, barriers nothing; the entry of `crate::abi` runs each launch's
//!   blocks on the thread pool. The launch rules make the threads of a block
//!   independent between barriers, so running each thread loop to its end
//!   computes what the GPU computes, with the statements the PTX has.

use super::gen::{Frame, Gen, Mode};
use super::R;
use inkwell::attributes::AttributeLoc;
use inkwell::module::{Linkage, Module};
use inkwell::types::BasicMetadataTypeEnum;
use inkwell::types::BasicType;
use inkwell::values::{BasicMetadataValueEnum, BasicValueEnum, FunctionValue, IntValue, PointerValue};
use inkwell::{AddressSpace, IntPredicate};
use texc_compiler::ops::{BinOp, MathFn, ReduceOp};
use texc_compiler::tir::VarId;
use texc_schedules::gpu::Launch;
use texc_schedules::gpu::SWIZZLE_ALIGN;
use texc_schedules::ir::{AsyncStep, ForKind, Stmt, WarpReduce};

/// The kernel being built: where its thread runs.
#[derive(Clone, Copy)]
pub(super) struct GpuKernel<'ctx> {
    /// `blockIdx.{x,y,z}` as i64.
    pub block_idx: [IntValue<'ctx>; 3],
    /// `threadIdx.{x,y,z}` as i64 on the GPU; `None` in the emulation, where
    /// thread loops are loops (one call of the kernel runs a whole block).
    pub thread_idx: Option<[IntValue<'ctx>; 3]>,
    /// Threads per block (x, y, z).
    pub block: [i64; 3],
}

/// The name of launch `i`'s kernel.
pub fn kernel_name(f: &texc_schedules::LoopFunc, i: usize) -> String {
    format!("{}_k{i}", f.p.name.replace(|c: char| !c.is_ascii_alphanumeric() && c != '_', "_"))
}

const SREG: [[&str; 3]; 2] = [
    ["llvm.nvvm.read.ptx.sreg.ctaid.x", "llvm.nvvm.read.ptx.sreg.ctaid.y", "llvm.nvvm.read.ptx.sreg.ctaid.z"],
    ["llvm.nvvm.read.ptx.sreg.tid.x", "llvm.nvvm.read.ptx.sreg.tid.y", "llvm.nvvm.read.ptx.sreg.tid.z"],
];

impl<'ctx> Gen<'ctx, '_> {
    /// A module with one PTX kernel per launch.
    pub(super) fn build_ptx(mut self, launches: &[Launch]) -> R<Module<'ctx>> {
        self.libdevice = true;
        for (i, l) in launches.iter().enumerate() {
            let k = self.kernel_fn(&kernel_name(self.f, i), 0, Linkage::External);
            let bb = self.cx.append_basic_block(k, "entry");
            self.b.position_at_end(bb);
            let sreg = |g: &Self, unit: usize, d: usize, n: i64| -> R<IntValue<'ctx>> {
                let i64t = g.cx.i64_type();
                if n <= 1 {
                    return Ok(i64t.const_zero());
                }
                let v = g.call(g.intrinsic(SREG[unit][d], &[])?, &[])?.into_int_value();
                Ok(g.b.build_int_z_extend(v, i64t, "idx")?)
            };
            let block_idx =
                [sreg(&self, 0, 0, l.grid[0])?, sreg(&self, 0, 1, l.grid[1])?, sreg(&self, 0, 2, l.grid[2])?];
            let thread_idx =
                [sreg(&self, 1, 0, l.block[0])?, sreg(&self, 1, 1, l.block[1])?, sreg(&self, 1, 2, l.block[2])?];
            self.dynamic_shared = if l.dynamic_shared > 0 {
                texc_schedules::gpu::shared_offsets(self.f, &self.f.body[l.stmt])
            } else {
                Default::default()
            };
            self.kernel_body(k, l, block_idx, Some(thread_idx))?;
            self.annotate_kernel(k, l)?;
        }
        Ok(self.m)
    }

    /// A module whose `crate::abi` entry runs every launch on the CPU.
    pub(super) fn build_emulation(mut self, launches: &[Launch]) -> R<Module<'ctx>> {
        let ptr = self.cx.ptr_type(AddressSpace::default());
        let i64t = self.cx.i64_type();
        let pf = self.m.add_function(
            crate::abi::PARALLEL_FOR,
            self.cx.void_type().fn_type(&[ptr.into(), ptr.into(), i64t.into()], false),
            Some(Linkage::External),
        );
        let mut tasks = Vec::new();
        for (i, l) in launches.iter().enumerate() {
            let k = self.kernel_fn(&kernel_name(self.f, i), 3, Linkage::Internal);
            let n = (self.used.len() + self.f.p.scalars.len()) as u32;
            let bb = self.cx.append_basic_block(k, "entry");
            self.b.position_at_end(bb);
            let p = |j: u32| k.get_nth_param(n + j).expect("index param").into_int_value();
            self.kernel_body(k, l, [p(0), p(1), p(2)], None)?;
            tasks.push(self.block_task(i, l, k)?);
        }
        // The body: one context with every tensor and scalar, then each launch.
        let body = self.region_fn("texc_body", &[], &[], false)?;
        let fr = self.frame_from_params(body, &[], &[]);
        let bb = self.cx.append_basic_block(body, "entry");
        self.b.position_at_end(bb);
        let slots = self.slot_types(&[], 0);
        let ctx = self.entry_alloca(body, i64t.array_type(slots.len().max(1) as u32).into())?;
        let values: Vec<BasicValueEnum> =
            self.used.iter().map(|t| fr.tensors[t].into()).chain(fr.scalars.iter().copied()).collect();
        for (j, v) in values.iter().enumerate() {
            let slot = self.gep(i64t.into(), ctx, i64t.const_int(j as u64, false))?;
            self.b.build_store(slot, *v)?;
        }
        for (task, l) in tasks.iter().zip(launches) {
            let task = task.as_global_value().as_pointer_value();
            let n = i64t.const_int(l.blocks() as u64, false);
            self.b.build_call(pf, &[task.into(), ctx.into(), n.into()], "")?;
        }
        self.b.build_return(None)?;
        self.entry(body)?;
        Ok(self.m)
    }

    /// `kernel(tensors..., scalars..., extra i64s...)`.
    fn kernel_fn(&mut self, name: &str, extra: usize, linkage: Linkage) -> FunctionValue<'ctx> {
        let ptr = self.cx.ptr_type(AddressSpace::default());
        let mut params: Vec<BasicMetadataTypeEnum> = self.used.iter().map(|_| ptr.into()).collect();
        for s in &self.f.p.scalars {
            params.push(self.scalar_ty(texc_compiler::tir::Ty::Elem(s.elem)).into());
        }
        params.extend((0..extra).map(|_| BasicMetadataTypeEnum::from(self.cx.i64_type())));
        let k = self.m.add_function(name, self.cx.void_type().fn_type(&params, false), Some(linkage));
        self.attrs(k);
        for i in 0..self.used.len() {
            k.add_attribute(AttributeLoc::Param(i as u32), self.enum_attr("noalias"));
        }
        k
    }

    /// The statements of launch `l` in kernel `k` (positioned at its entry).
    fn kernel_body(
        &mut self,
        k: FunctionValue<'ctx>,
        l: &Launch,
        block_idx: [IntValue<'ctx>; 3],
        thread_idx: Option<[IntValue<'ctx>; 3]>,
    ) -> R<()> {
        let mut fr = self.frame_from_params(k, &[], &[]);
        self.gpu = Some(GpuKernel { block_idx, thread_idx, block: l.block });
        let stmt = self.f.body[l.stmt].clone();
        self.stmt(&mut fr, &stmt, Mode::Scalar)?;
        self.gpu = None;
        self.b.build_return(None)?;
        Ok(())
    }

    /// `!nvvm.annotations`: `k` is a kernel launched with exactly `l.block` threads.
    fn annotate_kernel(&self, k: FunctionValue<'ctx>, l: &Launch) -> R<()> {
        let i32t = self.cx.i32_type();
        let fptr = k.as_global_value().as_pointer_value();
        let mut notes: Vec<(&str, u64)> = vec![("kernel", 1)];
        notes.extend(["reqntidx", "reqntidy", "reqntidz"].into_iter().zip(l.block.map(|n| n as u64)));
        for (key, v) in notes {
            let md = self.cx.metadata_node(&[
                fptr.into(),
                self.cx.metadata_string(key).into(),
                i32t.const_int(v, false).into(),
            ]);
            self.m.add_global_metadata("nvvm.annotations", &md).map_err(super::llvm_err)?;
        }
        Ok(())
    }

    /// The emulation's task for launch `i`: blocks `lo..hi`, one call of
    /// kernel `k` each (its thread loops run in order).
    fn block_task(&mut self, i: usize, l: &Launch, k: FunctionValue<'ctx>) -> R<FunctionValue<'ctx>> {
        let ptr = self.cx.ptr_type(AddressSpace::default());
        let i64t = self.cx.i64_type();
        let task = self.m.add_function(
            &format!("texc_launch{i}"),
            self.cx.void_type().fn_type(&[ptr.into(), i64t.into(), i64t.into()], false),
            Some(Linkage::Internal),
        );
        self.attrs(task);
        let bb = self.cx.append_basic_block(task, "entry");
        self.b.position_at_end(bb);
        let ctx = task.get_nth_param(0).expect("ctx").into_pointer_value();
        let mut args: Vec<BasicMetadataValueEnum> = Vec::new();
        for (j, ty) in self.slot_types(&[], 0).into_iter().enumerate() {
            let slot = self.gep(i64t.into(), ctx, i64t.const_int(j as u64, false))?;
            args.push(self.b.build_load(ty, slot, "arg")?.into());
        }
        let lo = task.get_nth_param(1).expect("lo").into_int_value();
        let hi = task.get_nth_param(2).expect("hi").into_int_value();
        self.count(task, "block", lo, hi, &mut |g, b| {
            let mut call = args.clone();
            call.extend(g.unflatten(b, l.grid)?.map(BasicMetadataValueEnum::from));
            g.b.build_call(k, &call, "")?;
            Ok(())
        })?;
        self.b.build_return(None)?;
        Ok(task)
    }

    /// A block's shared buffer on the GPU: a `.shared` array of the module
    /// (address space 3), or its place in the kernel's dynamic shared memory
    /// (`.extern .shared`, sized at launch), used through a generic pointer.
    pub(super) fn shared_buffer(&mut self, tensor: texc_compiler::tir::TensorId) -> R<PointerValue<'ctx>> {
        let generic = self.cx.ptr_type(AddressSpace::default());
        if let Some(&at) = self.dynamic_shared.get(&tensor) {
            let name = "texc_dynamic_shared";
            let bytes = self.cx.i8_type().array_type(0);
            let g = self.m.get_global(name).unwrap_or_else(|| {
                let g = self.m.add_global(bytes, Some(AddressSpace::from(3u16)), name);
                g.set_linkage(Linkage::External);
                // Swizzled buffers lie at multiples of 1024 bytes from its start.
                g.set_alignment(if self.swizzled.is_empty() { 16 } else { SWIZZLE_ALIGN as u32 });
                g
            });
            let base = self.b.build_address_space_cast(g.as_pointer_value(), generic, "dynamic_shared")?;
            return self.gep(self.cx.i8_type().into(), base, self.cx.i64_type().const_int(at as u64, false));
        }
        let d = self.f.p.tensor(tensor);
        let ty = self.mem_ty(d.elem).array_type(d.len().max(1) as u32);
        let name = format!("{}_shared_{}", self.f.p.name, tensor.0);
        let g = match self.m.get_global(&name) {
            Some(g) => g,
            None => {
                let g = self.m.add_global(ty, Some(AddressSpace::from(3u16)), &name);
                g.set_linkage(Linkage::Internal);
                g.set_initializer(&ty.get_undef());
                g.set_alignment(if self.swizzled.contains(&tensor) { SWIZZLE_ALIGN as u32 } else { 16 });
                g
            }
        };
        Ok(self.b.build_address_space_cast(g.as_pointer_value(), generic, "shared")?)
    }

    /// `bar.sync 0` on the GPU; nothing in the emulation, whose thread loops
    /// run to their end before the next statement.
    pub(super) fn barrier(&mut self) -> R<()> {
        match self.gpu {
            Some(GpuKernel { thread_idx: Some(_), .. }) => {
                if texc_schedules::ir::has_wgmma(self.f) {
                    // The threads' stores to shared memory, visible to the
                    // asynchronous proxy `wgmma` reads its operands through.
                    let ty = self.cx.void_type().fn_type(&[], false);
                    let fence = "fence.proxy.async.shared::cta;".to_string();
                    let asm = self.cx.create_inline_asm(ty, fence, "~{memory}".into(), true, false, None, false);
                    self.b.build_indirect_call(ty, asm, &[], "")?;
                }
                self.b.build_call(self.intrinsic("llvm.nvvm.barrier0", &[])?, &[], "")?;
                Ok(())
            }
            Some(_) => Ok(()),
            None => Err(crate::CodegenError::Unsupported("a barrier outside a GPU kernel".into())),
        }
    }

    /// An asynchronous copy (`ForKind::Async`) on the GPU: one `cp.async` of
    /// the loop's elements from the global tensor its store loads to the
    /// shared buffer it writes (16 bytes through L2 only, `.cg`; 4 or 8
    /// through L1). Both ends must be provably aligned to the copy's size.
    pub(super) fn async_copy(
        &mut self,
        fr: &mut Frame<'ctx>,
        var: VarId,
        lo: i64,
        extent: i64,
        body: &[Stmt],
    ) -> R<()> {
        let unsupported = |why: &str| Err(crate::CodegenError::Unsupported(format!("asynchronous copy: {why}")));
        let [Stmt::Store { tensor, indices, value }] = body else {
            return unsupported("its loop must hold one store and nothing else");
        };
        let texc_compiler::tir::TExpr::Load(src, src_idx) = self.f.p.expr(*value).clone() else {
            return unsupported("the stored value must be a load of a global tensor");
        };
        let elem = self.f.p.tensor(*tensor).elem;
        let bytes = elem.size() as i64 * extent;
        if self.f.p.tensor(src).elem != elem || !matches!(bytes, 4 | 8 | 16) {
            return unsupported(&format!("copies are 4, 8 or 16 bytes of one type, not {bytes}"));
        }
        let lanes = extent as u32;
        for (t, idx) in [(*tensor, indices.as_slice()), (src, src_idx.as_slice())] {
            if texc_schedules::analysis::access(self.f, t, idx, var) != texc_schedules::analysis::Access::Contiguous {
                return unsupported(&format!("`{}`'s elements are not consecutive", self.f.p.tensor(t).name));
            }
            if self.vector_alignment(t, idx, var, lo, lanes) as i64 != bytes {
                return unsupported(&format!(
                    "`{}`'s elements are not provably aligned to {bytes} bytes",
                    self.f.p.tensor(t).name
                ));
            }
        }
        let mty = self.mem_ty(elem);
        let dst = self.lane0_address(fr, *tensor, indices, var, lo, mty)?;
        let from = self.lane0_address(fr, src, &src_idx, var, lo, mty)?;
        let dst = self.b.build_address_space_cast(dst, self.cx.ptr_type(AddressSpace::from(3u16)), "dst")?;
        let from = self.b.build_address_space_cast(from, self.cx.ptr_type(AddressSpace::from(1u16)), "src")?;
        let name = match bytes {
            16 => "llvm.nvvm.cp.async.cg.shared.global.16",
            8 => "llvm.nvvm.cp.async.ca.shared.global.8",
            _ => "llvm.nvvm.cp.async.ca.shared.global.4",
        };
        self.b.build_call(self.intrinsic(name, &[])?, &[dst.into(), from.into()], "")?;
        Ok(())
    }

    /// `cp.async.commit_group` / `cp.async.wait_group n` on the GPU; nothing
    /// in the emulation, whose copies land when they are made.
    pub(super) fn async_step(&mut self, step: AsyncStep) -> R<()> {
        if !self.on_device() {
            return Ok(());
        }
        let i32t = self.cx.i32_type();
        match step {
            AsyncStep::Commit => {
                self.b.build_call(self.intrinsic("llvm.nvvm.cp.async.commit.group", &[])?, &[], "")?;
            }
            AsyncStep::Wait(n) => {
                let n = i32t.const_int(n.max(0) as u64, false);
                self.b.build_call(self.intrinsic("llvm.nvvm.cp.async.wait.group", &[])?, &[n.into()], "")?;
            }
        }
        Ok(())
    }

    /// A warp reduction on the GPU: each thread below the buffer's length
    /// combines its element with its partners' by `shfl.sync.bfly`, lanes
    /// `d` apart for each step `d`. (The emulation has it as loops,
    /// `texc_schedules::cross_thread::warp_reductions_as_loops`.)
    pub(super) fn warp_reduce(&mut self, fr: &mut Frame<'ctx>, w: WarpReduce) -> R<()> {
        let unsupported = |why: String| Err(crate::CodegenError::Unsupported(format!("warp reduction: {why}")));
        let Some(GpuKernel { thread_idx: Some(tid), block, .. }) = self.gpu else {
            return unsupported("the emulation runs warp reductions as loops; this one was left".into());
        };
        let d = self.f.p.tensor(w.tensor);
        let (n, elem) = (d.len(), d.elem);
        if !matches!(elem.size(), 4 | 8) || elem == texc_compiler::types::ElemType::Bool {
            return unsupported(format!("shuffles move 4- or 8-byte elements, not {elem}"));
        }
        let (i32t, i64t) = (self.cx.i32_type(), self.cx.i64_type());
        let x = tid[0];
        let merge = if n < block[0] {
            let on = self.cx.append_basic_block(fr.func, "warp.on");
            let merge = self.cx.append_basic_block(fr.func, "warp.off");
            let c = self.b.build_int_compare(IntPredicate::SLT, x, i64t.const_int(n as u64, true), "in")?;
            self.b.build_conditional_branch(c, on, merge)?;
            self.b.position_at_end(on);
            Some(merge)
        } else {
            None
        };
        // The lanes of this thread's warp that take part: all, or the first
        // `n - warp_base` of the last warp.
        let mask = if n % 32 == 0 {
            i32t.const_all_ones()
        } else {
            let base = self.b.build_and(x, i64t.const_int(!31u64, false), "warp.base")?;
            let left = self.b.build_int_sub(i64t.const_int(n as u64, false), base, "warp.left")?;
            let left = self.b.build_int_truncate(left, i32t, "left")?;
            let bit = self.b.build_left_shift(i32t.const_int(1, false), left, "bit")?;
            let some = self.b.build_int_sub(bit, i32t.const_int(1, false), "some")?;
            let full = self.b.build_int_compare(IntPredicate::UGE, left, i32t.const_int(32, false), "full")?;
            self.b.build_select(full, i32t.const_all_ones(), some, "mask")?.into_int_value()
        };
        let ty = texc_compiler::tir::Ty::Elem(elem);
        let p = fr.tensors[&w.tensor];
        let mty = self.mem_ty(elem);
        let mut v = self.b.build_load(mty, p, "lane.v")?;
        for step in w.steps() {
            let other = self.shuffle_xor(v, elem.size() as u32 / 4, mask, step)?;
            v = match w.op {
                ReduceOp::Sum => self.arith(BinOp::Add, v, other, ty)?,
                ReduceOp::Prod => self.arith(BinOp::Mul, v, other, ty)?,
                ReduceOp::Max => self.math(MathFn::Max, &[v, other], ty, super::gen::Mode::Scalar)?,
                ReduceOp::Min => self.math(MathFn::Min, &[v, other], ty, super::gen::Mode::Scalar)?,
            };
        }
        self.b.build_store(p, v)?;
        if let Some(merge) = merge {
            self.b.build_unconditional_branch(merge)?;
            self.b.position_at_end(merge);
        }
        Ok(())
    }

    /// The value `v` of lane `lane ^ step`, in `halves` 32-bit words
    /// (`shfl.sync.bfly.b32` each).
    fn shuffle_xor(
        &self,
        v: BasicValueEnum<'ctx>,
        halves: u32,
        mask: IntValue<'ctx>,
        step: i64,
    ) -> R<BasicValueEnum<'ctx>> {
        let i32t = self.cx.i32_type();
        let ty = v.get_type();
        let words = self.b.build_bit_cast(v, i32t.vec_type(halves), "words")?.into_vector_value();
        let f = self.intrinsic("llvm.nvvm.shfl.sync.bfly.i32", &[])?;
        let mut out = i32t.vec_type(halves).get_undef();
        for h in 0..halves {
            let at = i32t.const_int(h as u64, false);
            let word = self.b.build_extract_element(words, at, "word")?;
            let args =
                [mask.into(), word.into(), i32t.const_int(step as u64, false).into(), i32t.const_int(31, false).into()];
            let got = self.call(f, &args)?;
            out = self.b.build_insert_element(out, got, at, "got")?;
        }
        Ok(self.b.build_bit_cast(out, ty, "shfl")?)
    }

    /// Whether code is being built for the GPU itself (not the emulation).
    pub(super) fn on_device(&self) -> bool {
        matches!(self.gpu, Some(GpuKernel { thread_idx: Some(_), .. }))
    }

    /// (x, y, z) of a flat index over `dims` (x fastest).
    fn unflatten(&self, flat: IntValue<'ctx>, dims: [i64; 3]) -> R<[IntValue<'ctx>; 3]> {
        let c = |v: i64| self.cx.i64_type().const_int(v as u64, false);
        let x = self.b.build_int_unsigned_rem(flat, c(dims[0]), "x")?;
        let rest = self.b.build_int_unsigned_div(flat, c(dims[0]), "yz")?;
        let y = self.b.build_int_unsigned_rem(rest, c(dims[1]), "y")?;
        let z = self.b.build_int_unsigned_div(rest, c(dims[1]), "z")?;
        Ok([x, y, z])
    }

    /// A loop bound to a block or thread index: its one iteration on this thread.
    pub(super) fn bound_loop(
        &mut self,
        fr: &mut Frame<'ctx>,
        var: VarId,
        lo: i64,
        extent: i64,
        kind: ForKind,
        body: &[Stmt],
    ) -> R<()> {
        let k = self.gpu.expect("inside a GPU kernel");
        let i64t = self.cx.i64_type();
        let (idx, size) = match (kind, k.thread_idx) {
            (ForKind::Block(d), _) => (k.block_idx[d.index()], extent),
            (ForKind::Thread(d), Some(tid)) => (tid[d.index()], k.block[d.index()]),
            // The emulation: the block's threads one after another.
            (ForKind::Thread(_), None) => {
                let int = |v: i64| i64t.const_int(v as u64, true);
                return self.serial_loop(fr, var, int(lo), int(lo + extent), body);
            }
            _ => unreachable!("bound loops only"),
        };
        let v = self.b.build_int_add(idx, i64t.const_int(lo as u64, true), &self.f.vars[var as usize].name)?;
        fr.vars.insert(var, v);
        let r = if extent < size {
            let then_bb = self.cx.append_basic_block(fr.func, "active");
            let merge = self.cx.append_basic_block(fr.func, "inactive");
            let c = self.b.build_int_compare(IntPredicate::SLT, idx, i64t.const_int(extent as u64, true), "on")?;
            self.b.build_conditional_branch(c, then_bb, merge)?;
            self.b.position_at_end(then_bb);
            self.stmts(fr, body, Mode::Scalar)?;
            self.wgmma_wait(fr)?;
            self.b.build_unconditional_branch(merge)?;
            self.b.position_at_end(merge);
            Ok(())
        } else {
            self.stmts(fr, body, Mode::Scalar)
        };
        fr.vars.remove(&var);
        r
    }
}
