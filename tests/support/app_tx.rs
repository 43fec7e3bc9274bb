//! Helpers for the tests of jobs in the application's own transactions
//! (`tests/app_tx_*.rs`): temp files, manual clocks, an application table
//! beside tickler's, bounded polling waits, and child processes that re-run
//! this test binary and talk to the parent through marker lines on stdout.
#![allow(dead_code)]

use chrono::{DateTime, TimeZone, Utc};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tickler::{Durability, Lease, ManualClock, Queue};

pub use super::common::{fixed_policy, ms, raw, secs, t0, wait_until};

/// A temporary directory and the path of an application file inside it.
pub fn temp_db() -> (tempfile::TempDir, PathBuf) {
    super::common::temp_db_named("app.db")
}

/// A queue on `path` whose clock stands at [`t0`] and only moves by hand.
pub fn manual_queue(path: &Path) -> (Queue, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(t0()));
    let queue = Queue::builder(path)
        .clock(clock.clone())
        .sqlite(|o| o.durability(Durability::Normal))
        .retry_policy(fixed_policy())
        .open()
        .expect("open queue");
    (queue, clock)
}

/// The application's table used by most tests: one row per effect a
/// handler (or an enqueuing caller) wrote.
pub const EFFECTS_DDL: &str = "CREATE TABLE IF NOT EXISTS effects (
    id        INTEGER PRIMARY KEY,
    job_id    INTEGER,
    run_token TEXT,
    note      TEXT NOT NULL,
    pid       INTEGER
)";

/// Creates the `effects` table if missing.
pub fn create_effects(conn: &rusqlite::Connection) {
    conn.execute_batch(EFFECTS_DDL)
        .expect("create effects table");
}

/// Inserts one effect row inside `tx`.
pub fn insert_effect(
    tx: &rusqlite::Transaction<'_>,
    job_id: Option<i64>,
    run_token: Option<&str>,
    note: &str,
) -> rusqlite::Result<()> {
    tx.execute(
        "INSERT INTO effects (job_id, run_token, note, pid) VALUES (?1, ?2, ?3, ?4)",
        rusqlite::params![job_id, run_token, note, std::process::id()],
    )?;
    Ok(())
}

/// Number of rows in `table` (any connection).
pub fn count(conn: &rusqlite::Connection, table: &str) -> i64 {
    conn.query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))
        .unwrap_or_else(|e| panic!("count {table}: {e}"))
}

/// Number of effect rows of job `id`.
pub fn effects_of(conn: &rusqlite::Connection, id: i64) -> i64 {
    conn.query_row(
        "SELECT count(*) FROM effects WHERE job_id = ?1",
        [id],
        |r| r.get(0),
    )
    .expect("count effects of job")
}

/// A child process running one test function of this test binary, with
/// its stdout read line by line on a thread (so the parent can wait for a
/// marker with a bound) and its stderr kept in a file.
pub struct ChildTest {
    pub child: Child,
    lines: Receiver<String>,
    seen: Vec<String>,
    stderr_path: PathBuf,
}

impl ChildTest {
    /// Re-executes the current test binary running only `test_fn`, with
    /// `envs` set. The child function must return at once when its env
    /// var is absent, so that a plain `cargo test` run passes it trivially.
    pub fn spawn(test_fn: &str, envs: &[(&str, &std::ffi::OsStr)], dir: &Path) -> ChildTest {
        let exe = std::env::current_exe().expect("current_exe");
        static SPAWNED: AtomicUsize = AtomicUsize::new(0);
        let n = SPAWNED.fetch_add(1, Ordering::SeqCst);
        let stderr_path = dir.join(format!("{test_fn}-{n}.stderr"));
        let mut cmd = Command::new(exe);
        super::engine::current().pass_to(&mut cmd);
        cmd.args(["--exact", test_fn, "--nocapture", "--test-threads=1"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr_path).expect("child stderr file"));
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn child test process");
        let stdout = child.stdout.take().expect("child stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        ChildTest {
            child,
            lines: rx,
            seen: Vec::new(),
            stderr_path,
        }
    }

