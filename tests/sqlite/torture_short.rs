//! A short kill -9 torture run for CI: 15 seconds of
//! SIGKILLs against three worker processes while a producer enqueues, then
//! the full check (nothing lost, every job terminal, no run_token or job
//! with two accepted outcomes, duplicate executions only where a kill hit a
//! running handler, no `Busy` in user code, WAL bounded, integrity ok).
//!
//! The run is `tests/support/torture.rs`, the same code as
//! `cargo run --release --example torture`; here the worker and producer
//! processes are this test binary run again for [`torture_role`].

use crate::torture;

use std::time::Duration;

#[test]
fn fifteen_seconds_of_kill_9_lose_nothing_and_finish_nothing_twice() {
    let dir = tempfile::tempdir().expect("tempdir");
    let settings = torture::Settings::new(dir.path().to_path_buf(), Duration::from_secs(15));
    torture::short_run(&settings, dir, "torture_short::torture_role");
}

/// A worker or producer process of the run above; does nothing unless
/// started by it.
#[test]
fn torture_role() {
    if std::env::var_os(torture::ENV_ROLE).is_some() {
        std::process::exit(torture::run_role());
    }
}
