//! texc runtime: typed host tensors and their `.npy` files, aligned buffers
//! for generated code, and the thread pool its parallel loops run on.
//!
//! Pipeline position: last. The interpreter and the JIT backends read
//! inputs and write outputs as [`Tensor`]s. Every malformed file is a
//! [`NpyError`], never a panic. [`cuda`] reaches NVIDIA GPUs through the
//! driver API, loaded at run time.

pub mod amx;
pub mod atomic;
mod buffer;
pub mod cuda;
pub mod local;
pub mod memory;
mod npy;
mod npz;
pub mod pool;
mod random;
pub mod roofline;

pub use buffer::{AlignedBuf, OutOfMemory, ALIGN};
pub use npy::{read_npy, read_npy_bytes, read_npy_limited, write_npy, NpyError};
pub use npz::{read_npz_limited, write_npz};
pub use random::SplitMix64;

use half::{bf16, f16};
use std::fmt;

/// Element types of tensors and scalars (LANGUAGE.md §2), shared by every layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    F16,
    BF16,
    F32,
    F64,
    I8,
    U8,
    I32,
    I64,
    Bool,
}

impl DType {
    pub const ALL: [DType; 9] =
        [DType::F16, DType::BF16, DType::F32, DType::F64, DType::I8, DType::U8, DType::I32, DType::I64, DType::Bool];

    pub fn from_name(s: &str) -> Option<DType> {
        DType::ALL.iter().copied().find(|t| t.name() == s)
    }

    pub fn is_int(self) -> bool {
        matches!(self, DType::I8 | DType::U8 | DType::I32 | DType::I64)
    }

    /// Size of one element in bytes.
    pub fn size(self) -> usize {
        match self {
            DType::I8 | DType::U8 | DType::Bool => 1,
            DType::F16 | DType::BF16 => 2,
            DType::F32 | DType::I32 => 4,
            DType::F64 | DType::I64 => 8,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::I8 => "i8",
            DType::U8 => "u8",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::Bool => "bool",
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::F16 | DType::BF16 | DType::F32 | DType::F64)
    }

