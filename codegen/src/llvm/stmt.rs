//! Statements: loops (serial, unrolled, vectorized, parallel), guards,
//! local buffers and stores.

use super::amx::tile_nest;
use super::gen::{Frame, Gen, Mode};
use super::wgmma::issues_only_wgmma;
use super::{llvm_err, R};
use crate::{abi, CodegenError};
use inkwell::module::Linkage;
use inkwell::types::{BasicType, BasicTypeEnum};
use inkwell::values::{
    BasicMetadataValueEnum, BasicValue, BasicValueEnum, FunctionValue, InstructionValue, IntValue, MetadataValue,
    PointerValue,
};
use inkwell::{AddressSpace, IntPredicate};
use texc_compiler::tir::{TExpr, TExprId, TensorId, Ty, VarId};
use texc_schedules::analysis;
use texc_schedules::ir::{ForKind, Stmt};
use texc_schedules::LoopFunc;

impl<'ctx> Gen<'ctx, '_> {
    pub(super) fn stmts(&mut self, fr: &mut Frame<'ctx>, body: &[Stmt], mode: Mode<'ctx>) -> R<()> {
        for s in body {
            self.stmt(fr, s, mode)?;
        }
        Ok(())
    }

    pub(super) fn stmt(&mut self, fr: &mut Frame<'ctx>, s: &Stmt, mode: Mode<'ctx>) -> R<()> {
        if !fr.wgmma_pending.is_empty() && !issues_only_wgmma(s) {
            self.wgmma_wait(fr)?;
        }
        match s {
            Stmt::For { var, lo, extent, kind, body } => {
                if let Mode::Vector { .. } = mode {
                    return Err(CodegenError::Unsupported("a loop inside a vectorized loop".into()));
                }
                if let Some(d) = tile_nest(self.f, s).filter(|_| !fr.tiles_resident) {
                    return self.resident_tile_dot(fr, s, d);
                }
                let int = |v: i64| self.cx.i64_type().const_int(v as u64, true);
                match kind {
                    ForKind::Async if self.on_device() => self.async_copy(fr, *var, *lo, *extent, body),
                    // The emulation's copies land at once: its thread loops run in order.
                    ForKind::Vectorized | ForKind::Async if *extent > 1 => {
                        for (base, lanes) in self.vector_pieces(body, *lo, *extent, *kind) {
                            self.stmts(fr, body, Mode::Vector { var: *var, base, lanes, mask: None })?;
                        }
                        Ok(())
                    }
                    // The loops around tensor-core operations whose accumulators
                    // are in registers: unrolled, so that each names its registers.
                    ForKind::Serial | ForKind::Unrolled
                        if fr.resident.as_ref().is_some_and(|r| r.loops.contains(var)) =>
                    {
                        for k in *lo..*lo + *extent {
                            fr.vars.insert(*var, int(k));
                            self.stmts(fr, body, mode)?;
                        }
                        fr.vars.remove(var);
                        Ok(())
                    }
                    ForKind::Unrolled if self.transposed_copies(fr, *var, *lo, *extent, body)? => Ok(()),
                    ForKind::Unrolled if *extent <= 64 => {
                        for k in *lo..*lo + *extent {
                            fr.vars.insert(*var, int(k));
                            self.stmts(fr, body, mode)?;
                        }
                        Ok(())
                    }
                    ForKind::Parallel if *extent > 1 => self.parallel(fr, *var, *lo, *extent, body),
                    ForKind::Block(_) | ForKind::Thread(_) if self.gpu.is_some() => {
                        self.bound_loop(fr, *var, *lo, *extent, *kind, body)
                    }
                    ForKind::Serial if self.resident_accumulators(fr, *var, *lo, *extent, body)? => Ok(()),
                    _ => self.serial_loop(fr, *var, int(*lo), int(*lo + *extent), body),
                }
            }
            Stmt::If { cond, then } => match mode {
                // A guard that is the same in every lane (it does not involve the
                // vector loop) is a branch around vector code, not a mask on it.
                Mode::Vector { var, .. } if analysis::lane_uniform(self.f, *cond, var) => {
                    self.guarded(fr, *cond, then, mode)
                }
                Mode::Scalar => self.guarded(fr, *cond, then, mode),
                Mode::Vector { .. } => {
                    let c = self.expr(fr, *cond, mode)?.into_vector_value();
                    let m = self.and_mask(mode.mask(), c)?;
                    self.stmts(fr, then, mode.with_mask(Some(m)))
                }
            },
            Stmt::Store { tensor, indices, value } => {
                let v = self.expr(fr, *value, mode)?;
                self.store(fr, *tensor, indices, v, mode)
            }
            Stmt::Barrier => self.barrier(),
            Stmt::Async(step) => self.async_step(*step),
            Stmt::Mma { op, c, a, b } => self.mma(fr, *op, c, a, b),
            Stmt::Wgmma(w) => self.wgmma(fr, w),
            Stmt::TileDot(d) => self.tile_dot(fr, d),
            Stmt::WarpReduce(w) => self.warp_reduce(fr, *w),
            Stmt::Prefetch { tensor, offset } => self.prefetch(fr, *tensor, *offset, mode),
            Stmt::Alloc { tensor, body } if self.on_device() && self.f.registers.contains(tensor) => {
                // The thread's own element, in a register after SROA.
                let ty = self.mem_ty(self.f.p.tensor(*tensor).elem);
                let p = self.entry_alloca(fr.func, ty.into())?;
                fr.tensors.insert(*tensor, p);
                let r = self.stmts(fr, body, mode);
                fr.tensors.remove(tensor);
                r
            }
            Stmt::Alloc { tensor, body } if self.on_device() && self.f.shared.contains(tensor) => {
                let p = self.shared_buffer(*tensor)?;
                fr.tensors.insert(*tensor, p);
                let r = self.stmts(fr, body, mode);
                fr.tensors.remove(tensor);
                r
            }
            Stmt::Alloc { tensor, body } if self.heap.contains(tensor) => {
                let bytes = self.local_bytes(*tensor);
                if self.on_device() {
                    let name = &self.f.p.tensor(*tensor).name;
                    return Err(CodegenError::Unsupported(format!(
                        "`{name}` ({bytes} bytes) would take a GPU thread's private buffers past {} bytes",
                        texc_schedules::attach::MAX_STACK_BYTES
                    )));
                }
                self.heap_local(fr, *tensor, bytes, body, mode)
            }
            Stmt::Alloc { tensor, body } => {
                // A stack array in the function's entry block: private to each
                // task, and promoted to registers by SROA when indices are constant.
                let p = self.stack_array(fr.func, *tensor)?;
                fr.tensors.insert(*tensor, p);
                let r = self.stmts(fr, body, mode);
                fr.tensors.remove(tensor);
                r
            }
        }
    }

    /// The pieces (first lane, lanes) a vectorized loop over `lo..lo + extent`
    /// is emitted in: one, or — where the lanes past the last full register of
    /// the body's widest element fill at most half a register — the full
    /// registers and that tail apart. LLVM widens a vector to a power of two
    /// lanes: 19 `f32` lanes with AVX-512 ran as two 16-lane registers, and
    /// as 16 + 3 the tail is one 4-lane operation, which costs half a 16-lane
    /// one on CPUs that split 512-bit operations in two (Zen 4) and no more
    /// elsewhere. Where the registers the loop takes (its short tail apart)
    /// are not a power of two, the full ones go in runs of a power of two
    /// each and any tail apart: LLVM widens 48 lanes (three AVX-512
    /// registers, `--knob nvec=3`) to 64 and builds the operands lane by lane
    /// (MEASURED: a 3×3 convolution 32 → 64 at 147², blocks of 8 filters ×
    /// 48 lanes, 78 ms, against 6.5 ms as 32 + 16). The lanes of a vectorized
    /// loop are independent (the race verifier proves it), so the order of
    /// the pieces is free.
    pub(super) fn vector_pieces(&self, body: &[Stmt], lo: i64, extent: i64, kind: ForKind) -> Vec<(i64, u32)> {
        let whole = vec![(lo, extent as u32)];
        let Some(register) = self.register_bytes() else { return whole };
        if kind != ForKind::Vectorized || self.gpu.is_some() {
            return whole;
        }
        let widest = widest_element(self.f, body);
        let full = (register / widest.max(1)) as i64;
        if extent < full {
            return whole;
        }
        let tail = extent % full;
        let short_tail = tail > 0 && tail <= full / 2;
        let widened = (extent + full - 1) / full;
        if !short_tail && widened.count_ones() == 1 {
            return whole;
        }
        let mut pieces = registers_in_powers_of_two(lo, extent / full, full);
        if tail > 0 {
            pieces.push((lo + extent - tail, tail as u32));
        }
        pieces
    }

    /// `t`'s stack array in `func`, made on first use.
    fn stack_array(&mut self, func: FunctionValue<'ctx>, t: TensorId) -> R<PointerValue<'ctx>> {
        if let Some(&p) = self.stack_arrays.get(&(func, t)) {
            return Ok(p);
        }
        let d = self.f.p.tensor(t);
        let ty = self.mem_ty(d.elem).array_type(d.len().max(1) as u32);
        let p = self.entry_alloca(func, ty.into())?;
        p.as_instruction().expect("alloca").set_alignment(64).map_err(llvm_err)?;
        self.stack_arrays.insert((func, t), p);
        Ok(p)
    }

    fn local_bytes(&self, t: TensorId) -> i64 {
        let d = self.f.p.tensor(t);
        d.len().max(1) * d.elem.size() as i64
    }

    /// A local that `LoopFunc::heap_locals` puts on the heap: taken around
    /// `body` (once per execution of the enclosing loop; the runtime keeps a
    /// block per thread for the next one).
    fn heap_local(&mut self, fr: &mut Frame<'ctx>, t: TensorId, bytes: i64, body: &[Stmt], mode: Mode<'ctx>) -> R<()> {
        let (alloc, free) = self.local_memory();
        let n = self.cx.i64_type().const_int(bytes as u64, false);
        let p = self.call(alloc, &[n.into()])?.into_pointer_value();
        fr.tensors.insert(t, p);
        let r = self.stmts(fr, body, mode);
        fr.tensors.remove(&t);
        r?;
        self.b.build_call(free, &[p.into()], "")?;
        Ok(())
    }

    /// `abi::LOCAL_ALLOC` and `abi::LOCAL_FREE`. The buffer is `noalias`
    /// (like `malloc`'s), 64-byte aligned and never null, so that LLVM
    /// treats it as it does a stack array.
    fn local_memory(&self) -> (FunctionValue<'ctx>, FunctionValue<'ctx>) {
        let ptr = self.cx.ptr_type(AddressSpace::default());
        let i64t = self.cx.i64_type();
        let alloc = self.external(abi::LOCAL_ALLOC, ptr.fn_type(&[i64t.into()], false));
        let free = self.external(abi::LOCAL_FREE, self.cx.void_type().fn_type(&[ptr.into()], false));
        for f in [alloc, free] {
            self.attrs(f);
        }
        for (name, v) in [("noalias", 0), ("nonnull", 0), ("align", 64)] {
            let a = self.cx.create_enum_attribute(inkwell::attributes::Attribute::get_named_enum_kind_id(name), v);
            alloc.add_attribute(inkwell::attributes::AttributeLoc::Return, a);
        }
        (alloc, free)
    }

    /// `if cond: then` as a branch; `cond` is evaluated as a scalar.
    pub(super) fn guarded(&mut self, fr: &mut Frame<'ctx>, cond: TExprId, then: &[Stmt], mode: Mode<'ctx>) -> R<()> {
        let c = self.expr(fr, cond, Mode::Scalar)?.into_int_value();
        let then_bb = self.cx.append_basic_block(fr.func, "then");
        let merge = self.cx.append_basic_block(fr.func, "endif");
        self.b.build_conditional_branch(c, then_bb, merge)?;
        self.b.position_at_end(then_bb);
        self.stmts(fr, then, mode)?;
        self.wgmma_wait(fr)?;
        self.b.build_unconditional_branch(merge)?;
        self.b.position_at_end(merge);
        Ok(())
    }

    pub(super) fn serial_loop(
        &mut self,
        fr: &mut Frame<'ctx>,
        var: VarId,
        lo: IntValue<'ctx>,
        hi: IntValue<'ctx>,
        body: &[Stmt],
    ) -> R<()> {
        // Each iteration's statements are emitted with no operation in flight.
        self.wgmma_wait(fr)?;
        let name = self.f.vars[var as usize].name.clone();
        let rolled = self.f.rolled.contains(&var);
        self.count_loop(fr.func, &name, lo, hi, rolled, &mut |g, i| {
            fr.vars.insert(var, i);
            g.stmts(fr, body, Mode::Scalar)?;
            g.wgmma_wait(fr)
        })?;
        fr.vars.remove(&var);
        Ok(())
    }

    /// `for i in lo..hi: body(i)` in function `func` (`name` names `i`).
    pub(super) fn count(
        &mut self,
        func: FunctionValue<'ctx>,
        name: &str,
        lo: IntValue<'ctx>,
        hi: IntValue<'ctx>,
        body: &mut dyn FnMut(&mut Self, IntValue<'ctx>) -> R<()>,
    ) -> R<()> {
        self.count_loop(func, name, lo, hi, false, body)
    }

    /// [`Gen::count`]; a loop kept `rolled` carries
    /// `llvm.loop.unroll.disable`, so that LLVM's unroller leaves it as the
    /// schedule made it.
    fn count_loop(
        &mut self,
        func: FunctionValue<'ctx>,
        name: &str,
        lo: IntValue<'ctx>,
        hi: IntValue<'ctx>,
        rolled: bool,
        body: &mut dyn FnMut(&mut Self, IntValue<'ctx>) -> R<()>,
    ) -> R<()> {
        let i64t = self.cx.i64_type();
        let pre = self.b.get_insert_block().expect("positioned");
        let header = self.cx.append_basic_block(func, "loop");
        let body_bb = self.cx.append_basic_block(func, "body");
        let exit = self.cx.append_basic_block(func, "exit");
        self.b.build_unconditional_branch(header)?;
        self.b.position_at_end(header);
        let phi = self.b.build_phi(i64t, name)?;
        let i = phi.as_basic_value().into_int_value();
        let c = self.b.build_int_compare(IntPredicate::SLT, i, hi, "cond")?;
        self.b.build_conditional_branch(c, body_bb, exit)?;
        self.b.position_at_end(body_bb);
        body(self, i)?;
        let next = self.b.build_int_add(i, i64t.const_int(1, false), "next")?;
        let end = self.b.get_insert_block().expect("positioned");
        let latch = self.b.build_unconditional_branch(header)?;
        if rolled {
            self.not_unrolled(latch)?;
        }
        phi.add_incoming(&[(&lo, pre), (&next, end)]);
        self.b.position_at_end(exit);
        Ok(())
    }

    /// Mark the loop whose back edge is `latch` `llvm.loop.unroll.disable`:
    /// its loop ID, `!{self, !{"llvm.loop.unroll.disable"}}`, made
    /// self-referential through a temporary node (the C API's way; inkwell
    /// has none).
    fn not_unrolled(&self, latch: InstructionValue<'ctx>) -> R<()> {
        use llvm_sys::core::{LLVMMDNodeInContext2, LLVMMDStringInContext2, LLVMMetadataAsValue};
        use llvm_sys::debuginfo::{LLVMMetadataReplaceAllUsesWith, LLVMTemporaryMDNode};
        const DISABLE: &str = "llvm.loop.unroll.disable";
        let cx = self.cx.raw();
        // SAFETY: every node is made in `cx`, the context `latch` lives in;
        // the temporary node is consumed by the replacement.
        let id = unsafe {
            let mut disable = LLVMMDStringInContext2(cx, DISABLE.as_ptr().cast(), DISABLE.len());
            let mut ops = [LLVMTemporaryMDNode(cx, std::ptr::null_mut(), 0), LLVMMDNodeInContext2(cx, &mut disable, 1)];
            let id = LLVMMDNodeInContext2(cx, ops.as_mut_ptr(), ops.len());
            LLVMMetadataReplaceAllUsesWith(ops[0], id);
            MetadataValue::new(LLVMMetadataAsValue(cx, id))
        };
        latch.set_metadata(id, self.cx.get_kind_id("llvm.loop")).map_err(llvm_err)
    }

    /// Outline `for var in 0..n parallel: body` into a task run by the pool.
    pub(super) fn parallel(&mut self, fr: &mut Frame<'ctx>, var: VarId, base: i64, n: i64, body: &[Stmt]) -> R<()> {
        let i64t = self.cx.i64_type();
        let ptr = self.cx.ptr_type(AddressSpace::default());
        let mut captured: Vec<VarId> = fr.vars.keys().copied().collect();
        captured.sort_unstable();
        // Buffers of attached stages computed before this loop, read inside it.
        let mut locals: Vec<TensorId> = fr.tensors.keys().copied().filter(|t| !self.used.contains(t)).collect();
        locals.sort_unstable();
        self.tasks += 1;
        // Named after the tensor the loop writes last (its stage; producers
        // attached inside it come first), so that a profile of a compiled
        // model (`perf report`) says which stage each task is.
        let id = match last_store(body) {
            Some(t) => format!("{}_{}", self.tasks, symbol_part(&self.f.p.tensor(t).name)),
            None => self.tasks.to_string(),
        };
        // The region: (tensors, scalars, captured vars, locals, lo, hi).
        let region = self.region_fn(&format!("texc_region{id}"), &captured, &locals, true)?;
        let saved = self.b.get_insert_block().expect("positioned");
        {
            let mut rf = self.frame_from_params(region, &captured, &locals);
            let k = self.used.len() + self.f.p.scalars.len() + captured.len() + locals.len();
            let lo = region.get_nth_param(k as u32).expect("lo").into_int_value();
            let hi = region.get_nth_param(k as u32 + 1).expect("hi").into_int_value();
            let bb = self.cx.append_basic_block(region, "entry");
            self.b.position_at_end(bb);
            let off = i64t.const_int(base as u64, true);
            let lo = self.b.build_int_add(lo, off, "lo")?;
            let hi = self.b.build_int_add(hi, off, "hi")?;
            self.serial_loop(&mut rf, var, lo, hi, body)?;
            self.b.build_return(None)?;
        }
        // The task: unpack the context, call the region.
        let task = self.m.add_function(
            &format!("texc_task{id}"),
            self.cx.void_type().fn_type(&[ptr.into(), i64t.into(), i64t.into()], false),
            Some(Linkage::Internal),
        );
        self.attrs(task);
        let slots = self.used.len() + self.f.p.scalars.len() + captured.len() + locals.len();
        let slot_ty = i64t.array_type(slots.max(1) as u32);
        {
            let bb = self.cx.append_basic_block(task, "entry");
            self.b.position_at_end(bb);
            let ctx = task.get_nth_param(0).expect("ctx").into_pointer_value();
            let mut args: Vec<BasicMetadataValueEnum> = Vec::new();
            let tys: Vec<BasicTypeEnum> = self.slot_types(&captured, locals.len());
            for (k, ty) in tys.iter().enumerate() {
                let slot = self.gep(i64t.into(), ctx, i64t.const_int(k as u64, false))?;
                args.push(self.b.build_load(*ty, slot, "cap")?.into());
            }
            args.push(task.get_nth_param(1).expect("lo").into());
            args.push(task.get_nth_param(2).expect("hi").into());
            self.b.build_call(region, &args, "")?;
            self.b.build_return(None)?;
        }
        // At the loop: fill a context and hand the task to the pool.
        self.b.position_at_end(saved);
        let ctx = self.entry_alloca(fr.func, slot_ty.into())?;
        let mut values: Vec<BasicValueEnum> = self.used.iter().map(|t| fr.tensors[t].as_basic_value_enum()).collect();
        values.extend(fr.scalars.iter().copied());
        values.extend(captured.iter().map(|v| fr.vars[v].as_basic_value_enum()));
        values.extend(locals.iter().map(|t| fr.tensors[t].as_basic_value_enum()));
        for (k, v) in values.iter().enumerate() {
            let slot = self.gep(i64t.into(), ctx, i64t.const_int(k as u64, false))?;
            self.b.build_store(slot, *v)?;
        }
        let pf = self.m.get_function("texc_parallel_for").expect("declared");
        let task_ptr = task.as_global_value().as_pointer_value();
        self.b.build_call(pf, &[task_ptr.into(), ctx.into(), i64t.const_int(n as u64, false).into()], "")?;
        self.forget_amx_config(fr)?;
        Ok(())
    }

    pub(super) fn slot_types(&self, captured: &[VarId], locals: usize) -> Vec<BasicTypeEnum<'ctx>> {
        let ptr = self.cx.ptr_type(AddressSpace::default());
        let mut v: Vec<BasicTypeEnum> = self.used.iter().map(|_| ptr.into()).collect();
        v.extend(self.f.p.scalars.iter().map(|s| self.scalar_ty(Ty::Elem(s.elem))));
        v.extend(captured.iter().map(|_| BasicTypeEnum::from(self.cx.i64_type())));
        v.extend((0..locals).map(|_| BasicTypeEnum::from(ptr)));
        v
    }

    pub(super) fn entry_alloca(&self, func: FunctionValue<'ctx>, ty: BasicTypeEnum<'ctx>) -> R<PointerValue<'ctx>> {
        let entry = func.get_first_basic_block().expect("entry block");
        let tmp = self.cx.create_builder();
        match entry.get_first_instruction() {
            Some(i) => tmp.position_before(&i),
            None => tmp.position_at_end(entry),
        }
        Ok(tmp.build_alloca(ty, "ctx")?)
    }
}

