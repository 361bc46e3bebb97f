//! Intel AMX tile products ([`TileDot`]) on x86: each one inline-assembly
//! block that loads the block's accumulators (or starts them from
//! `tilezero`), runs the whole sum `k` by 64 bytes (`tileloadd` of each
//! operand's tiles, `tdpbusd` per accumulator tile), and stores the
//! accumulators back. Serial loops around a product that adds to
//! accumulators they do not move (a convolution's sums over the filter's
//! rows and columns) load them once before and store them once after, the
//! product in them its steps alone ([`Gen::resident_tile_dot`]). The
//! configuration is loaded before, unless this call of the function
//! loaded the same one last.
//!
//! Tiles: accumulators in `tmm0`–`tmm3` (row tile `r`, column tile `q` in
//! `tmm(2r + q)`), the rows of `a` in `tmm4`–`tmm5`, the columns of `b` in
//! `tmm6`–`tmm7`. The configuration (palette 1) gives each tile the rows and
//! bytes of its part of the block: a block's last, shorter tiles are
//! loaded, multiplied and stored short, so nothing outside the block is
//! read or written. One block is one assembly block because AMX tiles
//! cannot stay in registers across LLVM values: the accumulators live in
//! tiles for the whole sum.
//!
//! Linux gives a process AMX's tile state only on request: every kernel
//! with tile products asks once per process (`arch_prctl(ARCH_REQ_XCOMP_PERM,
//! XFEATURE_XTILEDATA)` behind a flag), so that code compiled ahead of time
//! runs in a process that never asked.
//!
//! Invariants: the tiles' rows and columns are those the verifier checked
//! (`texc_schedules::verify`: columns contiguous, `k` a multiple of 16, at
//! most 32 × 32 accumulators); the assembly reads and writes only the
//! elements of its three tiles.

use super::gen::{Frame, Gen, Mode};
use super::R;
use crate::CodegenError;
use inkwell::module::Linkage;
use inkwell::types::BasicMetadataTypeEnum;
use inkwell::values::{BasicMetadataValueEnum, PointerValue};
use inkwell::AddressSpace;
use texc_schedules::ir::{ForKind, LoopFunc, Stmt, TileDot};

