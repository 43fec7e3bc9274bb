//! Tests of the `tickler` binary (feature `cli`, on by default). The
//! binary operates a queue file, so these run on SQLite; what the library
//! guarantees on every engine is in the contract target.

#[macro_use]
#[path = "../support/mod.rs"]
mod support;

mod batch;
mod errors_explained;
mod escapes;
mod import;
mod no_orphans;
mod operator_edges;
mod ops;
mod private_files;
mod process_tree;
mod schedule;
mod schedule_cli_edges;
mod serve;
mod serve_batch;
mod serve_bulk;
mod serve_hunt;
mod wait;
mod wait_hunt;
mod work;