/// The tensor the last store in `body` writes.
fn last_store(body: &[Stmt]) -> Option<TensorId> {
    body.iter().rev().find_map(|s| match s {
        Stmt::Store { tensor, .. } => Some(*tensor),
        Stmt::For { body, .. } | Stmt::If { then: body, .. } | Stmt::Alloc { body, .. } => last_store(body),
        Stmt::Mma { c, .. } => Some(c.tensor),
        Stmt::Wgmma(w) => Some(w.c.tensor),
        Stmt::TileDot(d) => Some(d.c.tensor),
        Stmt::Barrier | Stmt::Async(_) | Stmt::WarpReduce(_) | Stmt::Prefetch { .. } => None,
    })
}

/// A tensor name as part of a symbol: letters, digits and `_`; its last 48
/// characters (a stage's suffix, `.T.Am`, tells more than a long prefix).
fn symbol_part(name: &str) -> String {
    let s: Vec<char> = name.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
    s[s.len().saturating_sub(48)..].iter().collect()
}

/// The bytes of the widest element a vector statement of `body` computes,
/// loads or stores (index arithmetic aside).
fn widest_element(f: &LoopFunc, body: &[Stmt]) -> u32 {
    fn of_expr(f: &LoopFunc, e: TExprId) -> u32 {
        let own = match f.p.ty(e) {
            Ty::Elem(t) => t.size() as u32,
            Ty::Index => 0,
        };
        let loaded = match f.p.expr(e) {
            TExpr::Load(t, _) => f.p.tensor(*t).elem.size() as u32,
            _ => 0,
        };
        f.p.children(e).into_iter().map(|c| of_expr(f, c)).fold(own.max(loaded), u32::max)
    }
    body.iter()
        .map(|s| match s {
            Stmt::Store { tensor, value, .. } => (f.p.tensor(*tensor).elem.size() as u32).max(of_expr(f, *value)),
            Stmt::If { cond, then } => of_expr(f, *cond).max(widest_element(f, then)),
            Stmt::For { body, .. } | Stmt::Alloc { body, .. } => widest_element(f, body),
            _ => 0,
        })
        .max()
        .unwrap_or(0)
}

/// `count` registers of `full` lanes from `lo` as pieces of a power of two
/// registers each, the largest first (3 → 2 + 1).
fn registers_in_powers_of_two(lo: i64, count: i64, full: i64) -> Vec<(i64, u32)> {
    let mut pieces = Vec::new();
    let (mut at, mut left) = (lo, count);
    while left > 0 {
        let n = 1i64 << (63 - left.leading_zeros());
        pieces.push((at, (n * full) as u32));
        at += n * full;
        left -= n;
    }
    pieces
}
