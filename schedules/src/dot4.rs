//! Integer products on dot-product instructions: a TIR-to-TIR pass for
//! targets with [`Intrinsic::Dot4`] (x86 VNNI's `vpdpbusd`) or
//! [`Intrinsic::Dot2`] (`vpmaddwd`, on CPUs without VNNI).
//!
//! A sum of products of 8-bit integers widened to `i32`,
//! `sum[k](i32(A[.., k, ..]) * i32(W[.., k, ..]))` with `A` in `u8` and
//! `W` in `i8`, where the reduction variable `k` is, alone, one index of
//! each operand (any dimension: a matrix product's inner one, a
//! convolution's channels; or `base + k` with `base` a multiple of 4, a
//! grouped convolution's `g · Cg + c` where 4 divides `Cg`), becomes
//! `sum[k4](@dot4(0, A.q4[.., k4, ..], W.q4[.., k4, ..]))`: the operands
//! packed four consecutive `k` to an `i32` (byte `t` holds `k = 4·k4 + t`,
//! zero past the end of `k`), one `vpdpbusd` lane per four products.
//! Activations read at a stride (a convolution of stride 2's `2·x + s`)
//! are rearranged first, so that the packed rows are contiguous
//! ([`crate::subsample`]). Each packed operand is a stage of its own,
//! inserted just before the product, so that a constant one (a model's
//! weights) is packed once, when constants are folded: the pipeline runs
//! this pass before folding, and again as the CPU strategy's first
//! preparation step (for kernels whose weights are arguments).
//! Legalization then moves the accumulator into the instruction
//! (`c + @dot4(0, a, b)` → `@dot4(c, a, b)`).
//!
//! Without VNNI ([`Word::Halves`]) the operands are packed two `k` to an
//! `i32` instead, each byte widened to 16 bits (zero- or sign-extended as
//! its type says): `sum[k2](@dot2(0, A.q2[.., k2, ..], W.q2[.., k2, ..]))`,
//! one `vpmaddwd` lane per two products. Widening once, when packing (for
//! constant weights, when folding), not before every instruction, halves
//! the instructions per product (MEASURED: `docs/quantization.md`).
//! `vpmaddubsw`, which multiplies bytes directly, saturates its 16-bit
//! pair sums for about one weight pair in seventy of a quantized
//! ResNet-18; where the weights are known (a model's, [`Known`]) and no
//! neighbouring pair can saturate ([`pairs_cannot_saturate`]: 7-bit
//! weights never do), the product is packed in bytes as for `vpdpbusd` and
//! computed with [`Intrinsic::Dot4Sat`] instead, which those weights make
//! equal to `@dot4` (MEASURED: ResNet-18 with ORT's `reduce_range`, 1.2–1.5×
//! faster than on `@dot2`). In halves both operands are signed 16-bit
//! numbers, so an `i8` unsigned side needs no offset, and `u8 × u8`
//! products are packed too.
//!
//! Products of two `i8` operands take `vpdpbusd`'s unsigned side offset by
//! 128 (`a + 128` in `0..=255`) and subtract what that adds,
//! `128 · Σ w` over the same variables: a stage of its own over the signed
//! operand alone (`W.sum`), so constant weights' sums are folded too. That
//! operand must be indexed by plain variables, each once (a matrix's or a
//! filter's); where neither is, the product is left as written (LLVM
//! widens it to 16 bits).
//!
//! A product of `u8` activations read through a window — no variable alone
//! in an index of each operand, as a depthwise convolution's
//! `X[n, c, 2·y + r, 2·x + s]` and `W[c, 0, r, s]` — is packed along the
//! window's row instead ([`as_window`]: `s` moves the activations' last
//! dimension as `base + s` and is alone in an index of the weights): the
//! weights packed along `s`, the activations read in place, word `q` being
//! `Σ_t i32(X[.., base + 4q + t]) · 256^t` (`2q + t` and `65536^t` in
//! halves) — overlapping words, which a packed copy would store four times
//! over, and which code generation loads as one span and a shuffle
//! (`codegen/src/llvm/memory.rs`, `byte_window`) — and the words' products
//! chained, `s` left a sum of one (MEASURED: AMD Zen 4, AVX-512 VNNI, `u8`
//! depthwise 3 × 3 layers of MobileNetV2 1.2–1.8× faster, the model 3.64 →
//! 3.24 ms on one thread; docs/quantization.md).
//!
//! On targets with AMX-INT8, a matrix product or a convolution of stride 1
//! ([`tile_axes`]: the unsigned operand's rows along an axis `i`, the
//! signed one's columns along another, `j`) whose sum fills at least half
//! of its 64-byte rows is packed for tiles instead: the unsigned operand
//! with `k` last ([`Layout::TileRows`]: `A.q4[.., i, k4]`, a
//! convolution's `X.q4[n, h, w, c4]`: a tile's rows of 64 bytes), the
//! signed one with `k` and then `j` last ([`Layout::TileCols`]:
//! `W.q4[k4, j]`, `W.q4[r, s, c4, f]`), both zero past `k` to a multiple
//! of 16 packed elements; the CPU strategy then computes the sum on tiles
//! (`strategy/cpu/tiles.rs`).
//!
//! Why not in the e-graph: the rewrite changes a reduction's extent and
//! adds tensors whose layout the loop schedule reads; the operator graph
//! has neither.
//!
//! Invariants: the program computes the same values bit for bit (integer
//! sums wrap in `i32` either way, and the four products of a lane are the
//! products of the original sum, zero bytes adding nothing; `@dot4sat`
//! only with weights whose pair sums fit 16 bits for any unsigned bytes); the packed
//! variable is used by nothing but the two loads; stages stay in an order
//! where every tensor is written before it is read; operator records'
//! stage ranges move with the inserted stages.

use crate::analysis::involves;
use crate::ir::TileDot;
use crate::normalize::{fresh_name, replace_node, subst};
use crate::prepack::insert_stage;
use texc_compiler::ops::{BinOp, Intrinsic, ReduceOp};
use texc_compiler::target::Target;
use texc_compiler::tir::*;
use texc_compiler::types::ElemType;

const I32: Ty = Ty::Elem(ElemType::I32);

/// The values of the `i8` input tensors known when compiling (a model's
/// weights), by name; `None` for any other.
pub type Known<'a> = &'a dyn Fn(&str) -> Option<&'a [i8]>;

/// No tensor's values known (kernels whose weights are arguments).
pub fn nothing_known(_: &str) -> Option<&'static [i8]> {
    None
}

