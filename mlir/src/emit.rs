//! Operations shared by both exports: types, constants, and texc's
//! operators (arithmetic, comparisons, math, conversions) spelled in
//! `arith`/`math`, on scalars or on vectors of lanes alike (the `arith` and
//! `math` operations are elementwise, so one spelling serves both).
//!
//! Invariant: every operation emitted here has a defined result for every
//! input; where an MLIR operation's result is undefined on some inputs
//! (`arith.fptosi` out of range or on NaN), the emitted code selects around it.

use crate::{MlirError, R};
use melior::ir::attribute::{FloatAttribute, IntegerAttribute};
use melior::ir::operation::OperationBuilder;
use melior::ir::ValueLike;
use melior::ir::{Attribute, Block, BlockLike, Identifier, Location, Type, Value};
use melior::Context;
use std::cell::RefCell;
use std::collections::BTreeSet;
use texc_compiler::ops::{BinOp, Intrinsic, MathFn, UnOp};
use texc_compiler::tir::Ty;
use texc_compiler::types::ElemType;

/// Builds operations at one location of one context.
pub struct B<'c> {
    pub cx: &'c Context,
    pub loc: Location<'c>,
    /// C functions called (declared in the module once it is built).
    pub externs: RefCell<BTreeSet<&'static str>>,
}

/// How a type's values compare, divide and widen.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Class {
    Float,
    Signed,
    /// `u8` and `bool`.
    Unsigned,
    Index,
}

pub fn class(t: Ty) -> Class {
    match t {
        Ty::Index => Class::Index,
        Ty::Elem(e) if e.is_float() => Class::Float,
        Ty::Elem(ElemType::U8 | ElemType::Bool) => Class::Unsigned,
        Ty::Elem(_) => Class::Signed,
    }
}

/// Bits of an integer type (`index` counts as 64).
pub fn int_bits(t: Ty) -> u32 {
    match t {
        Ty::Elem(ElemType::Bool) => 1,
        Ty::Elem(ElemType::I8 | ElemType::U8) => 8,
        Ty::Elem(ElemType::I32) => 32,
        _ => 64,
    }
}

fn float_bits(e: ElemType) -> u32 {
    match e {
        ElemType::F16 | ElemType::BF16 => 16,
        ElemType::F32 => 32,
        _ => 64,
    }
}

/// The MLIR spelling of an element type.
pub fn elem_name(e: ElemType) -> &'static str {
    match e {
        ElemType::F16 => "f16",
        ElemType::BF16 => "bf16",
        ElemType::F32 => "f32",
        ElemType::F64 => "f64",
        ElemType::I8 | ElemType::U8 => "i8",
        ElemType::I32 => "i32",
        ElemType::I64 => "i64",
        ElemType::Bool => "i1",
    }
}

pub fn ty_name(t: Ty) -> &'static str {
    match t {
        Ty::Index => "index",
        Ty::Elem(e) => elem_name(e),
    }
}

/// `arith.cmpf` predicates (MLIR's `CmpFPredicate` numbering).
fn cmpf_predicate(op: BinOp) -> i64 {
    match op {
        BinOp::Eq => 1,
        BinOp::Gt => 2,
        BinOp::Ge => 3,
        BinOp::Lt => 4,
        BinOp::Le => 5,
        // `!=` holds for NaN: unordered-or-not-equal.
        _ => 13,
    }
}

/// `arith.cmpi` predicates (MLIR's `CmpIPredicate` numbering).
fn cmpi_predicate(op: BinOp, unsigned: bool) -> i64 {
    let (signed, uns) = match op {
        BinOp::Eq => (0, 0),
        BinOp::Ne => (1, 1),
        BinOp::Lt => (2, 6),
        BinOp::Le => (3, 7),
        BinOp::Gt => (4, 8),
        _ => (5, 9),
    };
    if unsigned {
        uns
    } else {
        signed
    }
}

pub const UNO: i64 = 14;
pub const OLT: i64 = 4;
pub const OGE: i64 = 3;

