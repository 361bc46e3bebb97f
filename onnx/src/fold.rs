//! Constant evaluation of the nodes exporters write around shapes and masks:
//! comparisons, logic, `Where`, casts, integer and f32 arithmetic, `Expand`,
//! `Transpose` and `Trilu` of constants, computed at import time so that the
//! kernel sees their results as constants (an `Expand` shape, a causal mask).
//!
//! Invariants: every result is exactly what ONNX defines, element by element
//! (integers exact, comparisons and selections exact, f32 arithmetic done in
//! f64 and rounded once to f32, as the interpreter does a single operation);
//! an operation this module cannot evaluate exactly is an error, and the node
//! is then refused rather than approximated.

use crate::proto::data_type;
use crate::Values;

type R<T = ()> = Result<T, String>;

/// One element of constant data.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Cell {
    F(f64),
    I(i64),
    B(bool),
}

impl Cell {
    fn f(self) -> f64 {
        match self {
            Cell::F(x) => x,
            Cell::I(x) => x as f64,
            Cell::B(x) => x as u8 as f64,
        }
    }
}

pub(crate) fn cells(v: &Values) -> Vec<Cell> {
    match v {
        Values::F32(d) => d.iter().map(|&x| Cell::F(x as f64)).collect(),
        Values::F64(d) => d.iter().map(|&x| Cell::F(x)).collect(),
        Values::I64(d) => d.iter().map(|&x| Cell::I(x)).collect(),
        Values::Bool(d) => d.iter().map(|&x| Cell::B(x)).collect(),
        Values::I8(_) | Values::U8(_) | Values::I32(_) => {
            v.as_wide_ints().expect("integer data").into_iter().map(Cell::I).collect()
        }
    }
}

/// Cells back into data of `like`'s kind: floats rounded to f32.
pub(crate) fn values(c: &[Cell], like: &Values) -> R<Values> {
    Ok(match like {
        Values::F32(_) | Values::F64(_) => Values::F32(c.iter().map(|x| x.f() as f32).collect()),
        Values::I64(_) => Values::I64(
            c.iter()
                .map(|x| if let Cell::I(i) = x { Ok(*i) } else { Err("mixed element types".to_string()) })
                .collect::<R<_>>()?,
        ),
        Values::Bool(_) => Values::Bool(
            c.iter()
                .map(|x| if let Cell::B(b) = x { Ok(*b) } else { Err("mixed element types".to_string()) })
                .collect::<R<_>>()?,
        ),
        // Quantized data is only moved (reshaped, transposed, gathered), so
        // every cell fits the type it came from.
        Values::I8(_) | Values::U8(_) | Values::I32(_) => {
            let ints = c
                .iter()
                .map(|x| if let Cell::I(i) = x { Ok(*i) } else { Err("mixed element types".to_string()) })
                .collect::<R<Vec<i64>>>()?;
            match like {
                Values::I8(_) => Values::I8(ints.iter().map(|&i| i as i8).collect()),
                Values::U8(_) => Values::U8(ints.iter().map(|&i| i as u8).collect()),
                _ => Values::I32(ints.iter().map(|&i| i as i32).collect()),
            }
        }
    })
}

/// Whether `elementwise` evaluates `op`.
pub(crate) fn is_elementwise(op: &str) -> bool {
    arity(op).is_some()
}

fn arity(op: &str) -> Option<usize> {
    Some(match op {
        "Not" | "Neg" | "Abs" | "Sqrt" | "Reciprocal" => 1,
        "Where" => 3,
        "Equal" | "Less" | "Greater" | "LessOrEqual" | "GreaterOrEqual" | "And" | "Or" | "Xor" | "Add" | "Sub"
        | "Mul" | "Div" | "Pow" | "Max" | "Min" | "Mod" => 2,
        _ => return None,
    })
}