/// Rewrite every integer product of `p` that the target's `@dot4` (or,
/// without VNNI, `@dot4sat` where `known` weights allow it, else `@dot2`)
/// can compute; the number rewritten.
pub fn pack_products(p: &mut Program, target: &Target, known: Known<'_>) -> usize {
    let Some(word) = Word::of(target) else { return 0 };
    let tiles = target.has_amx_int8() && word == Word::Bytes;
    let saturating = word == Word::Halves && target.has_intrinsic(Intrinsic::Dot4Sat);
    let mut made: Vec<(Packing, TensorId)> = Vec::new();
    let mut rewritten = 0;
    let mut si = 0;
    while si < p.stages.len() {
        let in_bytes = saturating.then(|| find_product(p, si, Word::Bytes)).flatten();
        let in_bytes = in_bytes.filter(|prod| pairs_cannot_saturate(p, &prod.w, known));
        let found = match in_bytes {
            Some(prod) => Some(Product { dot: Intrinsic::Dot4Sat, ..prod }),
            None => find_product(p, si, word),
        };
        match found {
            Some(prod) => {
                let direct = tiles.then(|| tile_product(p, si, &prod)).flatten();
                let gathered = (tiles && direct.is_none()).then(|| gathered_rows(p, si, &prod)).flatten();
                si = match gathered {
                    Some(f) => gather_rows(p, si, f, &mut made),
                    None => rewrite(p, si, prod, direct, &mut made).0,
                };
                rewritten += 1;
            }
            None => match find_window(p, si, word) {
                Some(win) => {
                    si = rewrite_window(p, si, win, &mut made);
                    rewritten += 1;
                }
                None => si += 1,
            },
        }
    }
    rewritten
}

/// Whether [`pack_products`] puts stage `si`'s product on AMX tiles for `target`.
pub(crate) fn packs_for_tiles(p: &Program, si: usize, target: &Target) -> bool {
    if !target.has_amx_int8() || Word::of(target) != Some(Word::Bytes) {
        return false;
    }
    let Some(prod) = find_product(p, si, Word::Bytes) else { return false };
    tile_product(p, si, &prod).is_some() || gathered_rows(p, si, &prod).is_some()
}

/// What a packed `i32` holds: four bytes of `k` ([`Intrinsic::Dot4`]'s
/// operands), or two, each widened to 16 bits ([`Intrinsic::Dot2`]'s).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Word {
    Bytes,
    Halves,
}

impl Word {
    /// The packing target's products take: bytes where `@dot4` is one
    /// instruction (VNNI) or `@dot2` is missing, else halves.
    fn of(target: &Target) -> Option<Word> {
        let (dot4, dot2) = (target.has_intrinsic(Intrinsic::Dot4), target.has_intrinsic(Intrinsic::Dot2));
        match () {
            _ if dot4 && (target.has_vnni() || !dot2) => Some(Word::Bytes),
            _ if dot2 => Some(Word::Halves),
            _ => None,
        }
    }

    /// Elements of `k` per `i32`.
    fn per_word(self) -> i64 {
        match self {
            Word::Bytes => 4,
            Word::Halves => 2,
        }
    }

    fn intrinsic(self) -> Intrinsic {
        match self {
            Word::Bytes => Intrinsic::Dot4,
            Word::Halves => Intrinsic::Dot2,
        }
    }
}

/// One operand of a product: the load, and the dimension `k` indexes.
#[derive(Clone, Copy)]
struct Operand {
    load: TExprId,
    tensor: TensorId,
    dim: usize,
    /// The index is `base + k`, `base` a multiple of the elements per word
    /// (a grouped convolution's `g · Cg + c`): the whole dimension is
    /// packed, and read at `base / 4 + k4` (`base / 2 + k2`).
    base: Option<TExprId>,
}

/// A sum of `u8 × i8` (or `i8 × i8`; `u8 × u8` in halves) products over
/// `k` (among the sum's variables); `a` is the unsigned side of `vpdpbusd`.
struct Product {
    reduce: TExprId,
    k: VarId,
    a: Operand,
    w: Operand,
    /// `a` is `i8` in bytes: packed offset by 128, and `128 · Σ w` subtracted.
    offset: bool,
    word: Word,
    /// The instruction on the packed words: `word`'s, or, on bytes,
    /// [`Intrinsic::Dot4Sat`] where no pair sum can saturate.
    dot: Intrinsic,
}

/// A packed tensor: `tensor`'s dimension `dim`, of which the first `len`,
/// as `word` says, each element plus 128 where `offset`. For AMX tiles
/// the packed dimension is padded with zeros to a whole number of 64-byte
/// rows.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Packing {
    tensor: TensorId,
    dim: usize,
    len: i64,
    offset: bool,
    layout: Layout,
    word: Word,
}

/// How a product's packed operands are laid out: for `vpdpbusd`'s
/// broadcasts and vectors, or for AMX's tiles.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Layout {
    Vectors,
    /// AMX tiles' unsigned operand, the packed dimension last: a tile row
    /// is 64 contiguous bytes of the sum (`A.q4[.., i, k4]`, a
    /// convolution's `X.q4[n, h, w, c4]`).
    TileRows,
    /// AMX tiles' signed operand, its other dimensions first, then the
    /// packed one and the columns' dimension `cols` (`W.q4[k4, j]`, a
    /// filter's `W.q4[r, s, c4, f]`): `tdpbusd`'s rows of 16 columns' four bytes.
    TileCols {
        cols: usize,
    },
}

/// The first sum in stage `si`'s value that is such a product.
fn find_product(p: &Program, si: usize, word: Word) -> Option<Product> {
    first_in(p, si, |st, e| as_product(p, st, e, word))
}

/// The first node of stage `si`'s value (depth first) that `found` takes.
fn first_in<T>(p: &Program, si: usize, found: impl Fn(&Stage, TExprId) -> Option<T>) -> Option<T> {
    let st = &p.stages[si];
    let mut stack = vec![st.value];
    while let Some(e) = stack.pop() {
        if let Some(x) = found(st, e) {
            return Some(x);
        }
        stack.extend(p.children(e));
    }
    None
}

fn as_product(p: &Program, st: &Stage, e: TExprId, word: Word) -> Option<Product> {
    let TExpr::Reduce(ReduceOp::Sum, vars, body) = p.expr(e) else { return None };
    let TExpr::Binary(BinOp::Mul, x, y) = *p.expr(*body) else { return None };
    if p.ty(e) != I32 || p.ty(*body) != I32 {
        return None;
    }
    let (x, y) = (widened(p, x)?, widened(p, y)?);
    // `vpdpbusd`'s unsigned side: the `u8` operand, else either `i8` one
    // (offset), the first whose partner's sum is a stage of its own.
    let roles = match (x.2, y.2) {
        (ElemType::U8, ElemType::I8) => vec![(x, y)],
        (ElemType::I8, ElemType::U8) => vec![(y, x)],
        (ElemType::I8, ElemType::I8) => vec![(x, y), (y, x)],
        (ElemType::U8, ElemType::U8) if word == Word::Halves => vec![(x, y)],
        _ => return None,
    };
    for (a, w) in roles {
        let offset = a.2 == ElemType::I8 && word == Word::Bytes;
        if offset && !summable(p, st, w.0, vars) {
            continue;
        }
        let found = vars.iter().rev().find_map(|&k| {
            let len = st.vars[k as usize].extent;
            let a = operand(p, (a.0, a.1), k, len, word)?;
            let w = operand(p, (w.0, w.1), k, len, word)?;
            (!used_outside(p, st.value, e, k)).then_some(Product {
                reduce: e,
                k,
                a,
                w,
                offset,
                word,
                dot: word.intrinsic(),
            })
        });
        if found.is_some() {
            return found;
        }
    }
    None
}

