//! Which engine a test runs on, and the harness that runs one contract
//! body on every engine.
//!
//! [`contract!`] turns `fn name() { … }` into the body `name` and a module
//! `name` with one test case per engine (`name::sqlite`, `name::postgres`),
//! so that a guarantee is written once and checked on each engine. The
//! sqlite and postgres cases of one body run in the same process, in
//! parallel threads: the engine is a thread-local that the generated case
//! sets before it calls the body, not a process-wide variable. Threads a
//! body spawns do not inherit thread-locals, so [`temp_db`] also records
//! the engine of the directory it makes, and [`target`] reads it from the
//! path first.
//!
//! A test opens its queue at `target(path)` instead of `path`: on SQLite
//! that is the path; on PostgreSQL it is the URL of a database of its own,
//! named after the path, so opening the same path again (a restarted
//! process, a second process) reaches the same database. [`run`] drops the
//! databases its case made when the case passes (a failed case keeps its
//! own, to be looked at): over a whole run of the suite they would fill
//! the disk of a small machine.
//!
//! A child process (this test binary run again for one case, the `tickler`
//! binary, an example) learns its engine from [`ENGINE_VAR`], set on its
//! `Command` only ([`Engine::pass_to`]).
//!
//! [`temp_db`]: super::common::temp_db
#![allow(dead_code)]

use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// The variable that names the engine of a child process.
pub const ENGINE_VAR: &str = "TICKLER_TEST_ENGINE";

/// An engine the contract runs on. A new engine is a variant here (its
/// name and URL variable in the two tables below) and one case line in
/// [`engine_cases!`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    Sqlite,
    Postgres,
    Mysql,
    /// PostgreSQL through PgBouncer in transaction mode, opened with
    /// `pooler=transaction`: for the bodies of claims and pools
    /// (`contract! { poolers: … }`).
    PgBouncerTransaction,
    /// PostgreSQL through PgBouncer in session mode, with the defaults.
    PgBouncerSession,
}

impl Engine {
    /// The name of its test case, and of its value of [`ENGINE_VAR`].
    pub fn name(self) -> &'static str {
        match self {
            Engine::Sqlite => "sqlite",
            Engine::Postgres => "postgres",
            Engine::Mysql => "mysql",
            Engine::PgBouncerTransaction => "pgbouncer_transaction",
            Engine::PgBouncerSession => "pgbouncer_session",
        }
    }

    /// True for PostgreSQL, also through a pooler: the same server, SQL
    /// and helpers.
    pub fn is_postgres(self) -> bool {
        matches!(
            self,
            Engine::Postgres | Engine::PgBouncerTransaction | Engine::PgBouncerSession
        )
    }

    /// True for the engine without a server (SQLite): one file.
    pub fn is_embedded(self) -> bool {
        self.url_var().is_none()
    }

    /// The variable holding the URL of its server (`None`: embedded).
    pub fn url_var(self) -> Option<&'static str> {
        match self {
            Engine::Sqlite => None,
            Engine::Postgres => Some("TICKLER_TEST_DATABASE_URL"),
            Engine::Mysql => Some("TICKLER_TEST_MYSQL_URL"),
            Engine::PgBouncerTransaction => Some("TICKLER_TEST_PGBOUNCER_TX_URL"),
            Engine::PgBouncerSession => Some("TICKLER_TEST_PGBOUNCER_SESSION_URL"),
        }
    }

    fn from_name(name: &str) -> Option<Engine> {
        [
            Engine::Sqlite,
            Engine::Postgres,
            Engine::Mysql,
            Engine::PgBouncerTransaction,
            Engine::PgBouncerSession,
        ]
        .into_iter()
        .find(|e| e.name().eq_ignore_ascii_case(name))
    }

    /// Tells a child process which engine it runs on.
    pub fn pass_to(self, cmd: &mut std::process::Command) {
        cmd.env(ENGINE_VAR, self.name());
    }
}

thread_local! {
    static CURRENT: Cell<Option<Engine>> = const { Cell::new(None) };
    /// The run of [`run`] this thread is in (0: none).
    static CASE: Cell<u64> = const { Cell::new(0) };
}

static NEXT_CASE: AtomicU64 = AtomicU64::new(1);

/// Directories made by `temp_db`, with the engine and the run of the case
/// that made them.
static DIRS: Mutex<Vec<(PathBuf, Engine, u64)>> = Mutex::new(Vec::new());

/// Databases [`target`] made on a server: the run of their case, the
/// server's engine (PostgreSQL also for a pooler's case) and the name.
static DATABASES: Mutex<Vec<(u64, Engine, String)>> = Mutex::new(Vec::new());

/// The engine of this thread's test case; else the one a parent process
/// passed in [`ENGINE_VAR`]; else SQLite.
pub fn current() -> Engine {
    if let Some(engine) = CURRENT.with(Cell::get) {
        return engine;
    }
    match std::env::var(ENGINE_VAR) {
        Ok(name) => Engine::from_name(&name)
            .unwrap_or_else(|| panic!("{ENGINE_VAR}={name} names no engine of the tests")),
        Err(_) => Engine::Sqlite,
    }
}

/// Records that `dir` belongs to the current case (see the module doc).
pub fn claim_dir(dir: &Path) {
    let mut dirs = DIRS.lock().unwrap_or_else(|e| e.into_inner());
    dirs.retain(|(d, _, _)| d.exists());
    dirs.push((dir.to_path_buf(), current(), CASE.with(Cell::get)));
}

/// The engine of the queue whose file would be `path`.
pub fn engine_of(path: &Path) -> Engine {
    let dirs = DIRS.lock().unwrap_or_else(|e| e.into_inner());
    dirs.iter()
        .find(|(d, _, _)| path.starts_with(d))
        .map(|(_, e, _)| *e)
        .unwrap_or_else(current)
}

