//! Helpers of the PostgreSQL tests (`tests/pg_*.rs`, feature `postgres`).
//!
//! The server comes from `TICKLER_TEST_DATABASE_URL` (`.ci/postgres` starts
//! a throwaway one and exports it; `.ci/run` does that before the
//! PostgreSQL tests). Without it a test fails when `CI=true` and otherwise
//! skips with a note:
//!
//! ```ignore
//! let Some(db) = pg::test_database() else { return };
//! ```
//!
//! Each [`TestDb`] is a fresh database of its own, dropped with it, so the
//! tests of a file run in parallel. A test that restarts the server takes
//! [`exclusive_server`] first: it waits until no other test of its binary
//! holds a `TestDb`, and the others wait for it. (cargo runs test binaries
//! one after another, so one binary's lock is enough.)
#![allow(dead_code)]

pub use super::engine::in_ci;
use std::collections::HashMap;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use postgres::error::SqlState;
use postgres::{Client, Config, NoTls};

/// The URL of the server's test database, or `None` (with a note) when
/// there is no server on a developer machine; panics when `CI=true`.
pub fn server_url() -> Option<String> {
    match std::env::var("TICKLER_TEST_DATABASE_URL") {
        Ok(url) if !url.trim().is_empty() => Some(url),
        _ => {
            if in_ci() {
                panic!(
                    "a PostgreSQL test found no server: .ci/run starts one \
                     (TICKLER_TEST_DATABASE_URL is not set)"
                );
            }
            eprintln!(
                "note: {} skipped: TICKLER_TEST_DATABASE_URL is not set \
                 (`.ci/postgres cargo test --features postgres --test 'pg_*'` \
                 runs it against a throwaway server)",
                test_name()
            );
            None
        }
    }
}

/// A fresh database for this test, or `None` (the test returns early)
/// when there is no server and `CI` is not `true`.
pub fn test_database() -> Option<TestDb> {
    server_url().map(|url| TestDb::create(&url))
}

fn test_name() -> String {
    // libtest names each test's thread after the test.
    std::thread::current()
        .name()
        .unwrap_or("a PostgreSQL test")
        .to_owned()
}

/// A connection to `url` that shows as `application_name` in
/// `pg_stat_activity`. Retries for up to 30 s while the server refuses
/// connections (as during a restart).
pub fn connect(url: &str, application_name: &str) -> Client {
    let mut config: Config = url
        .parse()
        .unwrap_or_else(|e| panic!("not a PostgreSQL URL: {url}: {e}"));
    config
        .application_name(application_name)
        .connect_timeout(Duration::from_secs(10));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match config.connect(NoTls) {
            Ok(client) => return client,
            Err(_) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => panic!("cannot connect to {url}: {e}"),
        }
    }
}

pub use super::engine::with_dbname;

/// Creates the role `name` with `options` (`LOGIN`, `NOLOGIN`) unless it
/// exists: roles belong to the server and outlive the tests' databases.
pub fn ensure_role(client: &mut Client, name: &str, options: &str) {
    client
        .batch_execute(&format!(
            "DO $$ BEGIN
               IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{name}') THEN
                 CREATE ROLE {name} {options};
               END IF;
             END $$;"
        ))
        .unwrap_or_else(|e| panic!("CREATE ROLE {name}: {}", describe(&e)));
}

/// A database of its own for one test: created from `template0` under a
/// random name through the server URL, dropped (its connections cut first)
/// when this is dropped.
pub struct TestDb {
    name: String,
    url: String,
    server_url: String,
    _shared: Option<SharedServer>,
}

impl TestDb {
    /// Creates a fresh database through `server_url` (any database of the
    /// server that the URL's user may connect to and create databases
    /// from).
    pub fn create(server_url: &str) -> TestDb {
        let shared = SharedServer::take();
        let name = format!(
            "tickler_t_{}_{:016x}",
            std::process::id(),
            fastrand::u64(..)
        );
        let mut admin = connect(server_url, "tickler_test_harness");
        admin
            .batch_execute(&format!("CREATE DATABASE \"{name}\" TEMPLATE template0"))
            .unwrap_or_else(|e| panic!("CREATE DATABASE {name}: {}", describe(&e)));
        TestDb {
            url: with_dbname(server_url, &name),
            name,
            server_url: server_url.to_owned(),
            _shared: shared,
        }
    }