/// `v` as a byte tensor's load widened to `i32`: the load, its tensor and type.
fn widened(p: &Program, v: TExprId) -> Option<(TExprId, TensorId, ElemType)> {
    let TExpr::Cast(l) = *p.expr(v) else { return None };
    let TExpr::Load(t, _) = p.expr(l) else { return None };
    match (p.ty(v), p.ty(l)) {
        (I32, Ty::Elem(el @ (ElemType::U8 | ElemType::I8))) => Some((l, *t, el)),
        _ => None,
    }
}

/// A sum of `u8 × i8` products over a window of the unsigned operand's
/// rows: `sum[.., s](i32(A[.., base + s]) * i32(W[.., s, ..]))`, `s`
/// moving along `A`'s last dimension and alone in one index of `W` (a
/// depthwise convolution's `X[n, c, 2·y + r, 2·x + s]` and `W[c, 0, r, s]`,
/// where no index is the sum's variable alone, as [`as_product`] needs).
struct Window {
    reduce: TExprId,
    s: VarId,
    /// The unsigned operand's load, and the index of its last dimension without `s`.
    a: TExprId,
    base: TExprId,
    w: Operand,
    word: Word,
}

/// The first sum in stage `si`'s value that is such a window product, in `word`s.
fn find_window(p: &Program, si: usize, word: Word) -> Option<Window> {
    first_in(p, si, |st, e| as_window(p, st, e, word))
}

/// Most elements of a window's row taken: a 7 × 7 window's rows are two
/// words of bytes, four of halves, chained.
const MAX_WINDOW: i64 = 8;

fn as_window(p: &Program, st: &Stage, e: TExprId, word: Word) -> Option<Window> {
    let TExpr::Reduce(ReduceOp::Sum, vars, body) = p.expr(e) else { return None };
    let TExpr::Binary(BinOp::Mul, x, y) = *p.expr(*body) else { return None };
    if p.ty(e) != I32 || p.ty(*body) != I32 {
        return None;
    }
    let (a, w) = match (widened(p, x)?, widened(p, y)?) {
        (a @ (_, _, ElemType::U8), w @ (_, _, ElemType::I8)) | (w @ (_, _, ElemType::I8), a @ (_, _, ElemType::U8)) => {
            (a, w)
        }
        _ => return None,
    };
    let TExpr::Load(_, ai) = p.expr(a.0) else { return None };
    let last = ai.len().checked_sub(1)?;
    vars.iter().rev().find_map(|&s| {
        let ext = st.vars[s as usize].extent;
        let base = match *p.expr(ai[last]) {
            TExpr::Binary(BinOp::Add, b, v) if plain_var(p, v) == Some(s) => b,
            TExpr::Binary(BinOp::Add, v, b) if plain_var(p, v) == Some(s) => b,
            _ => return None,
        };
        let only_last = ai.iter().enumerate().all(|(d, &i)| d == last || !involves(p, i, s));
        let w = operand(p, (w.0, w.1), s, ext, word).filter(|o| o.base.is_none())?;
        let fits = (2..=MAX_WINDOW).contains(&ext) && only_last && !involves(p, base, s);
        (fits && !used_outside(p, st.value, e, s)).then_some(Window { reduce: e, s, a: a.0, base, w, word })
    })
}

/// Window product `win` of stage `si` on `@dot4` (in halves `@dot2`, two
/// elements a word where this says four): the signed operand packed along
/// `s` (a stage before, shared with products packed alike), the unsigned
/// one's window read as words in place — word `q` is
/// `Σ_t i32(A[.., base + 4q + t]) · 256^t`, the bytes of the row from
/// `base + 4q` on, which code generation loads as a shuffle of the row
/// (no packed copy: a window's words overlap) — and the words' products
/// chained, `s` left a sum of one (`sum[.., s4](@dot4(@dot4(0, a₀, w₀), a₁, w₁))`).
/// The stage index of the product afterwards.
fn rewrite_window(p: &mut Program, mut si: usize, win: Window, made: &mut Vec<(Packing, TensorId)>) -> usize {
    let s = win.s as usize;
    let len = p.stages[si].vars[s].extent;
    let word = win.word;
    let key = Packing { tensor: win.w.tensor, dim: win.w.dim, len, offset: false, layout: Layout::Vectors, word };
    let packed = match made.iter().find(|(m, _)| *m == key) {
        Some(&(_, t)) => t,
        None => {
            let t = insert_packing(p, si, key, win.w.load);
            si += 1;
            made.push((key, t));
            t
        }
    };
    let span = p.span(win.reduce);
    let int = |p: &mut Program, v: i64, ty: Ty| p.alloc(TExpr::Int(v), ty, span);
    let TExpr::Load(a, ai) = p.expr(win.a).clone() else { unreachable!("an operand is a load") };
    let TExpr::Load(_, wi) = p.expr(win.w.load).clone() else { unreachable!("an operand is a load") };
    let a_ty = p.ty(win.a);
    let n = word.per_word();
    let mut chain = int(p, 0, I32);
    for q in 0..packed_len(len, word, false) {
        let mut parts = None;
        for t in 0..(len - n * q).min(n) {
            let mut idx = ai.clone();
            let off = int(p, n * q + t, Ty::Index);
            idx[ai.len() - 1] = p.alloc(TExpr::Binary(BinOp::Add, win.base, off), Ty::Index, span);
            let byte = p.alloc(TExpr::Load(a, idx), a_ty, span);
            let mut byte = p.alloc(TExpr::Cast(byte), I32, span);
            if t > 0 {
                let scale = int(p, 1 << (32 / n * t), I32);
                byte = p.alloc(TExpr::Binary(BinOp::Mul, byte, scale), I32, span);
            }
            parts = Some(match parts {
                None => byte,
                Some(acc) => p.alloc(TExpr::Binary(BinOp::Add, acc, byte), I32, span),
            });
        }
        let mut idx = wi.clone();
        let s4 = p.alloc(TExpr::Var(win.s), Ty::Index, span);
        let at = int(p, q, Ty::Index);
        idx[win.w.dim] = p.alloc(TExpr::Binary(BinOp::Add, s4, at), Ty::Index, span);
        let idx = packed_order(idx.len(), win.w.dim, Layout::Vectors).into_iter().map(|d| idx[d]).collect();
        let weights = p.alloc(TExpr::Load(packed, idx), I32, span);
        let parts = parts.expect("a word has parts");
        chain = p.alloc(TExpr::Intrinsic(word.intrinsic(), vec![chain, parts, weights]), I32, span);
    }
    let st = &mut p.stages[si];
    st.vars[s].extent = 1;
    st.vars[s].name = format!("{}{n}", st.vars[s].name);
    let TExpr::Reduce(op, vars, _) = p.expr(win.reduce).clone() else { unreachable!("a product is a sum") };
    let sum = p.alloc(TExpr::Reduce(op, vars, chain), I32, span);
    let value = p.stages[si].value;
    p.stages[si].value = replace_node(p, value, win.reduce, sum);
    si
}

