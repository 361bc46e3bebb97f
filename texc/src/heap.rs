//! The process's glibc heap, set for a compiler that runs what it compiled:
//! tensor-sized blocks mapped so that freeing them returns them
//! ([`map_large_allocations`], first in `main`), and the compile's freed
//! small blocks returned before the run ([`return_freed_memory`]). Both do
//! nothing outside Linux's glibc.

/// glibc serves an allocation below its mmap threshold from a heap that
/// rarely shrinks, and raises the threshold (up to 32 MiB) whenever a
/// mapped block is freed; a model's weights, copied, folded and freed one
/// by one, then stay resident after they are gone (ResNet-50: 261 MB peak
/// resident instead of 206, MEASURED). A fixed threshold keeps every
/// tensor-sized block mapped and returned when freed; smaller blocks, the
/// compiler's, are unaffected. The `texc` binary calls it first in `main`.
#[doc(hidden)]
pub fn map_large_allocations() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `mallopt` takes glibc's arena lock; it only changes when
    // later allocations are mapped.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 << 10);
    }
}

/// Give the heap's free pages back to the system between a compile and
/// its run: glibc keeps the compile's freed memory (small blocks, in the
/// arenas of the threads that compiled) resident, and the run's buffers
/// would come on top of it. MEASURED (`/usr/bin/time -f %M texc run
/// MODEL.onnx --target host --no-cache`, Zen 3, two runs each): peak
/// resident Inception-v3 209–213 → 198 MB, ResNet-50 193–195 → 191,
/// DenseNet-121 140–141 → 136; Swin-T and ConvNeXt-T unchanged (their
/// peak is in the compile).
pub(crate) fn return_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` only releases memory that is free.
    unsafe {
        libc::malloc_trim(0);
    }
}
