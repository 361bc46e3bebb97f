//! A warpgroup's tensor-core operation (`Stmt::Wgmma`, sm_90a). On the GPU:
//! each of the 128 lanes holds the accumulators `WgmmaOp::d_fragment`
//! assigns it (loaded from the tile, or the registers of a resident loop,
//! see `super::mma`), builds the 64-bit matrix descriptors of `A` and `B`
//! from their shared-memory addresses (`ir::wgmma_descriptor`), and issues
//! `wgmma.mma_async` (`scale-d` 1: accumulate) and `wgmma.commit_group`.
//!
//! Operations on resident accumulators are left in flight: consecutive
//! ones (the steps of a slice of `k`, the tiles of unrolled loops) are
//! issued back to back behind one `wgmma.fence`, and the registers they
//! write are listed in `Frame::wgmma_pending` until [`Gen::wgmma_wait`]
//! emits `wgmma.wait_group 0`. It is emitted before any statement that is
//! not made only of operations (a barrier, a copy, a store), at the end of
//! a loop's body and of a guarded branch, and before a runtime loop — so
//! that no ordinary instruction reads the registers, and no copy
//! overwrites the shared operands, of an unfinished operation. The wait
//! passes the pending registers through itself, so that LLVM orders every
//! later read of them after it. Operations whose accumulators are in
//! memory wait at once. Before the barrier that publishes the operands,
//! `fence.proxy.async.shared::cta` makes the threads' stores visible to
//! the asynchronous proxy that wgmma reads shared memory through
//! ([`Gen::barrier`]).
//!
//! In the CPU emulation the block's operation runs at once as loops, and
//! reads `A` and `B` at the byte offsets the descriptor's canonical layout
//! gives (not by their logical indices), as the evaluator does.

use super::gen::{Frame, Gen};
use super::gpu::GpuKernel;
use super::R;
use crate::CodegenError;
use inkwell::types::BasicMetadataTypeEnum;
use inkwell::values::{BasicMetadataValueEnum, BasicValueEnum, IntValue, PointerValue};
use inkwell::AddressSpace;
use texc_compiler::types::ElemType;
use texc_schedules::ir::{Major, SmemMatrix, Stmt, Wgmma, WgmmaOp};

/// How an operation's inline PTX completes.
#[derive(Clone, Copy)]
struct Issue {
    /// A `wgmma.fence` first: nothing is in flight, and ordinary
    /// instructions may have written the registers since.
    fence: bool,
    /// `wgmma.wait_group 0` last: the operation finishes inside the block.
    wait: bool,
}

/// Statement `s` is `wgmma` operations only, possibly in loops: nothing in
/// it touches the registers or shared operands of operations in flight.
pub(super) fn issues_only_wgmma(s: &Stmt) -> bool {
    match s {
        Stmt::Wgmma(_) => true,
        Stmt::For { body, .. } => body.iter().all(issues_only_wgmma),
        _ => false,
    }
}