/// The run of the case the queue whose file would be `path` belongs to.
fn case_of(path: &Path) -> u64 {
    let dirs = DIRS.lock().unwrap_or_else(|e| e.into_inner());
    dirs.iter()
        .find(|(d, _, _)| path.starts_with(d))
        .map(|(_, _, case)| *case)
        .unwrap_or_else(|| CASE.with(Cell::get))
}

/// Notes that `target` made (or reached) the database `name` for `path`.
fn made_database(path: &Path, engine: Engine, name: &str) {
    let case = case_of(path);
    let mut made = DATABASES.lock().unwrap_or_else(|e| e.into_inner());
    if case != 0 && !made.iter().any(|(c, _, n)| *c == case && n == name) {
        made.push((case, engine, name.to_owned()));
    }
}

/// Drops the databases the run `case` made. Not in a child process: its
/// parent, the case itself, still reads them after it exits.
fn drop_databases(case: u64) {
    if std::env::var_os(ENGINE_VAR).is_some() {
        return;
    }
    let mine: Vec<(Engine, String)> = {
        let mut made = DATABASES.lock().unwrap_or_else(|e| e.into_inner());
        let (mine, rest) = std::mem::take(&mut *made)
            .into_iter()
            .partition(|(c, _, _)| *c == case);
        *made = rest;
        mine.into_iter().map(|(_, e, n)| (e, n)).collect()
    };
    for (engine, name) in mine {
        match engine {
            Engine::Mysql => drop_mysql_database(&name),
            _ => drop_postgres_database(&name),
        }
    }
}

#[cfg(feature = "mysql")]
fn drop_mysql_database(name: &str) {
    use mysql::prelude::Queryable;
    let Ok(server) = std::env::var("TICKLER_TEST_MYSQL_URL") else {
        return;
    };
    let Ok(mut admin) = mysql::Opts::from_url(&server)
        .map_err(|e| e.to_string())
        .and_then(|opts| mysql::Conn::new(opts).map_err(|e| e.to_string()))
    else {
        return;
    };
    // A connection a case left open (a leaked pool) would hold the drop
    // on its metadata lock: cut them, and bound the wait.
    let ids: Vec<u64> = admin
        .exec(
            "SELECT ID FROM information_schema.PROCESSLIST WHERE DB = ? AND ID <> CONNECTION_ID()",
            (name,),
        )
        .unwrap_or_default();
    for id in ids {
        let _ = admin.query_drop(format!("KILL CONNECTION {id}"));
    }
    let _ = admin.query_drop("SET SESSION lock_wait_timeout = 10");
    if let Err(e) = admin.query_drop(format!("DROP DATABASE IF EXISTS `{name}`")) {
        eprintln!("note: DROP DATABASE {name}: {e}");
    }
}

#[cfg(not(feature = "mysql"))]
fn drop_mysql_database(_name: &str) {}

#[cfg(feature = "postgres")]
fn drop_postgres_database(name: &str) {
    let Ok(server) = std::env::var("TICKLER_TEST_DATABASE_URL") else {
        return;
    };
    let Ok(mut admin) = postgres::Client::connect(&server, postgres::NoTls) else {
        return;
    };
    // FORCE cuts what a case left connected, a pooler's server
    // connections among them.
    if let Err(e) = admin.batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
    {
        eprintln!("note: DROP DATABASE {name}: {e:?}");
    }
}

#[cfg(not(feature = "postgres"))]
fn drop_postgres_database(_name: &str) {}

/// True when this thread's case runs on PostgreSQL (also through a
/// pooler).
pub fn on_postgres() -> bool {
    current().is_postgres()
}

/// True when this thread's case runs on MySQL/MariaDB.
pub fn on_mysql() -> bool {
    current() == Engine::Mysql
}

/// `CI=true`: a case that cannot run fails rather than skips.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
}

/// Runs `body` as the case of `engine`: skips it with a note when the
/// engine's server is not configured on a developer machine, and fails
/// then under CI, which must never skip silently.
pub fn run(engine: Engine, body: fn()) {
    if let Some(var) = engine.url_var() {
        if std::env::var(var).map_or(true, |v| v.trim().is_empty()) {
            let case = std::thread::current().name().unwrap_or("a case").to_owned();
            assert!(
                !in_ci(),
                "{case}: {var} is not set (CI must run every engine; .ci/postgres and \
                 .ci/mariadb set it)"
            );
            eprintln!(
                "note: {case} skipped: {var} is not set (`.ci/postgres cargo test --release \
                 --features postgres --test contract` runs it, `.ci/mariadb` the mysql cases)"
            );
            return;
        }
    }
    struct Reset(Option<Engine>, u64);
    impl Drop for Reset {
        fn drop(&mut self) {
            CURRENT.with(|c| c.set(self.0));
            let case = CASE.with(|c| c.replace(self.1));
            if !std::thread::panicking() {
                drop_databases(case);
            }
        }
    }
    let case = NEXT_CASE.fetch_add(1, Ordering::Relaxed);
    let _reset = Reset(
        CURRENT.with(|c| c.replace(Some(engine))),
        CASE.with(|c| c.replace(case)),
    );
    body();
}

/// The name libtest gives the test `f` of the module `module_path`
/// (`module_path!()`, whose first segment is the target's crate).
pub fn test_path(module_path: &str, f: &str) -> String {
    match module_path.split_once("::") {
        Some((_, inner)) => format!("{inner}::{f}"),
        None => f.to_owned(),
    }
}

/// The name of the current engine's case of the contract body `f` of
/// `module_path`: what a child process runs to be that case again.
pub fn case_name(module_path: &str, f: &str) -> String {
    format!("{}::{}", test_path(module_path, f), current().name())
}