/// Whether `vpmaddubsw` on operand `w` packed in bytes equals `vpdpbusd`:
/// its values are known, and no two neighbours along the packed dimension
/// (a superset of the pairs the instruction sums, whatever the packing's
/// start) can take a pair sum past 16 bits with any unsigned bytes beside
/// them — the positive weights of a pair sum to at most 128 and the
/// negative ones to at least −128 (`255 · 128 = 32640`; 129 would make
/// 32895). Weights quantized to 7 bits (ONNX Runtime's `reduce_range`)
/// always pass; full-range ones rarely do (MEASURED: about one pair in
/// seventy of a quantized ResNet-18 fails, in every layer).
fn pairs_cannot_saturate(p: &Program, w: &Operand, known: Known<'_>) -> bool {
    let decl = p.tensor(w.tensor);
    if decl.elem != ElemType::I8 || !p.input_tensors().any(|t| t == w.tensor) {
        return false;
    }
    let Some(values) = known(&decl.name) else { return false };
    let shape: Vec<usize> = decl.shape.iter().map(|&d| d as usize).collect();
    if values.len() != shape.iter().product::<usize>() {
        return false;
    }
    // Neighbours along `dim` lie `stride` apart in row-major order.
    let (n, stride) = (shape[w.dim], shape[w.dim + 1..].iter().product::<usize>());
    let fits = |x: i8, y: i8| {
        let (x, y) = (i32::from(x), i32::from(y));
        x.max(0) + y.max(0) <= 128 && x.min(0) + y.min(0) >= -128
    };
    (0..values.len()).filter(|i| (i / stride) % n + 1 < n).all(|i| fits(values[i], values[i + stride]))
}

/// Whether the signed operand `load` can be summed over the reduction
/// `vars` in a stage of its own: each index a plain variable, each
/// variable used once, every reduction variable among them.
fn summable(p: &Program, st: &Stage, load: TExprId, vars: &[VarId]) -> bool {
    let TExpr::Load(_, idx) = p.expr(load) else { return false };
    let plain: Vec<VarId> = idx
        .iter()
        .filter_map(|&i| match p.expr(i) {
            TExpr::Var(v) => Some(*v),
            _ => None,
        })
        .collect();
    let distinct = plain.iter().enumerate().all(|(i, v)| !plain[..i].contains(v));
    let axes_or_sums = plain.iter().all(|&v| (v as usize) < st.n_axes || vars.contains(&v));
    plain.len() == idx.len() && distinct && axes_or_sums && vars.iter().all(|v| plain.contains(v))
}

/// `load` as an operand packed along `k`: `k` alone is one of its indices,
/// and in no other; or `base + k` is, with `base` a multiple of the
/// elements per word and the dimension and `k`'s extent `len` too, so that
/// a word's group never straddles two values of `base`.
fn operand(p: &Program, (load, tensor): (TExprId, TensorId), k: VarId, len: i64, word: Word) -> Option<Operand> {
    let TExpr::Load(_, idx) = p.expr(load) else { return None };
    let is_k = |i: TExprId| matches!(p.expr(i), TExpr::Var(v) if *v == k);
    let dims: Vec<usize> = (0..idx.len()).filter(|&d| involves(p, idx[d], k)).collect();
    let [dim] = dims[..] else { return None };
    let base = match *p.expr(idx[dim]) {
        _ if is_k(idx[dim]) => None,
        TExpr::Binary(BinOp::Add, x, y) if is_k(y) || is_k(x) => {
            let base = if is_k(y) { x } else { y };
            let whole = p.tensor(tensor).shape[dim];
            let n = word.per_word();
            let aligned = multiple_of(p, base, n) && len % n == 0 && whole % n == 0 && !involves(p, base, k);
            if !aligned {
                return None;
            }
            Some(base)
        }
        _ => return None,
    };
    Some(Operand { load, tensor, dim, base })
}

/// Whether integer expression `e` is a multiple of `n` for every value of its variables.
fn multiple_of(p: &Program, e: TExprId, n: i64) -> bool {
    match *p.expr(e) {
        TExpr::Int(v) => v % n == 0,
        TExpr::Binary(BinOp::Mul, a, b) => multiple_of(p, a, n) || multiple_of(p, b, n),
        TExpr::Binary(BinOp::Add | BinOp::Sub, a, b) => multiple_of(p, a, n) && multiple_of(p, b, n),
        _ => false,
    }
}

/// Whether variable `k` occurs in `e` outside the sum `inside` (another sum
/// of the stage may reuse it, and its extent is about to change).
fn used_outside(p: &Program, e: TExprId, inside: TExprId, k: VarId) -> bool {
    if e == inside {
        return false;
    }
    match p.expr(e) {
        TExpr::Var(v) => *v == k,
        TExpr::Reduce(_, vars, _) if vars.contains(&k) => true,
        _ => p.children(e).into_iter().any(|c| used_outside(p, c, inside, k)),
    }
}

/// The signed operand's dimension of the columns where product `prod` of
/// stage `si` is one AMX's tiles run as it is (a matrix product, or a
/// convolution of stride 1: [`tile_axes`]) and where they pay
/// ([`worth_tiles`]). The CPU strategy's `tiles` then blocks the sum by
/// tiles of the row and column axes.
fn tile_product(p: &Program, si: usize, prod: &Product) -> Option<usize> {
    let st = &p.stages[si];
    let TExpr::Reduce(_, vars, _) = p.expr(prod.reduce) else { return None };
    if !worth_tiles(p, st, vars, prod) {
        return None;
    }
    let axes = tile_axes(p, st, vars, prod.k, (prod.a.load, prod.a.dim), (prod.w.load, prod.w.dim))?;
    let TExpr::Load(_, wi) = p.expr(prod.w.load) else { return None };
    wi.iter().position(|&i| plain_var(p, i) == Some(axes.col as VarId))
}

/// The variable `e` is, if it is one alone.
fn plain_var(p: &Program, e: TExprId) -> Option<VarId> {
    match p.expr(e) {
        TExpr::Var(v) => Some(*v),
        _ => None,
    }
}

