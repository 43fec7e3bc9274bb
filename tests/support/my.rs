//! Helpers of the MySQL/MariaDB tests (`tests/mysql`, feature `mysql`).
//!
//! The server comes from `TICKLER_TEST_MYSQL_URL` (`.ci/mariadb` starts a
//! throwaway MariaDB and exports it, with `TICKLER_TEST_MYSQL_CTL`, the
//! command that restarts it). Without it a test fails when `CI=true` and
//! otherwise skips with a note:
//!
//! ```ignore
//! let Some(db) = my::test_database() else { return };
//! ```
//!
//! Each [`TestDb`] is a database of its own, dropped with it. A test that
//! restarts the server takes [`exclusive_database`]: it waits until no
//! other test of its binary holds a database, and the others wait for it.
#![allow(dead_code)]

pub use super::engine::{in_ci, with_dbname};
use mysql::prelude::Queryable;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

/// Held shared by every test's database, alone by a test that restarts
/// the server.
static SERVER: RwLock<()> = RwLock::new(());

/// The server's URL, or `None` (with a note) on a developer machine
/// without one; panics when `CI=true`.
pub fn server_url() -> Option<String> {
    match std::env::var("TICKLER_TEST_MYSQL_URL") {
        Ok(url) if !url.trim().is_empty() => Some(url),
        _ => {
            assert!(
                !in_ci(),
                "a MySQL test found no server: .ci/run starts one (TICKLER_TEST_MYSQL_URL is not set)"
            );
            eprintln!(
                "note: a MySQL test skipped: TICKLER_TEST_MYSQL_URL is not set \
                 (`.ci/mariadb cargo test --features mysql --test mysql` runs it)"
            );
            None
        }
    }
}

enum Guard {
    Shared(#[allow(dead_code)] RwLockReadGuard<'static, ()>),
    Alone(#[allow(dead_code)] RwLockWriteGuard<'static, ()>),
}

/// A database of its own for one test, dropped when this is dropped.
pub struct TestDb {
    name: String,
    url: String,
    server_url: String,
    _guard: Guard,
}

impl TestDb {
    fn create(server_url: &str, guard: Guard) -> TestDb {
        let name = format!("tickler_t_{:016x}", fastrand::u64(..));
        connect(server_url)
            .query_drop(format!("CREATE DATABASE `{name}`"))
            .unwrap_or_else(|e| panic!("CREATE DATABASE {name}: {e}"));
        TestDb {
            url: with_dbname(server_url, &name),
            name,
            server_url: server_url.to_owned(),
            _guard: guard,
        }
    }

    /// The URL of this database, for `Queue::open`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A connection of the test's own to this database.
    pub fn connect(&self) -> mysql::Conn {
        connect(&self.url)
    }

    /// Cuts every connection to this database but the caller's (as a DBA's
    /// `KILL`, a proxy or a network fault would); returns how many.
    pub fn kill_connections(&self) -> usize {
        kill_connections(&self.url)
    }
}

/// Cuts every connection to the database of `url` but the one that cuts;
/// returns how many.
pub fn kill_connections(url: &str) -> usize {
    let mut admin = connect(url);
    let ids: Vec<u64> = admin
        .query(
            "SELECT ID FROM information_schema.PROCESSLIST
             WHERE DB = DATABASE() AND ID <> CONNECTION_ID()",
        )
        .expect("list connections");
    ids.iter()
        .filter(|id| admin.query_drop(format!("KILL CONNECTION {id}")).is_ok())
        .count()
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Ok(mut admin) = mysql::Conn::new(opts(&self.server_url)) {
            let _ = admin.query_drop(format!("DROP DATABASE IF EXISTS `{}`", self.name));
        }
    }
}

/// A fresh database, or `None` when there is no server and `CI` is not
/// `true`.
pub fn test_database() -> Option<TestDb> {
    let url = server_url()?;
    let guard = SERVER.read().unwrap_or_else(|e| e.into_inner());
    Some(TestDb::create(&url, Guard::Shared(guard)))
}

/// A fresh database, with no other test of this binary holding one: for
/// a test that restarts the server.
pub fn exclusive_database() -> Option<TestDb> {
    let url = server_url()?;
    let guard = SERVER.write().unwrap_or_else(|e| e.into_inner());
    Some(TestDb::create(&url, Guard::Alone(guard)))
}

fn opts(url: &str) -> mysql::Opts {
    mysql::OptsBuilder::from_opts(
        mysql::Opts::from_url(url).unwrap_or_else(|e| panic!("not a MySQL URL: {url}: {e}")),
    )
    .tcp_connect_timeout(Some(Duration::from_secs(10)))
    .additional_capabilities(mysql::consts::CapabilityFlags::CLIENT_FOUND_ROWS)
    .into()
}

/// A connection to `url`, retried for up to 30 s while the server refuses
/// connections (as during a restart).
pub fn connect(url: &str) -> mysql::Conn {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match mysql::Conn::new(opts(url)) {
            Ok(conn) => return conn,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(100)),
            Err(e) => panic!("cannot connect to {url}: {e}"),
        }
    }
}

/// Restarts the server with `TICKLER_TEST_MYSQL_CTL` (the caller holds an
/// [`exclusive_database`]); false when the variable is not set.
pub fn restart_server() -> bool {
    let Ok(command) = std::env::var("TICKLER_TEST_MYSQL_CTL") else {
        return false;
    };
    if command.trim().is_empty() {
        return false;
    }
    let status = std::process::Command::new("sh")
        .arg("-c")
        .arg(&command)
        .stdin(std::process::Stdio::null())
        .status()
        .unwrap_or_else(|e| panic!("cannot run TICKLER_TEST_MYSQL_CTL ({command}): {e}"));
    assert!(
        status.success(),
        "TICKLER_TEST_MYSQL_CTL ({command}) failed: {status}"
    );
    if let Some(url) = server_url() {
        connect(&url)
            .query_drop("SELECT 1")
            .expect("server back up");
    }
    true
}

/// The server stopped with SIGSTOP (it accepts TCP but answers nothing, as
/// a host looks to a client while a failover moves its address, or a
/// server frozen by its machine); resumed with SIGCONT when dropped, also
/// when the test panics. For a test holding [`exclusive_database`].
pub struct Stopped(u32);

impl Stopped {
    /// Stops the server whose pid `@@pid_file` names; `None` (with a note)
    /// when this user cannot signal it, which fails in CI.
    pub fn server(url: &str) -> Option<Stopped> {
        let file: String = connect(url)
            .query_first("SELECT @@pid_file")
            .expect("read @@pid_file")
            .expect("the server names its pid file");
        let pid: u32 = match std::fs::read_to_string(&file) {
            Ok(text) => text
                .trim()
                .parse()
                .unwrap_or_else(|e| panic!("{file} holds no pid: {e}")),
            Err(e) => {
                assert!(!in_ci(), "cannot read the server's pid file {file}: {e}");
                eprintln!("note: a MySQL test skipped: cannot read {file}: {e}");
                return None;
            }
        };
        if !signal("STOP", pid) {
            assert!(!in_ci(), "cannot stop the server (pid {pid})");
            eprintln!("note: a MySQL test skipped: cannot signal the server (pid {pid})");
            return None;
        }
        Some(Stopped(pid))
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        assert!(
            signal("CONT", self.0),
            "cannot resume the server (pid {})",
            self.0
        );
    }
}

fn signal(name: &str, pid: u32) -> bool {
    std::process::Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .stdin(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}