/// A command that runs this test binary again as the current engine's case
/// of the contract body `f` of `module_path` (`module_path!()`), alone and
/// with its output not captured, with the engine passed on
/// ([`ENGINE_VAR`]): a second process of the same test.
pub fn child_case(module_path: &str, f: &str) -> std::process::Command {
    let exe = std::env::current_exe().expect("test binary path");
    let mut cmd = std::process::Command::new(exe);
    cmd.args([
        "--exact",
        case_name(module_path, f).as_str(),
        "--nocapture",
        "--test-threads=1",
    ]);
    current().pass_to(&mut cmd);
    cmd
}

/// The test cases of one body, one per engine: `$body` is the path of a
/// `fn()`. The PostgreSQL case is compiled with the `postgres` feature, the
/// MySQL/MariaDB case with `mysql`.
#[macro_export]
macro_rules! engine_cases {
    ($body:path) => {
        #[test]
        fn sqlite() {
            $crate::support::engine::run($crate::support::engine::Engine::Sqlite, $body);
        }

        #[cfg(feature = "postgres")]
        #[test]
        fn postgres() {
            $crate::support::engine::run($crate::support::engine::Engine::Postgres, $body);
        }

        #[cfg(feature = "mysql")]
        #[test]
        fn mysql() {
            $crate::support::engine::run($crate::support::engine::Engine::Mysql, $body);
        }
    };
    (poolers: $body:path) => {
        $crate::engine_cases!($body);

        #[cfg(feature = "postgres")]
        #[test]
        fn pgbouncer_transaction() {
            $crate::support::engine::run(
                $crate::support::engine::Engine::PgBouncerTransaction,
                $body,
            );
        }

        #[cfg(feature = "postgres")]
        #[test]
        fn pgbouncer_session() {
            $crate::support::engine::run($crate::support::engine::Engine::PgBouncerSession, $body);
        }
    };
}