impl<'ctx> Gen<'ctx, '_> {
    /// One AMX tile product: its accumulators loaded (or zeroed), its
    /// steps, its accumulators stored; only the steps inside loops that
    /// keep them resident ([`Gen::resident_tile_dot`]).
    pub(super) fn tile_dot(&mut self, fr: &mut Frame<'ctx>, d: &TileDot) -> R<()> {
        let ptr = self.cx.ptr_type(AddressSpace::default());
        let i64t = self.cx.i64_type();
        let [a, b] = [&d.a, &d.b].map(|t| self.place(fr, t));
        let (a, b) = (a?, b?);
        let zero = i64t.const_zero();
        let a0 = self.element(&a, zero, zero)?;
        // The second row tile's first rows; the first's again where there is none.
        let a1 =
            if d.m > TileDot::TILE { self.element(&a, i64t.const_int(TileDot::TILE as u64, false), zero)? } else { a0 };
        let b0 = self.element(&b, zero, zero)?;
        let bytes = |p: &super::mma::Placed<'ctx>| i64t.const_int(4 * p.row_stride() as u64, false);
        let (lda, ldb) = (bytes(&a), bytes(&b));
        let bstep = i64t.const_int((4 * TileDot::K_STEP * b.row_stride()) as u64, false);
        let steps = i64t.const_int((d.k / TileDot::K_STEP) as u64, false);
        let mut args: Vec<BasicMetadataValueEnum> =
            vec![a0.into(), a1.into(), b0.into(), steps.into(), lda.into(), ldb.into(), bstep.into()];
        let (asm, constraints, params) = if fr.tiles_resident {
            (steps_asm(d, ["$8", "$9", "$10"]), STEPS, vec![])
        } else {
            self.amx_ready()?;
            let config = self.tile_config(d)?;
            self.configure_tiles(fr, config)?;
            let [c0, c1, ldc] = self.accumulator_rows(fr, d)?;
            args.extend([c0, c1, ldc, config.into()]);
            (tile_dot_asm(d), WHOLE, vec![BasicMetadataTypeEnum::from(ptr), ptr.into(), i64t.into(), ptr.into()])
        };
        let params: Vec<BasicMetadataTypeEnum> = [ptr, ptr, ptr]
            .map(BasicMetadataTypeEnum::from)
            .into_iter()
            .chain([i64t, i64t, i64t, i64t].map(BasicMetadataTypeEnum::from))
            .chain(params)
            .collect();
        let out = self.cx.struct_type(&[ptr.into(), ptr.into(), ptr.into(), i64t.into()], false);
        let fn_ty = out.fn_type(&params, false);
        let asm_fn = self.cx.create_inline_asm(fn_ty, asm, constraints.into(), true, false, None, false);
        self.b.build_indirect_call(fn_ty, asm_fn, &args, "tdpbusd")?;
        Ok(())
    }

    /// Loops (`nest`, a chain of serial loops ending in `d`: [`tile_nest`])
    /// around a tile product whose accumulators they do not move: the
    /// accumulators are loaded into tiles once before them and stored once
    /// after, and each iteration runs the product's steps alone (a
    /// convolution's sums over the filter's rows and columns: a 3 × 3
    /// filter over 64 channels is one 64-byte step per iteration, which
    /// loading and storing the accumulators around would cost more than).
    /// Tiles keep their values between assembly blocks: nothing else in
    /// the loops touches them.
    pub(super) fn resident_tile_dot(&mut self, fr: &mut Frame<'ctx>, nest: &Stmt, d: &TileDot) -> R<()> {
        self.amx_ready()?;
        let config = self.tile_config(d)?;
        self.configure_tiles(fr, config)?;
        let rows = self.accumulator_rows(fr, d)?;
        let ptr = self.cx.ptr_type(AddressSpace::default());
        let ty = self.cx.void_type().fn_type(&[ptr.into(), ptr.into(), self.cx.i64_type().into()], false);
        let c = ["$0", "$1", "$2"];
        // [`tile_nest`]: the product adds to its accumulators.
        for (i, tiles) in [Tiles::Load, Tiles::Store].into_iter().enumerate() {
            if i == 1 {
                fr.tiles_resident = true;
                let body = self.stmt(fr, nest, Mode::Scalar);
                fr.tiles_resident = false;
                body?;
            }
            let asm = accumulators_asm(d, tiles, c);
            let asm_fn = self.cx.create_inline_asm(ty, asm, ACCUMULATORS.into(), true, false, None, false);
            self.b.build_indirect_call(ty, asm_fn, &rows, "")?;
        }
        Ok(())
    }

    /// The first elements of the accumulators' two row tiles (the first's
    /// again where there is one), and their row stride in bytes.
    fn accumulator_rows(&mut self, fr: &mut Frame<'ctx>, d: &TileDot) -> R<[BasicMetadataValueEnum<'ctx>; 3]> {
        let i64t = self.cx.i64_type();
        let c = self.place(fr, &d.c)?;
        let zero = i64t.const_zero();
        let c0 = self.element(&c, zero, zero)?;
        let c1 =
            if d.m > TileDot::TILE { self.element(&c, i64t.const_int(TileDot::TILE as u64, false), zero)? } else { c0 };
        Ok([c0.into(), c1.into(), i64t.const_int(4 * c.row_stride() as u64, false).into()])
    }

    /// Refuse tile products where they cannot run; ask Linux for the tile state.
    fn amx_ready(&mut self) -> R<()> {
        if self.gpu.is_some() {
            return Err(CodegenError::Unsupported("an AMX tile product in a GPU kernel".into()));
        }
        if !self.spec.features.split(',').any(|f| f == "+amx-int8") {
            return Err(CodegenError::Unsupported(format!(
                "an AMX tile product (`{}`) for a CPU without AMX-INT8 (`x86-avx512-amx` has it)",
                TileDot::SCHEDULE_NAME
            )));
        }
        self.request_amx()
    }

    /// Load tile configuration `config` unless this call of the function
    /// loaded it last (`ldtilecfg` took 46 ns on an AMX Xeon core, two
    /// 64-byte steps of a 32 × 32 block; a block's tiles keep their shape
    /// from one block to the next).
    fn configure_tiles(&mut self, fr: &mut Frame<'ctx>, config: PointerValue<'ctx>) -> R<()> {
        let ptr = self.cx.ptr_type(AddressSpace::default());
        let slot = self.amx_config_slot(fr)?;
        let last = self.b.build_load(ptr, slot, "amx.cfg")?.into_pointer_value();
        let same = self.b.build_int_compare(inkwell::IntPredicate::EQ, last, config, "amx.same")?;
        let func = fr.func;
        let (load, done) =
            (self.cx.append_basic_block(func, "amx.cfg.load"), self.cx.append_basic_block(func, "amx.cfg.done"));
        self.b.build_conditional_branch(same, done, load)?;
        self.b.position_at_end(load);
        let ty = self.cx.void_type().fn_type(&[ptr.into()], false);
        let asm =
            self.cx.create_inline_asm(ty, "ldtilecfg ($0)".into(), "r,~{memory}".into(), true, false, None, false);
        self.b.build_indirect_call(ty, asm, &[config.into()], "")?;
        self.b.build_store(slot, config)?;
        self.b.build_unconditional_branch(done)?;
        self.b.position_at_end(done);
        Ok(())
    }

    /// The frame's slot of the configuration last loaded ([`Frame::amx_config`]),
    /// made at the function's entry, null there.
    fn amx_config_slot(&mut self, fr: &mut Frame<'ctx>) -> R<PointerValue<'ctx>> {
        if let Some(slot) = fr.amx_config {
            return Ok(slot);
        }
        let ptr = self.cx.ptr_type(AddressSpace::default());
        let entry = fr.func.get_first_basic_block().expect("entry block");
        let at = self.cx.create_builder();
        match entry.get_first_instruction() {
            Some(i) => at.position_before(&i),
            None => at.position_at_end(entry),
        }
        let slot = at.build_alloca(ptr, "amx.cfg.slot")?;
        at.build_store(slot, ptr.const_null())?;
        fr.amx_config = Some(slot);
        Ok(slot)
    }

    /// After a parallel loop, whose tasks may have run tile products of
    /// other shapes on this thread: the configuration is unknown.
    pub(super) fn forget_amx_config(&mut self, fr: &mut Frame<'ctx>) -> R<()> {
        if !self.has_tile_dots {
            return Ok(());
        }
        let slot = self.amx_config_slot(fr)?;
        self.b.build_store(slot, self.cx.ptr_type(AddressSpace::default()).const_null())?;
        Ok(())
    }

    /// The tile configuration of `d`'s block: a constant of 64 bytes
    /// (palette 1; each tile's bytes per row at 16 + 2t, its rows at 48 + t).
    fn tile_config(&mut self, d: &TileDot) -> R<PointerValue<'ctx>> {
        let bytes = tile_config_bytes(d);
        let name = format!("texc.amx.cfg.{}x{}", d.m, d.n);
        if let Some(g) = self.m.get_global(&name) {
            return Ok(g.as_pointer_value());
        }
        let i8t = self.cx.i8_type();
        let init = i8t.const_array(&bytes.iter().map(|&x| i8t.const_int(u64::from(x), false)).collect::<Vec<_>>());
        let g = self.m.add_global(i8t.array_type(64), None, &name);
        g.set_initializer(&init);
        g.set_constant(true);
        g.set_linkage(Linkage::Private);
        g.set_alignment(64);
        Ok(g.as_pointer_value())
    }

    /// Ask Linux for the tile state, once per process: a call to
    /// `texc.amx.request`, which makes the `arch_prctl` system call the
    /// first time (a flag in the module remembers it).
    fn request_amx(&mut self) -> R<()> {
        let name = "texc.amx.request";
        let f = match self.m.get_function(name) {
            Some(f) => f,
            None => self.define_amx_request(name)?,
        };
        self.b.build_call(f, &[], "")?;
        Ok(())
    }

    fn define_amx_request(&mut self, name: &str) -> R<inkwell::values::FunctionValue<'ctx>> {
        let (i8t, i64t) = (self.cx.i8_type(), self.cx.i64_type());
        let flag = self.m.add_global(i8t, None, "texc.amx.requested");
        flag.set_initializer(&i8t.const_zero());
        flag.set_linkage(Linkage::Internal);
        let f = self.m.add_function(name, self.cx.void_type().fn_type(&[], false), Some(Linkage::Internal));
        let here = self.b.get_insert_block().expect("inside a function");
        let (entry, ask, done) = (
            self.cx.append_basic_block(f, "entry"),
            self.cx.append_basic_block(f, "ask"),
            self.cx.append_basic_block(f, "done"),
        );
        self.b.position_at_end(entry);
        let asked = self.b.build_load(i8t, flag.as_pointer_value(), "asked")?.into_int_value();
        let yes = self.b.build_int_compare(inkwell::IntPredicate::NE, asked, i8t.const_zero(), "yes")?;
        self.b.build_conditional_branch(yes, done, ask)?;
        self.b.position_at_end(ask);
        let ty = i64t.fn_type(&[i64t.into(), i64t.into(), i64t.into()], false);
        let syscall = self.cx.create_inline_asm(
            ty,
            "syscall".into(),
            "={rax},{rax},{rdi},{rsi},~{rcx},~{r11},~{memory}".into(),
            true,
            false,
            None,
            false,
        );
        let args = [SYS_ARCH_PRCTL, texc_runtime::amx::ARCH_REQ_XCOMP_PERM, texc_runtime::amx::XFEATURE_XTILEDATA]
            .map(|v| BasicMetadataValueEnum::from(i64t.const_int(v, false)));
        self.b.build_indirect_call(ty, syscall, &args, "perm")?;
        self.b.build_store(flag.as_pointer_value(), i8t.const_int(1, false))?;
        self.b.build_unconditional_branch(done)?;
        self.b.position_at_end(done);
        self.b.build_return(None)?;
        self.b.position_at_end(here);
        Ok(f)
    }
}

