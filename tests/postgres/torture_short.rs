//! A short torture run on PostgreSQL for CI: 20 seconds
//! of SIGKILLs against three worker processes while a producer enqueues,
//! every connection to the database cut every 2–5 s, and one server
//! restart (fast shutdown) halfway when `TICKLER_TEST_PG_CTL` is set; then
//! the full check (nothing lost, every job terminal, no run_token or job
//! with two accepted outcomes or effects, every duplicate execution
//! explained by a kill, cut or restart, no error reaching user code, no
//! error logged by tickler, amcheck on the indexes).
//!
//! The run is `tests/support/torture.rs`, the same code as
//! `cargo run --release --features postgres --example torture -- --db URL`;
//! here the worker and producer processes are this test binary run again
//! for [`pg_torture_role`].
#![cfg(feature = "postgres")]

use crate::support::pg;
use crate::torture;

use std::time::Duration;

#[test]
fn twenty_seconds_of_kills_cuts_and_a_restart_lose_nothing_and_finish_nothing_twice() {
    // It restarts the server: no other test of this binary may hold a
    // database meanwhile.
    let _server = pg::exclusive_server();
    let Some(db) = pg::test_database() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let mut settings = torture::Settings::new(dir.path().to_path_buf(), Duration::from_secs(20));
    settings.db_url = Some(db.url().to_owned());
    settings.cut_every = (Duration::from_secs(2), Duration::from_secs(5));
    settings.server_ctl = std::env::var("TICKLER_TEST_PG_CTL")
        .ok()
        .filter(|c| !c.trim().is_empty());
    settings.restarts = 1;
    let report = torture::short_run(&settings, dir, "torture_short::pg_torture_role");
    if pg::can_restart_server() {
        assert_eq!(report.restarts, 1, "the server was not restarted: {report}");
    }
}

/// A worker or producer process of the run above; does nothing unless
/// started by it.
#[test]
fn pg_torture_role() {
    if std::env::var_os(torture::ENV_ROLE).is_some() {
        std::process::exit(torture::run_role());
    }
}

/// The same run on a primary and its synchronous standby of their own,
/// with a failover (the primary stopped at once, the standby promoted)
/// halfway instead of a restart: the URL names both servers with
/// `target_session_attrs=read-write`, and the full check holds across the
/// switch (synchronous replication: nothing acknowledged is lost).
#[test]
fn twenty_seconds_of_kills_cuts_and_a_failover_lose_nothing_and_finish_nothing_twice() {
    let Some(pair) = pg::StandbyPair::start("torture", true) else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let mut settings = torture::Settings::new(dir.path().to_path_buf(), Duration::from_secs(20));
    settings.db_url = Some(pair.url());
    settings.cut_every = (Duration::from_secs(2), Duration::from_secs(5));
    settings.server_ctl = Some(pair.failover_command());
    settings.restarts = 1;
    let report = torture::short_run(&settings, dir, "torture_short::pg_torture_role");
    assert_eq!(report.restarts, 1, "no failover happened: {report}");
}
