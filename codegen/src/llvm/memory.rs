//! Memory: flat offsets, loads and stores in scalar and vector code. How a
//! vector access is made follows `texc_schedules::analysis::access`.

use super::gen::{Frame, Gen, Mode};
use super::{llvm_err, R};
use inkwell::builder::Builder;
use inkwell::types::{BasicTypeEnum, VectorType};
use inkwell::values::{
    BasicMetadataValueEnum, BasicValue, BasicValueEnum, FunctionValue, IntMathValue, PointerValue, VectorValue,
};
use inkwell::{AddressSpace, IntPredicate};
use texc_compiler::ops::BinOp;
use texc_compiler::tir::{TExpr, TExprId, TensorId, Ty, VarId};
use texc_compiler::types::ElemType;
use texc_schedules::analysis::{self, Access};

/// Lanes from which a masked load that is not an instruction copies its
/// span through the stack ([`Gen::bounced_load`]) rather than loading lane
/// by lane: a few lanes' branches cost less than the copy's.
const MIN_BOUNCED_LANES: u32 = 8;

impl<'ctx> Gen<'ctx, '_> {
    pub(super) fn flat_offset(
        &mut self,
        fr: &mut Frame<'ctx>,
        t: TensorId,
        idx: &[TExprId],
        mode: Mode<'ctx>,
    ) -> R<BasicValueEnum<'ctx>> {
        if self.on_device() && self.f.registers.contains(&t) {
            // A `registers` buffer: each thread has only its own element.
            return self.const_of(Ty::Index, 0, 0.0, mode);
        }
        let shape = &self.f.p.tensor(t).shape;
        let mut stride = 1i64;
        let mut acc: Option<BasicValueEnum> = None;
        for d in (0..idx.len()).rev() {
            let i = self.expr(fr, idx[d], mode)?;
            let s = self.const_of(Ty::Index, stride, 0.0, mode)?;
            let term = self.arith(BinOp::Mul, i, s, Ty::Index)?;
            acc = Some(match acc {
                Some(a) => self.arith(BinOp::Add, a, term, Ty::Index)?,
                None => term,
            });
            stride *= shape[d];
        }
        let flat = match acc {
            Some(a) => a,
            None => self.const_of(Ty::Index, 0, 0.0, mode)?,
        };
        if self.swizzled.contains(&t) {
            return self.swizzled_offset(flat, self.f.p.tensor(t).elem.size() as i64, mode);
        }
        Ok(flat)
    }

    /// Element offset `flat` of a buffer `wgmma` reads with the 128-byte
    /// swizzle, where it is stored: `texc_schedules::ir::swizzle128` of its
    /// byte offset, in elements of `size` bytes (scalar or per lane).
    pub(super) fn swizzled_offset(
        &mut self,
        flat: BasicValueEnum<'ctx>,
        size: i64,
        mode: Mode<'ctx>,
    ) -> R<BasicValueEnum<'ctx>> {
        // In elements: the chunk's bits (16 bytes) exclusive-or the row's within 8 (128 bytes).
        let chunk = (16 / size).trailing_zeros() as i64;
        let shift = self.const_of(Ty::Index, 3, 0.0, mode)?;
        let mask = self.const_of(Ty::Index, 7 << chunk, 0.0, mode)?;
        fn swizzle<'ctx, T: IntMathValue<'ctx> + Copy>(b: &Builder<'ctx>, x: T, shift: T, mask: T) -> R<T> {
            let row = b.build_right_shift(x, shift, false, "row")?;
            Ok(b.build_xor(x, b.build_and(row, mask, "row")?, "swizzled")?)
        }
        Ok(match flat {
            BasicValueEnum::VectorValue(x) => {
                swizzle(&self.b, x, shift.into_vector_value(), mask.into_vector_value())?.into()
            }
            x => swizzle(&self.b, x.into_int_value(), shift.into_int_value(), mask.into_int_value())?.into(),
        })
    }

    /// How a vector access to `t` at `idx` reads its lanes
    /// (`analysis::access`), except that in a swizzled buffer lanes that
    /// follow each other stay so only within a 16-byte chunk the access
    /// provably starts, which the swizzle keeps whole: any other access of
    /// several elements is lane by lane.
    fn access(&self, t: TensorId, idx: &[TExprId], var: VarId, base: i64, lanes: u32) -> Access {
        let a = analysis::access(self.f, t, idx, var);
        if !self.swizzled.contains(&t) {
            return a;
        }
        let bytes = lanes * self.f.p.tensor(t).elem.size() as u32;
        let in_chunk = bytes <= 16 && analysis::vector_alignment(&self.f.p, t, idx, var, base, lanes) >= bytes;
        match a {
            Access::Uniform => a,
            Access::Contiguous if in_chunk => a,
            _ => Access::Gather,
        }
    }

    /// The alignment of a contiguous vector access to `t` at `idx` whose
    /// lane 0 is at `var = base`: on the GPU, where a vector access wider
    /// than its alignment is split into element accesses, the vector's size
    /// (at most 16 bytes, the widest access) when its offset provably allows
    /// it (device buffers and shared arrays are 16-byte aligned); else an element.
    pub(super) fn vector_alignment(&self, t: TensorId, idx: &[TExprId], var: VarId, base: i64, lanes: u32) -> u32 {
        if !self.on_device() {
            return self.f.p.tensor(t).elem.size() as u32;
        }
        analysis::vector_alignment(&self.f.p, t, idx, var, base, lanes)
    }

    pub(super) fn load(
        &mut self,
        fr: &mut Frame<'ctx>,
        t: TensorId,
        idx: &[TExprId],
        mode: Mode<'ctx>,
    ) -> R<BasicValueEnum<'ctx>> {
        let elem = self.f.p.tensor(t).elem;
        let mty = self.mem_ty(elem);
        let base = fr.tensors[&t];
        let align = elem.size() as u32;
        let v: BasicValueEnum = match mode {
            Mode::Scalar => {
                let off = self.flat_offset(fr, t, idx, mode)?.into_int_value();
                let p = self.gep(mty, base, off)?;
                self.b.build_load(mty, p, "ld")?
            }
            Mode::Vector { var, base, lanes, mask } => {
                let vt = self.vec_ty(mty, lanes);
                match self.access(t, idx, var, base, lanes) {
                    Access::Uniform if mask.is_none() => {
                        let s = self.load(fr, t, idx, Mode::Scalar)?;
                        return Ok(self.splat(s, lanes)?.into());
                    }
                    Access::Contiguous => {
                        let p = self.lane0_address(fr, t, idx, var, base, mty)?;
                        // Not a stack array's: SROA keeps those in registers, and masked
                        // loads would stop it. Nor one a statement stores in place: its
                        // stores are LLVM's pieces, and a masked load of what they just
                        // wrote waits for them instead of taking their values (MEASURED:
                        // SqueezeNet's classifier, summed in its output, 1.4× slower).
                        let odd_tail = (!self.stack_arrays.contains_key(&(fr.func, t))
                            && !self.updated_in_place.contains(&t))
                        .then(|| self.odd_tail(lanes, align))
                        .flatten();
                        match mask {
                            None if odd_tail.is_some() => {
                                let padded = odd_tail.expect("checked");
                                let wide = self.masked_load(p, mty, self.first_on(lanes, padded), align)?;
                                self.lanes_of(wide, 0, lanes)?.into()
                            }
                            None => {
                                let ld = self.b.build_load(vt, p, "vld")?;
                                let al = self.vector_alignment(t, idx, var, base, lanes);
                                ld.as_instruction_value().expect("load").set_alignment(al).map_err(llvm_err)?;
                                ld
                            }
                            Some(m) if self.masked_access_native(align) && !self.slow_masked_loads() => {
                                self.masked_load(p, mty, m, align)?.into()
                            }
                            Some(m) => {
                                let full = move |g: &mut Self| g.plain_load(p, mty, lanes, align);
                                let partial = move |g: &mut Self| g.masked_load(p, mty, m, align);
                                self.unless_all_on(m, full, partial)?.into()
                            }
                        }
                    }
                    // Small constant strides: one wide masked load of the span, then a
                    // shuffle that keeps every s-th element (no gather).
                    Access::Strided(stride @ 2..=4) => {
                        let p = self.lane0_address(fr, t, idx, var, base, mty)?;
                        let stride = stride as u32;
                        let masked = move |g: &mut Self| g.strided_masked_load(p, mty, lanes, stride, mask, align);
                        // Where masked bytes are lane-by-lane branches: the span the lanes read,
                        // from the first to the last (every element inside the tensor), loaded whole.
                        let span = move |g: &mut Self| {
                            let span = g.span_load(p, mty, (lanes - 1) * stride + 1, align)?;
                            g.every(span, stride, lanes)
                        };
                        match mask {
                            // AVX2's `vmaskmovps` loads are slower than plain ones (MEASURED: a
                            // stride-2 depthwise 3 × 3, 96 × 56 × 56 f32 out, 0.26 → 0.18 ms as
                            // spans; AVX-512's `vmovups {k}` is a plain load, 0.14 → 0.16 as spans).
                            None if self.slow_masked_loads() => span(self)?.into(),
                            _ if self.masked_access_native(align) => masked(self)?.into(),
                            None => span(self)?.into(),
                            Some(m) => self.unless_all_on(m, span, masked)?.into(),
                        }
                    }
                    _ => {
                        // (A swizzled buffer's lanes are not where the logical pattern says.)
                        if self.swizzled.contains(&t) {
                        } else if let Some(v) = self.load_lane_pattern(fr, t, idx, var, base, lanes, mty, mask)? {
                            return Ok(v);
                        }
                        let ptrs = self.lane_addresses(fr, t, idx, mode, elem)?;
                        let f = self.intrinsic("llvm.masked.gather", &[vt.into(), ptrs.get_type().into()])?;
                        let al = self.cx.i32_type().const_int(align as u64, false);
                        let m = mask.unwrap_or_else(|| self.true_mask(lanes));
                        self.call(f, &[ptrs.into(), al.into(), m.into(), vt.const_zero().into()])?
                    }
                }
            }
        };
        if elem == ElemType::Bool {
            let zero = self.const_of(Ty::Elem(ElemType::I8), 0, 0.0, mode)?;
            return self.compare(BinOp::Ne, v, zero, Ty::Elem(ElemType::I8));
        }
        Ok(v)
    }

    /// A gather whose lane offsets are compile-time constants
    /// (`analysis::lane_offsets`) within a span of at most four vectors: one
    /// load of the span and a constant shuffle. Without a mask every element
    /// of the span lies between two elements that some lane reads, so inside
    /// the buffer; under a mask, the span is loaded under the mask of the
    /// positions that active lanes read.
    #[allow(clippy::too_many_arguments)]
    fn load_lane_pattern(
        &mut self,
        fr: &mut Frame<'ctx>,
        t: TensorId,
        idx: &[TExprId],
        var: VarId,
        base: i64,
        lanes: u32,
        mty: BasicTypeEnum<'ctx>,
        mask: Option<VectorValue<'ctx>>,
    ) -> R<Option<BasicValueEnum<'ctx>>> {
        let elem = self.f.p.tensor(t).elem;
        if elem == ElemType::Bool {
            return Ok(None);
        }
        let Some(offsets) = analysis::lane_offsets(self.f, t, idx, var, base, lanes as usize) else {
            return Ok(None);
        };
        let (lo, hi) = (*offsets.iter().min().expect("lanes"), *offsets.iter().max().expect("lanes"));
        let span = hi - lo + 1;
        if span > 4 * lanes as i64 {
            return Ok(None);
        }
        let p0 = self.lane0_address(fr, t, idx, var, base, mty)?;
        let i64t = self.cx.i64_type();
        let start = self.gep(mty, p0, i64t.const_int(lo as u64, true))?;
        let wt = self.vec_ty(mty, span as u32);
        let i32t = self.cx.i32_type();
        let wide = match mask {
            None => self.span_load(start, mty, span as u32, elem.size() as u32)?,
            Some(m) => {
                let wide_mask = self.span_mask(m, &offsets, lo, span as u32)?;
                self.masked_load(start, mty, wide_mask, elem.size() as u32)?
            }
        };
        let pick: Vec<_> = offsets.iter().map(|&o| i32t.const_int((o - lo) as u64, false)).collect();
        let v = self.b.build_shuffle_vector(wide, wt.get_poison(), VectorType::const_vector(&pick), "lanes")?;
        Ok(Some(v.into()))
    }

    /// The `i32` words of bytes `parts` (`(t, x_t)`: byte `t` of every lane
    /// is `x_t`'s, missing ones zero) where every `x_t` is a load of one
    /// `u8` tensor at the same indices but for a constant added to the
    /// last (`X[.., b + k_t]`: a window's bytes, `crate::dot4`'s in-place
    /// words) and the lanes read constant offsets within four vectors of
    /// bytes: one load of the span every part reads and one shuffle that
    /// places the bytes (`vpermb` with AVX-512 VBMI), instead of each part
    /// loaded, widened to 32 bits, shifted and added. `None` for other parts.
    pub(super) fn byte_window(
        &mut self,
        fr: &mut Frame<'ctx>,
        parts: &[(usize, TExprId)],
        (var, base, lanes): (VarId, i64, u32),
        mask: Option<VectorValue<'ctx>>,
    ) -> R<Option<VectorValue<'ctx>>> {
        let p = &self.f.p;
        let load_of = |x: TExprId| match p.expr(x) {
            TExpr::Load(t, idx) => Some((*t, idx.clone())),
            _ => None,
        };
        let Some(loads) = parts.iter().map(|&(t, x)| Some((t, load_of(x)?))).collect::<Option<Vec<_>>>() else {
            return Ok(None);
        };
        let (t, idx0) = &loads[0].1;
        // (A 0-d tensor's part has no row to read along.)
        let Some(last) = idx0.len().checked_sub(1) else { return Ok(None) };
        let split = |i: TExprId| match *p.expr(i) {
            TExpr::Binary(BinOp::Add, b, k) => match *p.expr(k) {
                TExpr::Int(k) => (b, k),
                _ => (i, 0),
            },
            _ => (i, 0),
        };
        let stem = split(idx0[last]).0;
        let same = |(u, idx): &(TensorId, Vec<TExprId>)| {
            let same_value = |a: &TExprId, b: &TExprId| analysis::same_value(p, *a, *b);
            u == t
                && idx.len() == idx0.len()
                && idx[..last].iter().zip(&idx0[..last]).all(|(a, b)| same_value(a, b))
                && same_value(&split(idx[last]).0, &stem)
        };
        if p.tensor(*t).elem != ElemType::U8 || self.swizzled.contains(t) || !loads.iter().all(|(_, l)| same(l)) {
            return Ok(None);
        }
        // Offsets from the part nearest the row's start, whose lane 0 reads
        // an element of the tensor (the stem alone may not: `X[.., x + 1]`).
        let (_, (_, anchor)) = loads.iter().min_by_key(|(_, (_, idx))| split(idx[last]).1).expect("parts");
        let first = split(anchor[last]).1;
        let Some(offsets) = analysis::lane_offsets(self.f, *t, anchor, var, base, lanes as usize) else {
            return Ok(None);
        };
        let at: Vec<(usize, Vec<i64>)> = loads
            .iter()
            .map(|(b, (_, idx))| (*b, offsets.iter().map(|o| o + split(idx[last]).1 - first).collect()))
            .collect();
        let every = at.iter().flat_map(|(_, o)| o.iter().copied());
        let (lo, hi) = (every.clone().min().expect("lanes"), every.max().expect("lanes"));
        if hi - lo + 1 > 4 * lanes as i64 {
            return Ok(None);
        }
        let span = (hi - lo + 1) as u32;
        let i8t = self.cx.i8_type();
        let p0 = self.lane0_address(fr, *t, anchor, var, base, i8t.into())?;
        let start = self.gep(i8t.into(), p0, self.cx.i64_type().const_int(lo as u64, true))?;
        let whole = span.next_power_of_two();
        let wide = match mask {
            // With AVX-512 VBMI, the span as one register of the power of
            // two above it (its bytes past the span off, a masked load):
            // the shuffle is one `vpermb` (MEASURED, Zen 4, `host`, `u8`
            // depthwise 3 × 3 layers, 144 × 56 × 56 of stride 1: 0.12 →
            // 0.11 ms, 96 × 56 × 56 of stride 2: 0.09 → 0.08; without VBMI
            // the two overlapping pieces shuffle as well or better).
            None if self.has_feature("avx512vbmi") && whole != span && whole <= 64 => {
                self.masked_load(start, i8t.into(), self.first_on(span, whole), 1)?
            }
            None => self.span_load(start, i8t.into(), span, 1)?,
            Some(m) => {
                let mut read: Option<VectorValue<'ctx>> = None;
                for (_, o) in &at {
                    let part = self.span_mask(m, o, lo, span)?;
                    read = Some(match read {
                        None => part,
                        Some(r) => self.b.build_or(r, part, "read")?,
                    });
                }
                self.masked_load(start, i8t.into(), read.expect("parts"), 1)?
            }
        };
        // Index `span` (the loaded vector's length) picks from the second operand: zero.
        let span = wide.get_type().get_size();
        let i32t = self.cx.i32_type();
        let at = &at;
        let pick: Vec<_> = (0..lanes as usize)
            .flat_map(|l| {
                (0..4).map(move |b| match at.iter().find(|(t, _)| *t == b) {
                    Some((_, o)) => (o[l] - lo) as u64,
                    None => span as u64,
                })
            })
            .map(|i| i32t.const_int(i, false))
            .collect();
        let zero = i8t.vec_type(span).const_zero();
        let bytes = self.b.build_shuffle_vector(wide, zero, VectorType::const_vector(&pick), "window")?;
        Ok(Some(self.b.build_bit_cast(bytes, i32t.vec_type(lanes), "words")?.into_vector_value()))
    }

    /// A constant mask of `lanes` lanes whose first `on` are on.
    fn first_on(&self, on: u32, lanes: u32) -> VectorValue<'ctx> {
        let i1 = self.cx.bool_type();
        let bits: Vec<_> = (0..lanes).map(|l| if l < on { i1.const_all_ones() } else { i1.const_zero() }).collect();
        VectorType::const_vector(&bits)
    }

    /// The mask of span positions `j` read by an active lane: the OR, over the
    /// k-th lanes reading each position, of shuffles of the lane mask `m`
    /// (a position read by fewer than k lanes takes a constant-false lane).
    fn span_mask(&mut self, m: VectorValue<'ctx>, offsets: &[i64], lo: i64, span: u32) -> R<VectorValue<'ctx>> {
        let mut readers: Vec<Vec<u32>> = vec![Vec::new(); span as usize];
        for (l, &o) in offsets.iter().enumerate() {
            readers[(o - lo) as usize].push(l as u32);
        }
        let most = readers.iter().map(Vec::len).max().unwrap_or(0);
        let lanes = offsets.len() as u32;
        let i32t = self.cx.i32_type();
        // Index `lanes` picks from the second shuffle operand: all false.
        let falses = m.get_type().const_zero();
        let mut acc: Option<VectorValue<'ctx>> = None;
        for k in 0..most {
            let pick: Vec<_> =
                readers.iter().map(|r| i32t.const_int(r.get(k).copied().unwrap_or(lanes) as u64, false)).collect();
            let part = self.b.build_shuffle_vector(m, falses, VectorType::const_vector(&pick), "spanm")?;
            acc = Some(match acc {
                None => part,
                Some(a) => self.b.build_or(a, part, "spanm")?,
            });
        }
        Ok(acc.expect("at least one lane"))
    }

    pub(super) fn lane0_address(
        &mut self,
        fr: &mut Frame<'ctx>,
        t: TensorId,
        idx: &[TExprId],
        var: VarId,
        base: i64,
        mty: BasicTypeEnum<'ctx>,
    ) -> R<PointerValue<'ctx>> {
        let saved = fr.vars.insert(var, self.cx.i64_type().const_int(base as u64, true));
        let off = self.flat_offset(fr, t, idx, Mode::Scalar)?.into_int_value();
        match saved {
            Some(v) => fr.vars.insert(var, v),
            None => fr.vars.remove(&var),
        };
        self.gep(mty, fr.tensors[&t], off)
    }

    pub(super) fn lane_addresses(
        &mut self,
        fr: &mut Frame<'ctx>,
        t: TensorId,
        idx: &[TExprId],
        mode: Mode<'ctx>,
        elem: ElemType,
    ) -> R<VectorValue<'ctx>> {
        let lanes = mode.lanes().expect("vector mode");
        let off = self.flat_offset(fr, t, idx, mode.with_mask(None))?;
        let size = self.const_of(Ty::Index, elem.size() as i64, 0.0, mode)?;
        let bytes = self.arith(BinOp::Mul, off, size, Ty::Index)?;
        let base = self.b.build_ptr_to_int(fr.tensors[&t], self.cx.i64_type(), "base")?;
        let base = self.splat(base.into(), lanes)?;
        let addr = self.b.build_int_add(base, bytes.into_vector_value(), "addr")?;
        let pt = self.cx.ptr_type(AddressSpace::default()).vec_type(lanes);
        Ok(self.b.build_int_to_ptr(addr, pt, "ptrs")?)
    }

    /// `prefetch T at OFFSET`: `llvm.prefetch` of the element's line, for
    /// reading, into the L2 (locality 2: `prefetcht1` on x86).
    pub(super) fn prefetch(&mut self, fr: &mut Frame<'ctx>, t: TensorId, offset: TExprId, mode: Mode<'ctx>) -> R<()> {
        if mode.lanes().is_some() || self.on_device() {
            return Err(crate::CodegenError::Unsupported(
                "a prefetch inside a vectorized loop or in GPU code (prefetches are scalar CPU statements)".into(),
            ));
        }
        let off = self.expr(fr, offset, Mode::Scalar)?.into_int_value();
        let p = self.gep(self.mem_ty(self.f.p.tensor(t).elem), fr.tensors[&t], off)?;
        let f = self.intrinsic("llvm.prefetch", &[p.get_type().into()])?;
        let i32t = self.cx.i32_type();
        let [read, l2, data] = [0, 2, 1].map(|k| i32t.const_int(k, false).into());
        self.call_void(f, &[p.into(), read, l2, data])
    }

    pub(super) fn store(
        &mut self,
        fr: &mut Frame<'ctx>,
        t: TensorId,
        idx: &[TExprId],
        v: BasicValueEnum<'ctx>,
        mode: Mode<'ctx>,
    ) -> R<()> {
        let elem = self.f.p.tensor(t).elem;
        let mty = self.mem_ty(elem);
        let align = elem.size() as u32;
        let v = if elem == ElemType::Bool {
            match v {
                BasicValueEnum::VectorValue(x) => {
                    self.b.build_int_z_extend(x, self.cx.i8_type().vec_type(x.get_type().get_size()), "b8")?.into()
                }
                _ => self.b.build_int_z_extend(v.into_int_value(), self.cx.i8_type(), "b8")?.into(),
            }
        } else {
            v
        };
        match mode {
            Mode::Scalar => {
                let off = self.flat_offset(fr, t, idx, mode)?.into_int_value();
                let p = self.gep(mty, fr.tensors[&t], off)?;
                self.b.build_store(p, v)?;
            }
            Mode::Vector { var, base, lanes, mask } => {
                let vt = self.vec_ty(mty, lanes);
                let al = self.cx.i32_type().const_int(align as u64, false);
                if self.access(t, idx, var, base, lanes) == Access::Contiguous {
                    let p = self.lane0_address(fr, t, idx, var, base, mty)?;
                    match mask {
                        None => {
                            let st = self.b.build_store(p, v)?;
                            st.set_alignment(self.vector_alignment(t, idx, var, base, lanes)).map_err(llvm_err)?;
                        }
                        Some(m) => self.masked_store(p, mty, v.into_vector_value(), m, align)?,
                    }
                } else {
                    let ptrs = self.lane_addresses(fr, t, idx, mode, elem)?;
                    let f = self.intrinsic("llvm.masked.scatter", &[vt.into(), ptrs.get_type().into()])?;
                    let m = mask.unwrap_or_else(|| self.true_mask(lanes));
                    self.call_void(f, &[v, ptrs.into(), al.into(), m.into()])?;
                }
            }
        }
        Ok(())
    }

    /// The lanes of a vector access with a constant stride of 2–4 under
    /// `mask`: one masked load of the span (every `stride`-th element), then
    /// a shuffle that keeps them (no gather).
    fn strided_masked_load(
        &mut self,
        p: PointerValue<'ctx>,
        mty: BasicTypeEnum<'ctx>,
        lanes: u32,
        stride: u32,
        mask: Option<VectorValue<'ctx>>,
        align: u32,
    ) -> R<VectorValue<'ctx>> {
        let wide_lanes = lanes * stride;
        let (i32t, bool_t) = (self.cx.i32_type(), self.cx.bool_type());
        let pattern: Vec<_> = (0..wide_lanes)
            .map(|j| if j % stride == 0 { bool_t.const_all_ones() } else { bool_t.const_zero() })
            .collect();
        let mut wide_mask = VectorType::const_vector(&pattern);
        if let Some(m) = mask {
            let spread: Vec<_> = (0..wide_lanes).map(|j| i32t.const_int((j / stride) as u64, false)).collect();
            let mw =
                self.b.build_shuffle_vector(m, m.get_type().get_poison(), VectorType::const_vector(&spread), "mw")?;
            wide_mask = self.b.build_and(wide_mask, mw, "mw")?;
        }
        let wide = self.masked_load(p, mty, wide_mask, align)?;
        self.every(wide, stride, lanes)
    }

    /// Elements `0, stride, 2·stride, ..` of `v`, `lanes` of them.
    fn every(&self, v: VectorValue<'ctx>, stride: u32, lanes: u32) -> R<VectorValue<'ctx>> {
        let i32t = self.cx.i32_type();
        let pick: Vec<_> = (0..lanes).map(|l| i32t.const_int((l * stride) as u64, false)).collect();
        Ok(self.b.build_shuffle_vector(v, v.get_type().get_poison(), VectorType::const_vector(&pick), "strided")?)
    }

    /// A vector of `lanes` elements `mty` loaded from `p`, aligned to `align` bytes.
    pub(super) fn plain_load(
        &mut self,
        p: PointerValue<'ctx>,
        mty: BasicTypeEnum<'ctx>,
        lanes: u32,
        align: u32,
    ) -> R<VectorValue<'ctx>> {
        let ld = self.b.build_load(self.vec_ty(mty, lanes), p, "vld")?;
        ld.as_instruction_value().expect("load").set_alignment(align).map_err(llvm_err)?;
        Ok(ld.into_vector_value())
    }

    /// `n` consecutive elements from `p`, every one inside the buffer. Where
    /// `n` is no power of two (a stride-2 row of 16 bytes spans 31), LLVM
    /// legalizes the load element by element (AVX2: 15 `vpinsrb` per row;
    /// MEASURED: an int8 stride-2 depthwise convolution, 96 × 56 × 56 out,
    /// 0.67–0.74 ms on AVX2 against 0.21 on AVX-512, whose masked load
    /// avoids it; 0.22–0.24 with this); two loads of the
    /// power of two below, overlapping in the middle, read the same span as
    /// whole registers and one shuffle joins them. `align`: an element's.
    fn span_load(
        &mut self,
        p: PointerValue<'ctx>,
        mty: BasicTypeEnum<'ctx>,
        n: u32,
        align: u32,
    ) -> R<VectorValue<'ctx>> {
        let half = n.next_power_of_two() / 2;
        if n.is_power_of_two() || half < 4 || self.on_device() {
            return self.plain_load(p, mty, n, align);
        }
        let lo = self.plain_load(p, mty, half, align)?;
        let i64t = self.cx.i64_type();
        let p_hi = self.gep(mty, p, i64t.const_int((n - half) as u64, false))?;
        let hi = self.plain_load(p_hi, mty, half, align)?;
        let i32t = self.cx.i32_type();
        let pick: Vec<_> =
            (0..n).map(|i| i32t.const_int(if i < half { i } else { i - (n - half) + half } as u64, false)).collect();
        Ok(self.b.build_shuffle_vector(lo, hi, VectorType::const_vector(&pick), "span")?)
    }

    /// The lanes, whole registers, that a load of `lanes` elements of
    /// `bytes` bytes is made of as a masked load, where its last register
    /// holds a count of elements no power of two makes (a 7-wide row of
    /// f32 or i32: LLVM loads 4, 2 and 1 and inserts them, four
    /// instructions for the row a masked load (`vmaskmovps`, AVX-512's
    /// `vmovups {k}`) reads at once). `None` for other loads: power-of-two
    /// tails, or elements whose masked loads are not instructions.
    fn odd_tail(&self, lanes: u32, bytes: u32) -> Option<u32> {
        if self.on_device() || bytes < 4 {
            return None;
        }
        let register = self.register_bytes()? / bytes;
        let tail = lanes % register;
        (tail.count_ones() > 1 && self.masked_access_native(bytes)).then(|| lanes.div_ceil(register) * register)
    }

    /// Whether a masked access of `bytes`-byte elements is one instruction
    /// here: any with AVX-512BW, 4- and 8-byte ones with AVX
    /// (`vmaskmovps`); on GPUs masked accesses are lowered as they are.
    fn masked_access_native(&self, bytes: u32) -> bool {
        let on = |f: &str| self.has_feature(f);
        self.on_device() || on("avx512bw") || (bytes >= 4 && (on("avx") || on("avx2")))
    }

    /// Whether a masked load costs more than a plain one here: AVX2's
    /// `vmaskmovps` (AVX-512's `vmovups {k}` and GPUs' predicated loads
    /// do not).
    fn slow_masked_loads(&self) -> bool {
        !self.on_device() && !self.has_feature("avx512f")
    }

    /// `full(self)` where every lane of `mask` is on, else `partial(self)`:
    /// for masked accesses LLVM expands lane by lane (bytes on AVX2: a
    /// branch and a scalar load per lane — MEASURED: a `u8` 3 × 3 max pool
    /// with padding ran 7.6× slower on AVX2 than on AVX-512), one test of
    /// the mask and a plain vector access where no lane is off — inside a
    /// padded image, all but its border.
    fn unless_all_on(
        &mut self,
        mask: VectorValue<'ctx>,
        full: impl FnOnce(&mut Self) -> R<VectorValue<'ctx>>,
        partial: impl FnOnce(&mut Self) -> R<VectorValue<'ctx>>,
    ) -> R<VectorValue<'ctx>> {
        let lanes = mask.get_type().get_size();
        let f = self.intrinsic("llvm.vector.reduce.and", &[self.cx.bool_type().vec_type(lanes).into()])?;
        let all = self.call(f, &[mask.into()])?.into_int_value();
        let func = self.b.get_insert_block().and_then(|b| b.get_parent()).expect("inside a function");
        let (full_bb, partial_bb, merge) = (
            self.cx.append_basic_block(func, "all.on"),
            self.cx.append_basic_block(func, "some.off"),
            self.cx.append_basic_block(func, "masked.end"),
        );
        self.b.build_conditional_branch(all, full_bb, partial_bb)?;
        self.b.position_at_end(full_bb);
        let x = full(self)?;
        let x_end = self.b.get_insert_block().expect("positioned");
        self.b.build_unconditional_branch(merge)?;
        self.b.position_at_end(partial_bb);
        let y = partial(self)?;
        let y_end = self.b.get_insert_block().expect("positioned");
        self.b.build_unconditional_branch(merge)?;
        self.b.position_at_end(merge);
        let phi = self.b.build_phi(x.get_type(), "masked")?;
        phi.add_incoming(&[(&x, x_end), (&y, y_end)]);
        Ok(phi.as_basic_value().into_vector_value())
    }

    /// The lanes of `mask` read from the contiguous elements at `p`, for
    /// [`Self::masked_load`] where masked loads of such elements are not
    /// instructions (bytes and halves on AVX2) and the vector has at least
    /// [`MIN_BOUNCED_LANES`]: the elements from the first lane on to the
    /// last — inside the tensor, which holds both ends and everything
    /// between — copied
    /// into a stack slot by two overlapping moves of the largest power of
    /// two of bytes that fits (one branch per size, as small `memcpy`s do);
    /// the slot loaded whole, lanes off zeroed. LLVM's own expansion
    /// branches and loads lane by lane: 32 branches for a 32-byte vector
    /// (MEASURED: a `u8` padding copy, 96 × 112 × 112 on AVX2, whose rows'
    /// first and last vectors are partial, 0.36 → 0.19 ms). `align` is the
    /// element's size.
    fn bounced_load(
        &mut self,
        p: PointerValue<'ctx>,
        mty: BasicTypeEnum<'ctx>,
        mask: VectorValue<'ctx>,
        align: u32,
    ) -> R<VectorValue<'ctx>> {
        let lanes = mask.get_type().get_size();
        let (i8t, i64t) = (self.cx.i8_type(), self.cx.i64_type());
        let vt = self.vec_ty(mty, lanes);
        let func = self.b.get_insert_block().and_then(|b| b.get_parent()).expect("inside a function");
        let slot = self.entry_alloca(func, vt.into())?;
        let bits_t =
            self.cx.custom_width_int_type(std::num::NonZeroU32::new(lanes).expect("lanes")).map_err(llvm_err)?;
        let bits = self.b.build_bit_cast(mask, bits_t, "bits")?.into_int_value();
        let none = self.b.build_int_compare(IntPredicate::EQ, bits, bits_t.const_zero(), "none")?;
        let start = self.b.get_insert_block().expect("positioned");
        let (copy, done) = (self.cx.append_basic_block(func, "bounce"), self.cx.append_basic_block(func, "bounced"));
        self.b.build_conditional_branch(none, done, copy)?;
        self.b.position_at_end(copy);
        let yes = self.cx.bool_type().const_all_ones();
        let tz = self.intrinsic("llvm.cttz", &[bits_t.into()])?;
        let lz = self.intrinsic("llvm.ctlz", &[bits_t.into()])?;
        let widen = |g: &Self, v: BasicValueEnum<'ctx>| g.b.build_int_z_extend(v.into_int_value(), i64t, "n");
        let first = widen(self, self.call(tz, &[bits.into(), yes.into()])?)?;
        let leading = widen(self, self.call(lz, &[bits.into(), yes.into()])?)?;
        let size = i64t.const_int(align as u64, false);
        let last_end = self.b.build_int_sub(i64t.const_int(lanes as u64, false), leading, "end")?;
        let off = self.b.build_int_mul(first, size, "off")?;
        let len = self.b.build_int_mul(self.b.build_int_sub(last_end, first, "on")?, size, "len")?;
        let (src, dst) = (self.gep(i8t.into(), p, off)?, self.gep(i8t.into(), slot, off)?);
        let copied = self.cx.append_basic_block(func, "copied");
        let mut piece = (lanes * align).next_power_of_two();
        if piece > lanes * align {
            piece /= 2;
        }
        // `len` lies in `piece..2·piece` for the first size it reaches.
        while piece >= align {
            let fits = self.b.build_int_compare(IntPredicate::UGE, len, i64t.const_int(piece as u64, false), "fits")?;
            let (this, next) = (self.cx.append_basic_block(func, "move"), self.cx.append_basic_block(func, "smaller"));
            self.b.build_conditional_branch(fits, this, next)?;
            self.b.position_at_end(this);
            let pt = i8t.vec_type(piece);
            let tail = self.b.build_int_sub(len, i64t.const_int(piece as u64, false), "tail")?;
            let (src_tail, dst_tail) = (self.gep(i8t.into(), src, tail)?, self.gep(i8t.into(), dst, tail)?);
            for (from, to) in [(src, dst), (src_tail, dst_tail)] {
                let v = self.b.build_load(pt, from, "piece")?;
                v.as_instruction_value().expect("load").set_alignment(1).map_err(llvm_err)?;
                self.b.build_store(to, v)?.set_alignment(1).map_err(llvm_err)?;
            }
            self.b.build_unconditional_branch(copied)?;
            self.b.position_at_end(next);
            piece /= 2;
        }
        self.b.build_unconditional_branch(copied)?;
        self.b.position_at_end(copied);
        let v = self.plain_load(slot, mty, lanes, align)?;
        let v = self.b.build_select(mask, v, vt.const_zero(), "on")?.into_vector_value();
        let copied_end = self.b.get_insert_block().expect("positioned");
        self.b.build_unconditional_branch(done)?;
        self.b.position_at_end(done);
        let phi = self.b.build_phi(vt, "bounced")?;
        phi.add_incoming(&[(&vt.const_zero(), start), (&v, copied_end)]);
        Ok(phi.as_basic_value().into_vector_value())
    }

    /// `llvm.masked.load` of `mask`'s lanes of `mty` from `p` (masked-off
    /// lanes zero), as loads of one vector register each where it is wider.
    /// LLVM 19's x86 backend splits a wider masked load itself, and where O3
    /// had merged a uniform branch into a constant lane mask (`splat(g) &
    /// <1, 1, 0, 0>`) it loaded the all-false half with a plain `vmovups`,
    /// past the end of the tensor. A load of register width leaves it
    /// nothing to split, and a piece whose lanes are all off folds away.
    /// `align` is the element's size, the access's alignment.
    fn masked_load(
        &mut self,
        p: PointerValue<'ctx>,
        mty: BasicTypeEnum<'ctx>,
        mask: VectorValue<'ctx>,
        align: u32,
    ) -> R<VectorValue<'ctx>> {
        let lanes = mask.get_type().get_size();
        if !self.masked_access_native(align) && lanes >= MIN_BOUNCED_LANES {
            return self.bounced_load(p, mty, mask, align);
        }
        let piece = self.masked_piece_lanes(align, lanes);
        let al = self.cx.i32_type().const_int(align as u64, false);
        let mut parts = Vec::new();
        for first in (0..lanes).step_by(piece as usize) {
            let n = piece.min(lanes - first);
            let m = self.lanes_of(mask, first, n)?;
            let vt = self.vec_ty(mty, n);
            let at = self.gep(mty, p, self.cx.i64_type().const_int(first as u64, false))?;
            let f = self.intrinsic("llvm.masked.load", &[vt.into(), at.get_type().into()])?;
            parts.push(self.call(f, &[at.into(), al.into(), m.into(), vt.const_zero().into()])?.into_vector_value());
        }
        self.concat(&parts)
    }

    /// `llvm.masked.store` of `v`'s `mask`ed lanes to `p`, in pieces of one
    /// vector register each (see [`Self::masked_load`]).
    fn masked_store(
        &mut self,
        p: PointerValue<'ctx>,
        mty: BasicTypeEnum<'ctx>,
        v: VectorValue<'ctx>,
        mask: VectorValue<'ctx>,
        align: u32,
    ) -> R<()> {
        let lanes = mask.get_type().get_size();
        let piece = self.masked_piece_lanes(align, lanes);
        let al = self.cx.i32_type().const_int(align as u64, false);
        for first in (0..lanes).step_by(piece as usize) {
            let n = piece.min(lanes - first);
            let (m, x) = (self.lanes_of(mask, first, n)?, self.lanes_of(v, first, n)?);
            let at = self.gep(mty, p, self.cx.i64_type().const_int(first as u64, false))?;
            let f = self.intrinsic("llvm.masked.store", &[x.get_type().into(), at.get_type().into()])?;
            self.call_void(f, &[x.into(), at.into(), al.into(), m.into()])?;
        }
        Ok(())
    }

    /// Lanes of a `bytes`-byte element in one masked access of register
    /// width: 64 bytes with AVX-512 (unless it prefers 256-bit vectors), 32
    /// with AVX; all `lanes` on GPUs and where masked accesses are not
    /// instructions (LLVM expands them lane by lane).
    fn masked_piece_lanes(&self, bytes: u32, lanes: u32) -> u32 {
        match self.register_bytes() {
            Some(register) if !self.on_device() => (register / bytes.max(1)).clamp(1, lanes),
            _ => lanes,
        }
    }

    /// A CPU vector register's bytes: 64 with AVX-512 (unless it prefers
    /// 256-bit vectors), 32 with AVX; `None` without either.
    pub(super) fn register_bytes(&self) -> Option<u32> {
        match () {
            _ if self.has_feature("avx512f") && !self.has_feature("prefer-256-bit") => Some(64),
            _ if self.has_feature("avx") || self.has_feature("avx2") => Some(32),
            _ => None,
        }
    }

    pub(super) fn call_void(&self, f: FunctionValue<'ctx>, args: &[BasicValueEnum<'ctx>]) -> R<()> {
        let a: Vec<BasicMetadataValueEnum> = args.iter().map(|&x| x.into()).collect();
        self.b.build_call(f, &a, "")?;
        Ok(())
    }

    pub(super) fn and_mask(&self, a: Option<VectorValue<'ctx>>, b: VectorValue<'ctx>) -> R<VectorValue<'ctx>> {
        Ok(match a {
            Some(a) => self.b.build_and(a, b, "mask")?,
            None => b,
        })
    }
}
