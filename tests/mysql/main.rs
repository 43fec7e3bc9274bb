//! Tests of what is MySQL's alone (feature `mysql`): its server (connections
//! killed, a restart), its dialect and plans, what is refused at open. What
//! holds on every engine is in the contract target, whose bodies all run on
//! MariaDB too. Each test takes a database of its own from `support::my`
//! and, without `TICKLER_TEST_MYSQL_URL`, fails under CI and skips
//! elsewhere.

#[macro_use]
#[path = "../support/mod.rs"]
mod support;
/// The torture run, shared with `examples/torture.rs`.
#[path = "../support/torture.rs"]
mod torture;

/// The server and the dialect: kills, a restart, deadlocks, plans, refusals.
mod engine;
/// TLS: the modes of `ssl-mode`, certificates and names checked.
mod tls;
/// Kills, killed connections and a server restart.
mod torture_short;