    /// Its URL, for `Queue::open` or the engine's own connections.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Its database name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The URL of the database it was created through (still there after
    /// this one is dropped).
    pub fn server_url(&self) -> &str {
        &self.server_url
    }

    /// A new connection to it, as application `tickler_test`.
    pub fn connect(&self) -> Client {
        connect(&self.url, "tickler_test")
    }

    /// A new connection to it under an application name of its own (for
    /// [`terminate_connections`]).
    pub fn connect_as(&self, application_name: &str) -> Client {
        connect(&self.url, application_name)
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let result = (|| -> Result<(), postgres::Error> {
            let mut admin = connect(&self.server_url, "tickler_test_harness");
            let mut tries = 0;
            loop {
                // A pool may reconnect between the two statements; FORCE
                // (PostgreSQL 13+) cuts those too, the retry covers the rest.
                admin.execute(
                    "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity
                     WHERE datname = $1 AND pid <> pg_backend_pid()",
                    &[&self.name],
                )?;
                match admin.batch_execute(&format!(
                    "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
                    self.name
                )) {
                    Ok(()) => return Ok(()),
                    Err(e) if e.code() == Some(&SqlState::OBJECT_IN_USE) && tries < 50 => {
                        tries += 1;
                        std::thread::sleep(Duration::from_millis(100));
                    }
                    Err(e) => return Err(e),
                }
            }
        })();
        if let Err(e) = result {
            let message = format!(
                "could not drop test database {}: {}",
                self.name,
                describe(&e)
            );
            if std::thread::panicking() {
                eprintln!("{message}");
            } else {
                panic!("{message}");
            }
        }
    }
}

/// A PostgreSQL error with the server's message (the client's Display of
/// a server error is only "db error").
pub fn describe(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{}: {} ({})", db.severity(), db.message(), db.code().code()),
        None => e.to_string(),
    }
}

/// Enqueues `job` and claims the first due job (the highest priority),
/// with a 30 s lease: a job for a test's `complete_with`.
pub fn enqueue_and_claim(queue: &tickler::Queue, job: tickler::NewJob) -> tickler::Lease {
    queue.enqueue(job).unwrap();
    queue
        .manual()
        .claim("default", "w", 1, Duration::from_secs(30))
        .unwrap()
        .remove(0)
}

/// Cuts, on the server side, the connections to the database of `url`
/// (all of them with `None`, else those whose `application_name` is the
/// given one), except the one this function opens to do it; returns once
/// they are gone, with how many there were. The next query on a cut
/// connection fails.
pub fn terminate_connections(url: &str, application_name: Option<&str>) -> usize {
    let mut client = connect(url, "tickler_test_terminator");
    let row = client
        .query_one(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 5000))
             FROM pg_stat_activity
             WHERE datname = current_database() AND pid <> pg_backend_pid()
               AND backend_type = 'client backend'
               AND ($1::text IS NULL OR application_name = $1)",
            &[&application_name],
        )
        .expect("pg_terminate_backend");
    usize::try_from(row.get::<_, i64>(0)).expect("count")
}

/// Whether [`restart_server`] can restart the server here.
/// (`TICKLER_TEST_PG_CTL` is set; `.ci/postgres` sets it.)
pub fn can_restart_server() -> bool {
    std::env::var("TICKLER_TEST_PG_CTL").is_ok_and(|c| !c.trim().is_empty())
}

