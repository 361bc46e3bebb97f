//! The `texc` command as a library: [`run_from_args`] does everything the
//! binary does short of exiting, so that tests and the `cli_args` fuzz
//! target can run the command in-process.
//!
//! Exit status: 0 on success, 1 for a problem in user input (source, shapes,
//! files), 2 for command-line misuse and for features not built yet, 101 for
//! an internal error (a panic).

mod args;
mod calibrate;
mod commands;
pub mod heap;
mod import;
mod progress;
mod qdq;
mod quantize;
mod report;
mod tune;

use clap::Parser;
use std::ffi::OsString;

/// Exit status of an internal error: texc panicked.
pub const INTERNAL_ERROR: i32 = 101;

/// Run `texc` on an argument vector (`args[0]` is the program name, as in
/// `std::env::args_os()`) and return its exit status. Command-line errors
/// are printed as clap prints them (to stderr, status 2); `--help` and
/// `--version` print to stdout and return 0. The command runs on a worker
/// thread with a large stack; a panic there is reported on stderr and
/// returns [`INTERNAL_ERROR`].
pub fn run_from_args<I, T>(args: I) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = match args::Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            // What `Error::exit` does, short of exiting: help and version to
            // stdout (status 0), errors to stderr (status 2).
            let _ = e.print();
            return e.exit_code();
        }
    };
    // The front end recurses over expressions (bounded by MAX_EXPR_DEPTH);
    // give it room regardless of the platform's main-thread stack.
    let worker = std::thread::Builder::new().stack_size(256 << 20).spawn(move || commands::run(cli));
    match worker.map(|h| h.join()) {
        Ok(Ok(code)) => code,
        _ => {
            eprintln!("error: internal error: texc crashed; please report this with the input that caused it");
            INTERNAL_ERROR
        }
    }
}
