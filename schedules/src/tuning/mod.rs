//! Autotuning support: the search space of a schedule template
//! ([`space`]), the tuning database ([`db`]) and the learned cost model
//! that ranks candidates ([`model`]). The search itself runs in
//! the `texc tune` command, which measures each candidate in a worker
//! process.

pub mod db;
pub mod model;
pub mod space;
