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
    #[error("`{path}` is not a valid .npz archive: {reason}")]
    NpzMalformed { path: String, reason: String },
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
    read_npy_limited(path, u64::MAX)
}

/// Longest `.npy` header texc reads (NumPy writes a few hundred bytes).
const MAX_HEADER: usize = 1 << 20;

/// Read a `.npy` file whose data takes at most `max_bytes`: the header is
/// read first, then exactly the bytes it promises, so that neither a huge
/// array nor an endless file (`/dev/zero`) is read into memory.
pub fn read_npy_limited(path: &Path, max_bytes: u64) -> Result<Tensor, NpyError> {
    let shown = path.display().to_string();
    let open = |source: std::io::Error| NpyError::Open { path: shown.clone(), source };
    let malformed = |reason: String| NpyError::Malformed { path: shown.clone(), reason };
    let file = File::open(path).map_err(open)?;
    let file_len = file.metadata().ok().filter(|m| m.is_file()).map(|m| m.len());
    let mut r = BufReader::new(file);
    // Magic, version, header length (2 bytes in version 1, 4 after).
    let mut prefix = [0u8; 12];
    r.read_exact(&mut prefix[..10]).map_err(|_| malformed("too short for a .npy header".into()))?;
    if &prefix[..6] != b"\x93NUMPY" {
        return Err(malformed("it does not start with the .npy magic `\\x93NUMPY`".into()));
    }
    let (fixed, header_len) = if prefix[6] == 1 {
        (10, u16::from_le_bytes([prefix[8], prefix[9]]) as usize)
    } else {
        r.read_exact(&mut prefix[10..12]).map_err(|_| malformed("truncated header".into()))?;
        (12, u32::from_le_bytes([prefix[8], prefix[9], prefix[10], prefix[11]]) as usize)
    };
    if header_len > MAX_HEADER {
        return Err(malformed(format!("its header claims {header_len} bytes")));
    }
    let mut bytes = prefix[..fixed].to_vec();
    bytes.resize(fixed + header_len, 0);
    r.read_exact(&mut bytes[fixed..]).map_err(|_| malformed("truncated header".into()))?;
    let header = npyz::NpyFile::new(&bytes[..]).map_err(|e| malformed(e.to_string()))?;
    let size = match header.dtype() {
        npyz::DType::Plain(ts) => ts.size_field() as u64,
        other => return Err(NpyError::UnsupportedDType { path: shown.clone(), descr: other.descr() }),
    };
    let data = header
        .shape()
        .iter()
        .try_fold(size, |a, &d| a.checked_mul(d))
        .ok_or_else(|| malformed("its shape overflows".into()))?;
    if data > max_bytes {
        return Err(malformed(format!(
            "its {} of data exceed the memory available to this run ({})",
            crate::memory::human(data),
            crate::memory::human(max_bytes)
        )));
    }
    let total = bytes.len() as u64 + data;
    if let Some(len) = file_len.filter(|&len| len < total) {
        return Err(malformed(format!("the header promises {data} bytes of data but the file is only {len} bytes")));
    }
    let data = usize::try_from(data).map_err(|_| malformed("too large for this machine".into()))?;
    bytes.try_reserve_exact(data).map_err(|_| malformed(format!("cannot allocate {data} bytes for it")))?;
    r.take(data as u64).read_to_end(&mut bytes).map_err(open)?;
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
    // Written beside the target and renamed over it: concurrent writers never tear the file.
    crate::atomic::write_with(path, |file| {
        let mut w = BufWriter::new(file);
        write_npy_to(&mut w, t)?;
        std::io::Write::flush(&mut w)
    })
    .map_err(err)
}

/// Write a tensor in `.npy` format to `w` (as [`write_npy`] does to a file).
pub(crate) fn write_npy_to<W: std::io::Write>(w: &mut W, t: &Tensor) -> std::io::Result<()> {
    let shape: Vec<u64> = t.shape.iter().map(|&d| d as u64).collect();
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
        Data::F16(v) => put(&mut *w, &shape, v.iter().copied()),
        Data::BF16(v) => put(&mut *w, &shape, v.iter().map(|x: &bf16| x.to_f32())),
        Data::F32(v) => put(&mut *w, &shape, v.iter().copied()),
        Data::F64(v) => put(&mut *w, &shape, v.iter().copied()),
        Data::I8(v) => put(&mut *w, &shape, v.iter().copied()),
        Data::U8(v) => put(&mut *w, &shape, v.iter().copied()),
        Data::I32(v) => put(&mut *w, &shape, v.iter().copied()),
        Data::I64(v) => put(&mut *w, &shape, v.iter().copied()),
        Data::Bool(v) => put(&mut *w, &shape, v.iter().copied()),
    }
}