    /// Waits (at most `timeout`) for a stdout line starting with `prefix`
    /// and returns it; panics with the child's output if it exits or the
    /// time runs out first.
    pub fn wait_line(&mut self, prefix: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left.max(ms(1))) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.starts_with(prefix) {
                        return line;
                    }
                }
                Err(RecvTimeoutError::Timeout) if Instant::now() < deadline => {}
                Err(e) => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    panic!(
                        "no line starting with {prefix:?} from the child within {timeout:?} ({e:?})\n{}",
                        self.output()
                    );
                }
            }
        }
    }

    /// SIGKILLs the child (`kill -9`) and reaps it.
    pub fn kill9(&mut self) {
        self.child.kill().expect("SIGKILL the child");
        let status = self.child.wait().expect("reap the child");
        assert!(!status.success(), "child was not killed: {status}");
    }

    /// Waits (at most `timeout`) for the child to exit; asserts it passed.
    pub fn wait_success(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                break status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("child still running after {timeout:?}\n{}", self.output());
            }
            std::thread::sleep(ms(5));
        };
        // Collect the rest of stdout (the reader thread ends at EOF).
        while let Ok(line) = self.lines.recv_timeout(secs(5)) {
            self.seen.push(line);
        }
        let out = self.output();
        assert!(status.success(), "child failed: {status}\n{out}");
        assert!(
            out.contains("1 passed"),
            "child did not run its test function:\n{out}"
        );
    }

    /// Everything the child wrote so far.
    pub fn output(&self) -> String {
        format!(
            "--- child stdout ---\n{}\n--- child stderr ---\n{}",
            self.seen.join("\n"),
            std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
        )
    }
}

impl Drop for ChildTest {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Prints a marker line for the parent and flushes stdout at once. Starts
/// with a newline: the test harness's "test name ... " has none yet.
pub fn marker(line: impl std::fmt::Display) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    writeln!(out, "\n{line}").expect("write marker");
    out.flush().expect("flush marker");
}

// On every engine: `Queue::complete_with` through each engine's own
// transaction type.

/// Creates the table `app_effects` of [`complete_writing`], on any engine.
pub fn create_app_effects(path: &Path) {
    super::engine::execute_batch(
        path,
        "CREATE TABLE IF NOT EXISTS app_effects (job_id BIGINT NOT NULL, note TEXT NOT NULL)",
    );
}

/// The rows of `app_effects`.
pub fn app_effects(path: &Path) -> i64 {
    super::engine::query_int(path, "SELECT count(*) FROM app_effects", &[])
}

/// `complete_with` writing one effect row, through the engine's own
/// transaction type.
pub fn complete_writing(queue: &Queue, lease: &Lease) -> tickler::Result<()> {
    if super::engine::on_postgres() {
        return pg_complete_writing(queue, lease);
    }
    if super::engine::on_mysql() {
        return my_complete_writing(queue, lease);
    }
    queue.complete_with(lease, |tx: &tickler::rusqlite::Transaction| {
        tx.execute(
            "INSERT INTO app_effects (job_id, note) VALUES (?1, 'done')",
            [lease.job_id.0],
        )?;
        Ok(())
    })
}

#[cfg(feature = "postgres")]
fn pg_complete_writing(queue: &Queue, lease: &Lease) -> tickler::Result<()> {
    queue.complete_with(lease, |tx: &mut tickler::postgres::Transaction| {
        tx.execute(
            "INSERT INTO app_effects (job_id, note) VALUES ($1, 'done')",
            &[&lease.job_id.0],
        )?;
        Ok(())
    })
}

#[cfg(not(feature = "postgres"))]
fn pg_complete_writing(_: &Queue, _: &Lease) -> tickler::Result<()> {
    unreachable!("a PostgreSQL case needs the `postgres` feature")
}

#[cfg(feature = "mysql")]
fn my_complete_writing(queue: &Queue, lease: &Lease) -> tickler::Result<()> {
    use tickler::mysql::prelude::Queryable;
    queue.complete_with(lease, |tx: &mut tickler::mysql::Transaction| {
        tx.exec_drop(
            "INSERT INTO app_effects (job_id, note) VALUES (?, 'done')",
            (lease.job_id.0,),
        )?;
        Ok(())
    })
}

#[cfg(not(feature = "mysql"))]
fn my_complete_writing(_: &Queue, _: &Lease) -> tickler::Result<()> {
    unreachable!("a MySQL case needs the `mysql` feature")
}