    /// The integers an integer or bool element holds, as the bounds a
    /// number given from outside (a scalar argument) must lie within;
    /// `None` for floats.
    pub fn integer_range(self) -> Option<(f64, f64)> {
        match self {
            DType::Bool => Some((0.0, 1.0)),
            DType::I8 => Some((i8::MIN as f64, i8::MAX as f64)),
            DType::U8 => Some((0.0, u8::MAX as f64)),
            DType::I32 => Some((i32::MIN as f64, i32::MAX as f64)),
            DType::I64 => Some((-(2f64.powi(63)), 2f64.powi(63) - 1.0)),
            DType::F16 | DType::BF16 | DType::F32 | DType::F64 => None,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Element storage, one variant per [`DType`].
#[derive(Clone, Debug, PartialEq)]
pub enum Data {
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    F32(Vec<f32>),
    F64(Vec<f64>),
    I8(Vec<i8>),
    U8(Vec<u8>),
    I32(Vec<i32>),
    I64(Vec<i64>),
    Bool(Vec<bool>),
}

/// A dense, row-major host tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: Data,
}

/// Round an `f64` to the precision of a float dtype (identity for f64).
pub fn round_to(dtype: DType, v: f64) -> f64 {
    match dtype {
        DType::F16 => f16::from_f64(v).to_f64(),
        DType::BF16 => bf16::from_f64(v).to_f64(),
        DType::F32 => v as f32 as f64,
        _ => v,
    }
}

/// Wrap an integer to the range of an integer dtype (two's complement).
pub fn wrap_to(dtype: DType, v: i64) -> i64 {
    match dtype {
        DType::I8 => v as i8 as i64,
        DType::U8 => v as u8 as i64,
        DType::I32 => v as i32 as i64,
        DType::Bool => (v != 0) as i64,
        _ => v,
    }
}

/// The offsets within `bytes` of the whole pages of memory inside it (empty
/// where it holds none, or off Linux): what `madvise` may be given.
pub fn whole_pages(bytes: &[u8]) -> std::ops::Range<usize> {
    #[cfg(target_os = "linux")]
    // SAFETY: sysconf has no preconditions.
    let page = (unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).max(1) as usize;
    #[cfg(not(target_os = "linux"))]
    let page = bytes.len() + 1;
    let start = bytes.as_ptr() as usize;
    let first = start.checked_next_multiple_of(page).map_or(bytes.len(), |a| (a - start).min(bytes.len()));
    first..first + (bytes.len() - first) / page * page
}

/// Zero `pages` (whole pages of memory this process owns) by giving them
/// back to the system, which maps zeroed pages in when they are touched again.
fn release_pages(pages: &mut [u8]) {
    if pages.is_empty() {
        return;
    }
    #[cfg(target_os = "linux")]
    {
        // SAFETY: `pages` is whole pages of private memory borrowed mutably;
        // MADV_DONTNEED on private anonymous memory makes the next access
        // see zero-filled pages, the same as the `fill(0)` below.
        let done = unsafe { libc::madvise(pages.as_mut_ptr().cast(), pages.len(), libc::MADV_DONTNEED) } == 0;
        if done {
            return;
        }
    }
    pages.fill(0);
}

impl Tensor {
    /// The elements' memory as generated code reads it (f16/bf16 as their
    /// bits, bools as bytes 0/1; little-endian hosts), without a copy.
    pub fn bytes(&self) -> &[u8] {
        fn raw<T>(v: &[T]) -> &[u8] {
            // SAFETY: every element type of `Data` is plain data without
            // padding (`bool` is one byte, 0 or 1), so its bytes may be read.
            unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
        }
        match &self.data {
            Data::F16(v) => raw(v),
            Data::BF16(v) => raw(v),
            Data::F32(v) => raw(v),
            Data::F64(v) => raw(v),
            Data::I8(v) => raw(v),
            Data::U8(v) => raw(v),
            Data::I32(v) => raw(v),
            Data::I64(v) => raw(v),
            Data::Bool(v) => raw(v),
        }
    }

    /// The elements' memory (as [`Tensor::bytes`]), for generated code that
    /// writes it in place.
    ///
    /// # Safety
    /// The bytes of a bool tensor must be left 0 or 1 (what generated code
    /// writes); every other element type takes any bytes.
    pub unsafe fn bytes_mut(&mut self) -> &mut [u8] {
        let len = self.bytes().len();
        // SAFETY: the pointer and length are those of `bytes`, borrowed
        // mutably through `self`.
        unsafe { std::slice::from_raw_parts_mut(self.as_mut_ptr(), len) }
    }

    /// Zero the bytes `range` of the elements' memory and give the whole
    /// pages inside it back to the system (they read as zero when touched
    /// again): rows of a weight that nothing will read any more stop
    /// counting in the resident memory before the tensor is dropped.
    pub fn release(&mut self, range: std::ops::Range<usize>) {
        // SAFETY: the bytes are only zeroed, a value of every element type.
        let bytes = unsafe { self.bytes_mut() };
        let range = range.start.min(bytes.len())..range.end.min(bytes.len());
        let Some(region) = bytes.get_mut(range) else { return };
        let pages = whole_pages(region);
        region[..pages.start].fill(0);
        region[pages.end..].fill(0);
        release_pages(&mut region[pages]);
    }

    /// The elements' memory (as [`Tensor::bytes`]) for generated code that
    /// reads it in place.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        match &mut self.data {
            Data::F16(v) => v.as_mut_ptr().cast(),
            Data::BF16(v) => v.as_mut_ptr().cast(),
            Data::F32(v) => v.as_mut_ptr().cast(),
            Data::F64(v) => v.as_mut_ptr().cast(),
            Data::I8(v) => v.as_mut_ptr().cast(),
            Data::U8(v) => v.as_mut_ptr().cast(),
            Data::I32(v) => v.as_mut_ptr().cast(),
            Data::I64(v) => v.as_mut_ptr().cast(),
            Data::Bool(v) => v.as_mut_ptr().cast(),
        }
    }

    pub fn dtype(&self) -> DType {
        match &self.data {
            Data::F16(_) => DType::F16,
            Data::BF16(_) => DType::BF16,
            Data::F32(_) => DType::F32,
            Data::F64(_) => DType::F64,
            Data::I8(_) => DType::I8,
            Data::U8(_) => DType::U8,
            Data::I32(_) => DType::I32,
            Data::I64(_) => DType::I64,
            Data::Bool(_) => DType::Bool,
        }
    }

