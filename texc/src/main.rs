//! The `texc` command line (LANGUAGE.md §8); the work is in the library
//! (`texc::run_from_args`), which the `cli_args` fuzz target also calls.
//!
//! Exit status: 0 on success, 1 for a problem in user input (source, shapes,
//! files), 2 for command-line misuse and for features not built yet, 101 for
//! an internal error.

fn main() {
    map_large_allocations();
    std::process::exit(texc::run_from_args(std::env::args_os()));
}

/// glibc serves an allocation below its mmap threshold from a heap that
/// rarely shrinks, and raises the threshold (up to 32 MiB) whenever a
/// mapped block is freed; a model's weights, copied, folded and freed one
/// by one, then stay resident after they are gone (ResNet-50: 261 MB peak
/// resident instead of 206, MEASURED). A fixed threshold keeps every
/// tensor-sized block mapped and returned when freed; smaller blocks, the
/// compiler's, are unaffected.
fn map_large_allocations() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: called first in `main`, before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 << 10);
    }
}