/// Whether product `prod` (a sum over `vars` in stage `st`) pays for
/// packing its unsigned operand for tiles: its operands are packed whole
/// (not a grouped convolution's), its sum fills at least half of the
/// 64-byte rows it is padded to (three channels would fill 3 of 64
/// bytes), and, where packing moves the sum's dimension last (a
/// convolution's channels: a pass that scatters words, per call), it
/// makes at least [`MIN_TILE_REUSE`] products per element of that operand
/// and sums at least [`MIN_TILE_DEPTH`] products per output.
fn worth_tiles(p: &Program, st: &Stage, vars: &[VarId], prod: &Product) -> bool {
    let len = st.vars[prod.k as usize].extent;
    let dense = 2 * ((len + 3) / 4) >= packed_len(len, Word::Bytes, true);
    let extent = |v: usize| st.vars[v].extent as f64;
    let depth: f64 = vars.iter().map(|&v| extent(v as usize)).product();
    let products = (0..st.n_axes).map(extent).product::<f64>() * depth;
    let a = p.tensor(prod.a.tensor);
    let in_place = prod.a.dim + 1 == a.shape.len();
    let reused = in_place || (products >= MIN_TILE_REUSE * a.len().max(1) as f64 && depth >= MIN_TILE_DEPTH);
    prod.a.base.is_none() && prod.w.base.is_none() && dense && reused
}

/// Products per element of a convolution's input from which packing it
/// channels last for AMX tiles pays (MEASURED, 1 thread, AMX Xeon, int8
/// QDQ models, tiles for every convolution whose channels fill the rows
/// against this bound: MobileNetV2 5.28 → 4.61 ms, whose 1×1 convolutions
/// make 24–192 products per input byte, against 4.49 with none on tiles;
/// ResNet-18 5.63 → 5.06; a bound of 512 took ResNet-18 back to 5.54).
const MIN_TILE_REUSE: f64 = 128.0;

/// Products per output from which a convolution runs on tiles: a shorter
/// sum is a step or two of tile products per block, against a block's
/// transposing write-back and the tile unit's cost to the code around it
/// (MEASURED as [`MIN_TILE_REUSE`]: MobileNetV2 4.70 → 3.96 ms at 1 thread,
/// 2.84 → 2.66 at 2, its 1×1 convolutions from 32–96 channels back on
/// `vpdpbusd`; ResNet-50 20.2 → 17.7 and 11.7 → 10.8, the 1×1 convolutions
/// from 64 channels; ResNet-18 within noise).
const MIN_TILE_DEPTH: f64 = 256.0;

/// Whether stage `si` holds a sum [`tile_sum`] sees as AMX tiles'.
pub(crate) fn reads_tiles(p: &Program, si: usize) -> bool {
    let st = &p.stages[si];
    let mut stack = vec![st.value];
    while let Some(e) = stack.pop() {
        if tile_sum(p, st, e).is_some() {
            return true;
        }
        stack.extend(p.children(e));
    }
    false
}

/// The axes of `e` if it is a packed product laid out for AMX tiles in
/// stage `st`: `sum[k4, ..](@dot4(0, A.q4[.., k4], W.q4[.., k4, j]))` of
/// [`tile_axes`]' form, `k4` a multiple of 16 long.
pub(crate) fn tile_sum(p: &Program, st: &Stage, e: TExprId) -> Option<TileAxes> {
    let TExpr::Reduce(ReduceOp::Sum, vars, body) = p.expr(e) else { return None };
    let TExpr::Intrinsic(Intrinsic::Dot4, args) = p.expr(*body) else { return None };
    let [zero, a, w] = args.as_slice() else { return None };
    let (TExpr::Load(_, ai), TExpr::Load(_, wi)) = (p.expr(*a), p.expr(*w)) else { return None };
    let plain = |e: TExprId| plain_var(p, e);
    let k = plain(*ai.last()?)?;
    let whole_rows = vars.contains(&k) && st.vars[k as usize].extent % TILE_WORDS == 0;
    if !matches!(p.expr(*zero), TExpr::Int(0)) || !whole_rows || wi.len() < 2 {
        return None;
    }
    let axes = tile_axes(p, st, vars, k, (*a, ai.len() - 1), (*w, wi.len() - 2))?;
    (plain(wi[wi.len() - 1]) == Some(axes.col as VarId)).then_some(axes)
}

/// The signed operand of tile product stage `st` (its value [`tile_sum`]'s
/// form): the tensor its `W.q4[.., k4, j]` reads.
pub(crate) fn tile_signed_operand(p: &Program, st: &Stage) -> Option<TensorId> {
    tile_sum(p, st, st.value)?;
    let TExpr::Reduce(_, _, body) = p.expr(st.value) else { return None };
    let TExpr::Intrinsic(Intrinsic::Dot4, args) = p.expr(*body) else { return None };
    match p.expr(*args.get(2)?) {
        TExpr::Load(w, _) => Some(*w),
        _ => None,
    }
}

/// The stage's axes that an AMX tile product runs its rows and columns
/// along, and its packed sum.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TileAxes {
    /// The axis along the unsigned operand's rows (a tile row each).
    pub row: usize,
    /// The axis along the signed operand's columns.
    pub col: usize,
    /// The packed reduction variable, `k` (the tiles' 64-byte rows).
    pub sum: VarId,
}

/// The axis `j` of the signed operand `w`'s columns in the form AMX tiles
/// compute ([`tile_axes`]): `w` reads `k` alone at `w_dim`, `j` alone in
/// another dimension, and other reduction variables of `vars` alone in the rest.
fn tile_columns(p: &Program, st: &Stage, vars: &[VarId], k: VarId, (w, w_dim): (TExprId, usize)) -> Option<usize> {
    let TExpr::Load(_, wi) = p.expr(w) else { return None };
    if plain_var(p, *wi.get(w_dim)?) != Some(k) {
        return None;
    }
    let mut col = None;
    for i in wi.iter().enumerate().filter(|&(d, _)| d != w_dim).map(|(_, &i)| i) {
        match plain_var(p, i) {
            Some(v) if (v as usize) < st.n_axes && col.is_none() => col = Some(v as usize),
            Some(v) if v != k && vars.contains(&v) => {}
            _ => return None,
        }
    }
    col
}