/// Linux x86-64's system call number of `arch_prctl`.
const SYS_ARCH_PRCTL: u64 = 158;

/// Rows of row tile `r` of an `m`-row block, and bytes of column tile `q`
/// of an `n`-column one (`i32` elements).
fn part(total: i64, i: i64) -> i64 {
    (total - i * TileDot::TILE).clamp(0, TileDot::TILE)
}

/// The 64 bytes `ldtilecfg` reads for `d`'s block.
pub(crate) fn tile_config_bytes(d: &TileDot) -> [u8; 64] {
    let mut cfg = [0u8; 64];
    cfg[0] = 1;
    // A tile unused has no rows and no bytes: `ldtilecfg` faults on one without the other.
    let mut set = |t: usize, rows: i64, colsb: i64| {
        let (rows, colsb) = if rows == 0 || colsb == 0 { (0, 0) } else { (rows, colsb) };
        cfg[16 + 2 * t..18 + 2 * t].copy_from_slice(&(colsb as u16).to_le_bytes());
        cfg[48 + t] = rows as u8;
    };
    for r in 0..2 {
        for q in 0..2 {
            set(2 * r as usize + q as usize, part(d.m, r), 4 * part(d.n, q));
        }
        // Rows of `a`: 64 bytes of the sum each.
        set(4 + r as usize, part(d.m, r), 4 * TileDot::K_STEP);
    }
    for q in 0..2 {
        // `b`: 16 rows of the sum, the column tile's bytes each.
        set(6 + q as usize, TileDot::K_STEP, 4 * part(d.n, q));
    }
    cfg
}