    pub fn len(&self) -> usize {
        match &self.data {
            Data::F16(v) => v.len(),
            Data::BF16(v) => v.len(),
            Data::F32(v) => v.len(),
            Data::F64(v) => v.len(),
            Data::I8(v) => v.len(),
            Data::U8(v) => v.len(),
            Data::I32(v) => v.len(),
            Data::I64(v) => v.len(),
            Data::Bool(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Build from `f64` values, rounding (floats) or wrapping (integers) to `dtype`.
    pub fn from_f64(dtype: DType, shape: Vec<usize>, v: &[f64]) -> Tensor {
        let data = match dtype {
            DType::F16 => Data::F16(v.iter().map(|&x| f16::from_f64(x)).collect()),
            DType::BF16 => Data::BF16(v.iter().map(|&x| bf16::from_f64(x)).collect()),
            DType::F32 => Data::F32(v.iter().map(|&x| x as f32).collect()),
            DType::F64 => Data::F64(v.to_vec()),
            DType::I8 => Data::I8(v.iter().map(|&x| x as i8).collect()),
            DType::U8 => Data::U8(v.iter().map(|&x| x as u8).collect()),
            DType::I32 => Data::I32(v.iter().map(|&x| x as i32).collect()),
            DType::I64 => Data::I64(v.iter().map(|&x| x as i64).collect()),
            DType::Bool => Data::Bool(v.iter().map(|&x| x != 0.0).collect()),
        };
        Tensor { shape, data }
    }

    /// Build from `i64` values, wrapping to integer dtypes.
    pub fn from_i64(dtype: DType, shape: Vec<usize>, v: &[i64]) -> Tensor {
        let data = match dtype {
            DType::I8 => Data::I8(v.iter().map(|&x| x as i8).collect()),
            DType::U8 => Data::U8(v.iter().map(|&x| x as u8).collect()),
            DType::I32 => Data::I32(v.iter().map(|&x| x as i32).collect()),
            DType::I64 => Data::I64(v.to_vec()),
            DType::Bool => Data::Bool(v.iter().map(|&x| x != 0).collect()),
            _ => return Tensor::from_f64(dtype, shape, &v.iter().map(|&x| x as f64).collect::<Vec<_>>()),
        };
        Tensor { shape, data }
    }

    /// All elements as `f64` (exact for every dtype except i64 beyond 2^53).
    pub fn to_f64(&self) -> Vec<f64> {
        match &self.data {
            Data::F16(v) => v.iter().map(|x| x.to_f64()).collect(),
            Data::BF16(v) => v.iter().map(|x| x.to_f64()).collect(),
            Data::F32(v) => v.iter().map(|&x| x as f64).collect(),
            Data::F64(v) => v.clone(),
            Data::I8(v) => v.iter().map(|&x| x as f64).collect(),
            Data::U8(v) => v.iter().map(|&x| x as f64).collect(),
            Data::I32(v) => v.iter().map(|&x| x as f64).collect(),
            Data::I64(v) => v.iter().map(|&x| x as f64).collect(),
            Data::Bool(v) => v.iter().map(|&x| x as u8 as f64).collect(),
        }
    }

    /// All elements as `i64`; `None` for float tensors.
    pub fn to_i64(&self) -> Option<Vec<i64>> {
        Some(match &self.data {
            Data::I8(v) => v.iter().map(|&x| x as i64).collect(),
            Data::U8(v) => v.iter().map(|&x| x as i64).collect(),
            Data::I32(v) => v.iter().map(|&x| x as i64).collect(),
            Data::I64(v) => v.clone(),
            Data::Bool(v) => v.iter().map(|&x| x as i64).collect(),
            _ => return None,
        })
    }

    /// Zeros of `dtype`, in memory the system zeroes as it is first touched
    /// (an output that generated code writes once).
    pub fn zeros(dtype: DType, shape: Vec<usize>) -> Result<Tensor, OutOfMemory> {
        let n = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).ok_or(OutOfMemory(usize::MAX))?;
        /// # Safety
        /// All-zero bytes must be a value of `T`.
        unsafe fn zeroed<T>(n: usize) -> Result<Vec<T>, OutOfMemory> {
            let layout = std::alloc::Layout::array::<T>(n).map_err(|_| OutOfMemory(usize::MAX))?;
            if layout.size() == 0 {
                return Ok(Vec::new());
            }
            // SAFETY: the layout has a non-zero size; the memory is `n` zeroed
            // `T`s (the caller's promise), allocated by the global allocator
            // with `T`'s layout, as `Vec` frees it.
            unsafe {
                let p = std::alloc::alloc_zeroed(layout).cast::<T>();
                if p.is_null() {
                    return Err(OutOfMemory(layout.size()));
                }
                Ok(Vec::from_raw_parts(p, n, n))
            }
        }
        // SAFETY: zero bytes are 0 (or +0.0, or false) of every element type.
        let data = unsafe {
            match dtype {
                DType::F16 => Data::F16(zeroed(n)?),
                DType::BF16 => Data::BF16(zeroed(n)?),
                DType::F32 => Data::F32(zeroed(n)?),
                DType::F64 => Data::F64(zeroed(n)?),
                DType::I8 => Data::I8(zeroed(n)?),
                DType::U8 => Data::U8(zeroed(n)?),
                DType::I32 => Data::I32(zeroed(n)?),
                DType::I64 => Data::I64(zeroed(n)?),
                DType::Bool => Data::Bool(zeroed(n)?),
            }
        };
        Ok(Tensor { shape, data })
    }

    /// Seeded random data: floats uniform in [-1, 1), integers over a small
    /// range that fits every integer dtype's arithmetic without surprises.
    /// Generated straight into the tensor's own type (no wider temporary).
    pub fn random(dtype: DType, shape: Vec<usize>, rng: &mut SplitMix64) -> Result<Tensor, OutOfMemory> {
        let n = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).ok_or(OutOfMemory(usize::MAX))?;
        fn fill<T>(n: usize, mut next: impl FnMut() -> T) -> Result<Vec<T>, OutOfMemory> {
            let mut v = Vec::new();
            v.try_reserve_exact(n).map_err(|_| OutOfMemory(n.saturating_mul(std::mem::size_of::<T>())))?;
            v.extend((0..n).map(|_| next()));
            Ok(v)
        }
        let (lo, hi) = match dtype {
            DType::Bool => (0, 1),
            DType::U8 => (0, 255),
            DType::I8 => (-128, 127),
            _ => (-100, 100),
        };
        let mut float = || rng.next_f64() * 2.0 - 1.0;
        let data = match dtype {
            DType::F16 => Data::F16(fill(n, || f16::from_f64(float()))?),
            DType::BF16 => Data::BF16(fill(n, || bf16::from_f64(float()))?),
            DType::F32 => Data::F32(fill(n, || float() as f32)?),
            DType::F64 => Data::F64(fill(n, float)?),
            _ => {
                let mut int = || lo + (rng.next_u64() % (hi - lo + 1) as u64) as i64;
                match dtype {
                    DType::I8 => Data::I8(fill(n, || int() as i8)?),
                    DType::U8 => Data::U8(fill(n, || int() as u8)?),
                    DType::I32 => Data::I32(fill(n, || int() as i32)?),
                    DType::I64 => Data::I64(fill(n, int)?),
                    _ => Data::Bool(fill(n, || int() != 0)?),
                }
            }
        };
        Ok(Tensor { shape, data })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `release` zeroes exactly its range, whole pages and the partial ones
    /// at its ends, and leaves every other byte as it was.
    #[test]
    fn release_zeroes_its_range_and_nothing_else() {
        let mut t = Tensor { shape: vec![5000], data: Data::F32(vec![1.5; 5000]) };
        t.release(100..17_000);
        let b = t.bytes();
        assert!(b[100..17_000].iter().all(|&x| x == 0));
        let one = 1.5f32.to_le_bytes();
        for (i, chunk) in b.chunks(4).enumerate() {
            if i * 4 + 4 <= 100 || i * 4 >= 17_000 {
                assert_eq!(chunk, one, "element {i}");
            }
        }
        // A range past the end is cut to the tensor.
        t.release(19_990..1 << 40);
        assert_eq!(&t.bytes()[19_988..19_990], &one[..2]);
        assert!(t.bytes()[19_990..].iter().all(|&x| x == 0));
    }
}
