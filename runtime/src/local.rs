//! Heap memory for generated code's large local buffers.
//!
//! A local buffer (a packed block of a matrix product, an attached stage's
//! box) that would take its frame past the stack's share
//! (`texc_schedules::ir::LoopFunc::heap_locals`) is taken from here for
//! each execution of the statement that holds it and given back at its
//! end: [`texc_local_alloc`] and [`texc_local_free`], which JIT-compiled
//! code calls (objects define weak stand-ins over `aligned_alloc`). Each
//! thread keeps one block, the largest it gave back, and hands it out again
//! to a request it can hold, so a loop that takes a 2 MiB block on every
//! iteration neither calls the allocator nor touches fresh pages each time
//! (the inner one of two nested buffers does, each time). Invariant: a
//! kept block is owned by its thread only and freed when the thread ends —
//! for the pool's workers, which never end, it stays (at most 16 MiB,
//! `attach::MAX_LOCAL_BYTES`, per thread).

use std::alloc::{alloc, dealloc, Layout};
use std::cell::Cell;

/// Alignment of local buffers: a cache line, and what vector loads assume.
const ALIGN: usize = 64;

thread_local! {
    /// The block this thread last gave back.
    static SPARE: Spare = const { Spare(Cell::new(None)) };
}

/// A block from the allocator: `ALIGN` bytes of header (its size), then the
/// buffer that generated code sees.
#[derive(Clone, Copy)]
struct Block(*mut u8);

impl Block {
    fn new(size: usize) -> Option<Block> {
        // SAFETY: the layout is not zero-sized (it has the header).
        let base = unsafe { alloc(layout(size)) };
        if base.is_null() {
            return None;
        }
        // SAFETY: the header is the block's first ALIGN bytes, aligned for a usize.
        unsafe { (base as *mut usize).write(size) };
        Some(Block(base))
    }

    /// The block whose buffer `p` is.
    ///
    /// SAFETY: `p` came from [`Block::buffer`].
    unsafe fn of(p: *mut u8) -> Block {
        Block(p.sub(ALIGN))
    }

    fn size(self) -> usize {
        // SAFETY: written by `new`.
        unsafe { (self.0 as *const usize).read() }
    }

    fn buffer(self) -> *mut u8 {
        // SAFETY: the block holds ALIGN bytes of header and `size` more.
        unsafe { self.0.add(ALIGN) }
    }

    fn free(self) {
        // SAFETY: allocated by `new` with this layout.
        unsafe { dealloc(self.0, layout(self.size())) }
    }
}

struct Spare(Cell<Option<Block>>);

impl Drop for Spare {
    fn drop(&mut self) {
        if let Some(b) = self.0.take() {
            b.free();
        }
    }
}

fn layout(size: usize) -> Layout {
    Layout::from_size_align(size + ALIGN, ALIGN).expect("sizes are bounded by texc_schedules::attach::MAX_LOCAL_BYTES")
}

/// A buffer of at least `bytes` bytes, 64-byte aligned, never NULL: when
/// memory is exhausted the process reports it and exits with status 1
/// (generated code cannot unwind, and a kernel's loop cannot go on without
/// its buffer).
pub extern "C" fn texc_local_alloc(bytes: u64) -> *mut u8 {
    let size = bytes as usize;
    if let Some(b) = SPARE.with(|s| s.0.take()) {
        if b.size() >= size {
            return b.buffer();
        }
        b.free();
    }
    match Block::new(size) {
        Some(b) => b.buffer(),
        None => {
            eprintln!("error: out of memory: a kernel's local buffer of {size} bytes could not be allocated");
            std::process::exit(1);
        }
    }
}

/// Give back a buffer from [`texc_local_alloc`]: it becomes the thread's
/// spare when it is larger than the one kept.
///
/// # Safety
/// `p` came from [`texc_local_alloc`] and is not used after this call.
pub unsafe extern "C" fn texc_local_free(p: *mut u8) {
    let b = Block::of(p);
    SPARE.with(|s| match s.0.take() {
        Some(kept) if kept.size() >= b.size() => {
            s.0.set(Some(kept));
            b.free();
        }
        kept => {
            if let Some(k) = kept {
                k.free();
            }
            s.0.set(Some(b));
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spare_blocks_serve_requests_they_can_hold() {
        let a = texc_local_alloc(1 << 20);
        assert_eq!(a as usize % ALIGN, 0);
        // SAFETY: the buffer holds 1 MiB.
        unsafe { a.write_bytes(7, 1 << 20) };
        unsafe { texc_local_free(a) };
        // The kept block serves a smaller request, and not a larger one.
        let b = texc_local_alloc(1000);
        assert_eq!(a, b);
        let c = texc_local_alloc(2 << 20);
        assert_ne!(c, b);
        unsafe { c.write_bytes(1, 2 << 20) };
        unsafe { texc_local_free(b) };
        unsafe { texc_local_free(c) };
        let d = texc_local_alloc(2 << 20);
        assert_eq!(d, c, "the larger block is the one kept");
        unsafe { texc_local_free(d) };
    }
}
