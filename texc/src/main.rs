//! The `texc` command line (LANGUAGE.md §8).
//!
//! Exit status: 0 on success, 1 for a problem in user input (source, shapes,
//! files), 2 for command-line misuse and for features not built yet.

mod args;
mod commands;

use clap::Parser;

fn main() {
    let cli = args::Cli::parse();
    // The front end recurses over expressions (bounded by MAX_EXPR_DEPTH);
    // give it room regardless of the platform's main-thread stack.
    let worker = std::thread::Builder::new().stack_size(256 << 20).spawn(move || commands::run(cli));
    let code = match worker.map(|h| h.join()) {
        Ok(Ok(code)) => code,
        _ => {
            eprintln!("error: internal error: texc crashed; please report this with the input that caused it");
            101
        }
    };
    std::process::exit(code);
}
