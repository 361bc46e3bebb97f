//! Tensor-core operations (`Stmt::Mma`): on the GPU, one `mma.sync` per
//! warp, each lane loading its fragment elements where PTX's ISA guide puts
//! them (`MmaOp::fragments`: lane `l` is in group `g = l / 4` at position
//! `t = l % 4`); in the CPU emulation, the tile product as three loops
//! (TF32 inputs rounded as `cvt.rna.tf32.f32` rounds them).

use super::gen::{Frame, Gen, Mode};
use super::gpu::GpuKernel;
use super::R;
use crate::CodegenError;
use inkwell::types::VectorType;
use inkwell::values::{BasicValueEnum, IntValue, PointerValue};
use texc_schedules::ir::{Coord, MmaOp, Tile};

/// A tile in memory: the tensor's base, the tile's origin, the tensor's strides.
#[derive(Clone)]
struct Placed<'ctx> {
    base: PointerValue<'ctx>,
    origin: Vec<IntValue<'ctx>>,
    strides: Vec<i64>,
    rows: usize,
    cols: usize,
    elem: texc_compiler::types::ElemType,
}

impl<'ctx> Gen<'ctx, '_> {
    pub(super) fn mma(&mut self, fr: &mut Frame<'ctx>, op: MmaOp, c: &Tile, a: &Tile, b: &Tile) -> R<()> {
        let [c, a, b] = [c, a, b].map(|t| self.place(fr, t));
        let (c, a, b) = (c?, a?, b?);
        match self.gpu {
            Some(GpuKernel { thread_idx: Some(tid), .. }) => self.mma_warp(op, tid[0], &c, &a, &b),
            Some(_) => self.mma_loops(fr, op, &c, &a, &b),
            None => Err(CodegenError::Unsupported("a tensor-core operation outside a GPU kernel".into())),
        }
    }

    fn place(&mut self, fr: &mut Frame<'ctx>, t: &Tile) -> R<Placed<'ctx>> {
        let d = self.f.p.tensor(t.tensor);
        let mut strides = vec![1i64; d.shape.len()];
        for k in (0..d.shape.len().saturating_sub(1)).rev() {
            strides[k] = strides[k + 1] * d.shape[k + 1];
        }
        let (elem, rows, cols) = (d.elem, t.rows, t.cols);
        let mut origin = Vec::new();
        for &i in &t.origin {
            origin.push(self.expr(fr, i, Mode::Scalar)?.into_int_value());
        }
        Ok(Placed { base: fr.tensors[&t.tensor], origin, strides, rows, cols, elem })
    }

    /// The address of element (r, c) of tile `t`.
    fn element(&self, t: &Placed<'ctx>, r: IntValue<'ctx>, c: IntValue<'ctx>) -> R<PointerValue<'ctx>> {
        let i64t = self.cx.i64_type();
        let mut off = i64t.const_zero();
        for (d, (&o, &s)) in t.origin.iter().zip(&t.strides).enumerate() {
            let mut i = o;
            if d == t.rows {
                i = self.b.build_int_add(i, r, "r")?;
            }
            if d == t.cols {
                i = self.b.build_int_add(i, c, "c")?;
            }
            let term = self.b.build_int_mul(i, i64t.const_int(s as u64, true), "term")?;
            off = self.b.build_int_add(off, term, "off")?;
        }
        self.gep(self.mem_ty(t.elem), t.base, off)
    }

    fn load_at(&self, t: &Placed<'ctx>, r: IntValue<'ctx>, c: IntValue<'ctx>) -> R<BasicValueEnum<'ctx>> {
        let p = self.element(t, r, c)?;
        Ok(self.b.build_load(self.mem_ty(t.elem), p, "el")?)
    }

    /// One `mma.sync` by the warp whose lane is `lane`: each lane loads the
    /// fragment elements [`MmaOp::fragments`] assigns it, and stores its part of the result.
    fn mma_warp(
        &mut self,
        op: MmaOp,
        lane: IntValue<'ctx>,
        c: &Placed<'ctx>,
        a: &Placed<'ctx>,
        b: &Placed<'ctx>,
    ) -> R<()> {
        let i64t = self.cx.i64_type();
        let k = |v: i64| i64t.const_int(v as u64, true);
        let g = self.b.build_right_shift(lane, k(2), false, "group")?;
        let t = self.b.build_and(lane, k(3), "pos")?;
        let coord = |gen: &Self, x: Coord| -> R<(IntValue<'ctx>, IntValue<'ctx>)> {
            let lin = |c0: i64, cg: i64, ct: i64| -> R<IntValue<'ctx>> {
                let v = gen.b.build_int_mul(g, k(cg), "g")?;
                let v = gen.b.build_int_add(v, gen.b.build_int_mul(t, k(ct), "t")?, "gt")?;
                Ok(gen.b.build_int_add(v, k(c0), "at")?)
            };
            Ok((lin(x.r0, x.rg, x.rt)?, lin(x.c0, x.cg, x.ct)?))
        };
        let frag = op.fragments();
        let mut args: Vec<BasicValueEnum<'ctx>> = Vec::new();
        for (tile, coords) in [(a, frag.a), (b, frag.b)] {
            if op.rounds_to_tf32() {
                // One TF32 value (`cvt.rna.tf32.f32`) per register.
                for &x in coords {
                    let (r, col) = coord(self, x)?;
                    let e = self.load_at(tile, r, col)?;
                    args.push(self.call(self.intrinsic("llvm.nvvm.f2tf32.rna", &[])?, &[e])?);
                }
                continue;
            }
            // Halves go in pairs, in register order.
            for pair in coords.chunks(2) {
                let mut v = VectorType::const_vector(&[self.cx.f16_type().const_zero(); 2]);
                for (i, &x) in pair.iter().enumerate() {
                    let (r, col) = coord(self, x)?;
                    let e = self.load_at(tile, r, col)?;
                    v = self.b.build_insert_element(v, e, self.cx.i32_type().const_int(i as u64, false), "h")?;
                }
                args.push(v.into());
            }
        }
        let mut places = Vec::new();
        for &x in frag.c {
            let (r, col) = coord(self, x)?;
            args.push(self.load_at(c, r, col)?);
            places.push((r, col));
        }
        let name = match op {
            MmaOp::M16n8k16F16F32 => "llvm.nvvm.mma.m16n8k16.row.col.f32.f32",
            MmaOp::M16n8k8Tf32F32 => "llvm.nvvm.mma.m16n8k8.row.col.tf32",
        };
        let f = self.intrinsic(name, &[])?;
        let d = self.call(f, &args)?.into_struct_value();
        for (i, &(r, col)) in places.iter().enumerate() {
            let v = self.b.build_extract_value(d, i as u32, "d")?;
            let p = self.element(c, r, col)?;
            self.b.build_store(p, v)?;
        }
        Ok(())
    }

    /// `x` rounded to TF32 as `cvt.rna.tf32.f32` does: add half of the last
    /// kept bit, clear the 13 bits TF32 drops (NaN stays NaN).
    fn tf32(&self, x: inkwell::values::FloatValue<'ctx>) -> R<inkwell::values::FloatValue<'ctx>> {
        let i32t = self.cx.i32_type();
        let bits = self.b.build_bit_cast(x, i32t, "bits")?.into_int_value();
        let up = self.b.build_int_add(bits, i32t.const_int(0x1000, false), "up")?;
        let cut = self.b.build_and(up, i32t.const_int(!0x1fffu32 as u64, false), "cut")?;
        let r = self.b.build_bit_cast(cut, self.cx.f32_type(), "tf32")?.into_float_value();
        let nan = self.b.build_float_compare(inkwell::FloatPredicate::UNO, x, x, "nan")?;
        Ok(self.b.build_select(nan, x, r, "r")?.into_float_value())
    }

    /// The tile product `c += a × b` as loops (the emulation runs a whole
    /// warp's operation at once), accumulating in f32.
    fn mma_loops(
        &mut self,
        fr: &mut Frame<'ctx>,
        op: MmaOp,
        c: &Placed<'ctx>,
        a: &Placed<'ctx>,
        b: &Placed<'ctx>,
    ) -> R<()> {
        let (m, n, kk) = op.shape();
        let i64t = self.cx.i64_type();
        let f32t = self.cx.f32_type();
        let zero = i64t.const_zero();
        let func = fr.func;
        self.count(func, "r", zero, i64t.const_int(m as u64, false), &mut |g, r| {
            g.count(func, "c", zero, i64t.const_int(n as u64, false), &mut |g, col| {
                let p = g.element(c, r, col)?;
                let acc0 = g.b.build_load(f32t, p, "acc")?.into_float_value();
                let slot = g.entry_alloca(func, f32t.into())?;
                g.b.build_store(slot, acc0)?;
                g.count(func, "k", zero, i64t.const_int(kk as u64, false), &mut |g, k| {
                    let x = g.load_at(a, r, k)?.into_float_value();
                    let y = g.load_at(b, k, col)?.into_float_value();
                    let (x, y) = if op.rounds_to_tf32() {
                        (g.tf32(x)?, g.tf32(y)?)
                    } else {
                        (g.b.build_float_ext(x, f32t, "a")?, g.b.build_float_ext(y, f32t, "b")?)
                    };
                    let prod = g.b.build_float_mul(x, y, "ab")?;
                    let acc = g.b.build_load(f32t, slot, "acc")?.into_float_value();
                    let sum = g.b.build_float_add(acc, prod, "sum")?;
                    g.b.build_store(slot, sum)?;
                    Ok(())
                })?;
                let acc = g.b.build_load(f32t, slot, "acc")?;
                g.b.build_store(p, acc)?;
                Ok(())
            })
        })
    }
}
