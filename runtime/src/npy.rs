//! `.npy` reading and writing through `npyz`.
//!
//! Accepted: little-endian (or byte-order-free) arrays of the texc dtypes in
//! C order. Anything else is a [`NpyError`] naming what was found.

use crate::{DType, Data, Tensor};
use half::{bf16, f16};
use std::fs::File;
use std::io::{BufReader, BufWriter, Read};
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum NpyError {
    #[error("cannot open `{path}`: {source}")]
    Open { path: String, source: std::io::Error },
    #[error("`{path}` is not a valid .npy file: {reason}")]
    Malformed { path: String, reason: String },
    #[error(
        "`{path}` holds dtype `{descr}`, which texc does not read (expected one of <f2 <f4 <f8 |i1 |u1 <i4 <i8 |b1)"
    )]
    UnsupportedDType { path: String, descr: String },
    #[error("`{path}` is in Fortran order; save it with numpy.ascontiguousarray first")]
    FortranOrder { path: String },
    #[error("cannot write `{path}`: {source}")]
    Write { path: String, source: std::io::Error },
}

fn dtype_of(descr: &str) -> Option<DType> {
    Some(match descr {
        "<f2" => DType::F16,
        "<f4" => DType::F32,
        "<f8" => DType::F64,
        "|i1" | "<i1" => DType::I8,
        "|u1" | "<u1" => DType::U8,
        "<i4" => DType::I32,
        "<i8" => DType::I64,
        "|b1" | "<b1" => DType::Bool,
        _ => return None,
    })
}

/// Read a `.npy` file.
pub fn read_npy(path: &Path) -> Result<Tensor, NpyError> {
    let shown = path.display().to_string();
    let file = File::open(path).map_err(|source| NpyError::Open { path: shown.clone(), source })?;
    let mut bytes = Vec::new();
    BufReader::new(file).read_to_end(&mut bytes).map_err(|source| NpyError::Open { path: shown.clone(), source })?;
    read_npy_bytes(&bytes, &shown)
}

/// Parse `.npy` bytes; `name` is used in messages.
pub fn read_npy_bytes(bytes: &[u8], name: &str) -> Result<Tensor, NpyError> {
    let malformed = |reason: String| NpyError::Malformed { path: name.to_string(), reason };
    let npy = npyz::NpyFile::new(bytes).map_err(|e| malformed(e.to_string()))?;
    let descr = match npy.dtype() {
        npyz::DType::Plain(ts) => ts.to_string(),
        other => return Err(NpyError::UnsupportedDType { path: name.to_string(), descr: other.descr() }),
    };
    let dtype = dtype_of(&descr).ok_or_else(|| NpyError::UnsupportedDType { path: name.to_string(), descr })?;
    if npy.order() == npyz::Order::Fortran && npy.shape().len() > 1 {
        return Err(NpyError::FortranOrder { path: name.to_string() });
    }
    let shape: Vec<usize> = npy.shape().iter().map(|&d| d as usize).collect();
    let n =
        shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).ok_or_else(|| malformed("shape overflows".into()))?;
    let available = bytes.len() as u64;
    if (n as u64).saturating_mul(dtype.size() as u64) > available {
        return Err(malformed(format!("the header promises {n} elements but the file is only {available} bytes")));
    }
    let rd = |e: std::io::Error| malformed(e.to_string());
    let data = match dtype {
        DType::F16 => Data::F16(npy.into_vec::<f16>().map_err(rd)?),
        DType::F32 => Data::F32(npy.into_vec::<f32>().map_err(rd)?),
        DType::F64 => Data::F64(npy.into_vec::<f64>().map_err(rd)?),
        DType::I8 => Data::I8(npy.into_vec::<i8>().map_err(rd)?),
        DType::U8 => Data::U8(npy.into_vec::<u8>().map_err(rd)?),
        DType::I32 => Data::I32(npy.into_vec::<i32>().map_err(rd)?),
        DType::I64 => Data::I64(npy.into_vec::<i64>().map_err(rd)?),
        DType::Bool => Data::Bool(npy.into_vec::<bool>().map_err(rd)?),
        DType::BF16 => unreachable!("no .npy descriptor maps to bf16"),
    };
    let t = Tensor { shape, data };
    if t.len() != n {
        return Err(malformed(format!("expected {n} elements, found {}", t.len())));
    }
    Ok(t)
}

/// Write a tensor as `.npy`. `bf16`, which NumPy has no type for, is written as `<f4`.
pub fn write_npy(path: &Path, t: &Tensor) -> Result<(), NpyError> {
    let shown = path.display().to_string();
    let err = |source: std::io::Error| NpyError::Write { path: shown.clone(), source };
    let file = File::create(path).map_err(err)?;
    let shape: Vec<u64> = t.shape.iter().map(|&d| d as u64).collect();
    let w = BufWriter::new(file);
    fn put<T: npyz::AutoSerialize, W: std::io::Write>(
        w: W,
        shape: &[u64],
        v: impl IntoIterator<Item = T>,
    ) -> std::io::Result<()> {
        use npyz::WriterBuilder;
        let mut wr = npyz::WriteOptions::<T>::new().default_dtype().shape(shape).writer(w).begin_nd()?;
        wr.extend(v)?;
        wr.finish()
    }
    match &t.data {
        Data::F16(v) => put(w, &shape, v.iter().copied()),
        Data::BF16(v) => put(w, &shape, v.iter().map(|x: &bf16| x.to_f32())),
        Data::F32(v) => put(w, &shape, v.iter().copied()),
        Data::F64(v) => put(w, &shape, v.iter().copied()),
        Data::I8(v) => put(w, &shape, v.iter().copied()),
        Data::U8(v) => put(w, &shape, v.iter().copied()),
        Data::I32(v) => put(w, &shape, v.iter().copied()),
        Data::I64(v) => put(w, &shape, v.iter().copied()),
        Data::Bool(v) => put(w, &shape, v.iter().copied()),
    }
    .map_err(err)
}