/// One contract body, run on every engine: `contract! { /// doc
/// fn name() { … } }` keeps `name` as it is and adds the module `name`
/// with a case per engine ([`engine_cases!`]).
///
/// `contract! { sqlite_only: … }` generates the SQLite case alone, and
/// `contract! { servers_only: … }` the cases of the server engines; the
/// doc must say why the guarantee is not every engine's.
/// `contract! { poolers: … }` adds, to every engine's case, PostgreSQL
/// through PgBouncer in transaction and in session mode: the bodies of
/// claims, fencing and pools, which a pooler must not change.
#[macro_export]
macro_rules! contract {
    ($(#[$meta:meta])* fn $name:ident() $body:block) => {
        $(#[$meta])*
        fn $name() $body

        mod $name {
            $crate::engine_cases!(super::$name);
        }
    };
    (poolers: $(#[$meta:meta])* fn $name:ident() $body:block) => {
        $(#[$meta])*
        fn $name() $body

        mod $name {
            $crate::engine_cases!(poolers: super::$name);
        }
    };
    (servers_only: $(#[$meta:meta])* fn $name:ident() $body:block) => {
        $(#[$meta])*
        // A build without a server engine has no case to run it.
        #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
        fn $name() $body

        mod $name {
            #[cfg(feature = "postgres")]
            #[test]
            fn postgres() {
                $crate::support::engine::run($crate::support::engine::Engine::Postgres, super::$name);
            }

            #[cfg(feature = "mysql")]
            #[test]
            fn mysql() {
                $crate::support::engine::run($crate::support::engine::Engine::Mysql, super::$name);
            }
        }
    };
    (sqlite_only: $(#[$meta:meta])* fn $name:ident() $body:block) => {
        $(#[$meta])*
        fn $name() $body

        mod $name {
            #[test]
            fn sqlite() {
                $crate::support::engine::run($crate::support::engine::Engine::Sqlite, super::$name);
            }
        }
    };
}

/// Where the queue of a test whose file would be `path` lives.
pub fn target(path: &Path) -> PathBuf {
    // A path made without `temp_db` still tells the threads its case
    // spawns which engine it is on, once the case has used it.
    if CURRENT.with(Cell::get).is_some() {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            let known = DIRS
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .any(|(d, _, _)| dir.starts_with(d));
            if !known {
                claim_dir(dir);
            }
        }
    }
    match engine_of(path) {
        Engine::Sqlite => path.to_path_buf(),
        Engine::Postgres => postgres_target(path),
        Engine::Mysql => mysql_target(path),
        pooled @ (Engine::PgBouncerTransaction | Engine::PgBouncerSession) => {
            // Made on the server, reached through the pooler.
            postgres_target(path);
            let var = pooled.url_var().expect("a pooler's URL variable");
            let pooler = std::env::var(var).unwrap_or_else(|_| {
                panic!("a case through PgBouncer needs {var} (.ci/postgres sets it)")
            });
            let name = database_name(path);
            let url = with_dbname(&pooler, &name);
            PathBuf::from(if pooled == Engine::PgBouncerTransaction {
                with_param(&url, "pooler=transaction")
            } else {
                url
            })
        }
    }
}

/// The URL of the server itself for the queue whose file would be `path`
/// (also when the queue reaches it through a pooler): for the tests' own
/// statements, which a pooler in transaction mode would not carry.
pub fn server_target(path: &Path) -> PathBuf {
    match engine_of(path) {
        Engine::PgBouncerTransaction | Engine::PgBouncerSession => postgres_target(path),
        _ => target(path),
    }
}

/// `url` with `param` (`key=value`) added to its query.
pub fn with_param(url: &str, param: &str) -> String {
    let joint = if url.contains('?') { '&' } else { '?' };
    format!("{url}{joint}{param}")
}

/// The name of the database of the queue whose file would be `path`.
fn database_name(path: &Path) -> String {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    path.hash(&mut hasher);
    format!("tickler_c_{:016x}", hasher.finish())
}

#[cfg(feature = "mysql")]
fn mysql_target(path: &Path) -> PathBuf {
    use mysql::prelude::Queryable;
    let server = std::env::var("TICKLER_TEST_MYSQL_URL")
        .expect("a MySQL case needs TICKLER_TEST_MYSQL_URL (.ci/mariadb sets it)");
    let name = database_name(path);
    let mut admin = mysql::Conn::new(
        mysql::Opts::from_url(&server).unwrap_or_else(|e| panic!("{server}: {e}")),
    )
    .unwrap_or_else(|e| panic!("cannot connect to {server}: {e}"));
    admin
        .query_drop(format!("CREATE DATABASE IF NOT EXISTS `{name}`"))
        .unwrap_or_else(|e| panic!("CREATE DATABASE {name}: {e}"));
    made_database(path, Engine::Mysql, &name);
    PathBuf::from(with_dbname(&server, &name))
}

#[cfg(not(feature = "mysql"))]
fn mysql_target(_path: &Path) -> PathBuf {
    panic!("a MySQL case needs the `mysql` feature (--features mysql)")
}

#[cfg(feature = "postgres")]
fn postgres_target(path: &Path) -> PathBuf {
    let server = std::env::var("TICKLER_TEST_DATABASE_URL")
        .expect("a PostgreSQL case needs TICKLER_TEST_DATABASE_URL (.ci/postgres sets it)");
    let name = database_name(path);
    // Many cases at once may hold most of the server's connections for a
    // moment (each queue has a pool and a listener): a full server is
    // waited for, anything else fails the case.
    let mut tries = 0;
    let mut admin = loop {
        match postgres::Client::connect(&server, postgres::NoTls) {
            Ok(client) => break client,
            Err(e)
                if tries < 100
                    && e.code() == Some(&postgres::error::SqlState::TOO_MANY_CONNECTIONS) =>
            {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            Err(e) => panic!("cannot connect to {server}: {e:?}"),
        }
    };
    match admin.batch_execute(&format!("CREATE DATABASE \"{name}\" TEMPLATE template0")) {
        Ok(()) => {}
        Err(e) if e.code() == Some(&postgres::error::SqlState::DUPLICATE_DATABASE) => {}
        Err(e) => panic!("CREATE DATABASE {name}: {e:?}"),
    }
    made_database(path, Engine::Postgres, &name);
    PathBuf::from(with_dbname(&server, &name))
}

#[cfg(not(feature = "postgres"))]
fn postgres_target(_path: &Path) -> PathBuf {
    panic!("a PostgreSQL case needs the `postgres` feature (--features postgres)")
}

/// `url` with its database name replaced by `dbname` (URL form:
/// `postgres://user@host:port/dbname?params`).
pub fn with_dbname(url: &str, dbname: &str) -> String {
    let scheme_end = url
        .find("://")
        .unwrap_or_else(|| panic!("a server URL must be a URL (postgres://…, mysql://…): {url}"))
        + 3;
    let rest = &url[scheme_end..];
    let query_at = rest.find('?').unwrap_or(rest.len());
    let authority_end = rest[..query_at].find('/').unwrap_or(query_at);
    format!(
        "{}{}/{}{}",
        &url[..scheme_end],
        &rest[..authority_end],
        dbname,
        &rest[query_at..]
    )
}

/// A value bound to, or read from, a statement of [`execute`] and
/// [`query_row`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    Null,
    Int(i64),
    Text(String),
}

impl Value {
    /// The integer, or a panic naming what was there instead.
    pub fn int(&self) -> i64 {
        match self {
            Value::Int(n) => *n,
            other => panic!("expected an integer, found {other:?}"),
        }
    }

    /// The text, or a panic naming what was there instead.
    pub fn text(&self) -> &str {
        match self {
            Value::Text(s) => s,
            other => panic!("expected text, found {other:?}"),
        }
    }
}

impl From<i64> for Value {
    fn from(n: i64) -> Self {
        Value::Int(n)
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Self {
        Value::Text(s.to_owned())
    }
}

impl From<String> for Value {
    fn from(s: String) -> Self {
        Value::Text(s)
    }
}

impl From<Option<i64>> for Value {
    fn from(n: Option<i64>) -> Self {
        n.map_or(Value::Null, Value::Int)
    }
}

/// Runs one statement on the queue of a test whose file would be `path`,
/// beside tickler's own connections, and returns the rows it changed: the
/// way a test sets up a state the API cannot reach (an attempt count of
/// 9,999, a row changed by hand). `sql` is written once for both engines,
/// with `?1`, `?2`… placeholders (`$1`, `$2`… on PostgreSQL, positional
/// `?`s on MySQL).
pub fn execute(path: &Path, sql: &str, params: &[Value]) -> u64 {
    match engine_of(path) {
        e if e.is_postgres() => return pg::execute(&server_target(path), sql, params),
        Engine::Mysql => return my::execute(&target(path), sql, params),
        _ => {}
    }
    let conn = sqlite(path);
    let params: Vec<&dyn rusqlite::ToSql> = params.iter().map(sqlite_param).collect();
    conn.execute(sql, params.as_slice())
        .unwrap_or_else(|e| panic!("{sql}: {e}")) as u64
}

/// Runs statements without parameters, such as a trigger a test installs
/// (whose SQL differs between the engines).
pub fn execute_batch(path: &Path, sql: &str) {
    match engine_of(path) {
        e if e.is_postgres() => return pg::execute_batch(&server_target(path), sql),
        Engine::Mysql => return my::execute_batch(&target(path), sql),
        _ => {}
    }
    sqlite(path)
        .execute_batch(sql)
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// The first row of a query written as for [`execute`]; columns must be
/// integers (bool on PostgreSQL counts as one), text or NULL.
pub fn query_row(path: &Path, sql: &str, params: &[Value]) -> Vec<Value> {
    match engine_of(path) {
        e if e.is_postgres() => return pg::query_row(&server_target(path), sql, params),
        Engine::Mysql => return my::query_row(&target(path), sql, params),
        _ => {}
    }
    let conn = sqlite(path);
    let params: Vec<&dyn rusqlite::ToSql> = params.iter().map(sqlite_param).collect();
    conn.query_row(sql, params.as_slice(), |r| {
        (0..r.as_ref().column_count())
            .map(|i| {
                Ok(match r.get_ref(i)? {
                    rusqlite::types::ValueRef::Null => Value::Null,
                    rusqlite::types::ValueRef::Integer(n) => Value::Int(n),
                    rusqlite::types::ValueRef::Text(t) => {
                        Value::Text(String::from_utf8_lossy(t).into_owned())
                    }
                    other => panic!("{sql}: column {i} is {other:?}"),
                })
            })
            .collect()
    })
    .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// Locks the row of job `id` from a connection of the test's own (on
/// SQLite, the file's write lock) and holds it for `hold`, as a long
/// transaction of the application or a DBA's would; returns once the lock
/// is held, with the thread that lets it go.
pub fn hold_job_row(
    path: &Path,
    id: i64,
    hold: std::time::Duration,
) -> std::thread::JoinHandle<()> {
    let (held, is_held) = std::sync::mpsc::channel();
    let engine = engine_of(path);
    let (sqlite_path, server) = (path.to_path_buf(), server_target(path));
    let mysql_url = target(path);
    let lock = "SELECT id FROM tickler_jobs WHERE id = ?1 FOR UPDATE";
    let holder = std::thread::spawn(move || match engine {
        e if e.is_postgres() => pg::hold(&server, lock, id, hold, held),
        Engine::Mysql => my::hold(&mysql_url, lock, id, hold, held),
        _ => {
            let conn = sqlite(&sqlite_path);
            conn.execute_batch("BEGIN IMMEDIATE")
                .expect("take the write lock");
            held.send(()).expect("the test waits");
            std::thread::sleep(hold);
            conn.execute_batch("COMMIT").expect("let the write lock go");
        }
    });
    is_held.recv().expect("the row was locked");
    holder
}

/// Locks the row of limit `name` (a test's own name, no quote in it) from
/// a connection of the test's own and holds it for `hold`, as a claim or a
/// release of that limit does; returns once the lock is held, with the
/// thread that lets it go. Server engines only: on SQLite the write lock
/// is the limits' lock ([`hold_job_row`] holds it).
pub fn hold_limit_row(
    path: &Path,
    name: &str,
    hold: std::time::Duration,
) -> std::thread::JoinHandle<()> {
    assert!(!name.contains('\''), "a plain name");
    let (held, is_held) = std::sync::mpsc::channel();
    let engine = engine_of(path);
    let (server, mysql_url) = (server_target(path), target(path));
    // The helpers bind one integer: a condition that is always true.
    let lock = |cast: &str| {
        format!("SELECT name FROM tickler_limits WHERE name = '{name}' AND ?1{cast} > 0 FOR UPDATE")
    };
    let (pg_lock, my_lock) = (lock("::bigint"), lock(""));
    let holder = std::thread::spawn(move || match engine {
        e if e.is_postgres() => pg::hold(&server, &pg_lock, 1, hold, held),
        Engine::Mysql => my::hold(&mysql_url, &my_lock, 1, hold, held),
        _ => panic!("hold_limit_row: a SQLite file's limits are held by its write lock"),
    });
    is_held.recv().expect("the row was locked");
    holder
}

/// The deadlocks the database server found among the transactions on the
/// queue whose file would be `path`, from [`DeadlockWatch::start`] to
/// [`DeadlockWatch::finish`]: what a test of lock order checks.
///
/// PostgreSQL counts deadlocks per database (`pg_stat_database`), and
/// each case has a database of its own, so the count is the case's alone.
/// A backend sends its counts at most once a second while busy and up to
/// 10 s later once idle (`pg_stat_force_next_flush` hurries only the
/// caller's own), but always as it exits: `finish` waits until every
/// other connection to the database is gone (the caller drops its queues
/// first), so that no deadlock is still waiting to be counted.
///
/// InnoDB counts deadlocks for the whole server (`Innodb_deadlocks`),
/// which the other cases and any other test run on the server move too.
/// It keeps the last one it found, with the tables of each transaction's
/// locks, in `SHOW ENGINE INNODB STATUS`: a thread of the watch reads it
/// every few milliseconds and keeps each new one that names the case's
/// database, with the statements its transactions waited in. One of the
/// case's followed within those milliseconds by one elsewhere would be
/// missed (the case's, if any, come many at once); the server's count over
/// the same span is returned beside it.
///
/// A SQLite file has one writer at a time and no row locks: none.
pub struct DeadlockWatch {
    path: PathBuf,
    /// The count the server started from.
    before: i64,
    sampler: Option<my::Sampler>,
}

/// What a [`DeadlockWatch`] saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deadlocks {
    /// The case's own.
    pub ours: u64,
    /// The server's count over the same span (PostgreSQL: the case's
    /// database, so `ours`; InnoDB: every database).
    pub server: u64,
    /// InnoDB's only: of each of the case's deadlocks, the statement each
    /// transaction waited in, its white space folded.
    pub statements: Vec<Vec<String>>,
}

impl DeadlockWatch {
    /// Starts counting, once the queue of `path` was opened (which makes
    /// its database).
    pub fn start(path: &Path) -> DeadlockWatch {
        let engine = engine_of(path);
        let (before, sampler) = match engine {
            e if e.is_postgres() => (pg_deadlocks(path), None),
            Engine::Mysql => (
                my::server_deadlocks(&target(path)),
                Some(my::Sampler::start(&target(path), &database_name(path))),
            ),
            _ => (0, None),
        };
        DeadlockWatch {
            path: path.to_path_buf(),
            before,
            sampler,
        }
    }

    /// Stops counting; on PostgreSQL, once every connection of the
    /// caller's queues is gone (see the type's doc).
    pub fn finish(mut self) -> Deadlocks {
        let engine = engine_of(&self.path);
        if engine.is_postgres() {
            let others = "SELECT count(*) FROM pg_stat_activity
                          WHERE datname = current_database() AND pid <> pg_backend_pid()";
            super::common::wait_until(
                "the queues' connections to close",
                std::time::Duration::from_secs(60),
                || query_int(&self.path, others, &[]) == 0,
            );
            let ours = (pg_deadlocks(&self.path) - self.before).max(0) as u64;
            return Deadlocks {
                ours,
                server: ours,
                statements: Vec::new(),
            };
        }
        match self.sampler.take() {
            Some(sampler) => {
                let statements = sampler.stop();
                let after = my::server_deadlocks(&target(&self.path));
                Deadlocks {
                    ours: statements.len() as u64,
                    server: (after - self.before).max(0) as u64,
                    statements,
                }
            }
            None => Deadlocks {
                ours: 0,
                server: 0,
                statements: Vec::new(),
            },
        }
    }
}

fn pg_deadlocks(path: &Path) -> i64 {
    query_int(
        path,
        "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()",
        &[],
    )
}

/// Transactions of the queue whose file would be `path` waiting for a row
/// lock another holds, now. Server engines only.
pub fn lock_waiters(path: &Path) -> i64 {
    match engine_of(path) {
        e if e.is_postgres() => query_int(
            path,
            "SELECT count(*) FROM pg_stat_activity
             WHERE wait_event_type = 'Lock' AND datname = current_database()",
            &[],
        ),
        // A statement of tickler's on the limits' rows still running: the
        // lock waits of information_schema.innodb_trx come and go.
        Engine::Mysql => query_int(
            path,
            "SELECT count(*) FROM information_schema.processlist
             WHERE db = database() AND id <> connection_id()
               AND info LIKE 'SELECT name, max_per_key, max_total%FROM tickler_limits%FOR UPDATE%'",
            &[],
        ),
        _ => panic!("lock_waiters: a SQLite file has no row locks"),
    }
}

/// Cuts, on the server's side, every connection to the database of the
/// queue whose file would be `path` but the one that cuts (as a DBA's
/// kill, a proxy's idle cut or a failover would); returns how many. The
/// next statement on a cut connection fails. Server engines only: nobody
/// can cut the connections to a SQLite file.
pub fn cut_connections(path: &Path) -> usize {
    match engine_of(path) {
        e if e.is_postgres() => pg::cut_connections(&server_target(path)),
        Engine::Mysql => my::cut_connections(&target(path)),
        _ => panic!("cut_connections: a SQLite file has no server connections"),
    }
}

/// A connection of the test's own to the MySQL database of the queue whose
/// file would be `path`: for the application's transactions.
#[cfg(feature = "mysql")]
pub fn mysql_connect(path: &Path) -> mysql::Conn {
    my::connect(&target(path))
}

/// One integer read by [`query_row`] (a count, a length).
pub fn query_int(path: &Path, sql: &str, params: &[Value]) -> i64 {
    query_row(path, sql, params)[0].int()
}

/// Rows in the jobs table.
pub fn row_count(path: &Path) -> i64 {
    query_int(path, "SELECT count(*) FROM tickler_jobs", &[])
}

fn sqlite(path: &Path) -> rusqlite::Connection {
    let conn = rusqlite::Connection::open(path).expect("open the queue file");
    // tickler's own connections may hold the write lock for a moment.
    conn.busy_timeout(std::time::Duration::from_secs(10))
        .expect("busy timeout");
    conn
}

fn sqlite_param(v: &Value) -> &dyn rusqlite::ToSql {
    match v {
        Value::Null => &rusqlite::types::Null,
        Value::Int(n) => n,
        Value::Text(s) => s,
    }
}

#[cfg(feature = "postgres")]
mod pg {
    use super::Value;
    use postgres::types::{ToSql, Type};
    use std::path::Path;

    /// `?N` placeholders as PostgreSQL writes them (`$N`); a `?` inside a
    /// quoted string is left alone.
    fn placeholders(sql: &str) -> String {
        let mut out = String::with_capacity(sql.len());
        let mut quoted = false;
        for c in sql.chars() {
            match c {
                '\'' => {
                    quoted = !quoted;
                    out.push(c);
                }
                '?' if !quoted => out.push('$'),
                _ => out.push(c),
            }
        }
        out
    }

    fn connect(url: &Path) -> postgres::Client {
        let url = url.to_str().expect("a URL");
        postgres::Client::connect(url, postgres::NoTls)
            .unwrap_or_else(|e| panic!("cannot connect to the test database: {e}"))
    }

    fn param(v: &Value) -> &(dyn ToSql + Sync) {
        match v {
            Value::Null => &None::<i64>,
            Value::Int(n) => n,
            Value::Text(s) => s,
        }
    }

    pub(super) fn execute(url: &Path, sql: &str, params: &[Value]) -> u64 {
        let sql = placeholders(sql);
        let params: Vec<_> = params.iter().map(param).collect();
        connect(url)
            .execute(sql.as_str(), &params)
            .unwrap_or_else(|e| panic!("{sql}: {e:?}"))
    }

    pub(super) fn execute_batch(url: &Path, sql: &str) {
        connect(url)
            .batch_execute(sql)
            .unwrap_or_else(|e| panic!("{sql}: {e:?}"));
    }

    pub(super) fn cut_connections(url: &Path) -> usize {
        crate::support::pg::terminate_connections(url.to_str().expect("a URL"), None)
    }

    pub(super) fn hold(
        url: &Path,
        sql: &str,
        id: i64,
        hold: std::time::Duration,
        held: std::sync::mpsc::Sender<()>,
    ) {
        let mut client = connect(url);
        let mut tx = client.transaction().expect("begin");
        tx.execute(placeholders(sql).as_str(), &[&id])
            .unwrap_or_else(|e| panic!("{sql}: {e:?}"));
        held.send(()).expect("the test waits");
        std::thread::sleep(hold);
        tx.commit().expect("commit");
    }

    pub(super) fn query_row(url: &Path, sql: &str, params: &[Value]) -> Vec<Value> {
        let sql = placeholders(sql);
        let params: Vec<_> = params.iter().map(param).collect();
        let row = connect(url)
            .query_one(sql.as_str(), &params)
            .unwrap_or_else(|e| panic!("{sql}: {e:?}"));
        (0..row.len())
            .map(|i| {
                let ty = row.columns()[i].type_().clone();
                let value = if ty == Type::INT8 {
                    row.get::<_, Option<i64>>(i).map(Value::Int)
                } else if ty == Type::INT4 {
                    row.get::<_, Option<i32>>(i).map(|n| Value::Int(n.into()))
                } else if ty == Type::INT2 {
                    row.get::<_, Option<i16>>(i).map(|n| Value::Int(n.into()))
                } else if ty == Type::BOOL {
                    row.get::<_, Option<bool>>(i).map(|b| Value::Int(b.into()))
                } else if ty == Type::TEXT || ty == Type::VARCHAR {
                    row.get::<_, Option<String>>(i).map(Value::Text)
                } else {
                    panic!("{sql}: column {i} is of type {ty}")
                };
                value.unwrap_or(Value::Null)
            })
            .collect()
    }
}

#[cfg(not(feature = "postgres"))]
mod pg {
    use super::Value;
    use std::path::Path;

    pub(super) fn execute(_: &Path, _: &str, _: &[Value]) -> u64 {
        unreachable!("target() refuses PostgreSQL without the feature")
    }

    pub(super) fn execute_batch(_: &Path, _: &str) {
        unreachable!("target() refuses PostgreSQL without the feature")
    }

    pub(super) fn query_row(_: &Path, _: &str, _: &[Value]) -> Vec<Value> {
        unreachable!("target() refuses PostgreSQL without the feature")
    }

    pub(super) fn cut_connections(_: &Path) -> usize {
        unreachable!("target() refuses PostgreSQL without the feature")
    }

    pub(super) fn hold(
        _: &Path,
        _: &str,
        _: i64,
        _: std::time::Duration,
        _: std::sync::mpsc::Sender<()>,
    ) {
        unreachable!("target() refuses this engine without its feature")
    }
}

#[cfg(feature = "mysql")]
mod my {
    use super::Value;
    use mysql::prelude::Queryable;
    use std::path::Path;

    /// `?N` placeholders as MySQL takes them: positional `?`s, with the
    /// values put in the order the placeholders appear (a `?N` used twice
    /// binds its value twice); a `?` inside a quoted string is left alone.
    fn positional(sql: &str, params: &[Value]) -> (String, Vec<mysql::Value>) {
        let mut out = String::with_capacity(sql.len());
        let mut values = Vec::new();
        let mut quoted = false;
        let mut chars = sql.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '\'' => {
                    quoted = !quoted;
                    out.push(c);
                }
                '?' if !quoted => {
                    let mut digits = String::new();
                    while let Some(d) = chars.peek().filter(|d| d.is_ascii_digit()) {
                        digits.push(*d);
                        chars.next();
                    }
                    let n: usize = digits.parse().unwrap_or(values.len() + 1);
                    values.push(param(&params[n - 1]));
                    out.push('?');
                }
                _ => out.push(c),
            }
        }
        (out, values)
    }

    fn param(v: &Value) -> mysql::Value {
        match v {
            Value::Null => mysql::Value::NULL,
            Value::Int(n) => mysql::Value::from(*n),
            Value::Text(s) => mysql::Value::from(s.as_str()),
        }
    }

    pub(super) fn connect(url: &Path) -> mysql::Conn {
        let url = url.to_str().expect("a URL");
        let opts = mysql::OptsBuilder::from_opts(mysql::Opts::from_url(url).expect("a MySQL URL"))
            .additional_capabilities(mysql::consts::CapabilityFlags::CLIENT_FOUND_ROWS)
            .init(vec!["SET time_zone = '+00:00', NAMES utf8mb4"]);
        mysql::Conn::new(opts)
            .unwrap_or_else(|e| panic!("cannot connect to the test database: {e}"))
    }

    fn params(values: Vec<mysql::Value>) -> mysql::Params {
        if values.is_empty() {
            mysql::Params::Empty
        } else {
            mysql::Params::Positional(values)
        }
    }

    pub(super) fn execute(url: &Path, sql: &str, values: &[Value]) -> u64 {
        let (sql, values) = positional(sql, values);
        let mut conn = connect(url);
        conn.exec_drop(sql.as_str(), params(values))
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        conn.affected_rows()
    }

    pub(super) fn execute_batch(url: &Path, sql: &str) {
        let mut conn = connect(url);
        conn.query_drop(sql)
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    pub(super) fn cut_connections(url: &Path) -> usize {
        crate::support::my::kill_connections(url.to_str().expect("a URL"))
    }

    pub(super) fn hold(
        url: &Path,
        sql: &str,
        id: i64,
        hold: std::time::Duration,
        held: std::sync::mpsc::Sender<()>,
    ) {
        let (sql, values) = positional(sql, &[Value::Int(id)]);
        let mut conn = connect(url);
        let mut tx = conn
            .start_transaction(mysql::TxOpts::default())
            .expect("begin");
        tx.exec_drop(sql.as_str(), params(values))
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        held.send(()).expect("the test waits");
        std::thread::sleep(hold);
        tx.commit().expect("commit");
    }

    pub(super) fn query_row(url: &Path, sql: &str, values: &[Value]) -> Vec<Value> {
        let (sql, values) = positional(sql, values);
        let row: mysql::Row = connect(url)
            .exec_first(sql.as_str(), params(values))
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
            .unwrap_or_else(|| panic!("{sql}: no row"));
        row.unwrap()
            .into_iter()
            .map(|v| match v {
                mysql::Value::NULL => Value::Null,
                mysql::Value::Int(n) => Value::Int(n),
                mysql::Value::UInt(n) => Value::Int(n as i64),
                mysql::Value::Bytes(b) => {
                    let text = String::from_utf8_lossy(&b).into_owned();
                    // Text protocol numbers (a SUM, a CAST) come as digits.
                    match text.parse::<i64>() {
                        Ok(n) if text.bytes().all(|c| c.is_ascii_digit() || c == b'-') => {
                            Value::Int(n)
                        }
                        _ => Value::Text(text),
                    }
                }
                other => panic!("{sql}: a column of {other:?}"),
            })
            .collect()
    }

    /// The server's count of deadlocks, all databases.
    pub(super) fn server_deadlocks(url: &Path) -> i64 {
        let row: Option<(String, String)> = connect(url)
            .query_first("SHOW GLOBAL STATUS LIKE 'Innodb_deadlocks'")
            .unwrap_or_else(|e| panic!("SHOW GLOBAL STATUS: {e}"));
        let (_, value) = row.expect("InnoDB's Innodb_deadlocks");
        value.parse().expect("a count")
    }

    /// A thread reading InnoDB's last deadlock (see `DeadlockWatch`).
    pub(super) struct Sampler {
        stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
        thread: Option<std::thread::JoinHandle<Vec<Vec<String>>>>,
    }

    impl Sampler {
        pub(super) fn start(url: &Path, database: &str) -> Sampler {
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let mut conn = connect(url);
            let (flag, named) = (stop.clone(), format!("`{database}`."));
            let thread = std::thread::spawn(move || {
                let mut seen: Vec<String> = Vec::new();
                let mut last = String::new();
                loop {
                    // Read once more after the stop, for one found just before.
                    let stopping = flag.load(std::sync::atomic::Ordering::Relaxed);
                    let row: Option<(String, String, String)> = conn
                        .query_first("SHOW ENGINE INNODB STATUS")
                        .unwrap_or_else(|e| panic!("SHOW ENGINE INNODB STATUS: {e}"));
                    let status = row.map(|r| r.2).unwrap_or_default();
                    if let Some(found) = latest_deadlock(&status) {
                        if found != last {
                            if found.contains(&named) {
                                seen.push(found.to_owned());
                            }
                            last = found.to_owned();
                        }
                    }
                    if stopping {
                        return seen.iter().map(|found| statements(found)).collect();
                    }
                    std::thread::sleep(std::time::Duration::from_millis(3));
                }
            });
            Sampler {
                stop,
                thread: Some(thread),
            }
        }

        /// The statements of each deadlock seen that named the database.
        pub(super) fn stop(mut self) -> Vec<Vec<String>> {
            self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
            let thread = self.thread.take().expect("running");
            thread.join().expect("the sampler ran")
        }
    }

    impl Drop for Sampler {
        fn drop(&mut self) {
            self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// The section of InnoDB's status on its last deadlock, if it found one
    /// since the server started.
    fn latest_deadlock(status: &str) -> Option<&str> {
        let start = status.find("LATEST DETECTED DEADLOCK")?;
        let rest = &status[start..];
        let end = rest.find("\nTRANSACTIONS\n").unwrap_or(rest.len());
        Some(&rest[..end])
    }

    /// The statement each transaction of a deadlock's section waited in:
    /// the lines after its thread's, up to the lock it waited for.
    fn statements(section: &str) -> Vec<String> {
        section
            .split("TRANSACTION:\n")
            .skip(1)
            .map(|tx| {
                let after = tx.split_once("thread id").map_or("", |(_, rest)| rest);
                let after = after.split_once('\n').map_or("", |(_, rest)| rest);
                let statement = after.split("*** WAITING FOR").next().unwrap_or("");
                statement.split_whitespace().collect::<Vec<_>>().join(" ")
            })
            .collect()
    }
}

#[cfg(not(feature = "mysql"))]
mod my {
    use super::Value;
    use std::path::Path;

    pub(super) fn server_deadlocks(_: &Path) -> i64 {
        unreachable!("target() refuses MySQL without the feature")
    }

    pub(super) struct Sampler;

    impl Sampler {
        pub(super) fn start(_: &Path, _: &str) -> Sampler {
            unreachable!("target() refuses MySQL without the feature")
        }

        pub(super) fn stop(self) -> Vec<Vec<String>> {
            unreachable!("target() refuses MySQL without the feature")
        }
    }

    pub(super) fn execute(_: &Path, _: &str, _: &[Value]) -> u64 {
        unreachable!("target() refuses MySQL without the feature")
    }

    pub(super) fn execute_batch(_: &Path, _: &str) {
        unreachable!("target() refuses MySQL without the feature")
    }

    pub(super) fn query_row(_: &Path, _: &str, _: &[Value]) -> Vec<Value> {
        unreachable!("target() refuses MySQL without the feature")
    }

    pub(super) fn cut_connections(_: &Path) -> usize {
        unreachable!("target() refuses MySQL without the feature")
    }

    pub(super) fn hold(
        _: &Path,
        _: &str,
        _: i64,
        _: std::time::Duration,
        _: std::sync::mpsc::Sender<()>,
    ) {
        unreachable!("target() refuses this engine without its feature")
    }
}