/// The form AMX tiles compute, over the operands `a` (unsigned) and `w`
/// of a sum of byte products over `vars` in stage `st`, `k` the packed
/// variable, read at `a_dim` and `w_dim` (one predicate before packing
/// and after it):
/// - `w` reads `k` alone at `w_dim`, one axis `j` (the columns) alone in
///   another dimension, and other reduction variables alone in the rest
///   (a matrix `W[j, k]`, a filter `W[f, c, r, s]`);
/// - `a` reads `k` alone at `a_dim`, and the rows in its last other
///   dimension that moves with an axis: an axis `i` other than `j`, as `i` or `i + s`
///   with `s` another reduction variable (a matrix's `A[.., i, k]`, a
///   convolution's `X[n, c, y + r, x + s]` of stride 1); its other
///   indices involve neither `i`, `j` nor `k`.
///
/// Each sum over the other variables is then a tile product whose rows of
/// `a` are one index apart.
fn tile_axes(
    p: &Program,
    st: &Stage,
    vars: &[VarId],
    k: VarId,
    a: (TExprId, usize),
    w: (TExprId, usize),
) -> Option<TileAxes> {
    let (a, a_dim) = a;
    let TExpr::Load(_, ai) = p.expr(a) else { return None };
    let plain = |e: TExprId| plain_var(p, e);
    let axis = |v: VarId| (v as usize) < st.n_axes;
    let other_sum = |v: VarId| v != k && vars.contains(&v);
    if plain(*ai.get(a_dim)?) != Some(k) {
        return None;
    }
    let col = tile_columns(p, st, vars, k, w)? as VarId;
    let row_of = |e: TExprId| -> Option<VarId> {
        match *p.expr(e) {
            TExpr::Var(v) if axis(v) && v != col => Some(v),
            TExpr::Binary(BinOp::Add, x, y) => match (plain(x), plain(y)) {
                (Some(i), Some(s)) | (Some(s), Some(i)) if axis(i) && i != col && other_sum(s) => Some(i),
                _ => None,
            },
            _ => None,
        }
    };
    // The rows: the last dimension that moves with an axis (a convolution
    // of stride 2's `2·x + s` is none, and its `y` no better).
    let moves = |d: usize| (0..st.n_axes).any(|v| involves(p, ai[d], v as VarId));
    let rows_dim = (0..ai.len()).rev().find(|&d| d != a_dim && moves(d))?;
    let row = row_of(ai[rows_dim])?;
    // Fewer rows than half a tile reuse each 1 KiB tile of `w` too little
    // (ResNet-18's 7 × 7 maps: 0.59 ms a layer on tiles, 0.36–0.42 on `vpdpbusd`).
    if st.vars[row as usize].extent < TileDot::TILE / 2 {
        return None;
    }
    let free = |i: TExprId| [row, col, k].iter().all(|&v| !involves(p, i, v));
    let rest_free = ai.iter().enumerate().all(|(d, &i)| d == a_dim || d == rows_dim || free(i));
    rest_free.then_some(TileAxes { row: row as usize, col: col as usize, sum: k })
}

/// The axis of the filters `f` where product `prod` of stage `si` is a
/// convolution that AMX tiles run only once its rows are gathered
/// ([`gather_rows`]): one whose rows are not one index apart (stride 2's
/// `2·x + s`) or too few (a 7 × 7 map's rows of 7), with a stage's last two
/// axes `y, x` that the unsigned operand moves with and the signed one
/// does not, `f` another axis, the signed operand a filter
/// ([`tile_columns`]), and the sum at least half of its 64-byte rows.
fn gathered_rows(p: &Program, si: usize, prod: &Product) -> Option<usize> {
    let st = &p.stages[si];
    let n = st.n_axes;
    let TExpr::Reduce(_, vars, _) = p.expr(prod.reduce) else { return None };
    let TExpr::Load(_, ai) = p.expr(prod.a.load) else { return None };
    if n < 3 || !worth_tiles(p, st, vars, prod) {
        return None;
    }
    let f = tile_columns(p, st, vars, prod.k, (prod.w.load, prod.w.dim))?;
    let (y, x) = (n - 2, n - 1);
    let k_alone = plain_var(p, ai[prod.a.dim]) == Some(prod.k);
    let a_moves = |v: usize| ai.iter().any(|&i| involves(p, i, v as VarId));
    let rows = st.vars[y].extent * st.vars[x].extent;
    (k_alone && f < y && !a_moves(f) && a_moves(x) && rows >= TileDot::TILE / 2).then_some(f)
}

/// Product stage `si` on AMX tiles with its rows gathered: computed
/// filters-last over the map's positions as one axis
/// (`Y.t[n, p, f]`, `p = y · W + x`, the stage a copy back: as
/// [`crate::filters_last`] does, the filters read as they are), its
/// operands packed for tiles (the filters straight into
/// [`Layout::TileCols`], as a direct tile product's are), and the
/// unsigned operand's elements gathered per position
/// (`X.q4.rows[n, p, r, s, c4] = X.q4[n, 2·(p / W) + r, 2·(p % W) + s, c4]`:
/// runs of contiguous packed channels): each position a tile row, one
/// index apart, the rows of the whole map in a block. The stage index of
/// the product afterwards.
fn gather_rows(p: &mut Program, si: usize, f: usize, made: &mut Vec<(Packing, TensorId)>) -> usize {
    let n = p.stages[si].n_axes;
    let at = crate::filters_last::rewrite(p, si, f, Some((n - 2, n - 1)), None) - 1;
    let prod = find_product(p, at, Word::Bytes).expect("the product, its axes renamed");
    let last = (p.stages[at].n_axes - 1) as VarId;
    let TExpr::Load(_, wi) = p.expr(prod.w.load) else { unreachable!("an operand is a load") };
    let cols = wi.iter().position(|&i| plain_var(p, i) == Some(last)).expect("the filters' axis");
    let TExpr::Reduce(_, vars, _) = p.expr(prod.reduce).clone() else { unreachable!("a product is a sum") };
    let (at, packed) = rewrite(p, at, prod, Some(cols), made);
    insert_row_gather(p, at, packed, &vars)
}

/// A stage before product stage `at` gathering its packed unsigned
/// operand `load` (`A.q4[..]`, read in a sum over `vars`) by the variables
/// it moves with — the stage's axes, then the sum's other variables, then
/// the packed one, each in order — and the product reading that; the
/// product's stage index afterwards.
fn insert_row_gather(p: &mut Program, at: usize, load: TExprId, vars: &[VarId]) -> usize {
    let st = p.stages[at].clone();
    let TExpr::Load(t, idx) = p.expr(load).clone() else { unreachable!("an operand is a load") };
    let k = plain_var(p, *idx.last().expect("packed last")).expect("the packed variable indexes the last dimension");
    let moves = |v: VarId| v != k && idx.iter().any(|&i| involves(p, i, v));
    let axes = (0..st.n_axes as VarId).filter(|&v| moves(v));
    let order: Vec<VarId> = axes.chain(vars.iter().copied().filter(|&v| moves(v))).chain([k]).collect();
    let rename: std::collections::HashMap<VarId, VarId> =
        order.iter().enumerate().map(|(i, &v)| (v, i as VarId)).collect();
    let span = p.span(load);
    let gathered = subst(p, load, &Default::default(), &rename);
    let decl = p.tensor(t).clone();
    let vars: Vec<VarDecl> = order.iter().map(|&v| st.vars[v as usize].clone()).collect();
    let shape: Vec<i64> = vars.iter().map(|v| v.extent).collect();
    let name = fresh_name(p, &format!("{}.rows", decl.name));
    p.tensors.push(TensorDecl { name, elem: ElemType::I32, shape, role: TensorRole::Temp, span });
    let rows = TensorId(p.tensors.len() as u32 - 1);
    let n_axes = vars.len();
    insert_stage(p, at, Stage { tensor: rows, vars, n_axes, value: gathered, span });
    let index: Vec<TExprId> = order.iter().map(|&v| p.alloc(TExpr::Var(v), Ty::Index, span)).collect();
    let read = p.alloc(TExpr::Load(rows, index), I32, span);
    let value = p.stages[at + 1].value;
    p.stages[at + 1].value = replace_node(p, value, load, read);
    at + 1
}

