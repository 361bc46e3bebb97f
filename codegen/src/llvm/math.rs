//! Built-in functions: LLVM intrinsics where they exist, polynomial `exp`,
//! `tanh` and `erf` for f32 vectors, the C math library (lane by lane) for
//! the rest; and
//! target intrinsics.

use super::expr::{float_ty, unsigned_ty};
use super::gen::{Gen, Mode};
use super::R;
use inkwell::module::Linkage;
use inkwell::types::{BasicMetadataTypeEnum, VectorType};
use inkwell::values::{BasicValueEnum, VectorValue};
use texc_compiler::ops::{BinOp, Intrinsic, MathFn};
use texc_compiler::tir::Ty;
use texc_compiler::types::ElemType;

impl<'ctx> Gen<'ctx, '_> {
    /// A target intrinsic (legalization introduced it because the target has it).
    pub(super) fn intrinsic_op(
        &self,
        i: Intrinsic,
        a: &[BasicValueEnum<'ctx>],
        ty: Ty,
        mode: Mode<'ctx>,
    ) -> R<BasicValueEnum<'ctx>> {
        match i {
            Intrinsic::Fma => self.call(self.intrinsic("llvm.fma", &[self.ty_in(ty, mode)])?, &[a[0], a[1], a[2]]),
            Intrinsic::Dot4 => self.dot4(a[0], a[1], a[2], mode),
            Intrinsic::Dot2 => self.dot2(a[0], a[1], a[2], mode),
            Intrinsic::Dot4Sat => self.dot4sat(a[0], a[1], a[2], mode),
        }
    }

    /// `@dot2(c, a, b)`: `vpmaddwd` on the words' 16-bit halves, in pieces
    /// as wide as the CPU's registers (zmm with AVX-512BW, ymm, xmm), plus
    /// `c`; a vector the pieces do not tile is padded as [`Gen::dot4`]
    /// pads. One lane alone: the halves split off and multiplied, which is
    /// what the instruction computes (both wrap the one overflowing sum,
    /// `2 · (-2¹⁵)²`, the same way).
    fn dot2(
        &self,
        c: BasicValueEnum<'ctx>,
        a: BasicValueEnum<'ctx>,
        b: BasicValueEnum<'ctx>,
        mode: Mode<'ctx>,
    ) -> R<BasicValueEnum<'ctx>> {
        let Some(lanes) = mode.lanes() else { return self.dot2_scalar(c, a, b) };
        let i16t = self.cx.i16_type();
        self.in_pieces(c, a, b, lanes, |x, y, w| {
            let [x, y] = [x, y].map(|v| self.b.build_bit_cast(v, i16t.vec_type(2 * w), "halves"));
            Ok(self.call(self.pmaddwd(w)?, &[x?.into(), y?.into()])?.into_vector_value())
        })
    }

    /// `@dot4sat(c, a, b)`: `vpmaddubsw` (the unsigned bytes of `a` by the
    /// signed ones of `b`, pairs summed with 16-bit saturation), `vpmaddwd`
    /// by ones (the two pair sums of a lane, exactly), plus `c`, in pieces
    /// as [`Gen::dot2`] takes them. One lane alone: the same instructions
    /// on an xmm register, the others' lanes dropped.
    fn dot4sat(
        &self,
        c: BasicValueEnum<'ctx>,
        a: BasicValueEnum<'ctx>,
        b: BasicValueEnum<'ctx>,
        mode: Mode<'ctx>,
    ) -> R<BasicValueEnum<'ctx>> {
        if let Some(lanes) = mode.lanes() {
            return self.dot4sat_lanes(c, a, b, lanes);
        }
        let i32t = self.cx.i32_type();
        let one = |v: BasicValueEnum<'ctx>| {
            self.b.build_insert_element(i32t.vec_type(1).get_poison(), v.into_int_value(), i32t.const_zero(), "one")
        };
        let lane = self.dot4sat_lanes(one(c)?.into(), one(a)?.into(), one(b)?.into(), 1)?;
        Ok(self.b.build_extract_element(lane.into_vector_value(), i32t.const_zero(), "dot4sat")?)
    }

    /// [`Gen::dot4sat`] on vectors of `lanes`.
    fn dot4sat_lanes(
        &self,
        c: BasicValueEnum<'ctx>,
        a: BasicValueEnum<'ctx>,
        b: BasicValueEnum<'ctx>,
        lanes: u32,
    ) -> R<BasicValueEnum<'ctx>> {
        let (i8t, i16t) = (self.cx.i8_type(), self.cx.i16_type());
        self.in_pieces(c, a, b, lanes, |x, y, w| {
            let name = match w {
                16 => "llvm.x86.avx512.pmaddubs.w.512",
                8 => "llvm.x86.avx2.pmadd.ub.sw",
                _ => "llvm.x86.ssse3.pmadd.ub.sw.128",
            };
            let [x, y] = [x, y].map(|v| self.b.build_bit_cast(v, i8t.vec_type(4 * w), "bytes"));
            let pairs = self.call(self.intrinsic(name, &[])?, &[x?.into(), y?.into()])?;
            let ones = VectorType::const_vector(&vec![i16t.const_int(1, false); 2 * w as usize]);
            Ok(self.call(self.pmaddwd(w)?, &[pairs, ones.into()])?.into_vector_value())
        })
    }

    /// `c` plus `piece(x, y, w)` over pieces of `w` lanes of `a` and `b`
    /// (16, 8 or 4: zmm with AVX-512BW, ymm, xmm), the vector padded as
    /// [`Gen::dot4`] pads and the padding's lanes dropped; each piece's sum
    /// through [`Gen::opaque_register`].
    fn in_pieces(
        &self,
        c: BasicValueEnum<'ctx>,
        a: BasicValueEnum<'ctx>,
        b: BasicValueEnum<'ctx>,
        lanes: u32,
        piece: impl Fn(VectorValue<'ctx>, VectorValue<'ctx>, u32) -> R<VectorValue<'ctx>>,
    ) -> R<BasicValueEnum<'ctx>> {
        let widest = self.pmaddwd_lanes().unwrap_or(4);
        let padded = self.padded_lanes(lanes, widest);
        let pad = |v: BasicValueEnum<'ctx>| self.lanes_of_padded(v.into_vector_value(), padded);
        let (a, b) = (pad(a)?, pad(b)?);
        let w = [16, 8, 4].into_iter().find(|&w| w <= widest && padded % w == 0).expect("4 divides a padded vector");
        let c = pad(c)?;
        // Each piece accumulated in its register, through the register
        // barrier there, then the lanes asked for: neither a 7-lane sum nor
        // a 16-lane one on AVX2 is one register, and LLVM reassociated such
        // rows' accumulations as before the barrier (MEASURED: an int8 3 × 3
        // convolution 64 → 64 at 56² on AVX2, blocks of 4 filters × 16
        // pixels: spills gone, 1.50 → 1.41 ms; docs/quantization.md).
        let sums = (0..padded / w)
            .map(|i| {
                let product = piece(self.lanes_of(a, i * w, w)?, self.lanes_of(b, i * w, w)?, w)?;
                let sum = self.b.build_int_add(self.lanes_of(c, i * w, w)?, product, "dot")?;
                Ok(self.opaque_register(sum)?.into_vector_value())
            })
            .collect::<R<Vec<_>>>()?;
        Ok(self.lanes_of(self.concat(&sums)?, 0, lanes)?.into())
    }

    /// `v` unchanged, through an empty assembly block that keeps it in a
    /// register, where it is one register wide: LLVM may not reassociate
    /// integer adds across it. A register block's `@dot2` accumulations,
    /// unrolled over a filter's taps, were regrouped into trees of partial
    /// sums that needed more registers than there are (MEASURED: an int8
    /// 3 × 3 convolution on AVX2 spilled six accumulators in its inner
    /// loop); `vpdpbusd` takes its accumulator in the instruction and
    /// never had this.
    fn opaque_register(&self, v: VectorValue<'ctx>) -> R<BasicValueEnum<'ctx>> {
        let ty = v.get_type();
        let bits = ty.get_size() * 32;
        if ![128, 256, 512].contains(&bits) || bits > 32 * self.pmaddwd_lanes().unwrap_or(4) {
            return Ok(v.into());
        }
        let fn_ty = ty.fn_type(&[ty.into()], false);
        let asm = self.cx.create_inline_asm(fn_ty, String::new(), "=v,0".into(), false, false, None, false);
        let out = self.b.build_indirect_call(fn_ty, asm, &[v.into()], "opaque")?;
        // What the empty block is: it touches no memory and returns. Without
        // `willreturn`, stores after it in a loop are not sure to run, and
        // LLVM does not keep a sum that accumulates in memory (a sliced
        // product's output) in a register across the loop (MEASURED: an
        // int8 1024³ product on AVX2, 15.1 → 30.4 ms without the attributes).
        for attr in ["memory", "willreturn", "nosync", "nounwind"] {
            out.add_attribute(inkwell::attributes::AttributeLoc::Function, self.enum_attr(attr));
        }
        match out.try_as_basic_value() {
            inkwell::values::ValueKind::Basic(v) => Ok(v),
            _ => unreachable!("the asm block returns its operand"),
        }
    }

    /// `vpmaddwd` on `w` lanes of `i32` (zmm, ymm or xmm).
    fn pmaddwd(&self, w: u32) -> R<inkwell::values::FunctionValue<'ctx>> {
        let name = match w {
            16 => "llvm.x86.avx512.pmaddw.d.512",
            8 => "llvm.x86.avx2.pmadd.wd",
            _ => "llvm.x86.sse2.pmadd.wd",
        };
        self.intrinsic(name, &[])
    }

    /// [`Gen::dot2`] on one `i32` lane.
    fn dot2_scalar(
        &self,
        c: BasicValueEnum<'ctx>,
        a: BasicValueEnum<'ctx>,
        b: BasicValueEnum<'ctx>,
    ) -> R<BasicValueEnum<'ctx>> {
        let (i16t, i32t) = (self.cx.i16_type(), self.cx.i32_type());
        let halves = |v: BasicValueEnum<'ctx>| -> R<[inkwell::values::IntValue<'ctx>; 2]> {
            let v = v.into_int_value();
            let low = self.b.build_int_truncate(v, i16t, "low")?;
            let low = self.b.build_int_s_extend(low, i32t, "slow")?;
            let high = self.b.build_right_shift(v, i32t.const_int(16, false), true, "high")?;
            Ok([low, high])
        };
        let ([al, ah], [bl, bh]) = (halves(a)?, halves(b)?);
        let low = self.b.build_int_mul(al, bl, "plow")?;
        let high = self.b.build_int_mul(ah, bh, "phigh")?;
        let sum = self.b.build_int_add(c.into_int_value(), low, "dot2")?;
        Ok(self.b.build_int_add(sum, high, "dot2")?.into())
    }

    /// `@dot4(c, a, b)`: `vpdpbusd` in pieces as wide as the CPU's VNNI
    /// registers, else `vpmaddwd` on the bytes widened to 16 bits, else the
    /// bytes widened to `i32`, multiplied, and each group of four summed
    /// (what the instruction computes, so all agree bit for bit). A vector
    /// the pieces do not tile (a 7-wide row) is padded to one they do, and
    /// the padding's lanes dropped; so is one that whole registers cover in
    /// fewer instructions than exact pieces (12 lanes: one zmm `vpdpbusd`,
    /// not three xmm ones and the shuffles between them — MEASURED: a 28-wide
    /// int8 convolution row ran 5× under the VNNI peak).
    fn dot4(
        &self,
        c: BasicValueEnum<'ctx>,
        a: BasicValueEnum<'ctx>,
        b: BasicValueEnum<'ctx>,
        mode: Mode<'ctx>,
    ) -> R<BasicValueEnum<'ctx>> {
        let Some(lanes) = mode.lanes() else { return self.dot4_scalar(c, a, b) };
        let unit = match (self.vnni_lanes(), self.pmaddwd_lanes()) {
            (Some(_), _) => 4,
            (None, Some(w)) => w,
            (None, None) => return self.dot4_widened(c, a, b, lanes, true),
        };
        let padded = match self.vnni_lanes() {
            Some(widest) => self.padded_lanes(lanes, widest),
            None => lanes.div_ceil(unit) * unit,
        };
        if padded == lanes {
            return self.dot4_tiled(c, a, b, lanes);
        }
        let [c, a, b] = [c, a, b].map(|v| self.lanes_of_padded(v.into_vector_value(), padded));
        let wide = self.dot4_tiled(c?.into(), a?.into(), b?.into(), padded)?;
        Ok(self.lanes_of(wide.into_vector_value(), 0, lanes)?.into())
    }

    /// A scalar `@dot4` as lane 0 of a 4-lane `vpdpbusd` where the machine
    /// has one: a product's last column alone (`x` of a 7×7 map's 49 is 16
    /// lanes thrice and 1) took a dozen widening and horizontal-add
    /// instructions per row of its block, more than the 16-lane vectors
    /// beside it together (MobileNetV2 int8's 1×1 convolutions at 7×7).
    fn dot4_scalar(
        &self,
        c: BasicValueEnum<'ctx>,
        a: BasicValueEnum<'ctx>,
        b: BasicValueEnum<'ctx>,
    ) -> R<BasicValueEnum<'ctx>> {
        if self.vnni_lanes().is_none() {
            return self.dot4_widened(c, a, b, 1, false);
        }
        let four = self.cx.i32_type().vec_type(4);
        let lane0 = self.cx.i32_type().const_zero();
        let put = |x: BasicValueEnum<'ctx>| {
            self.b.build_insert_element(four.get_poison(), x.into_int_value(), lane0, "lane0")
        };
        let [c, a, b] = [c, a, b].map(put);
        let wide = self.dot4_tiled(c?.into(), a?.into(), b?.into(), 4)?;
        Ok(self.b.build_extract_element(wide.into_vector_value(), lane0, "dot4")?)
    }

    /// The lanes `lanes` are computed in, by instructions of 16, 8 or 4
    /// lanes (at most `widest`): themselves where exact pieces are as few as
    /// whole widest registers, else padded to whole widest registers.
    fn padded_lanes(&self, lanes: u32, widest: u32) -> u32 {
        match self.exact_pieces(lanes, widest) {
            Some(n) if n <= lanes.div_ceil(widest) => lanes,
            _ => lanes.div_ceil(widest) * widest,
        }
    }

    /// How many `vpdpbusd` of one width (16, 8 or 4 lanes, at most
    /// `widest`) cover `lanes` exactly, with the widest that does; `None`
    /// when none does.
    fn exact_pieces(&self, lanes: u32, widest: u32) -> Option<u32> {
        [16, 8, 4].into_iter().find(|&w| w <= widest && lanes % w == 0).map(|w| lanes / w)
    }

    /// [`Gen::dot4`] on a vector of `lanes` that its instruction's pieces tile.
    fn dot4_tiled(
        &self,
        c: BasicValueEnum<'ctx>,
        a: BasicValueEnum<'ctx>,
        b: BasicValueEnum<'ctx>,
        lanes: u32,
    ) -> R<BasicValueEnum<'ctx>> {
        // Pieces of 4, 8 or 16 lanes (`vpdpbusd` on xmm, ymm, zmm).
        let widest = self.vnni_lanes().unwrap_or(0);
        match [16, 8, 4].into_iter().find(|&w| w <= widest && lanes % w == 0) {
            Some(w) => {
                let f = self.intrinsic(&format!("llvm.x86.avx512.vpdpbusd.{}", 32 * w), &[])?;
                let parts = (0..lanes / w)
                    .map(|i| {
                        let [c, a, b] = [c, a, b].map(|v| self.lanes_of(v.into_vector_value(), i * w, w));
                        self.call(f, &[c?.into(), a?.into(), b?.into()]).map(|v| v.into_vector_value())
                    })
                    .collect::<R<Vec<_>>>()?;
                Ok(self.concat(&parts)?.into())
            }
            None => {
                let w = self.pmaddwd_lanes().expect("dot4 tiles only with VNNI or vpmaddwd");
                self.dot4_pmaddwd(c, a, b, lanes, w)
            }
        }
    }

    /// Whether the CPU code is generated for has LLVM feature `f` (`avx2`, `avxvnni`, ..).
    pub(super) fn has_feature(&self, f: &str) -> bool {
        self.spec.features.split(',').any(|x| x.strip_prefix('+') == Some(f))
    }

    /// `i32` lanes of one `vpmaddwd` on this CPU: 16 with AVX-512BW, 8 with AVX2.
    fn pmaddwd_lanes(&self) -> Option<u32> {
        let on = |f: &str| self.has_feature(f);
        match () {
            _ if on("avx512bw") && !on("prefer-256-bit") => Some(16),
            _ if on("avx2") => Some(8),
            _ => None,
        }
    }

    /// `@dot4` without VNNI: each lane's bytes 0–1 and 2–3 widened to 16
    /// bits in place (zero- and sign-extended, so no product or pair sum can
    /// saturate), and one `vpmaddwd` per half summing its two products into
    /// the lane's `i32`. The lanes never move: widening all four bytes in
    /// order put each lane's two pair sums in neighbouring lanes, and
    /// gathering them back took four shuffles per instruction (MEASURED: an
    /// int8 3×3 convolution on AVX2 ran at a third of the 8-bit peak).
    fn dot4_pmaddwd(
        &self,
        c: BasicValueEnum<'ctx>,
        a: BasicValueEnum<'ctx>,
        b: BasicValueEnum<'ctx>,
        lanes: u32,
        w: u32,
    ) -> R<BasicValueEnum<'ctx>> {
        let f = self.pmaddwd(w)?;
        let mut sum = c.into_vector_value();
        for first in [0, 2] {
            let x = self.byte_pairs(a.into_vector_value(), lanes, first, false)?;
            let y = self.byte_pairs(b.into_vector_value(), lanes, first, true)?;
            let pieces = (0..lanes / w)
                .map(|i| {
                    let x = self.lanes_of(x, i * 2 * w, 2 * w)?;
                    let y = self.lanes_of(y, i * 2 * w, 2 * w)?;
                    self.call(f, &[x.into(), y.into()]).map(|v| v.into_vector_value())
                })
                .collect::<R<Vec<_>>>()?;
            sum = self.b.build_int_add(sum, self.concat(&pieces)?, "dot")?;
        }
        Ok(sum.into())
    }

    /// Bytes `first` and `first + 1` of each of `lanes` packed words `v`,
    /// zero- or sign-extended to the two `i16` of that word's place: one byte
    /// shuffle with zeros (`vpshufb`: the bytes stay in their 128-bit lane)
    /// puts each byte in the low half of its `i16`, or in the high half and
    /// an arithmetic shift brings it down signed.
    fn byte_pairs(&self, v: VectorValue<'ctx>, lanes: u32, first: u32, signed: bool) -> R<VectorValue<'ctx>> {
        let (i8t, i16t, i32t) = (self.cx.i8_type(), self.cx.i16_type(), self.cx.i32_type());
        let bytes = self.b.build_bit_cast(v, i8t.vec_type(4 * lanes), "bytes")?.into_vector_value();
        let at = |k: u32| i32t.const_int(k as u64, false);
        let zero = at(4 * lanes);
        let half = |k: u32| if signed { [zero, at(k)] } else { [at(k), zero] };
        let pick: Vec<_> = (0..lanes).flat_map(|l| [half(4 * l + first), half(4 * l + first + 1)]).flatten().collect();
        let spread = self.b.build_shuffle_vector(
            bytes,
            bytes.get_type().const_zero(),
            VectorType::const_vector(&pick),
            "pair",
        )?;
        let words = self.b.build_bit_cast(spread, i16t.vec_type(2 * lanes), "pair16")?.into_vector_value();
        if !signed {
            return Ok(words);
        }
        let eight = VectorType::const_vector(&vec![i16t.const_int(8, false); 2 * lanes as usize]);
        Ok(self.b.build_right_shift(words, eight, true, "spair")?)
    }

    /// Lanes of one `vpdpbusd` on this CPU: 16 with AVX-512 VNNI, 8 with
    /// AVX-VNNI or AVX-512 VNNI and VL; `None` without VNNI.
    fn vnni_lanes(&self) -> Option<u32> {
        let on = |f: &str| self.has_feature(f);
        let avx512 = on("avx512vnni") && on("avx512f") && !on("prefer-256-bit");
        match () {
            _ if avx512 => Some(16),
            _ if on("avxvnni") || (on("avx512vnni") && on("avx512vl")) => Some(8),
            _ => None,
        }
    }

    fn dot4_widened(
        &self,
        c: BasicValueEnum<'ctx>,
        a: BasicValueEnum<'ctx>,
        b: BasicValueEnum<'ctx>,
        lanes: u32,
        vector: bool,
    ) -> R<BasicValueEnum<'ctx>> {
        let i32t = self.cx.i32_type();
        let wide = i32t.vec_type(4 * lanes);
        let (a, b) = self.widened_bytes(a, b, lanes, wide)?;
        let prod = self.b.build_int_mul(a, b, "prod")?;
        let mut sum: BasicValueEnum<'ctx> = c;
        for t in 0..4 {
            let pick: Vec<_> = (0..lanes).map(|l| i32t.const_int((4 * l + t) as u64, false)).collect();
            let part =
                self.b.build_shuffle_vector(prod, wide.get_poison(), VectorType::const_vector(&pick), "group")?;
            let part: BasicValueEnum<'ctx> = match vector {
                true => part.into(),
                false => self.b.build_extract_element(part, i32t.const_zero(), "one")?,
            };
            sum = match (sum, part) {
                (BasicValueEnum::VectorValue(x), BasicValueEnum::VectorValue(y)) => {
                    self.b.build_int_add(x, y, "dot")?.into()
                }
                (x, y) => self.b.build_int_add(x.into_int_value(), y.into_int_value(), "dot")?.into(),
            };
        }
        Ok(sum)
    }

    /// The bytes of `lanes` packed words `a` (zero-extended: `vpdpbusd`'s
    /// unsigned side) and `b` (sign-extended), each widened to `to`.
    fn widened_bytes(
        &self,
        a: BasicValueEnum<'ctx>,
        b: BasicValueEnum<'ctx>,
        lanes: u32,
        to: VectorType<'ctx>,
    ) -> R<(VectorValue<'ctx>, VectorValue<'ctx>)> {
        let bytes = |v: BasicValueEnum<'ctx>| -> R<VectorValue<'ctx>> {
            Ok(self.b.build_bit_cast(v, self.cx.i8_type().vec_type(4 * lanes), "bytes")?.into_vector_value())
        };
        let a = self.b.build_int_z_extend(bytes(a)?, to, "ua")?;
        let b = self.b.build_int_s_extend(bytes(b)?, to, "sb")?;
        Ok((a, b))
    }

    /// Lanes `from..from + n` of `v`.
    pub(super) fn lanes_of(&self, v: VectorValue<'ctx>, from: u32, n: u32) -> R<VectorValue<'ctx>> {
        if from == 0 && n == v.get_type().get_size() {
            return Ok(v);
        }
        let i32t = self.cx.i32_type();
        let pick: Vec<_> = (from..from + n).map(|l| i32t.const_int(l as u64, false)).collect();
        Ok(self.b.build_shuffle_vector(v, v.get_type().get_poison(), VectorType::const_vector(&pick), "piece")?)
    }

    /// The pieces of [`Gen::lanes_of`] put back together, in order.
    pub(super) fn concat(&self, parts: &[VectorValue<'ctx>]) -> R<VectorValue<'ctx>> {
        let mut out = parts[0];
        for &p in &parts[1..] {
            let n = out.get_type().get_size() + p.get_type().get_size();
            let i32t = self.cx.i32_type();
            // Both operands as wide as the result: shufflevector takes operands of one type.
            let a = self.lanes_of_padded(out, n)?;
            let b = self.lanes_of_padded(p, n)?;
            let pick: Vec<_> = (0..out.get_type().get_size())
                .chain(n..n + p.get_type().get_size())
                .map(|l| i32t.const_int(l as u64, false))
                .collect();
            out = self.b.build_shuffle_vector(a, b, VectorType::const_vector(&pick), "concat")?;
        }
        Ok(out)
    }

    /// `v` with poison lanes appended up to `n` lanes.
    fn lanes_of_padded(&self, v: VectorValue<'ctx>, n: u32) -> R<VectorValue<'ctx>> {
        let i32t = self.cx.i32_type();
        let len = v.get_type().get_size();
        let pick: Vec<_> =
            (0..n).map(|l| if l < len { i32t.const_int(l as u64, false) } else { i32t.get_undef() }).collect();
        Ok(self.b.build_shuffle_vector(v, v.get_type().get_poison(), VectorType::const_vector(&pick), "pad")?)
    }

    pub(super) fn math(
        &mut self,
        f: MathFn,
        a: &[BasicValueEnum<'ctx>],
        ty: Ty,
        mode: Mode<'ctx>,
    ) -> R<BasicValueEnum<'ctx>> {
        if self.libdevice {
            if let Some(name) = libdevice_fn(f, ty) {
                return self.device_call(name, a, ty);
            }
        }
        let t = self.ty_in(ty, mode);
        let float = float_ty(ty);
        let un = |name: &str| -> R<BasicValueEnum<'ctx>> {
            let f = self.intrinsic(name, &[t])?;
            self.call(f, &[a[0]])
        };
        match f {
            MathFn::Exp if ty == Ty::Elem(ElemType::F32) && mode.lanes().is_some() => self.vector_expf(a[0], mode),
            MathFn::Exp => un("llvm.exp"),
            MathFn::Log => un("llvm.log"),
            MathFn::Sqrt => un("llvm.sqrt"),
            MathFn::Floor => un("llvm.floor"),
            MathFn::Ceil => un("llvm.ceil"),
            MathFn::Round => un("llvm.roundeven"),
            MathFn::Abs if float => un("llvm.fabs"),
            MathFn::Abs => {
                let f = self.intrinsic("llvm.abs", &[t])?;
                self.call(f, &[a[0], self.cx.bool_type().const_zero().into()])
            }
            MathFn::Rsqrt => {
                let s = un("llvm.sqrt")?;
                let one = self.const_of(ty, 1, 1.0, mode)?;
                self.arith(BinOp::Div, one, s, ty)
            }
            // 1 / (1 + e^−x) for x ≥ 0, e^x / (1 + e^x) below: e^−|x| never
            // overflows, so sigmoid(−95) is the denormal e^−95, not 1 / ∞. One
            // division of the picked numerator: a NaN fails `x ≥ 0` and takes
            // e (NaN) on.
            MathFn::Sigmoid => {
                let neg = self.float_neg(un("llvm.fabs")?)?;
                let e = match libdevice_fn(MathFn::Exp, ty) {
                    Some(name) if self.libdevice => self.device_call(name, &[neg], ty)?,
                    _ if ty == Ty::Elem(ElemType::F32) && mode.lanes().is_some() => {
                        self.vector_expf_of(neg, mode, ExpArg::NonPositive, Ln2::OnePart)?
                    }
                    _ => self.call(self.intrinsic("llvm.exp", &[t])?, &[neg])?,
                };
                let one = self.const_of(ty, 1, 1.0, mode)?;
                let negative = self.sign_bit_set(a[0], ty, mode)?;
                let numerator = self.sel(negative, e, one)?;
                let d = self.arith(BinOp::Add, one, e, ty)?;
                self.arith(BinOp::Div, numerator, d, ty)
            }
            MathFn::Tanh if ty == Ty::Elem(ElemType::F32) && mode.lanes().is_some() => self.vector_tanhf(a[0], mode),
            MathFn::Tanh => self.libm(if ty == Ty::Elem(ElemType::F64) { "tanh" } else { "tanhf" }, a[0], ty, mode),
            MathFn::Erf if ty == Ty::Elem(ElemType::F32) && mode.lanes().is_some() => self.vector_erff(a[0], mode),
            MathFn::Erf => self.libm(if ty == Ty::Elem(ElemType::F64) { "erf" } else { "erff" }, a[0], ty, mode),
            MathFn::Erfc => self.libm(if ty == Ty::Elem(ElemType::F64) { "erfc" } else { "erfcf" }, a[0], ty, mode),
            MathFn::Pow => {
                let f = self.intrinsic("llvm.pow", &[t])?;
                self.call(f, &[a[0], a[1]])
            }
            MathFn::Max | MathFn::Min | MathFn::Clamp => {
                let (mx, mn) = if float {
                    ("llvm.maximum", "llvm.minimum")
                } else if unsigned_ty(ty) {
                    ("llvm.umax", "llvm.umin")
                } else {
                    ("llvm.smax", "llvm.smin")
                };
                if f != MathFn::Clamp {
                    if let Some(r) = self.vrange(f == MathFn::Max, a[0], a[1], ty, mode)? {
                        return Ok(r);
                    }
                }
                let fmax = self.intrinsic(mx, &[t])?;
                let fmin = self.intrinsic(mn, &[t])?;
                match f {
                    MathFn::Max => self.call(fmax, &[a[0], a[1]]),
                    MathFn::Min => self.call(fmin, &[a[0], a[1]]),
                    _ => {
                        let lo = self.call(fmax, &[a[0], a[1]])?;
                        self.call(fmin, &[lo, a[2]])
                    }
                }
            }
        }
    }

    /// IEEE `maximum`/`minimum` of two float vectors that are not constants
    /// in three AVX-512DQ instructions a register: `vrangeps` orders −0 below +0 but
    /// returns the other operand for a NaN, so lanes where either is NaN take
    /// `a + b` (NaN) instead. LLVM 19 lowers `llvm.maximum` to six (a sign
    /// blend of each operand, then `vmaxps` and a NaN blend): the chain of a
    /// softmax's row maximum. `None` where the target lacks the instruction
    /// or an operand is constant (`relu`'s `max(x, 0)` is two for LLVM).
    fn vrange(
        &self,
        max: bool,
        a: BasicValueEnum<'ctx>,
        b: BasicValueEnum<'ctx>,
        ty: Ty,
        mode: Mode<'ctx>,
    ) -> R<Option<BasicValueEnum<'ctx>>> {
        let (Some(lanes), BasicValueEnum::VectorValue(va), BasicValueEnum::VectorValue(vb)) = (mode.lanes(), a, b)
        else {
            return Ok(None);
        };
        let (suffix, bits) = match ty {
            Ty::Elem(ElemType::F32) => ("ps", 32),
            Ty::Elem(ElemType::F64) => ("pd", 64),
            _ => return Ok(None),
        };
        if va.is_const() || vb.is_const() {
            return Ok(None);
        }
        // imm8: bits 1:0 pick max (01) or min (00), bits 3:2 the sign from the comparison (01).
        let imm = self.cx.i32_type().const_int(if max { 0b0101 } else { 0b0100 }, false);
        // One instruction per register: vectors wider than one (a register
        // block's 32 lanes) in pieces, one narrower than a power of two of
        // lanes (a row's tail of 15) padded as the dot products pad theirs.
        let register = 512 / bits;
        let mut pieces = Vec::new();
        let mut from = 0;
        while from < lanes {
            let n = (lanes - from).min(register);
            let width = n.next_power_of_two().max(128 / bits);
            let pa = self.lanes_of_padded(self.lanes_of(va, from, n)?, width)?;
            let pb = self.lanes_of_padded(self.lanes_of(vb, from, n)?, width)?;
            let args = vec![pa.into(), pb.into(), imm.into()];
            let Some(r) = self.avx512_masked(&format!("range.{suffix}"), "+avx512dq", width * bits, args)? else {
                return Ok(None);
            };
            pieces.push(self.lanes_of(r.into_vector_value(), 0, n)?);
            from += n;
        }
        let ranged = self.concat(&pieces)?;
        let nan = self.b.build_float_compare(inkwell::FloatPredicate::UNO, va, vb, "nan")?;
        let sum = self.b.build_float_add(va, vb, "nan_sum")?;
        Ok(Some(self.b.build_select(nan, sum, ranged, if max { "maximum" } else { "minimum" })?))
    }

    /// `exp` on f32 vectors without a libm call per lane (Cephes `expf`'s reduction):
    /// exp(x) = 2^k · p(r), k = round(x·log2 e), r = x − k·ln 2 in two parts,
    /// p a degree-6 polynomial; about 1 ulp, denormal results included.
    /// Fused multiply-adds where the target has them (half the instructions
    /// of a softmax's exponentials), and on AVX-512 `vscalefps` for 2^k · p,
    /// which rounds overflow to ∞ and underflow to denormals or 0 itself.
    pub(super) fn vector_expf(&self, x: BasicValueEnum<'ctx>, mode: Mode<'ctx>) -> R<BasicValueEnum<'ctx>> {
        self.vector_expf_of(x, mode, ExpArg::Any, Ln2::TwoPart)
    }

    /// [`Gen::vector_expf`] of an argument whose sign the caller knows
    /// (`arg`): the clamp on the side it cannot reach is left out; `ln2`
    /// says how k·ln 2 is taken out of it.
    pub(super) fn vector_expf_of(
        &self,
        x: BasicValueEnum<'ctx>,
        mode: Mode<'ctx>,
        arg: ExpArg,
        ln2: Ln2,
    ) -> R<BasicValueEnum<'ctx>> {
        let ty = Ty::Elem(ElemType::F32);
        let t = self.ty_in(ty, mode);
        let c = |v: f64| self.const_of(ty, 0, v, mode);
        let mul = |a, b| self.arith(BinOp::Mul, a, b, ty);
        let fma = |a: BasicValueEnum<'ctx>, b: BasicValueEnum<'ctx>, c: BasicValueEnum<'ctx>| {
            self.call(self.intrinsic("llvm.fmuladd", &[t])?, &[a, b, c])
        };
        // Clamped by compares, not `maximum`/`minimum`: a NaN compares false
        // and passes through unchanged (and to the result) in two instructions.
        let clamp = |x, bound: f64, op: BinOp| -> R<BasicValueEnum<'ctx>> {
            let b = c(bound)?;
            let out = self.compare(op, x, b, ty)?;
            self.sel(out, b, x)
        };
        // Beyond 88.8 the result is ∞ and below −104 it is 0 (e^−104 is under half the least denormal).
        let xc = if arg == ExpArg::NonPositive { x } else { clamp(x, 88.8, BinOp::Gt)? };
        let xc = if arg == ExpArg::NonNegative { xc } else { clamp(xc, -104.0, BinOp::Lt)? };
        let lanes = mode.lanes().expect("vector mode");
        // Where the target has no `vscalefps` and the argument's sign is
        // known, 2^k fits one exponent field once offset by `o`: k + o + 127
        // in [1, 254] for k in [−150, 0] (o = 24) or [0, 128] (o = −1). p is
        // then computed scaled by 2^−o — every coefficient times a power of
        // two, so each rounding is the same — and p·2^−o · 2^(k+o) rounds once.
        let scalef = self.avx512_available("+avx512f", lanes * 32);
        let offset: Option<i32> = match arg {
            _ if scalef => None,
            ExpArg::NonPositive => Some(24),
            ExpArg::NonNegative => Some(-1),
            ExpArg::Any => None,
        };
        // k = round(x·log2 e) as the low bits of MAGIC + x·log2 e: MAGIC's
        // unit in the last place is 1, so the fused add rounds to an integer
        // (to even) and its bit pattern is bits(1.5·2^23) + bias + k — no
        // rounding or conversion instruction, and a NaN needs no guard
        // before an integer conversion (its bits only multiply the NaN `p`).
        // The bias is the exponent field's: 127 + o for one field, 2 · 127
        // for two.
        let bias = offset.map_or(254, |o| 127 + o);
        let magic = 12_582_912.0 + f64::from(bias); // 1.5 · 2^23 + bias
        let shifted = fma(xc, c(std::f64::consts::LOG2_E)?, c(magic)?)?;
        let k = self.arith(BinOp::Sub, shifted, c(magic)?, ty)?;
        let r = match ln2 {
            Ln2::TwoPart => fma(k, c(2.121_944_4e-4)?, fma(k, c(-0.693359375)?, xc)?)?,
            Ln2::OnePart => fma(k, c(-std::f64::consts::LN_2)?, xc)?,
        };
        // e^r = 1 + r + r²·P(r), P of degree 4 (`scripts/fit_exp.py`: 0.52
        // units of 2^−23 in f32, as Cephes' degree 5), by Horner's rule
        // through all seven coefficients (no r² held beside the sum). On
        // AVX2's 16 registers, with the two exponent fields, a SiLU's loop
        // held one value more than fit, and LLVM's register allocator moved
        // its constants around the registers in a cycle of 21 copies per
        // vector instead of reloading one. MEASURED (AMD Zen 4, `x86-avx2`,
        // 1 thread): 50 176 SiLUs from L2 32 → 26 µs; 1.2 M (EfficientNet-B0's
        // largest) 0.90 → 0.44–0.58 ms.
        let scale = offset.map_or(1.0, |o| 2f64.powi(-o));
        let cs = [
            1.381_462_207_1e-3,
            8.368_710_055_9e-3,
            4.166_838_899_3e-2,
            1.666_652_113_2e-1,
            4.999_999_404_0e-1,
            1.0,
            1.0,
        ];
        let p = self.horner(&cs.map(|c| c * scale), r, mode)?;
        if scalef {
            if let Some(y) = self.scalef(p, k, lanes)? {
                return Ok(y);
            }
        }
        let i32v = self.cx.i32_type().vec_type(lanes);
        let splat_i = |v: u64| VectorType::const_vector(&vec![self.cx.i32_type().const_int(v, false); lanes as usize]);
        let bits = self.b.build_bit_cast(shifted, i32v, "k_bits")?.into_vector_value();
        let field = |e: VectorValue<'ctx>| -> R<BasicValueEnum<'ctx>> {
            let shifted = self.b.build_left_shift(e, splat_i(23), "e")?;
            Ok(self.b.build_bit_cast(shifted, t, "pow2")?)
        };
        if offset.is_some() {
            // b = bits(MAGIC + k) = bits(1.5·2^23) + 127 + o + k: the shift
            // by 23 pushes out all but k + o + 127.
            return mul(p, field(bits)?);
        }
        // 2^k = 2^h · 2^(k − h), h = ⌊k / 2⌋, each an exponent field, so that
        // k ∈ [-150, 128] (denormal results included) never overflows a
        // field. With b = bits(MAGIC + k) = bits(1.5·2^23) + 254 + k, b >> 1
        // and b − (b >> 1) are h + 127 and k − h + 127 (biased, both in
        // [52, 191]) plus multiples of 2^9 that the shift by 23 pushes out:
        // no integer constant, no add.
        let half = self.b.build_right_shift(bits, splat_i(1), false, "kh")?;
        let rest = self.b.build_int_sub(bits, half, "kr")?;
        mul(mul(p, field(half)?)?, field(rest)?)
    }

    /// `tanh` of an f32 vector without a library call per lane (a GELU's
    /// or an LSTM's cell spends most of its time there otherwise): below
    /// |x| = 0.625 the odd polynomial x + x³·P(x²) (Cephes' `tanhf`
    /// coefficients, relative error under 1e-7), above it 1 − 2 / (e^2|x| + 1)
    /// with x's sign, where the subtraction loses nothing; e^2|x| = ∞ gives
    /// exactly ±1. A NaN fails the `|x| < 0.625` test and comes out of the
    /// second form as NaN.
    fn vector_tanhf(&self, x: BasicValueEnum<'ctx>, mode: Mode<'ctx>) -> R<BasicValueEnum<'ctx>> {
        let ty = Ty::Elem(ElemType::F32);
        let t = self.ty_in(ty, mode);
        let c = |v: f64| self.const_of(ty, 0, v, mode);
        let ax = self.call(self.intrinsic("llvm.fabs", &[t])?, &[x])?;
        let z = self.arith(BinOp::Mul, x, x, ty)?;
        let p = self.horner(
            &[
                -5.704_988_727_45e-3,
                2.063_908_879_54e-2,
                -5.373_971_555_31e-2,
                1.333_144_220_36e-1,
                -3.333_328_194_22e-1,
            ],
            z,
            mode,
        )?;
        let xz = self.arith(BinOp::Mul, x, z, ty)?;
        let small = self.fmuladd(xz, p, x, mode)?;
        let e = self.vector_expf_of(self.arith(BinOp::Add, ax, ax, ty)?, mode, ExpArg::NonNegative, Ln2::OnePart)?;
        let d = self.arith(BinOp::Add, e, c(1.0)?, ty)?;
        let big = self.arith(BinOp::Sub, c(1.0)?, self.arith(BinOp::Div, c(2.0)?, d, ty)?, ty)?;
        let big = self.call(self.intrinsic("llvm.copysign", &[t])?, &[big, x])?;
        let is_small = self.compare(BinOp::Lt, ax, c(0.625)?, ty)?;
        self.sel(is_small, small, big)
    }

    /// `erf` of an f32 vector without a library call per lane (the GELU of
    /// BERT-style models and ConvNeXt): x·P(x²) / Q(x²) below |x| = 3.84,
    /// ±1 from there on (where erf rounds to within an ulp of 1), P of
    /// degree 6 and Q of degree 4 fitted relative to erf
    /// (`scripts/fit_erf.py`): relative error 3.2e-7 (5 units of 2^−24
    /// near 1), tiny arguments included. A NaN fails the `|x| ≥ 3.84` test
    /// and comes out of the quotient as NaN. WHY one quotient: the form it
    /// replaced computed both of its branches (x·P(x²) below 1, and
    /// 1 − e^−x²·Q(1/|x|) with an exponential and a division above) for
    /// every lane, 42 instructions an 8-lane vector (MEASURED, AMD Zen 4,
    /// 1 thread: a GELU over 65 536 elements on `x86-avx2` 82 → 31 µs, with `x / √2` as a product).
    fn vector_erff(&self, x: BasicValueEnum<'ctx>, mode: Mode<'ctx>) -> R<BasicValueEnum<'ctx>> {
        let ty = Ty::Elem(ElemType::F32);
        let t = self.ty_in(ty, mode);
        let c = |v: f64| self.const_of(ty, 0, v, mode);
        let z = self.arith(BinOp::Mul, x, x, ty)?;
        let p = self.arith(BinOp::Mul, x, self.horner(ERF_NUMERATOR, z, mode)?, ty)?;
        let q = self.horner(ERF_DENOMINATOR, z, mode)?;
        let quotient = self.arith(BinOp::Div, p, q, ty)?;
        let ax = self.call(self.intrinsic("llvm.fabs", &[t])?, &[x])?;
        let saturated = self.compare(BinOp::Ge, ax, c(3.84)?, ty)?;
        let one = self.call(self.intrinsic("llvm.copysign", &[t])?, &[c(1.0)?, x])?;
        self.sel(saturated, one, quotient)
    }

    /// Whether each lane of the float `x` has its sign bit set (−0 and
    /// negative NaNs included): an integer comparison of its bits with 0,
    /// which x86 folds into `vblendvps`' own test of the sign bit — no
    /// comparison instruction and no zero register.
    fn sign_bit_set(&self, x: BasicValueEnum<'ctx>, ty: Ty, mode: Mode<'ctx>) -> R<BasicValueEnum<'ctx>> {
        // The integer as wide as the float (f16's and bf16's 16 bits too).
        let int = match ty {
            Ty::Elem(ElemType::F64) => self.cx.i64_type(),
            Ty::Elem(ElemType::F32) => self.cx.i32_type(),
            _ => self.cx.i16_type(),
        };
        let slt = inkwell::IntPredicate::SLT;
        Ok(match mode.lanes() {
            Some(n) => {
                let bits = self.b.build_bit_cast(x, int.vec_type(n), "bits")?.into_vector_value();
                self.b.build_int_compare(slt, bits, int.vec_type(n).const_zero(), "negative")?.into()
            }
            None => {
                let bits = self.b.build_bit_cast(x, int, "bits")?.into_int_value();
                self.b.build_int_compare(slt, bits, int.const_zero(), "negative")?.into()
            }
        })
    }

    /// The polynomial with coefficients `cs` (highest degree first) at the
    /// f32 vector `z`, by Horner's rule in fused multiply-adds.
    fn horner(&self, cs: &[f64], z: BasicValueEnum<'ctx>, mode: Mode<'ctx>) -> R<BasicValueEnum<'ctx>> {
        let ty = Ty::Elem(ElemType::F32);
        let mut r = self.const_of(ty, 0, cs[0], mode)?;
        for &k in &cs[1..] {
            r = self.fmuladd(r, z, self.const_of(ty, 0, k, mode)?, mode)?;
        }
        Ok(r)
    }

    /// a·b + c, fused where the target has FMA.
    fn fmuladd(
        &self,
        a: BasicValueEnum<'ctx>,
        b: BasicValueEnum<'ctx>,
        c: BasicValueEnum<'ctx>,
        mode: Mode<'ctx>,
    ) -> R<BasicValueEnum<'ctx>> {
        let t = self.ty_in(Ty::Elem(ElemType::F32), mode);
        self.call(self.intrinsic("llvm.fmuladd", &[t])?, &[a, b, c])
    }

    /// `p · 2^k` for f32 vectors in one AVX-512 `vscalefps` (k integral),
    /// rounded once, ∞ on overflow, denormal or 0 on underflow, NaN through;
    /// `None` on targets without it.
    fn scalef(&self, p: BasicValueEnum<'ctx>, k: BasicValueEnum<'ctx>, lanes: u32) -> R<Option<BasicValueEnum<'ctx>>> {
        self.avx512_masked("scalef.ps", "+avx512f", lanes * 32, vec![p, k])
    }

    /// Whether [`Gen::avx512_masked`] has `feature`'s instructions on
    /// vectors of `width` bits: AVX512VL too below 512.
    fn avx512_available(&self, feature: &str, width: u32) -> bool {
        let has = |f: &str| self.has_feature(f.trim_start_matches('+'));
        has(feature) && (width == 512 || ((width == 128 || width == 256) && has("avx512vl")))
    }

    /// `llvm.x86.avx512.mask.{op}.{width}` on `args` (vectors of `width`
    /// bits, then any immediate), with an undefined pass-through, every lane
    /// enabled and, at 512 bits, the current rounding mode; `None` where the
    /// target lacks `feature`, or AVX512VL for 128- and 256-bit vectors.
    fn avx512_masked(
        &self,
        op: &str,
        feature: &str,
        width: u32,
        mut args: Vec<BasicValueEnum<'ctx>>,
    ) -> R<Option<BasicValueEnum<'ctx>>> {
        if !self.avx512_available(feature, width) {
            return Ok(None);
        }
        let f = self.intrinsic(&format!("llvm.x86.avx512.mask.{op}.{width}"), &[])?;
        let vt = args[0].into_vector_value().get_type();
        let mask = if vt.get_size() > 8 { self.cx.i16_type() } else { self.cx.i8_type() };
        args.push(vt.get_undef().into());
        args.push(mask.const_all_ones().into());
        if width == 512 {
            // _MM_FROUND_CUR_DIRECTION
            args.push(self.cx.i32_type().const_int(4, false).into());
        }
        Ok(Some(self.call(f, &args)?))
    }

    /// A call of libdevice function `name`, lane by lane in vector code
    /// (libdevice is scalar); f16 goes through f32.
    fn device_call(&self, name: &str, args: &[BasicValueEnum<'ctx>], ty: Ty) -> R<BasicValueEnum<'ctx>> {
        let Some(BasicValueEnum::VectorValue(first)) = args.first() else {
            return self.device_call_scalar(name, args, ty);
        };
        let i32t = self.cx.i32_type();
        let mut out = first.get_type().get_undef();
        for l in 0..first.get_type().get_size() {
            let at = i32t.const_int(l as u64, false);
            let lane: Vec<BasicValueEnum> = args
                .iter()
                .map(|v| self.b.build_extract_element(v.into_vector_value(), at, "lane"))
                .collect::<Result<_, _>>()?;
            let r = self.device_call_scalar(name, &lane, ty)?;
            out = self.b.build_insert_element(out, r, at, "lanes")?;
        }
        Ok(out.into())
    }

    fn device_call_scalar(&self, name: &str, args: &[BasicValueEnum<'ctx>], ty: Ty) -> R<BasicValueEnum<'ctx>> {
        let half = ty == Ty::Elem(ElemType::F16);
        let cty = if ty == Ty::Elem(ElemType::F64) { self.cx.f64_type() } else { self.cx.f32_type() };
        let params: Vec<BasicMetadataTypeEnum> = args.iter().map(|_| cty.into()).collect();
        let f = self
            .m
            .get_function(name)
            .unwrap_or_else(|| self.m.add_function(name, cty.fn_type(&params, false), Some(Linkage::External)));
        let mut wide = Vec::new();
        for &v in args {
            wide.push(if half { self.b.build_float_ext(v.into_float_value(), cty, "ext")?.into() } else { v });
        }
        let r = self.call(f, &wide)?;
        Ok(if half { self.b.build_float_trunc(r.into_float_value(), self.cx.f16_type(), "tr")?.into() } else { r })
    }

    /// A C math library call, lane by lane in vector code; f16 goes through f32.
    pub(super) fn libm(
        &self,
        name: &str,
        x: BasicValueEnum<'ctx>,
        ty: Ty,
        mode: Mode<'ctx>,
    ) -> R<BasicValueEnum<'ctx>> {
        let half = ty == Ty::Elem(ElemType::F16);
        let cty = if ty == Ty::Elem(ElemType::F64) { self.cx.f64_type() } else { self.cx.f32_type() };
        let f = self
            .m
            .get_function(name)
            .unwrap_or_else(|| self.m.add_function(name, cty.fn_type(&[cty.into()], false), Some(Linkage::External)));
        let one = |v: BasicValueEnum<'ctx>| -> R<BasicValueEnum<'ctx>> {
            let v = if half { self.b.build_float_ext(v.into_float_value(), cty, "ext")?.into() } else { v };
            let r = self.call(f, &[v])?;
            Ok(if half { self.b.build_float_trunc(r.into_float_value(), self.cx.f16_type(), "tr")?.into() } else { r })
        };
        match mode.lanes() {
            None => one(x),
            Some(l) => {
                let v = x.into_vector_value();
                let mut out = v.get_type().get_poison();
                for i in 0..l {
                    let idx = self.cx.i32_type().const_int(i as u64, false);
                    let e = self.b.build_extract_element(v, idx, "lane")?;
                    let r = one(e)?;
                    out = self.b.build_insert_element(out, r, idx, "lane")?;
                }
                Ok(out.into())
            }
        }
    }
}

/// erf(x) = x·P(x²) / Q(x²) on [0, 3.84]: P's coefficients, highest
/// degree first (`scripts/fit_erf.py`; `vector_erff`).
const ERF_NUMERATOR: &[f64] = &[
    2.087_326_755_884_078e-8,
    -1.982_728_235_816_466_6e-6,
    1.370_443_642_372_265_5e-4,
    3.428_875_468_671_322e-3,
    4.967_501_014_471_054e-2,
    1.930_378_526_449_203_5e-1,
    1.128_379_106_521_606_4,
];

/// Q's coefficients, highest degree first, Q(0) = 1.
const ERF_DENOMINATOR: &[f64] =
    &[8.955_554_803_833_365e-4, 1.378_110_423_684_120_2e-2, 1.121_663_004_159_927_4e-1, 5.044_073_462_486_267e-1, 1.0];

/// The libdevice function computing `f` on `ty`, where LLVM's NVPTX
/// backend has no instruction for it (the rest are intrinsics it lowers).
fn libdevice_fn(f: MathFn, ty: Ty) -> Option<&'static str> {
    let double = ty == Ty::Elem(ElemType::F64);
    if !float_ty(ty) {
        return None;
    }
    Some(match (f, double) {
        (MathFn::Exp, false) => "__nv_expf",
        (MathFn::Exp, true) => "__nv_exp",
        (MathFn::Log, false) => "__nv_logf",
        (MathFn::Log, true) => "__nv_log",
        (MathFn::Tanh, false) => "__nv_tanhf",
        (MathFn::Tanh, true) => "__nv_tanh",
        (MathFn::Erf, false) => "__nv_erff",
        (MathFn::Erf, true) => "__nv_erf",
        (MathFn::Erfc, false) => "__nv_erfcf",
        (MathFn::Erfc, true) => "__nv_erfc",
        (MathFn::Pow, false) => "__nv_powf",
        (MathFn::Pow, true) => "__nv_pow",
        _ => return None,
    })
}

/// What [`Gen::vector_expf_of`] may assume of its argument's sign (a NaN
/// is allowed in each: it passes through either way).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum ExpArg {
    Any,
    /// `−|x|`, `−x²`: never above 0, so never overflows.
    NonPositive,
    /// `2|x|`: never below 0, so never underflows.
    NonNegative,
}

/// How [`Gen::vector_expf_of`] computes r = x − k·ln 2.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Ln2 {
    /// ln 2 in two parts (Cody–Waite), k times the first exact: r as
    /// exact as f32 rounds it for every k, e^x within about 1 ulp.
    TwoPart,
    /// ln 2 as one f32 constant (1.9e-9 above it): one multiply-add and
    /// one register fewer; r is off by |k|·1.9e-9, and e^x's relative error
    /// grows by as much (under an ulp for |x| < 21, 2.4e-7 at k = −126,
    /// where e^x leaves the normal numbers). Taken where that error shows
    /// no further in the function's value: `sigmoid` (e^−|x| relative
    /// error is a negative x's relative error, and a positive x's 1 /
    /// (1 + e^−|x|) barely moves) and `tanh` (1 − 2 / (e^2|x| + 1)).
    /// MEASURED (AMD Zen 4, 1 thread, 65 536 SiLUs from L1/L2): `x86-avx2`
    /// 24.2 → 20.8 µs, `host` 17.3 → 15.8 — on AVX2 a SiLU's constants then
    /// stay in its 16 registers instead of being reloaded per vector.
    OnePart,
}