/// Constraints of a whole tile product's assembly ([`tile_dot_asm`]):
/// the steps' operands ([`STEPS`]), then the accumulators' rows and their
/// stride, and the configuration (loaded before, by [`Gen::configure_tiles`]).
const WHOLE: &str = "=&r,=&r,=&r,=&r,0,1,2,3,r,r,r,r,r,r,r,~{memory},~{dirflag},~{fpsr},~{flags}";
/// Constraints of the steps alone ([`steps_asm`]): `$0`–`$3` the cursors
/// over `a`'s two row tiles and `b`, and the steps left (tied to
/// `$4`–`$7`); `$8`, `$9` the row strides in bytes of `a` and `b`; `$10`
/// `b`'s advance per step.
const STEPS: &str = "=&r,=&r,=&r,=&r,0,1,2,3,r,r,r,~{memory},~{dirflag},~{fpsr},~{flags}";
/// Constraints of loading or storing the accumulators ([`accumulators_asm`]).
const ACCUMULATORS: &str = "r,r,r,~{memory},~{dirflag},~{fpsr},~{flags}";

/// What [`accumulators_asm`] does with the accumulator tiles.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Tiles {
    Load,
    Zero,
    Store,
}

/// The accumulator tiles of `d`'s block `tmm0`–`tmm3` (row tile `r`, column
/// tile `q` in `tmm(2r + q)`) loaded, zeroed or stored; `c` names the
/// operands of the two row tiles' first elements and the row stride.
fn accumulators_asm(d: &TileDot, what: Tiles, c: [&str; 3]) -> String {
    let (rows2, cols2) = (d.m > TileDot::TILE, d.n > TileDot::TILE);
    let [c0, c1, ldc] = c;
    let at = [
        format!("({c0},{ldc},1)"),
        format!("64({c0},{ldc},1)"),
        format!("({c1},{ldc},1)"),
        format!("64({c1},{ldc},1)"),
    ];
    (0..4)
        .filter(|&t| (t < 2 || rows2) && (t % 2 == 0 || cols2))
        .map(|t| match what {
            Tiles::Zero => format!("tilezero %tmm{t}\n"),
            Tiles::Load => format!("tileloadd {}, %tmm{t}\n", at[t]),
            Tiles::Store => format!("tilestored %tmm{t}, {}\n", at[t]),
        })
        .collect()
}