/// `len` packed `word`'s elements to an `i32`, padded to whole tile rows where `tiles`.
fn packed_len(len: i64, word: Word, tiles: bool) -> i64 {
    let n = word.per_word();
    let words = (len + n - 1) / n;
    match tiles {
        true => (words + TILE_WORDS - 1) / TILE_WORDS * TILE_WORDS,
        false => words,
    }
}

/// Packed elements in one 64-byte row of an AMX tile.
const TILE_WORDS: i64 = 16;

/// Pack the product's operands (stages before `si`, shared with earlier
/// products packed alike; strided activations subsampled first,
/// [`crate::subsample`]) and make it read them; the stage index of the
/// product afterwards, and its load of the packed unsigned operand.
/// Where `tiles` (the signed operand's dimension of the columns), in the
/// layouts of AMX tiles ([`Layout::TileRows`], [`Layout::TileCols`]).
fn rewrite(
    p: &mut Program,
    mut si: usize,
    mut prod: Product,
    tiles: Option<usize>,
    made: &mut Vec<(Packing, TensorId)>,
) -> (usize, TExprId) {
    if tiles.is_none() {
        if let Some(sub) = crate::subsample::subsample(p, si, prod.a.load, Some(prod.k)) {
            prod.a.tensor = sub;
            si += 1;
        }
    }
    let k = prod.k as usize;
    let len = p.stages[si].vars[k].extent;
    let correction = match prod.offset {
        true => {
            let sum = insert_sum(p, si, prod.w.load, &prod);
            si += 1;
            Some(sum)
        }
        false => None,
    };
    let (la, lw) = match tiles {
        Some(cols) => (Layout::TileRows, Layout::TileCols { cols }),
        None => (Layout::Vectors, Layout::Vectors),
    };
    let mut packed =
        [(prod.a, prod.offset, la), (prod.w, false, lw)].map(|(o, offset, layout)| (o, offset, layout, TensorId(0)));
    for (o, offset, layout, out) in &mut packed {
        // A grouped operand packs its whole dimension (the groups read different parts).
        let whole = p.tensor(o.tensor).shape[o.dim];
        let len = if o.base.is_some() { whole } else { len };
        let key = Packing { tensor: o.tensor, dim: o.dim, len, offset: *offset, layout: *layout, word: prod.word };
        *out = match made.iter().find(|(m, _)| *m == key) {
            Some(&(_, t)) => t,
            None => {
                let t = insert_packing(p, si, key, o.load);
                si += 1;
                made.push((key, t));
                t
            }
        };
    }
    let st = &mut p.stages[si];
    let n = prod.word.per_word();
    st.vars[k].extent = packed_len(len, prod.word, tiles.is_some());
    st.vars[k].name = format!("{}{n}", st.vars[k].name);
    let span = p.span(prod.reduce);
    let [(a, _, la, pa), (w, _, lw, pw)] = packed;
    let load = |p: &mut Program, o: Operand, layout: Layout, t: TensorId| {
        let TExpr::Load(_, mut idx) = p.expr(o.load).clone() else { unreachable!("an operand is a load") };
        if let Some(base) = o.base {
            let per_word = p.alloc(TExpr::Int(n), Ty::Index, span);
            let word = p.alloc(TExpr::Binary(BinOp::FloorDiv, base, per_word), Ty::Index, span);
            let k = p.alloc(TExpr::Var(prod.k), Ty::Index, span);
            idx[o.dim] = p.alloc(TExpr::Binary(BinOp::Add, word, k), Ty::Index, span);
        }
        let idx = packed_order(idx.len(), o.dim, layout).into_iter().map(|d| idx[d]).collect();
        p.alloc(TExpr::Load(t, idx), I32, span)
    };
    let (la, lw) = (load(p, a, la, pa), load(p, w, lw, pw));
    let zero = p.alloc(TExpr::Int(0), I32, span);
    let dot = p.alloc(TExpr::Intrinsic(prod.dot, vec![zero, la, lw]), I32, span);
    let TExpr::Reduce(op, vars, _) = p.expr(prod.reduce).clone() else { unreachable!("a product is a sum") };
    let mut sum = p.alloc(TExpr::Reduce(op, vars, dot), I32, span);
    if let Some((w_sum, idx)) = correction {
        let added = p.alloc(TExpr::Load(w_sum, idx), I32, span);
        let offset = p.alloc(TExpr::Int(128), I32, span);
        let added = p.alloc(TExpr::Binary(BinOp::Mul, offset, added), I32, span);
        sum = p.alloc(TExpr::Binary(BinOp::Sub, sum, added), I32, span);
    }
    let value = p.stages[si].value;
    p.stages[si].value = replace_node(p, value, prod.reduce, sum);
    (si, la)
}

/// A stage before `at` summing the signed operand `load` over the
/// product's reduction variables (it is [`summable`]):
/// `W.sum[a..] = sum[r..](i32(W[..]))` over the operand's dimensions that
/// the product's axes index, in order; with the index the product reads it
/// by.
fn insert_sum(p: &mut Program, at: usize, load: TExprId, prod: &Product) -> (TensorId, Vec<TExprId>) {
    let TExpr::Load(w, idx) = p.expr(load).clone() else { unreachable!("an operand is a load") };
    let TExpr::Reduce(_, sums, _) = p.expr(prod.reduce).clone() else { unreachable!("a product is a sum") };
    let st = &p.stages[at];
    let var_of = |i: TExprId| match p.expr(i) {
        TExpr::Var(v) => *v,
        _ => unreachable!("summable: plain variables"),
    };
    let (axes, reduced): (Vec<usize>, Vec<usize>) = (0..idx.len()).partition(|&d| !sums.contains(&var_of(idx[d])));
    let decl = p.tensor(w).clone();
    let span = p.span(load);
    let shape: Vec<i64> = axes.iter().map(|&d| decl.shape[d]).collect();
    let mut vars: Vec<VarDecl> =
        axes.iter().map(|&d| VarDecl { name: format!("d{d}"), extent: decl.shape[d] }).collect();
    vars.extend(reduced.iter().map(|&d| st.vars[var_of(idx[d]) as usize].clone()));
    let read: Vec<TExprId> = axes.iter().map(|&d| idx[d]).collect();
    let name = fresh_name(p, &format!("{}.sum", decl.name));
    p.tensors.push(TensorDecl { name, elem: ElemType::I32, shape, role: TensorRole::Temp, span });
    let out = TensorId(p.tensors.len() as u32 - 1);
    // The stage's variables: its axes first, in `axes` order, then the sums.
    let stage_var = |d: usize| match axes.iter().position(|&a| a == d) {
        Some(i) => i,
        None => axes.len() + reduced.iter().position(|&r| r == d).expect("a reduced dimension"),
    };
    let index: Vec<TExprId> =
        (0..idx.len()).map(|d| p.alloc(TExpr::Var(stage_var(d) as VarId), Ty::Index, span)).collect();
    let elem = p.alloc(TExpr::Load(w, index), Ty::Elem(decl.elem), span);
    let wide = p.alloc(TExpr::Cast(elem), I32, span);
    let sum_vars: Vec<VarId> = (axes.len()..vars.len()).map(|v| v as VarId).collect();
    let value = p.alloc(TExpr::Reduce(ReduceOp::Sum, sum_vars, wide), I32, span);
    insert_stage(p, at, Stage { tensor: out, vars, n_axes: axes.len(), value, span });
    (out, read)
}