/// Restarts the server (fast shutdown: open connections are cut) with the
/// command in `TICKLER_TEST_PG_CTL` and returns once it accepts
/// connections again; `false` (nothing done) if that variable is not set.
/// The calling thread must hold [`exclusive_server`].
pub fn restart_server() -> bool {
    let Ok(command) = std::env::var("TICKLER_TEST_PG_CTL") else {
        return false;
    };
    if command.trim().is_empty() {
        return false;
    }
    assert!(
        ExclusiveServer::held_by_this_thread(),
        "restart_server() needs exclusive_server() first: it would cut the \
         connections of the other tests running in parallel"
    );
    let status = std::process::Command::new("sh")
        .arg("-c")
        .arg(&command)
        .stdin(std::process::Stdio::null())
        .status()
        .unwrap_or_else(|e| panic!("cannot run TICKLER_TEST_PG_CTL ({command}): {e}"));
    assert!(
        status.success(),
        "TICKLER_TEST_PG_CTL ({command}) failed: {status}"
    );
    if let Some(url) = server_url() {
        let mut client = connect(&url, "tickler_test_harness");
        client.simple_query("SELECT 1").expect("server back up");
    }
    true
}

// ------------------------------------------------ shared / exclusive server

#[derive(Default)]
struct ServerUse {
    /// Live `TestDb`s per thread that created them.
    shared: HashMap<ThreadId, usize>,
    exclusive: Option<ThreadId>,
}

static SERVER_USE: Mutex<Option<ServerUse>> = Mutex::new(None);
static SERVER_USE_CHANGED: Condvar = Condvar::new();

fn server_use() -> MutexGuard<'static, Option<ServerUse>> {
    // A test that panicked while holding the lock changed nothing halfway.
    SERVER_USE.lock().unwrap_or_else(|e| e.into_inner())
}

/// What a `TestDb` holds: the server is not restarted under it.
struct SharedServer {
    thread: ThreadId,
}

impl SharedServer {
    /// `None` on the thread that holds the exclusive use (its own
    /// `TestDb`s need no share).
    fn take() -> Option<SharedServer> {
        let me = std::thread::current().id();
        let mut guard = server_use();
        loop {
            let state = guard.get_or_insert_with(ServerUse::default);
            match state.exclusive {
                Some(holder) if holder == me => return None,
                Some(_) => {
                    guard = SERVER_USE_CHANGED
                        .wait(guard)
                        .unwrap_or_else(|e| e.into_inner());
                }
                None => {
                    *state.shared.entry(me).or_default() += 1;
                    return Some(SharedServer { thread: me });
                }
            }
        }
    }
}

impl Drop for SharedServer {
    fn drop(&mut self) {
        let mut guard = server_use();
        if let Some(state) = guard.as_mut() {
            if let Some(n) = state.shared.get_mut(&self.thread) {
                *n -= 1;
                if *n == 0 {
                    state.shared.remove(&self.thread);
                }
            }
        }
        SERVER_USE_CHANGED.notify_all();
    }
}

/// Sole use of the server among this binary's tests, until dropped.
pub struct ExclusiveServer {
    _private: (),
}

/// Waits until no other test of this binary holds a `TestDb`, and keeps
/// them from creating one until the returned guard is dropped. Take it
/// before this test's own `TestDb`s.
pub fn exclusive_server() -> ExclusiveServer {
    let me = std::thread::current().id();
    let mut guard = server_use();
    loop {
        let state = guard.get_or_insert_with(ServerUse::default);
        assert!(
            !state.shared.contains_key(&me),
            "take exclusive_server() before creating this test's TestDb"
        );
        if state.exclusive.is_none() && state.shared.is_empty() {
            state.exclusive = Some(me);
            return ExclusiveServer { _private: () };
        }
        guard = SERVER_USE_CHANGED
            .wait(guard)
            .unwrap_or_else(|e| e.into_inner());
    }
}

impl ExclusiveServer {
    fn held_by_this_thread() -> bool {
        let me = std::thread::current().id();
        server_use()
            .as_ref()
            .is_some_and(|s| s.exclusive == Some(me))
    }
}

impl Drop for ExclusiveServer {
    fn drop(&mut self) {
        if let Some(state) = server_use().as_mut() {
            state.exclusive = None;
        }
        SERVER_USE_CHANGED.notify_all();
    }
}