/// The element-wise operator `op` of ONNX over broadcast operands; `None`
/// when it is not one this module evaluates.
pub(crate) fn elementwise(op: &str, operands: &[(Values, Vec<usize>)]) -> R<Option<(Vec<usize>, Values)>> {
    let Some(arity) = arity(op) else {
        return Ok(None);
    };
    if operands.len() != arity {
        return Err(format!("has {} inputs, expected {arity}", operands.len()));
    }
    let mut shape: Vec<usize> = Vec::new();
    for (_, s) in operands {
        shape = crate::ops::broadcast(&shape, s)?;
    }
    let count = crate::elements(&shape).filter(|&c| c <= 1 << 26).ok_or("too many elements for a constant")?;
    let data: Vec<Vec<Cell>> = operands.iter().map(|(v, _)| cells(v)).collect();
    let at: Vec<Vec<usize>> = operands.iter().map(|(_, s)| crate::ops::broadcast_positions(s, &shape)).collect();
    let float = operands.iter().any(|(v, _)| matches!(v, Values::F32(_) | Values::F64(_)));
    let mut out = Vec::with_capacity(count);
    for k in 0..count {
        let x: Vec<Cell> = (0..arity).map(|j| data[j][at[j][k]]).collect();
        out.push(apply(op, &x, float)?);
    }
    let like = match op {
        "Equal" | "Less" | "Greater" | "LessOrEqual" | "GreaterOrEqual" | "And" | "Or" | "Xor" | "Not" => {
            Values::Bool(vec![])
        }
        "Where" => operands[1].0.clone(),
        _ if float => Values::F32(vec![]),
        _ => operands[0].0.clone(),
    };
    Ok(Some((shape, values(&out, &like)?)))
}

fn apply(op: &str, x: &[Cell], float: bool) -> R<Cell> {
    use Cell::*;
    let cmp = |o: std::cmp::Ordering| -> R<Cell> {
        let ord = match (x[0], x[1]) {
            (I(a), I(b)) => a.cmp(&b),
            (B(_), _) | (_, B(_)) if op != "Equal" => return Err("an ordered comparison of bools".into()),
            (a, b) => a.f().partial_cmp(&b.f()).ok_or("a comparison with NaN")?,
        };
        Ok(B(match op {
            "Equal" => ord == std::cmp::Ordering::Equal,
            "LessOrEqual" => ord != std::cmp::Ordering::Greater,
            "GreaterOrEqual" => ord != std::cmp::Ordering::Less,
            _ => ord == o,
        }))
    };
    let logic = |f: fn(bool, bool) -> bool| match (x[0], x.get(1).copied().unwrap_or(B(false))) {
        (B(a), B(b)) => Ok(B(f(a, b))),
        _ => Err("logic operators take bools".to_string()),
    };
    // f32 arithmetic: in f64, rounded once to f32 by `values` (exact for
    // + − × ÷ √, whose f64 results round to the correctly rounded f32).
    let arith = |fi: fn(i64, i64) -> Option<i64>, ff: fn(f64, f64) -> f64| -> R<Cell> {
        match (x[0], x[1]) {
            (I(a), I(b)) if !float => {
                fi(a, b).map(I).ok_or_else(|| format!("integer overflow or division by zero: {a} and {b}"))
            }
            (a, b) if float => Ok(F(ff(a.f() as f32 as f64, b.f() as f32 as f64))),
            _ => Err("operands of different element types".into()),
        }
    };
    match op {
        "Equal" => cmp(std::cmp::Ordering::Equal),
        "Less" => cmp(std::cmp::Ordering::Less),
        "Greater" => cmp(std::cmp::Ordering::Greater),
        "LessOrEqual" | "GreaterOrEqual" => cmp(std::cmp::Ordering::Equal),
        "And" => logic(|a, b| a && b),
        "Or" => logic(|a, b| a || b),
        "Xor" => logic(|a, b| a != b),
        "Not" => logic(|a, _| !a),
        "Where" => match x[0] {
            B(c) => Ok(if c { x[1] } else { x[2] }),
            _ => Err("the condition of a Where must be bool".into()),
        },
        "Add" => arith(i64::checked_add, |a, b| a + b),
        "Sub" => arith(i64::checked_sub, |a, b| a - b),
        "Mul" => arith(i64::checked_mul, |a, b| a * b),
        // ONNX's integer Div truncates toward zero, as Rust's.
        "Div" => arith(i64::checked_div, |a, b| a / b),
        "Max" => arith(|a, b| Some(a.max(b)), f64::max),
        "Min" => arith(|a, b| Some(a.min(b)), f64::min),
        "Mod" if !float => {
            arith(|a, b| a.checked_rem(b).map(|r| if r != 0 && (r < 0) != (b < 0) { r + b } else { r }), f64::max)
        }
        "Pow" if float => arith(|_, _| None, f64::powf),
        "Neg" => match x[0] {
            I(a) => a.checked_neg().map(I).ok_or_else(|| "integer overflow".into()),
            F(a) => Ok(F(-a)),
            B(_) => Err("Neg of bools".into()),
        },
        "Abs" => match x[0] {
            I(a) => a.checked_abs().map(I).ok_or_else(|| "integer overflow".into()),
            F(a) => Ok(F(a.abs())),
            B(_) => Err("Abs of bools".into()),
        },
        "Sqrt" if float => Ok(F((x[0].f() as f32 as f64).sqrt())),
        "Reciprocal" if float => Ok(F(1.0 / (x[0].f() as f32 as f64))),
        _ => Err(format!("{op} of these element types cannot be computed at import")),
    }
}

