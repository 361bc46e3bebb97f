//! 64-byte aligned host buffers, the memory generated code reads and writes.
//!
//! Buffers of 2 MiB or more are 2 MiB aligned and, on Linux, asked to be
//! backed by transparent huge pages (`madvise(MADV_HUGEPAGE)`, before their
//! first touch), as NumPy does for its large arrays: a matrix product's
//! rows, thousands of 4 KiB pages apart, otherwise miss the TLB on every
//! register block (SGEMM 2048³ on AVX2, one thread: MEASURED).

use crate::{DType, Data, Tensor};
use half::{bf16, f16};
use std::alloc::{alloc, alloc_zeroed, dealloc, Layout};

pub const ALIGN: usize = 64;

/// Size and alignment of a huge page: buffers at least this large use them.
const HUGE: usize = 2 << 20;

/// 64-byte aligned memory for one tensor: zeroed, or a tensor's copy.
pub struct AlignedBuf {
    ptr: *mut u8,
    layout: Layout,
    pub dtype: DType,
    pub shape: Vec<usize>,
}

// SAFETY: the buffer owns its memory exclusively.
unsafe impl Send for AlignedBuf {}

/// An allocation failed: the memory it asked for, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("cannot allocate {0} bytes: out of memory")]
pub struct OutOfMemory(pub usize);

impl AlignedBuf {
    /// Zeroed memory for a tensor; an error, never an abort, when there is none.
    pub fn zeroed(dtype: DType, shape: Vec<usize>) -> Result<AlignedBuf, OutOfMemory> {
        let bytes = shape.iter().try_fold(dtype.size(), |a, &d| a.checked_mul(d)).ok_or(OutOfMemory(usize::MAX))?;
        let ptr_layout = if bytes >= HUGE { huge_zeroed(bytes) } else { small_zeroed(bytes) };
        let (ptr, layout) = ptr_layout.ok_or(OutOfMemory(bytes))?;
        Ok(AlignedBuf { ptr, layout, dtype, shape })
    }

    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The buffer's bytes (its elements, not the alignment padding).
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: the allocation holds at least `len * size` initialized bytes.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len() * self.dtype.size()) }
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as `bytes`, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len() * self.dtype.size()) }
    }

    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr
    }

    /// Copy a tensor in (bools as bytes 0/1, f16/bf16 as their bits).
    pub fn from_tensor(t: &Tensor) -> Result<AlignedBuf, OutOfMemory> {
        let mut b = AlignedBuf::zeroed(t.dtype(), t.shape.clone())?;
        let out = b.bytes_mut();
        macro_rules! put {
            ($v:expr, $conv:expr) => {
                for (chunk, x) in out.chunks_exact_mut(t.dtype().size()).zip($v.iter()) {
                    chunk.copy_from_slice(&$conv(*x));
                }
            };
        }
        match &t.data {
            Data::F16(v) => put!(v, |x: f16| x.to_bits().to_le_bytes()),
            Data::BF16(v) => put!(v, |x: bf16| x.to_bits().to_le_bytes()),
            Data::F32(v) => put!(v, |x: f32| x.to_le_bytes()),
            Data::F64(v) => put!(v, |x: f64| x.to_le_bytes()),
            Data::I8(v) => put!(v, |x: i8| x.to_le_bytes()),
            Data::U8(v) => put!(v, |x: u8| x.to_le_bytes()),
            Data::I32(v) => put!(v, |x: i32| x.to_le_bytes()),
            Data::I64(v) => put!(v, |x: i64| x.to_le_bytes()),
            Data::Bool(v) => put!(v, |x: bool| [x as u8]),
        }
        Ok(b)
    }

    /// [`AlignedBuf::from_tensor`] of a tensor the caller gives up: its
    /// pages are given back to the system as they are copied
    /// ([`Tensor::release`]), so that a large tensor and its copy are never
    /// both resident whole (VGG-11's 411 MB classifier matrix, copied for
    /// the repeated calls of `texc bench`, held once, not twice).
    pub fn from_owned_tensor(mut t: Tensor) -> Result<AlignedBuf, OutOfMemory> {
        let len = t.bytes().len();
        // Generated code reads the elements as they lie in memory on a
        // little-endian host (`Tensor::bytes`), which is what `from_tensor`
        // writes; a tensor whose data and shape disagree is copied (and
        // zero-filled) as `from_tensor` copies it, and pages are only given
        // back on Linux.
        let whole = t.shape.iter().try_fold(t.dtype().size(), |a, &d| a.checked_mul(d)) == Some(len);
        if len < HUGE || cfg!(target_endian = "big") || !cfg!(target_os = "linux") || !whole {
            return AlignedBuf::from_tensor(&t);
        }
        let (ptr, layout) = huge_pages(len).ok_or(OutOfMemory(len))?;
        // `t`'s bytes before `released` are copied and their pages given back.
        let (mut done, mut released) = (0, 0);
        while done < len {
            let end = (done + HUGE).min(len);
            let part = &t.bytes()[done..end];
            // SAFETY: the allocation holds `layout.size() >= len` bytes, and the
            // tensor's bytes are another allocation.
            unsafe { std::ptr::copy_nonoverlapping(part.as_ptr(), ptr.add(done), part.len()) };
            // Up to the last whole page copied: a page that straddles two
            // parts goes back with the next.
            let upto = released + crate::whole_pages(&t.bytes()[released..end]).end;
            t.release(released..upto);
            (done, released) = (end, upto);
        }
        // Every one of the tensor's `len` bytes was written above.
        Ok(AlignedBuf { ptr, layout, dtype: t.dtype(), shape: t.shape })
    }

    /// Copy out as a tensor.
    pub fn to_tensor(&self) -> Tensor {
        let b = self.bytes();
        let s = self.dtype.size();
        macro_rules! get {
            ($t:ty, $conv:expr) => {
                b.chunks_exact(s)
                    .map(|c| $conv(<[u8; std::mem::size_of::<$t>()]>::try_from(c).expect("chunk size")))
                    .collect()
            };
        }
        let data = match self.dtype {
            DType::F16 => Data::F16(get!(u16, |c| f16::from_bits(u16::from_le_bytes(c)))),
            DType::BF16 => Data::BF16(get!(u16, |c| bf16::from_bits(u16::from_le_bytes(c)))),
            DType::F32 => Data::F32(get!(f32, f32::from_le_bytes)),
            DType::F64 => Data::F64(get!(f64, f64::from_le_bytes)),
            DType::I8 => Data::I8(get!(i8, i8::from_le_bytes)),
            DType::U8 => Data::U8(get!(u8, u8::from_le_bytes)),
            DType::I32 => Data::I32(get!(i32, i32::from_le_bytes)),
            DType::I64 => Data::I64(get!(i64, i64::from_le_bytes)),
            DType::Bool => Data::Bool(b.iter().map(|&x| x != 0).collect()),
        };
        Tensor { shape: self.shape.clone(), data }
    }
}