/// The original dimensions of a packed tensor, in its order: the packed
/// dimension first where it was the innermost one (so that the next one
/// becomes the contiguous one: `W[j, k]` is packed as `W.q4[k4, j]`, whose
/// rows of `j` are the vectors of a product's register block), else in place
/// (a convolution's `X[n, c, h, w]` as `X.q4[n, c4, h, w]`); for AMX
/// tiles, as [`Layout::TileRows`] and [`Layout::TileCols`] say.
fn packed_order(rank: usize, dim: usize, layout: Layout) -> Vec<usize> {
    match layout {
        Layout::TileRows => (0..rank).filter(|&d| d != dim).chain([dim]).collect(),
        Layout::TileCols { cols } => (0..rank).filter(|&d| d != dim && d != cols).chain([dim, cols]).collect(),
        Layout::Vectors if dim + 1 == rank => std::iter::once(dim).chain(0..dim).collect(),
        Layout::Vectors => (0..rank).collect(),
    }
}

/// A stage before `at` writing `key.tensor` packed along `key.dim`
/// (dimensions in [`packed_order`]):
/// `T.q4[.., q, ..] = Σ_t byte(T[.., 4q + t, ..]) · 256^t` over the first
/// `key.len` indices (bytes past them 0), each byte as the low 8 bits of the
/// element (`i8` through `u8`, so that it is not sign-extended into the
/// next), or an `i8` element plus 128 where `key.offset`; in halves,
/// `T.q2[.., q, ..] = Σ_t half(T[.., 2q + t, ..]) · 65536^t`
/// ([`packed_part`]).
fn insert_packing(p: &mut Program, at: usize, key: Packing, load: TExprId) -> TensorId {
    let decl = p.tensor(key.tensor).clone();
    let span = p.span(load);
    let order = packed_order(decl.shape.len(), key.dim, key.layout);
    let tiles = key.layout != Layout::Vectors;
    let n = key.word.per_word();
    let extent = |d: usize| if d == key.dim { packed_len(key.len, key.word, tiles) } else { decl.shape[d] };
    let shape: Vec<i64> = order.iter().map(|&d| extent(d)).collect();
    let name = fresh_name(p, &format!("{}.q{n}", decl.name));
    p.tensors.push(TensorDecl { name, elem: ElemType::I32, shape: shape.clone(), role: TensorRole::Temp, span });
    let packed = TensorId(p.tensors.len() as u32 - 1);
    let int = |p: &mut Program, v: i64, ty: Ty| p.alloc(TExpr::Int(v), ty, span);
    // The stage variable of original dimension `d`.
    let var = |p: &mut Program, d: usize| {
        let v = order.iter().position(|&o| o == d).expect("a permutation");
        p.alloc(TExpr::Var(v as VarId), Ty::Index, span)
    };
    let per_word = int(p, n, Ty::Index);
    let q = var(p, key.dim);
    let base = p.alloc(TExpr::Binary(BinOp::Mul, q, per_word), Ty::Index, span);
    let mut value = None;
    for t in 0..n {
        let off = int(p, t, Ty::Index);
        let at_t = p.alloc(TExpr::Binary(BinOp::Add, base, off), Ty::Index, span);
        let idx: Vec<TExprId> = (0..decl.shape.len()).map(|d| if d == key.dim { at_t } else { var(p, d) }).collect();
        let elem = p.alloc(TExpr::Load(key.tensor, idx), Ty::Elem(decl.elem), span);
        let mut byte = packed_part(p, key, elem, t + 1 == n);
        if t > 0 {
            let scale = int(p, 1 << (32 / n * t), I32);
            byte = p.alloc(TExpr::Binary(BinOp::Mul, byte, scale), I32, span);
        }
        if n * (extent(key.dim) - 1) + t >= key.len {
            let end = int(p, key.len, Ty::Index);
            let inside = p.alloc(TExpr::Binary(BinOp::Lt, at_t, end), Ty::Elem(ElemType::Bool), span);
            let zero = int(p, 0, I32);
            byte = p.alloc(TExpr::Select(inside, byte, zero), I32, span);
        }
        value = Some(match value {
            None => byte,
            Some(acc) => p.alloc(TExpr::Binary(BinOp::Add, acc, byte), I32, span),
        });
    }
    let vars: Vec<VarDecl> =
        order.iter().zip(&shape).map(|(&d, &extent)| VarDecl { name: format!("d{d}"), extent }).collect();
    let n_axes = vars.len();
    insert_stage(p, at, Stage { tensor: packed, vars, n_axes, value: value.expect("a word's parts"), span });
    packed
}

/// One element `elem` of a packed word as the `i32` whose low bits are its
/// part: in bytes, its low 8 bits (`i8` through `u8`, so that it is not
/// sign-extended into the next byte), or an `i8` plus 128 where
/// `key.offset`; in halves, the element widened to 16 bits, an `i8` that
/// is not the word's `top` part taken modulo 2¹⁶ (so that its sign does
/// not reach the next half; the top half's multiplication by 2¹⁶ wraps,
/// so it needs nothing).
fn packed_part(p: &mut Program, key: Packing, elem: TExprId, top: bool) -> TExprId {
    let span = p.span(elem);
    let signed = p.ty(elem) == Ty::Elem(ElemType::I8);
    let wide = |p: &mut Program| p.alloc(TExpr::Cast(elem), I32, span);
    match (key.word, signed) {
        (_, false) => wide(p),
        (Word::Halves, true) if top => wide(p),
        (Word::Halves, true) => {
            // `x + (x < 0 ? 2¹⁶ : 0)`: `x mod 2¹⁶` as an add of a blend
            // that vectorizes (a floor modulo of a signed value is a
            // division's fix-up, and a select between two loads became
            // lane-by-lane masked loads: the weights' pack ran 15× slower).
            let x = wide(p);
            let zero = p.alloc(TExpr::Int(0), I32, span);
            let negative = p.alloc(TExpr::Binary(BinOp::Lt, x, zero), Ty::Elem(ElemType::Bool), span);
            let m = p.alloc(TExpr::Int(1 << 16), I32, span);
            let up = p.alloc(TExpr::Select(negative, m, zero), I32, span);
            p.alloc(TExpr::Binary(BinOp::Add, x, up), I32, span)
        }
        (Word::Bytes, true) if key.offset => {
            let x = wide(p);
            let offset = p.alloc(TExpr::Int(128), I32, span);
            p.alloc(TExpr::Binary(BinOp::Add, x, offset), I32, span)
        }
        (Word::Bytes, true) => {
            let low = p.alloc(TExpr::Cast(elem), Ty::Elem(ElemType::U8), span);
            p.alloc(TExpr::Cast(low), I32, span)
        }
    }
}