/// `Cast` of constant data to ONNX type `to`: f32, int64/int32 (floats
/// truncate toward zero, as ONNX Runtime does), bool (`!= 0`).
pub(crate) fn cast(data: &Values, to: i32) -> R<Values> {
    let c = cells(data);
    Ok(match to {
        data_type::FLOAT => Values::F32(c.iter().map(|x| x.f() as f32).collect()),
        data_type::INT64 | data_type::INT32 => Values::I64(
            c.iter()
                .map(|x| match *x {
                    Cell::I(i) => Ok(if to == data_type::INT32 { i as i32 as i64 } else { i }),
                    Cell::B(b) => Ok(b as i64),
                    Cell::F(f) if f.is_finite() && f.abs() < 9.2e18 => Ok(f.trunc() as i64),
                    Cell::F(f) => Err(format!("{f} does not fit an integer")),
                })
                .collect::<R<_>>()?,
        ),
        data_type::BOOL => Values::Bool(c.iter().map(|x| x.f() != 0.0).collect()),
        other => return Err(format!("a cast to {} is not supported", data_type::name(other))),
    })
}

/// Row-major strides of `shape`.
pub(crate) fn strides(shape: &[usize]) -> Vec<usize> {
    let mut st = vec![1; shape.len()];
    for k in (0..shape.len().saturating_sub(1)).rev() {
        st[k] = st[k + 1] * shape[k + 1];
    }
    st
}

/// For each element of the transposed tensor, the flat position it reads.
pub(crate) fn transpose_positions(xs: &[usize], perm: &[usize]) -> Vec<usize> {
    let shape: Vec<usize> = perm.iter().map(|&p| xs[p]).collect();
    let (sx, so) = (strides(xs), strides(&shape));
    let count: usize = shape.iter().product();
    (0..count)
        .map(|flat| {
            let mut pos = 0;
            for (k, &p) in perm.iter().enumerate() {
                pos += (flat / so[k]) % shape[k] * sx[p];
            }
            pos
        })
        .collect()
}

/// `Trilu`: which elements of the last two axes are kept (the rest become 0).
pub(crate) fn trilu_keeps(row: usize, col: usize, k: i64, upper: bool) -> bool {
    let d = col as i64 - row as i64;
    if upper {
        d >= k
    } else {
        d <= k
    }
}

/// A zero of the data's kind (what `Trilu` writes outside its triangle).
pub(crate) fn zero_like(v: &Values) -> Cell {
    match v {
        Values::F32(_) | Values::F64(_) => Cell::F(0.0),
        Values::I64(_) => Cell::I(0),
        Values::Bool(_) => Cell::B(false),
        Values::I8(_) | Values::U8(_) | Values::I32(_) => Cell::I(0),
    }
}

/// The flat offset of the leading-axes index `tuple` (ScatterND's and
/// GatherND's indices; negative ones count from the end) in a tensor of
/// shape `xs` with strides `st`; an index outside its axis is an error.
pub(crate) fn offset_of(tuple: &[i64], xs: &[usize], st: &[usize]) -> Result<usize, String> {
    let mut base = 0;
    for (j, &t) in tuple.iter().enumerate() {
        let d = xs[j] as i64;
        if !(-d..d).contains(&t) {
            return Err(format!("index {t} is outside an axis of {d}"));
        }
        base += t.rem_euclid(d) as usize * st[j];
    }
    Ok(base)
}
