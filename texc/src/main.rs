//! The `texc` command line (LANGUAGE.md §8); the work is in the library
//! (`texc::run_from_args`), which the `cli_args` fuzz target also calls.
//!
//! Exit status: 0 on success, 1 for a problem in user input (source, shapes,
//! files), 2 for command-line misuse and for features not built yet, 101 for
//! an internal error.

fn main() {
    texc::heap::map_large_allocations();
    std::process::exit(texc::run_from_args(std::env::args_os()));
}
