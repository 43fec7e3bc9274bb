//! What the test targets share, in one place: every target's `main.rs`
//! includes it (`#[macro_use] #[path = "../support/mod.rs"] mod support;`),
//! and each target uses the parts it needs.
//!
//! - `engine`: which engine a case runs on, the `contract!` harness that
//!   runs one body on every engine, and SQL on either engine beside
//!   tickler's own connections;
//! - `common`: fixed times, temporary queue files, manual-clock queues,
//!   bounded polling waits;
//! - `pool`: a scripted, recording handler for worker pools, and
//!   `flavored_tests!` (sync and async handlers);
//! - `schedule`: queues and runs for schedule tests;
//! - `reliability`: child processes of this test binary, fault helpers;
//! - `app_tx`: the application's own SQLite transactions beside tickler's;
//! - `cli`: the `tickler` binary (and `cli::serve` for `tickler serve`);
//! - `pg`: databases of their own on a PostgreSQL server (feature
//!   `postgres`);
//! - `dashboard_fill`: many rows at once, shared with the benchmarks;
//! - `limits`: jobs under a concurrency limit, claimed and read by hand;
//! - `deps`: jobs that run after others, and a parent's family of
//!   children, one per rule.
//!
//! Not every target uses every helper.
#![allow(dead_code, unused_imports, unused_macros)]

#[macro_use]
pub mod engine;

pub mod app_tx;
pub mod cli;
pub mod common;
pub mod dashboard_fill;
pub mod deps;
pub mod limits;
#[cfg(feature = "mysql")]
pub mod my;
#[cfg(feature = "postgres")]
pub mod pg;
pub mod pool;
pub mod reliability;
pub mod schedule;
