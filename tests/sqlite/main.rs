//! Tests of what is SQLite's alone: the file, its WAL and its write lock,
//! and the application's own rusqlite transactions. Each module says why
//! it is SQLite's; what holds on every engine is in the contract target.

#[macro_use]
#[path = "../support/mod.rs"]
mod support;
/// The power-cut harness: an `LD_PRELOAD` shim that keeps what a disk would
/// hold, and the cuts.
#[path = "../support/powercut.rs"]
mod powercut;
/// The kill -9 torture run, shared with `examples/torture.rs`.
#[path = "../support/torture.rs"]
mod torture;

/// Jobs in the application's own rusqlite transactions (`*_with(&tx)`):
/// a rusqlite `Transaction` exists only on SQLite (and `complete_with`
/// holds SQLite's write lock while the application writes).
mod app_tx_complete;
mod app_tx_connection;
mod app_tx_crash;
mod app_tx_enqueue;
mod app_tx_pool;
mod app_tx_schema;
/// The dashboard's queries read through SQLite's query plans.
mod dashboard_plan;
/// File modes, a full disk, damaged files (among them an error history
/// damaged past a CHECK constraint, which PostgreSQL's jsonb refuses to
/// store in the first place): faults of a file.
mod faults;
/// SQLite's write lock held by another process while leases run and the
/// reaper waits for it.
mod lock_stall_keeps_live_leases;
/// Power cuts: SQLite's, as the engine writes and fsyncs its own file;
/// a server owns its durability (its own fsyncs, its own settings).
mod power_cut;
/// The file's schema version (`user_version`), WAL mode, a non-SQLite file.
mod schema;
/// kill -9 against processes on one file: the WAL and `integrity_check`.
mod torture_short;
/// The WAL stays bounded.
mod wal_bound;