/// The whole sum of `d`'s block by 64-byte steps into the accumulator
/// tiles: `tileloadd` of `a`'s row tiles into `tmm4`–`tmm5` and `b`'s
/// column tiles into `tmm6`–`tmm7`, `tdpbusd` per accumulator tile.
/// Cursors as [`STEPS`] says; `ld` names the operands of `a`'s and `b`'s
/// row strides and `b`'s advance.
fn steps_asm(d: &TileDot, ld: [&str; 3]) -> String {
    let (rows2, cols2) = (d.m > TileDot::TILE, d.n > TileDot::TILE);
    let [lda, ldb, bstep] = ld;
    let mut s = format!("1:\ntileloadd ($0,{lda},1), %tmm4\n");
    if rows2 {
        s += &format!("tileloadd ($1,{lda},1), %tmm5\n");
    }
    s += &format!("tileloadd ($2,{ldb},1), %tmm6\n");
    if cols2 {
        s += &format!("tileloadd 64($2,{ldb},1), %tmm7\n");
    }
    for t in (0..4).filter(|&t| (t < 2 || rows2) && (t % 2 == 0 || cols2)) {
        s += &format!("tdpbusd %tmm{}, %tmm{}, %tmm{t}\n", 6 + t % 2, 4 + t / 2);
    }
    s + &format!("add $$64, $0\nadd $$64, $1\nadd {bstep}, $2\ndec $3\njnz 1b\n")
}

/// The assembly of `d`'s block alone: accumulators, steps, accumulators
/// stored (operands as [`WHOLE`] says: the steps' `$0`–`$10`, then `$11`,
/// `$12` the accumulators' two row tiles and `$13` their row stride).
fn tile_dot_asm(d: &TileDot) -> String {
    let c = ["$11", "$12", "$13"];
    let start = accumulators_asm(d, if d.zero { Tiles::Zero } else { Tiles::Load }, c);
    start + &steps_asm(d, ["$8", "$9", "$10"]) + &accumulators_asm(d, Tiles::Store, c)
}