fn small_zeroed(bytes: usize) -> Option<(*mut u8, Layout)> {
    let layout = Layout::from_size_align(bytes.max(ALIGN), ALIGN).ok()?;
    // SAFETY: the layout has a non-zero size.
    let ptr = unsafe { alloc_zeroed(layout) };
    (!ptr.is_null()).then_some((ptr, layout))
}

/// Whole huge pages, advised as such before they are first touched (by
/// the zeroing), so that the kernel backs them with 2 MiB pages; the
/// tensor's `bytes` are zeroed.
fn huge_zeroed(bytes: usize) -> Option<(*mut u8, Layout)> {
    let (ptr, layout) = huge_pages(bytes)?;
    // Only the tensor's bytes are touched: the rest of the last huge page is
    // never read, and stays uncommitted.
    // SAFETY: `ptr` starts `layout.size() >= bytes` bytes `huge_pages` allocated.
    unsafe { std::ptr::write_bytes(ptr, 0, bytes) };
    Some((ptr, layout))
}

/// Whole huge pages for `bytes`, advised as such before they are first
/// touched; not initialized.
fn huge_pages(bytes: usize) -> Option<(*mut u8, Layout)> {
    let layout = Layout::from_size_align(bytes.checked_next_multiple_of(HUGE)?, HUGE).ok()?;
    // SAFETY: the layout has a non-zero size.
    let ptr = unsafe { alloc(layout) };
    if ptr.is_null() {
        return None;
    }
    #[cfg(target_os = "linux")]
    // SAFETY: `ptr` starts `layout.size()` bytes this function owns. The advice
    // may fail (huge pages disabled): the memory is then ordinary pages.
    unsafe {
        libc::madvise(ptr.cast(), layout.size(), libc::MADV_HUGEPAGE);
    }
    Some((ptr, layout))
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout (`small_zeroed` or `huge_pages`).
        unsafe { dealloc(self.ptr, self.layout) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SplitMix64;

    /// A tensor given up to its copy comes out the same as one copied from
    /// a borrow, element for element, on both sides of the huge-page size
    /// and at lengths no page or part divides.
    #[test]
    fn an_owned_tensor_copies_as_a_borrowed_one_does() {
        let mut rng = SplitMix64::new(7);
        for dtype in [DType::F32, DType::F16, DType::I8, DType::I64, DType::Bool] {
            let size = dtype.size();
            for len in [5, HUGE / size - 1, HUGE / size + 3, 3 * HUGE / size + 1001] {
                let t = Tensor::random(dtype, vec![len], &mut rng).expect("memory");
                let borrowed = AlignedBuf::from_tensor(&t).expect("memory");
                let owned = AlignedBuf::from_owned_tensor(t.clone()).expect("memory");
                assert_eq!((owned.dtype, &owned.shape), (dtype, &t.shape), "{dtype:?} × {len}");
                assert!(owned.bytes() == borrowed.bytes(), "{dtype:?} × {len}: the copies differ");
                assert_eq!(owned.to_tensor(), t, "{dtype:?} × {len}");
                assert_eq!(owned.ptr as usize % ALIGN, 0, "{dtype:?} × {len}: aligned");
            }
        }
        // Data shorter than the shape says: copied as a borrowed one is (the rest zero).
        let short = Tensor { shape: vec![HUGE], data: Data::F32(vec![1.5; HUGE / 8]) };
        let owned = AlignedBuf::from_owned_tensor(short.clone()).expect("memory");
        assert!(owned.bytes() == AlignedBuf::from_tensor(&short).expect("memory").bytes());
    }
}