impl<'ctx> Gen<'ctx, '_> {
    pub(super) fn wgmma(&mut self, fr: &mut Frame<'ctx>, w: &Wgmma) -> R<()> {
        match self.gpu {
            Some(GpuKernel { thread_idx: Some(tid), .. }) => self.wgmma_warpgroup(fr, w, tid[0]),
            Some(_) => self.wgmma_loops(fr, w),
            None => Err(CodegenError::Unsupported("a tensor-core operation outside a GPU kernel".into())),
        }
    }

    /// The address of the first element of operand `m` (its tile's origin).
    fn smem_start(&mut self, fr: &mut Frame<'ctx>, m: &SmemMatrix) -> R<PointerValue<'ctx>> {
        let d = self.f.p.tensor(m.tensor);
        let (shape, elem) = (d.shape.clone(), d.elem);
        let i64t = self.cx.i64_type();
        let mut off = i64t.const_zero();
        for (k, &i) in m.origin.iter().enumerate() {
            let stride: i64 = shape[k + 1..].iter().product();
            let v = self.expr(fr, i, super::gen::Mode::Scalar)?.into_int_value();
            let term = self.b.build_int_mul(v, i64t.const_int(stride as u64, true), "term")?;
            off = self.b.build_int_add(off, term, "off")?;
        }
        self.gep(self.mem_ty(elem), fr.tensors[&m.tensor], off)
    }

    /// Operand `m`'s matrix descriptor: its shared-memory address (the
    /// logical one: the hardware swizzles it) in the start field, its byte
    /// offsets and layout in theirs.
    fn descriptor(&mut self, fr: &mut Frame<'ctx>, m: &SmemMatrix) -> R<IntValue<'ctx>> {
        let p = self.smem_start(fr, m)?;
        let shared = self.b.build_address_space_cast(p, self.cx.ptr_type(AddressSpace::from(3u16)), "smem")?;
        let i64t = self.cx.i64_type();
        let addr = self.b.build_ptr_to_int(shared, self.cx.i32_type(), "saddr")?;
        let addr = self.b.build_int_z_extend(addr, i64t, "saddr")?;
        let start = self.b.build_right_shift(addr, i64t.const_int(4, false), false, "start")?;
        let start = self.b.build_and(start, i64t.const_int(0x3fff, false), "start")?;
        let fields = texc_schedules::ir::wgmma_descriptor(0, m.lbo, m.sbo, m.swizzled);
        Ok(self.b.build_or(start, i64t.const_int(fields, false), "desc")?)
    }

    fn wgmma_warpgroup(&mut self, fr: &mut Frame<'ctx>, w: &Wgmma, lane: IntValue<'ctx>) -> R<()> {
        let f32t = self.cx.f32_type();
        let trans = [w.a.major, w.b.major].map(|m| m == Major::Mn);
        if fr.resident.as_ref().is_some_and(|r| r.tensor == w.c.tensor) {
            let slots = self.resident_slots(fr, &w.c)?;
            let mut acc: Vec<BasicValueEnum<'ctx>> = Vec::new();
            for &s in &slots {
                acc.push(self.b.build_load(f32t, s, "acc")?);
            }
            let (da, db) = (self.descriptor(fr, &w.a)?, self.descriptor(fr, &w.b)?);
            let issue = Issue { fence: fr.wgmma_pending.is_empty(), wait: false };
            let d = self.wgmma_asm(w.op, da, db, trans, &acc, issue)?;
            for (v, &s) in d.into_iter().zip(&slots) {
                self.b.build_store(s, v)?;
            }
            for s in slots {
                if !fr.wgmma_pending.contains(&s) {
                    fr.wgmma_pending.push(s);
                }
            }
            return Ok(());
        }
        // The accumulators in memory: loaded, and stored once the operation ends.
        self.wgmma_wait(fr)?;
        let c = self.place(fr, &w.c)?;
        let places = self.places(&w.op.d_fragment(), lane)?;
        let mut acc: Vec<BasicValueEnum<'ctx>> = Vec::new();
        for &(r, col) in &places {
            acc.push(self.load_at(&c, r, col)?);
        }
        let (da, db) = (self.descriptor(fr, &w.a)?, self.descriptor(fr, &w.b)?);
        let d = self.wgmma_asm(w.op, da, db, trans, &acc, Issue { fence: true, wait: true })?;
        for (v, &(r, col)) in d.into_iter().zip(&places) {
            let p = self.element(&c, r, col)?;
            self.b.build_store(p, v)?;
        }
        Ok(())
    }

    /// Waits for the operations in flight (`Frame::wgmma_pending`), their
    /// registers passed through the wait: reads after it see their results.
    pub(super) fn wgmma_wait(&mut self, fr: &mut Frame<'ctx>) -> R<()> {
        if fr.wgmma_pending.is_empty() {
            return Ok(());
        }
        let slots = std::mem::take(&mut fr.wgmma_pending);
        let f32t = self.cx.f32_type();
        let n = slots.len();
        let mut args: Vec<BasicMetadataValueEnum> = Vec::new();
        for &s in &slots {
            args.push(self.b.build_load(f32t, s, "acc")?.into());
        }
        let mut constraints: Vec<String> = vec!["=f".to_string(); n];
        constraints.extend((0..n).map(|i| i.to_string()));
        let out = self.cx.struct_type(&vec![f32t.into(); n], false);
        let params: Vec<BasicMetadataTypeEnum> = vec![f32t.into(); n];
        let fn_ty = out.fn_type(&params, false);
        let asm = "wgmma.wait_group.sync.aligned 0;".to_string();
        let asm_fn = self.cx.create_inline_asm(fn_ty, asm, constraints.join(","), true, false, None, false);
        let call = self.b.build_indirect_call(fn_ty, asm_fn, &args, "waited")?;
        let inkwell::values::ValueKind::Basic(d) = call.try_as_basic_value() else {
            return Err(CodegenError::Unsupported("wgmma wait without results".into()));
        };
        let d = d.into_struct_value();
        for (i, s) in slots.into_iter().enumerate() {
            let v = self.b.build_extract_value(d, i as u32, "acc")?;
            self.b.build_store(s, v)?;
        }
        Ok(())
    }

    /// The inline PTX of one operation: the lane's results.
    fn wgmma_asm(
        &mut self,
        op: WgmmaOp,
        da: IntValue<'ctx>,
        db: IntValue<'ctx>,
        [ta, tb]: [bool; 2],
        acc: &[BasicValueEnum<'ctx>],
        issue: Issue,
    ) -> R<Vec<BasicValueEnum<'ctx>>> {
        let n = acc.len();
        let f32t = self.cx.f32_type();
        let (i64t, i32t) = (self.cx.i64_type(), self.cx.i32_type());
        let regs: Vec<String> = (0..n).map(|i| format!("${i}")).collect();
        let ty = if op.ab == ElemType::BF16 { "bf16" } else { "f16" };
        // scale-d is a predicate made from an operand (1: d = a·b + d); the
        // immediates: A and B not negated (1, 1), then whether each is
        // MN-major (transposed from wgmma's K-major default).
        let fence = if issue.fence { "wgmma.fence.sync.aligned;\n" } else { "" };
        let wait = if issue.wait { "wgmma.wait_group.sync.aligned 0;\n" } else { "" };
        let asm = format!(
            "{{\n.reg .pred p;\nsetp.ne.b32 p, ${s}, 0;\n{fence}\
             wgmma.mma_async.sync.aligned.m64n{nn}k16.f32.{ty}.{ty} {{{regs}}}, ${a}, ${b}, p, 1, 1, {ta}, {tb};\n\
             wgmma.commit_group.sync.aligned;\n{wait}}}",
            nn = op.n,
            regs = regs.join(", "),
            a = n,
            b = n + 1,
            s = n + 2,
            ta = ta as u8,
            tb = tb as u8,
        );
        let mut constraints: Vec<String> = vec!["=f".to_string(); n];
        constraints.extend(["l".to_string(), "l".to_string(), "r".to_string()]);
        constraints.extend((0..n).map(|i| i.to_string()));
        let out = self.cx.struct_type(&vec![f32t.into(); n], false);
        let mut params: Vec<BasicMetadataTypeEnum> = vec![i64t.into(), i64t.into(), i32t.into()];
        params.extend(std::iter::repeat_n(BasicMetadataTypeEnum::from(f32t), n));
        let fn_ty = out.fn_type(&params, false);
        let asm_fn = self.cx.create_inline_asm(fn_ty, asm, constraints.join(","), true, false, None, false);
        let mut args: Vec<BasicMetadataValueEnum> = vec![da.into(), db.into(), i32t.const_int(1, false).into()];
        args.extend(acc.iter().map(|&v| BasicMetadataValueEnum::from(v)));
        let call = self.b.build_indirect_call(fn_ty, asm_fn, &args, "wgmma")?;
        let inkwell::values::ValueKind::Basic(d) = call.try_as_basic_value() else {
            return Err(CodegenError::Unsupported("wgmma inline assembly without results".into()));
        };
        let d = d.into_struct_value();
        (0..n).map(|i| Ok(self.b.build_extract_value(d, i as u32, "d")?)).collect()
    }

    /// The emulation: the block's operation as loops, `A` and `B` read at
    /// the descriptor's canonical byte offsets from their tiles' starts
    /// (swizzled as the hardware swizzles them, from the buffer's start).
    fn wgmma_loops(&mut self, fr: &mut Frame<'ctx>, w: &Wgmma) -> R<()> {
        let c = self.place(fr, &w.c)?;
        let (mm, nn, kk) = w.op.shape();
        let i64t = self.cx.i64_type();
        let f32t = self.cx.f32_type();
        let i8t = self.cx.i8_type();
        let k = |v: i64| i64t.const_int(v as u64, true);
        let start_of =
            |g: &mut Self, fr: &mut Frame<'ctx>, m: &SmemMatrix| -> R<(PointerValue<'ctx>, IntValue<'ctx>)> {
                let base = fr.tensors[&m.tensor];
                let p = g.smem_start(fr, m)?;
                let (b, s) = (g.b.build_ptr_to_int(base, i64t, "base")?, g.b.build_ptr_to_int(p, i64t, "start")?);
                Ok((base, g.b.build_int_sub(s, b, "start")?))
            };
        let (pa, pb) = (start_of(self, fr, &w.a)?, start_of(self, fr, &w.b)?);
        let elem = self.mem_ty(w.op.ab);
        let bf16 = w.op.ab == ElemType::BF16;
        let func = fr.func;
        let zero = i64t.const_zero();
        // Element (mn, k) of an operand: its canonical byte offset from the
        // tile's start (`ir::canonical_offset`), swizzled from the buffer's.
        let at = |g: &mut Self, (base, start): (PointerValue<'ctx>, IntValue<'ctx>), m: &SmemMatrix, r, kv| {
            let off = g.canonical_offset(m, r, kv)?;
            let mut byte = g.b.build_int_add(start, off, "byte")?;
            if m.swizzled {
                // The stores' own swizzle (`Gen::swizzled_offset`), in bytes.
                byte = g.swizzled_offset(byte.into(), 1, super::gen::Mode::Scalar)?.into_int_value();
            }
            let p = g.gep(i8t.into(), base, byte)?;
            let v = g.b.build_load(elem, p, "x")?;
            Ok::<_, CodegenError>(if bf16 {
                g.bf16_to_f32(v, None)?.into_float_value()
            } else {
                g.b.build_float_ext(v.into_float_value(), f32t, "x")?
            })
        };
        self.count(func, "r", zero, k(mm), &mut |g, r| {
            g.count(func, "c", zero, k(nn), &mut |g, col| {
                let p = g.element(&c, r, col)?;
                let slot = g.entry_alloca(func, f32t.into())?;
                let acc0 = g.b.build_load(f32t, p, "acc")?;
                g.b.build_store(slot, acc0)?;
                g.count(func, "k", zero, k(kk), &mut |g, kv| {
                    let x = at(g, pa, &w.a, r, kv)?;
                    let y = at(g, pb, &w.b, col, kv)?;
                    let prod = g.b.build_float_mul(x, y, "ab")?;
                    let acc = g.b.build_load(f32t, slot, "acc")?.into_float_value();
                    g.b.build_store(slot, g.b.build_float_add(acc, prod, "sum")?)?;
                    Ok(())
                })?;
                let acc = g.b.build_load(f32t, slot, "acc")?;
                g.b.build_store(p, acc)?;
                Ok(())
            })
        })
    }

    /// `ir::canonical_offset` of operand `m`'s element (`mn`, `kv`), in code.
    fn canonical_offset(&mut self, m: &SmemMatrix, mn: IntValue<'ctx>, kv: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        let i64t = self.cx.i64_type();
        let k = |v: i64| i64t.const_int(v as u64, true);
        let b = &self.b;
        // Σ (x / d % m) · s over the terms of the layout (m 0: no modulo).
        let term = |x: IntValue<'ctx>, d: i64, m: i64, s: i64| -> R<IntValue<'ctx>> {
            let mut v = if d > 1 { b.build_int_unsigned_div(x, k(d), "q")? } else { x };
            if m > 0 {
                v = b.build_int_unsigned_rem(v, k(m), "r")?;
            }
            Ok(b.build_int_mul(v, k(s), "t")?)
        };
        let terms = match (m.major, m.swizzled) {
            (Major::K, false) => {
                [term(mn, 8, 0, m.sbo)?, term(kv, 8, 0, m.lbo)?, term(mn, 1, 8, 16)?, term(kv, 1, 8, 2)?]
            }
            (Major::Mn, false) => {
                [term(mn, 8, 0, m.sbo)?, term(kv, 8, 0, m.lbo)?, term(kv, 1, 8, 16)?, term(mn, 1, 8, 2)?]
            }
            (Major::K, true) => [term(mn, 8, 0, m.sbo)?, term(mn, 1, 8, 128)?, term(kv, 1, 0, 2)?, k(0)],
            (Major::Mn, true) => {
                [term(mn, 64, 0, m.lbo)?, term(mn, 1, 64, 2)?, term(kv, 8, 0, m.sbo)?, term(kv, 1, 8, 128)?]
            }
        };
        let mut sum = terms[0];
        for t in &terms[1..] {
            sum = b.build_int_add(sum, *t, "off")?;
        }
        Ok(sum)
    }
}
