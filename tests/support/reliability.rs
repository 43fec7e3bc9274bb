//! Helpers for the reliability tests (`tests/contract/paused_holder.rs`,
//! `tests/sqlite/faults.rs`, `tests/sqlite/wal_bound.rs`, `tests/contract/model.rs`,
//! `tests/sqlite/torture_short.rs`): temporary files, child processes that are
//! this test binary run again for one test, and a bounded polling wait.
//! The torture run itself is `torture.rs` beside this file, shared with
//! `examples/torture.rs`.
#![allow(dead_code)]

pub use super::common::{ms, secs, temp_db, wait_until};
pub use super::engine;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Starts this test binary again, on the current engine, running only the
/// test `test` (its full name, see `engine::case_name`; it
/// must do nothing unless it finds one of the variables in `env`), with its
/// stdout and stderr in `<dir>/<name>.out`.
pub fn spawn_child(test: &str, dir: &Path, name: &str, env: &[(&str, &str)]) -> Child {
    let exe = std::env::current_exe().expect("current_exe");
    let out = File::create(dir.join(format!("{name}.out"))).expect("child output file");
    let err = out.try_clone().expect("child output file");
    let mut cmd = Command::new(exe);
    cmd.args(["--exact", test, "--nocapture", "--test-threads=1"])
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err);
    engine::current().pass_to(&mut cmd);
    for (key, value) in env {
        cmd.env(key, value);
    }
    cmd.spawn().expect("spawning a child test process")
}

/// In a child process started by [`spawn_child`]: the queue whose file
/// path the parent passed in the variable `var`, with
/// `Durability::Normal`; `None` when the variable is not set (the test
/// was not started as a child, and should do nothing).
pub fn child_queue(var: &str) -> Option<tickler::Queue> {
    let db = std::env::var_os(var)?;
    let queue = tickler::Queue::builder(engine::target(&PathBuf::from(db)))
        .sqlite(|o| o.durability(tickler::Durability::Normal))
        .open()
        .expect("the child opens the parent's queue");
    Some(queue)
}

/// What a child wrote so far (stdout and stderr together).
pub fn child_output(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(format!("{name}.out"))).unwrap_or_default()
}

/// Waits for `child` to exit, at most `timeout` (killing it after that),
/// and panics with its output unless it exited successfully.
pub fn expect_success(child: &mut Child, dir: &Path, name: &str, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "child {name} still running after {timeout:?}:\n{}",
                child_output(dir, name)
            );
        }
        std::thread::sleep(ms(10));
    };
    let out = child_output(dir, name);
    assert!(status.success(), "child {name} failed ({status}):\n{out}");
    assert!(
        out.contains("1 passed"),
        "child {name} did not run its test:\n{out}"
    );
}

/// True if this process can write where permission bits say it may not
/// (root, or CAP_DAC_OVERRIDE): probes by creating a file in a folder made
/// read-only for the probe.
pub fn permission_bits_are_ignored() -> bool {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o555))
        .expect("chmod probe folder");
    let ignored = File::create(dir.path().join("probe")).is_ok();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
        .expect("chmod probe folder back");
    ignored
}

/// Sends `sig` to a child process of the test (SIGSTOP, SIGCONT, …).
#[cfg(unix)]
pub fn signal(child: &Child, sig: libc::c_int) {
    let pid = libc::pid_t::try_from(child.id()).expect("pid");
    // SAFETY: kill(2) on our own child's pid; no memory is involved.
    let rc = unsafe { libc::kill(pid, sig) };
    assert_eq!(
        rc,
        0,
        "kill({pid}, {sig}): {}",
        std::io::Error::last_os_error()
    );
}