// ------------------------------------------------ a primary and its standby

/// A primary and a streaming standby of their own (`.ci/pg-standby`,
/// through `TICKLER_TEST_PG_STANDBY`), for the failover tests: stopped and
/// removed when dropped. The shared server is not touched.
pub struct StandbyPair {
    name: String,
    command: String,
    /// The primary's port, then the standby's, on 127.0.0.1.
    pub ports: (u16, u16),
}

impl StandbyPair {
    /// Starts a pair (`sync`: the primary's commits wait for the standby),
    /// or `None` with a note where the command is not set and `CI` is not
    /// `true`.
    pub fn start(name: &str, sync: bool) -> Option<StandbyPair> {
        StandbyPair::start_with_standby_ahead(name, sync, None)
    }

    /// [`StandbyPair::start`] with the standby's clock `ahead` of this
    /// machine's (libfaketime): a promoted standby whose clock is not the
    /// old primary's.
    pub fn start_with_standby_ahead(
        name: &str,
        sync: bool,
        ahead: Option<Duration>,
    ) -> Option<StandbyPair> {
        let command = match std::env::var("TICKLER_TEST_PG_STANDBY") {
            Ok(c) if !c.trim().is_empty() => c,
            _ => {
                assert!(
                    !in_ci(),
                    "a failover test found no TICKLER_TEST_PG_STANDBY: .ci/postgres sets it"
                );
                eprintln!(
                    "note: {} skipped: TICKLER_TEST_PG_STANDBY is not set (run under .ci/postgres)",
                    test_name()
                );
                return None;
            }
        };
        let name = format!("{name}-{}", std::process::id());
        let mut pair = StandbyPair {
            name,
            command,
            ports: (0, 0),
        };
        let mode = if sync { "sync" } else { "async" };
        let ahead = ahead.map(|d| d.as_secs().to_string());
        let out = match &ahead {
            Some(secs) => pair.run(&["start", mode, secs]),
            None => pair.run(&["start", mode]),
        };
        let mut ports = out.split_whitespace().map(|p| p.parse().expect("a port"));
        pair.ports = (ports.next().expect("port"), ports.next().expect("port"));
        Some(pair)
    }

    /// A URL naming both servers, primary first, that connects only to the
    /// one that takes writes (libpq's `target_session_attrs=read-write`).
    pub fn url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/postgres?target_session_attrs=read-write&sslmode=disable",
            self.ports.0, self.ports.1
        )
    }

    /// A plain connection to the primary (`false`) or the standby (`true`).
    pub fn connect(&self, standby: bool) -> Client {
        let port = if standby { self.ports.1 } else { self.ports.0 };
        connect(
            &format!("postgres://postgres@127.0.0.1:{port}/postgres?sslmode=disable"),
            "tickler_test_harness",
        )
    }

    /// The standby stops receiving the primary's changes (a sync primary
    /// then waits for it at each commit).
    pub fn cut(&self) {
        self.run(&["cut"]);
    }

    /// The primary goes silent, as a host that lost power does: every
    /// packet to or from it is dropped, so no reset and no answer comes.
    pub fn silence(&self) {
        self.run(&["silence"]);
    }

    /// The primary stops at once, as in a crash, and the standby is
    /// promoted; returns once the standby takes writes.
    pub fn failover(&self) {
        self.run(&["failover"]);
    }

    /// The shell command that does [`StandbyPair::failover`], for a
    /// harness that runs its own commands (the torture run's restarts).
    pub fn failover_command(&self) -> String {
        format!("{} failover {}", self.command, self.name)
    }

    fn run(&self, args: &[&str]) -> String {
        let script = format!("{} {} {}", self.command, args[0], self.name);
        let script = args[1..].iter().fold(script, |s, a| format!("{s} {a}"));
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(&script)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run {script}: {e}"));
        assert!(
            out.status.success(),
            "{script} failed: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for StandbyPair {
    fn drop(&mut self) {
        let _ = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("{} stop {}", self.command, self.name))
            .stdin(std::process::Stdio::null())
            .output();
    }
}