impl<'c> B<'c> {
    pub fn new(cx: &'c Context) -> B<'c> {
        B { cx, loc: Location::unknown(cx), externs: RefCell::default() }
    }

    /// Add the kernel's function (`entry` its body) and the declarations of
    /// the C functions it calls to module `m`.
    pub fn finish_module(&self, m: &melior::ir::Module<'c>, name: &str, function_type: &str, entry: Block<'c>) {
        use melior::ir::RegionLike;
        let region = melior::ir::Region::new();
        region.append_block(entry);
        let func = OperationBuilder::new("func.func", self.loc)
            .add_attributes(&[
                (Identifier::new(self.cx, "sym_name"), self.attr(&format!("\"{name}\""))),
                (Identifier::new(self.cx, "function_type"), self.attr(function_type)),
            ])
            .add_regions([region])
            .build()
            .expect("func.func");
        m.body().append_operation(func);
        self.declare_externs(m);
    }

    /// Declare the C functions that were called: `func.func private @erfcf(f32) -> f32`.
    fn declare_externs(&self, module: &melior::ir::Module<'c>) {
        for name in self.externs.borrow().iter() {
            let t = if *name == "erfc" { "f64" } else { "f32" };
            let f = OperationBuilder::new("func.func", self.loc)
                .add_attributes(&[
                    (Identifier::new(self.cx, "sym_name"), self.attr(&format!("\"{name}\""))),
                    (Identifier::new(self.cx, "function_type"), self.attr(&format!("({t}) -> {t}"))),
                    (Identifier::new(self.cx, "sym_visibility"), self.attr("\"private\"")),
                ])
                .add_regions([melior::ir::Region::new()])
                .build()
                .expect("an external function declaration");
            module.body().append_operation(f);
        }
    }

    pub fn ty(&self, s: &str) -> Type<'c> {
        Type::parse(self.cx, s).unwrap_or_else(|| panic!("texc-mlir: unparsable type `{s}`"))
    }

