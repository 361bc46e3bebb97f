//! Autotuning support: the search space of a schedule template
//! ([`space`]) and the tuning database ([`db`]). The search itself runs in
//! the `texc tune` command, which measures each candidate in a worker
//! process.

pub mod db;
pub mod space;
