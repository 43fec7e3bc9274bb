//! Tests of what is PostgreSQL's alone (feature `postgres`): its server
//! (connections cut, restarts, failover, a DBA's settings), its dialect
//! and plans, its application transactions. What holds on every engine is
//! in the contract target. Each test takes a database of its own from
//! `support::pg` and, without `TICKLER_TEST_DATABASE_URL`, fails under CI
//! and skips elsewhere.

#[macro_use]
#[path = "../support/mod.rs"]
mod support;
/// The torture run, shared with `examples/torture.rs`.
#[path = "../support/torture.rs"]
mod torture;

/// The application's own `postgres` transactions.
mod app_tx;
/// The engine's own behaviour: LISTEN/NOTIFY, the server's clock,
/// restarts; and the regressions from other queues' PostgreSQL reports
/// (connections, cron on the server's clock, a DBA's settings, failover,
/// locks, NUL bytes, plans, unique indexes).
mod engine;
/// An enqueue whose commit reply is lost on the wire.
mod enqueue_lost_commit;
/// What the server said reaches the caller; refusals fail at once.
mod errors;
/// The test harness's databases of their own.
mod harness;
/// The plans of the hot statements at two depths.
mod plans;
/// Through PgBouncer, in transaction and in session mode.
mod pooler;
/// A job's whole life on a server.
mod smoke;
/// A real standby promoted in the middle of work.
mod standby;
/// TLS with libpq's sslmode meanings, seen from the server.
mod tls;
/// Kills, cut connections and a server restart.
mod torture_short;