    pub fn attr(&self, s: &str) -> Attribute<'c> {
        Attribute::parse(self.cx, s).unwrap_or_else(|| panic!("texc-mlir: unparsable attribute `{s}`"))
    }

    /// The type of values of `t`: a scalar, or a vector of `lanes`.
    pub fn vty(&self, t: Ty, lanes: Option<u32>) -> Type<'c> {
        match lanes {
            None => self.ty(ty_name(t)),
            Some(l) => self.ty(&format!("vector<{l}x{}>", ty_name(t))),
        }
    }

    /// Append an operation; its results.
    pub fn op<'a>(
        &self,
        blk: &'a Block<'c>,
        name: &str,
        operands: &[Value<'c, '_>],
        results: &[Type<'c>],
        attrs: &[(&str, Attribute<'c>)],
    ) -> Vec<Value<'c, 'a>> {
        let attrs: Vec<(Identifier<'c>, Attribute<'c>)> =
            attrs.iter().map(|(n, a)| (Identifier::new(self.cx, n), *a)).collect();
        let op = OperationBuilder::new(name, self.loc)
            .add_operands(operands)
            .add_results(results)
            .add_attributes(&attrs)
            .build()
            .unwrap_or_else(|e| panic!("texc-mlir: cannot build `{name}`: {e}"));
        let op = blk.append_operation(op);
        (0..op.result_count()).map(|i| op.result(i).expect("result").into()).collect()
    }

    /// An operation with one result.
    pub fn op1<'a>(
        &self,
        blk: &'a Block<'c>,
        name: &str,
        operands: &[Value<'c, '_>],
        result: Type<'c>,
        attrs: &[(&str, Attribute<'c>)],
    ) -> Value<'c, 'a> {
        self.op(blk, name, operands, &[result], attrs)[0]
    }

    /// A scalar constant of type `t` (`v` is already a value of `t`).
    pub fn constant<'a>(&self, blk: &'a Block<'c>, t: Ty, v: f64) -> Value<'c, 'a> {
        let ty = self.vty(t, None);
        let a: Attribute<'c> = match class(t) {
            Class::Float => FloatAttribute::new(self.cx, ty, v).into(),
            _ => IntegerAttribute::new(ty, v as i64).into(),
        };
        self.op1(blk, "arith.constant", &[], ty, &[("value", a)])
    }

    pub fn int<'a>(&self, blk: &'a Block<'c>, t: Ty, v: i64) -> Value<'c, 'a> {
        let ty = self.vty(t, None);
        self.op1(blk, "arith.constant", &[], ty, &[("value", IntegerAttribute::new(ty, v).into())])
    }

    pub fn index<'a>(&self, blk: &'a Block<'c>, v: i64) -> Value<'c, 'a> {
        self.int(blk, Ty::Index, v)
    }

    /// `v` (a scalar of `t`) in every one of `lanes`.
    pub fn splat<'a>(&self, blk: &'a Block<'c>, v: Value<'c, '_>, t: Ty, lanes: u32) -> Value<'c, 'a> {
        self.op1(blk, "vector.broadcast", &[v], self.vty(t, Some(lanes)), &[])
    }

    /// `constant` broadcast to the shape of the operands at hand.
    pub fn constant_like<'a>(&self, blk: &'a Block<'c>, t: Ty, v: f64, lanes: Option<u32>) -> Value<'c, 'a> {
        let c = self.constant(blk, t, v);
        match lanes {
            Some(l) => self.splat(blk, c, t, l),
            None => c,
        }
    }

    fn cmp<'a>(
        &self,
        blk: &'a Block<'c>,
        float: bool,
        pred: i64,
        a: Value<'c, '_>,
        b: Value<'c, '_>,
        lanes: Option<u32>,
    ) -> Value<'c, 'a> {
        let name = if float { "arith.cmpf" } else { "arith.cmpi" };
        let bool_ty = self.vty(Ty::Elem(ElemType::Bool), lanes);
        self.op1(blk, name, &[a, b], bool_ty, &[("predicate", self.attr(&format!("{pred} : i64")))])
    }

    pub fn select<'a>(
        &self,
        blk: &'a Block<'c>,
        c: Value<'c, '_>,
        a: Value<'c, '_>,
        b: Value<'c, '_>,
    ) -> Value<'c, 'a> {
        self.op1(blk, "arith.select", &[c, a, b], a.r#type(), &[])
    }

    /// `op` on operands of type `operand` giving `result` (after legalization:
    /// no floor division, no integer `Div`).
    #[allow(clippy::too_many_arguments)]
    pub fn binary<'a>(
        &self,
        blk: &'a Block<'c>,
        op: BinOp,
        operand: Ty,
        result: Ty,
        a: Value<'c, '_>,
        b: Value<'c, '_>,
        lanes: Option<u32>,
    ) -> R<Value<'c, 'a>> {
        let cl = class(operand);
        let float = cl == Class::Float;
        if op.is_comparison() {
            let pred = if float { cmpf_predicate(op) } else { cmpi_predicate(op, cl == Class::Unsigned) };
            return Ok(self.cmp(blk, float, pred, a, b, lanes));
        }
        let unsigned = cl == Class::Unsigned;
        let name = match (op, float) {
            (BinOp::Add, true) => "arith.addf",
            (BinOp::Sub, true) => "arith.subf",
            (BinOp::Mul, true) => "arith.mulf",
            (BinOp::Div, true) => "arith.divf",
            (BinOp::Add, false) => "arith.addi",
            (BinOp::Sub, false) => "arith.subi",
            (BinOp::Mul, false) => "arith.muli",
            (BinOp::And, false) => "arith.andi",
            (BinOp::Or, false) => "arith.ori",
            // Legalization guarantees a divisor that is neither 0 nor -1.
            (BinOp::TruncDiv, false) if !unsigned => "arith.divsi",
            (BinOp::TruncRem, false) if !unsigned => "arith.remsi",
            (BinOp::TruncDiv | BinOp::UDiv, false) => "arith.divui",
            (BinOp::TruncRem | BinOp::URem, false) => "arith.remui",
            _ => {
                return Err(MlirError::Unsupported(format!(
                    "`{}` on {operand} is not legalized (texc legalizes expressions before export)",
                    op.symbol()
                )))
            }
        };
        Ok(self.op1(blk, name, &[a, b], self.vty(result, lanes), &[]))
    }

    pub fn unary<'a>(
        &self,
        blk: &'a Block<'c>,
        op: UnOp,
        t: Ty,
        a: Value<'c, '_>,
        lanes: Option<u32>,
    ) -> Value<'c, 'a> {
        match (op, class(t)) {
            (UnOp::Neg, Class::Float) => self.op1(blk, "arith.negf", &[a], self.vty(t, lanes), &[]),
            (UnOp::Neg, _) => {
                let zero = self.constant_like(blk, t, 0.0, lanes);
                self.op1(blk, "arith.subi", &[zero, a], self.vty(t, lanes), &[])
            }
            (UnOp::Not, _) => {
                let one = self.constant_like(blk, t, 1.0, lanes);
                self.op1(blk, "arith.xori", &[a, one], self.vty(t, lanes), &[])
            }
        }
    }

    /// A built-in function of type `t`.
    pub fn math<'a>(
        &self,
        blk: &'a Block<'c>,
        f: MathFn,
        t: Ty,
        a: &[Value<'c, 'a>],
        lanes: Option<u32>,
    ) -> Value<'c, 'a> {
        let ty = self.vty(t, lanes);
        let cl = class(t);
        let un = |name: &str| self.op1(blk, name, &[a[0]], ty, &[]);
        let bin = |name: &str, x: Value<'c, '_>, y: Value<'c, '_>| self.op1(blk, name, &[x, y], ty, &[]);
        let (max, min) = match cl {
            Class::Float => ("arith.maximumf", "arith.minimumf"),
            Class::Unsigned => ("arith.maxui", "arith.minui"),
            _ => ("arith.maxsi", "arith.minsi"),
        };
        match f {
            MathFn::Exp => un("math.exp"),
            MathFn::Log => un("math.log"),
            MathFn::Sqrt => un("math.sqrt"),
            MathFn::Rsqrt => un("math.rsqrt"),
            MathFn::Tanh => un("math.tanh"),
            MathFn::Erf => un("math.erf"),
            MathFn::Erfc => self.libm_erfc(blk, t, a[0], lanes),
            MathFn::Sigmoid => {
                let one = self.constant_like(blk, t, 1.0, lanes);
                let neg = self.op1(blk, "arith.negf", &[a[0]], ty, &[]);
                let e = self.op1(blk, "math.exp", &[neg], ty, &[]);
                let d = bin("arith.addf", one, e);
                bin("arith.divf", one, d)
            }
            MathFn::Abs => match cl {
                Class::Float => un("math.absf"),
                Class::Unsigned => a[0],
                _ => un("math.absi"),
            },
            MathFn::Floor => un("math.floor"),
            MathFn::Ceil => un("math.ceil"),
            MathFn::Round => un("math.roundeven"),
            MathFn::Max => bin(max, a[0], a[1]),
            MathFn::Min => bin(min, a[0], a[1]),
            MathFn::Pow => bin("math.powf", a[0], a[1]),
            MathFn::Clamp => {
                let lo = bin(max, a[0], a[1]);
                bin(min, lo, a[2])
            }
        }
    }

    /// `erfc` has no `math` operation in MLIR 19: C's `erfcf`/`erfc`,
    /// lane by lane on vectors.
    fn libm_erfc<'a>(&self, blk: &'a Block<'c>, t: Ty, x: Value<'c, '_>, lanes: Option<u32>) -> Value<'c, 'a> {
        let name = if t == Ty::Elem(ElemType::F64) { "erfc" } else { "erfcf" };
        self.externs.borrow_mut().insert(name);
        let call = |v: Value<'c, '_>| -> Value<'c, 'a> {
            let (v, narrow) = match t {
                Ty::Elem(ElemType::F16 | ElemType::BF16) => {
                    (self.op1(blk, "arith.extf", &[v], self.ty("f32"), &[]), true)
                }
                _ => (v, false),
            };
            let callee = self.attr(&format!("@{name}"));
            let r = self.op1(blk, "func.call", &[v], v.r#type(), &[("callee", callee)]);
            if narrow {
                self.op1(blk, "arith.truncf", &[r], self.vty(t, None), &[])
            } else {
                r
            }
        };
        match lanes {
            None => call(x),
            Some(l) => {
                let mut acc = self.constant_like(blk, t, 0.0, lanes);
                for i in 0..l {
                    let pos = self.attr(&format!("array<i64: {i}>"));
                    let e = self.op1(blk, "vector.extract", &[x], self.vty(t, None), &[("static_position", pos)]);
                    let r = call(e);
                    let pos = self.attr(&format!("array<i64: {i}>"));
                    acc = self.op1(blk, "vector.insert", &[r, acc], self.vty(t, lanes), &[("static_position", pos)]);
                }
                acc
            }
        }
    }

    pub fn intrinsic<'a>(
        &self,
        blk: &'a Block<'c>,
        i: Intrinsic,
        t: Ty,
        a: &[Value<'c, '_>],
        lanes: Option<u32>,
    ) -> Value<'c, 'a> {
        let ty = self.vty(t, lanes);
        match (i, class(t)) {
            (Intrinsic::Fma, Class::Float) => self.op1(blk, "math.fma", a, ty, &[]),
            (Intrinsic::Fma, _) => {
                let m = self.op1(blk, "arith.muli", &[a[0], a[1]], ty, &[]);
                self.op1(blk, "arith.addi", &[m, a[2]], ty, &[])
            }
            (Intrinsic::Dot4, _) => self.dot4(blk, t, a, lanes),
            (Intrinsic::Dot2, _) => self.dot2(blk, t, a, lanes),
            (Intrinsic::Dot4Sat, _) => self.dot4sat(blk, t, a, lanes),
        }
    }

    /// `@dot2(c, a, b)` in `arith`: each operand's half `t` shifted to the
    /// top and arithmetically down, products summed into `c`.
    fn dot2<'a>(&self, blk: &'a Block<'c>, t: Ty, a: &[Value<'c, '_>], lanes: Option<u32>) -> Value<'c, 'a> {
        let ty = self.vty(t, lanes);
        let k = |v: i64| self.constant_like(blk, t, v as f64, lanes);
        let mut sum = self.op1(blk, "arith.addi", &[a[0], k(0)], ty, &[]);
        for half in 0..2 {
            let signed = |v: Value<'c, '_>| {
                let top = self.op1(blk, "arith.shli", &[v, k(16 - 16 * half)], ty, &[]);
                self.op1(blk, "arith.shrsi", &[top, k(16)], ty, &[])
            };
            let prod = self.op1(blk, "arith.muli", &[signed(a[1]), signed(a[2])], ty, &[]);
            sum = self.op1(blk, "arith.addi", &[sum, prod], ty, &[]);
        }
        sum
    }

    /// `@dot4(c, a, b)` in `arith`: the four byte products summed into `c`.
    fn dot4<'a>(&self, blk: &'a Block<'c>, t: Ty, a: &[Value<'c, '_>], lanes: Option<u32>) -> Value<'c, 'a> {
        let ty = self.vty(t, lanes);
        let zero = self.constant_like(blk, t, 0.0, lanes);
        let mut sum = self.op1(blk, "arith.addi", &[a[0], zero], ty, &[]);
        for byte in 0..4 {
            let prod = self.byte_product(blk, t, a, lanes, byte);
            sum = self.op1(blk, "arith.addi", &[sum, prod], ty, &[]);
        }
        sum
    }

    /// `@dot4sat(c, a, b)` in `arith`: byte products summed in pairs, each
    /// pair clamped to the `i16` range (`arith.maxsi`, `arith.minsi`), into `c`.
    fn dot4sat<'a>(&self, blk: &'a Block<'c>, t: Ty, a: &[Value<'c, '_>], lanes: Option<u32>) -> Value<'c, 'a> {
        let ty = self.vty(t, lanes);
        let k = |v: i64| self.constant_like(blk, t, v as f64, lanes);
        let mut sum = self.op1(blk, "arith.addi", &[a[0], k(0)], ty, &[]);
        for first in [0, 2] {
            let [x, y] = [first, first + 1].map(|byte| self.byte_product(blk, t, a, lanes, byte));
            let pair = self.op1(blk, "arith.addi", &[x, y], ty, &[]);
            let pair = self.op1(blk, "arith.maxsi", &[pair, k(i16::MIN.into())], ty, &[]);
            let pair = self.op1(blk, "arith.minsi", &[pair, k(i16::MAX.into())], ty, &[]);
            sum = self.op1(blk, "arith.addi", &[sum, pair], ty, &[]);
        }
        sum
    }

    /// Byte `byte` of `a[1]` (shifted down and masked: unsigned) times that
    /// of `a[2]` (shifted to the top and arithmetically down: signed).
    fn byte_product<'a>(
        &self,
        blk: &'a Block<'c>,
        t: Ty,
        a: &[Value<'c, '_>],
        lanes: Option<u32>,
        byte: i64,
    ) -> Value<'c, 'a> {
        let ty = self.vty(t, lanes);
        let k = |v: i64| self.constant_like(blk, t, v as f64, lanes);
        let ua = self.op1(blk, "arith.shrui", &[a[1], k(8 * byte)], ty, &[]);
        let ua = self.op1(blk, "arith.andi", &[ua, k(255)], ty, &[]);
        let sb = self.op1(blk, "arith.shli", &[a[2], k(24 - 8 * byte)], ty, &[]);
        let sb = self.op1(blk, "arith.shrsi", &[sb, k(24)], ty, &[]);
        self.op1(blk, "arith.muli", &[ua, sb], ty, &[])
    }

    /// Convert `v` from `from` to `to` (docs/language.md, "Semantics").
    pub fn cast<'a>(
        &self,
        blk: &'a Block<'c>,
        v: Value<'c, 'a>,
        from: Ty,
        to: Ty,
        lanes: Option<u32>,
    ) -> Value<'c, 'a> {
        if from == to {
            return v;
        }
        let out = self.vty(to, lanes);
        let op = |name: &str, x: Value<'c, 'a>, t: Type<'c>| self.op1(blk, name, &[x], t, &[]);
        match (class(from), class(to)) {
            (_, _) if to == Ty::Elem(ElemType::Bool) => {
                let zero = self.constant_like(blk, from, 0.0, lanes);
                let float = class(from) == Class::Float;
                self.cmp(blk, float, if float { 13 } else { 1 }, v, zero, lanes)
            }
            (Class::Float, Class::Float) => {
                let (Ty::Elem(a), Ty::Elem(b)) = (from, to) else { unreachable!("floats are elements") };
                match float_bits(a).cmp(&float_bits(b)) {
                    std::cmp::Ordering::Less => op("arith.extf", v, out),
                    std::cmp::Ordering::Greater => op("arith.truncf", v, out),
                    // f16 <-> bf16: through f32.
                    std::cmp::Ordering::Equal => {
                        let wide = op("arith.extf", v, self.vty(Ty::Elem(ElemType::F32), lanes));
                        op("arith.truncf", wide, out)
                    }
                }
            }
            (Class::Index, Class::Float) => {
                let i = op("arith.index_cast", v, self.vty(Ty::Elem(ElemType::I64), lanes));
                op("arith.sitofp", i, out)
            }
            (Class::Unsigned, Class::Float) => op("arith.uitofp", v, out),
            (Class::Signed, Class::Float) => op("arith.sitofp", v, out),
            (Class::Float, Class::Index) => {
                let i = self.float_to_int(blk, v, from, Ty::Elem(ElemType::I64), lanes);
                op("arith.index_cast", i, out)
            }
            (Class::Float, _) => self.float_to_int(blk, v, from, to, lanes),
            (Class::Index, _) => op("arith.index_cast", v, out),
            (Class::Unsigned, Class::Index) => op("arith.index_castui", v, out),
            (_, Class::Index) => op("arith.index_cast", v, out),
            (fc, _) => match int_bits(from).cmp(&int_bits(to)) {
                std::cmp::Ordering::Less if fc == Class::Unsigned => op("arith.extui", v, out),
                std::cmp::Ordering::Less => op("arith.extsi", v, out),
                std::cmp::Ordering::Greater => op("arith.trunci", v, out),
                // i8 <-> u8: the same bits.
                std::cmp::Ordering::Equal => v,
            },
        }
    }

    /// Float to integer: truncate toward zero, saturate, NaN to 0. The
    /// conversion's result is used only where it is defined.
    fn float_to_int<'a>(
        &self,
        blk: &'a Block<'c>,
        v: Value<'c, 'a>,
        from: Ty,
        to: Ty,
        lanes: Option<u32>,
    ) -> Value<'c, 'a> {
        let (lo, hi) = texc_compiler::semantics::int_bounds(to);
        let unsigned = class(to) == Class::Unsigned;
        let conv = if unsigned { "arith.fptoui" } else { "arith.fptosi" };
        let t = self.op1(blk, conv, &[v], self.vty(to, lanes), &[]);
        // hi + 1 and lo are powers of two (or 0): exact in every float type.
        let above = self.constant_like(blk, from, hi as f64 + 1.0, lanes);
        let below = self.constant_like(blk, from, lo as f64, lanes);
        let is_above = self.cmp(blk, true, OGE, v, above, lanes);
        let is_below = self.cmp(blk, true, OLT, v, below, lanes);
        let is_nan = self.cmp(blk, true, UNO, v, v, lanes);
        let (hi_c, lo_c, zero) = (
            self.constant_like(blk, to, hi as f64, lanes),
            self.constant_like(blk, to, lo as f64, lanes),
            self.constant_like(blk, to, 0.0, lanes),
        );
        let t = self.select(blk, is_above, hi_c, t);
        let t = self.select(blk, is_below, lo_c, t);
        self.select(blk, is_nan, zero, t)
    }
}