/// `s` as loops around a tile product that can keep its accumulators in
/// tiles across them: serial loops, each the only statement of the one
/// outside it, the innermost's body the product alone, whose accumulators
/// do not move with the loops and start from themselves (not zero).
pub(super) fn tile_nest<'s>(f: &LoopFunc, s: &'s Stmt) -> Option<&'s TileDot> {
    let mut vars = Vec::new();
    let mut at = s;
    while let Stmt::For { var, kind: ForKind::Serial | ForKind::Unrolled, body, .. } = at {
        let [inner] = body.as_slice() else { return None };
        vars.push(*var);
        at = inner;
    }
    let Stmt::TileDot(d) = at else { return None };
    let fixed = d.c.origin.iter().all(|&i| vars.iter().all(|&v| !texc_schedules::analysis::involves(&f.p, i, v)));
    (!vars.is_empty() && !d.zero && fixed).then_some(d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use texc_compiler::tir::TensorId;
    use texc_schedules::ir::Tile;

    fn block(m: i64, n: i64) -> TileDot {
        let t = Tile { tensor: TensorId(0), origin: vec![], rows: 0, cols: 1 };
        TileDot { c: t.clone(), a: t.clone(), b: t, m, n, k: 64, zero: false }
    }

    #[test]
    fn a_short_block_configures_short_tiles_and_no_others() {
        let cfg = tile_config_bytes(&block(20, 7));
        let colsb = |t: usize| u16::from_le_bytes([cfg[16 + 2 * t], cfg[17 + 2 * t]]);
        let rows = |t: usize| cfg[48 + t];
        assert_eq!(cfg[0], 1);
        // Accumulators: 16 and 4 rows of 7 columns; no second column tile.
        assert_eq!((rows(0), colsb(0), rows(2), colsb(2)), (16, 28, 4, 28));
        assert_eq!((rows(1), colsb(1), rows(3), colsb(3)), (0, 0, 0, 0));
        // `a`: 16 and 4 rows of 64 bytes; `b`: 16 rows of 28 bytes, no second.
        assert_eq!((rows(4), colsb(4), rows(5), colsb(5)), (16, 64, 4, 64));
        assert_eq!((rows(6), colsb(6), rows(7), colsb(7)), (16, 28, 0, 0));
    }

    #[test]
    fn a_small_block_uses_one_tile_of_each() {
        let asm = tile_dot_asm(&block(16, 16));
        assert_eq!(asm.matches("tdpbusd").count(), 1);
        assert!(!asm.contains("%tmm5") && !asm.contains("%tmm7"));
        let asm = tile_dot_asm(&block(32, 32));
        assert_eq!(asm.matches("tdpbusd").count(), 4);
    }

    #[test]
    fn resident_accumulators_are_loaded_and_stored_once_around_the_steps() {
        let d = block(32, 20);
        let c = ["$0", "$1", "$2"];
        let (load, store) = (accumulators_asm(&d, Tiles::Load, c), accumulators_asm(&d, Tiles::Store, c));
        assert_eq!((load.matches("tileloadd").count(), store.matches("tilestored").count()), (4, 4));
        assert!(store.contains("tilestored %tmm3, 64($1,$2,1)"), "{store}");
        let steps = steps_asm(&d, ["$8", "$9", "$10"]);
        assert_eq!(steps.matches("tdpbusd").count(), 4);
        assert!(!steps.contains("tilestored") && !steps.contains("tilezero"), "{steps}");
        // Each accumulator tile is loaded, or zeroed, before the steps of a whole product.
        let whole = tile_dot_asm(&TileDot { zero: true, ..d });
        assert_eq!(whole.matches("tilezero").count(), 4);
        assert!(whole.find("tilezero").unwrap() < whole.find("tdpbusd").unwrap());
    }
}
