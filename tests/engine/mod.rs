//! Which engine the contract tests run on. The same test bodies run on
//! SQLite (the default) and, with `TICKLER_TEST_ENGINE=postgres` and the
//! `postgres` feature, on PostgreSQL (`.ci/run` does both; `.ci/postgres`
//! starts the server and exports `TICKLER_TEST_DATABASE_URL`).
//!
//! A test opens its queue at `target(path)` instead of `path`: on SQLite
//! that is the path; on PostgreSQL it is the URL of a database of its own,
//! named after the path, so opening the same path again (a restarted
//! process, a second process) reaches the same database. The server is a
//! throwaway one: the databases are left for it to take away.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// True when the tests run on PostgreSQL.
pub fn on_postgres() -> bool {
    std::env::var("TICKLER_TEST_ENGINE").is_ok_and(|e| e.eq_ignore_ascii_case("postgres"))
}

/// True (with a note) when a test that only makes sense on SQLite (it
/// opens the file itself, or is about the WAL) should return at once.
pub fn sqlite_only() -> bool {
    if on_postgres() {
        eprintln!("note: a SQLite-only test skipped on PostgreSQL");
        return true;
    }
    false
}

/// Where the queue of a test whose file would be `path` lives.
pub fn target(path: &Path) -> PathBuf {
    if !on_postgres() {
        return path.to_path_buf();
    }
    postgres_target(path)
}

#[cfg(feature = "postgres")]
fn postgres_target(path: &Path) -> PathBuf {
    use std::hash::{Hash, Hasher};
    let server = std::env::var("TICKLER_TEST_DATABASE_URL").expect(
        "TICKLER_TEST_ENGINE=postgres needs TICKLER_TEST_DATABASE_URL (.ci/postgres sets it)",
    );
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    path.hash(&mut hasher);
    let name = format!("tickler_c_{:016x}", hasher.finish());
    let mut admin = postgres::Client::connect(&server, postgres::NoTls)
        .unwrap_or_else(|e| panic!("cannot connect to {server}: {e}"));
    match admin.batch_execute(&format!("CREATE DATABASE \"{name}\" TEMPLATE template0")) {
        Ok(()) => {}
        Err(e) if e.code() == Some(&postgres::error::SqlState::DUPLICATE_DATABASE) => {}
        Err(e) => panic!("CREATE DATABASE {name}: {e:?}"),
    }
    PathBuf::from(with_dbname(&server, &name))
}

#[cfg(not(feature = "postgres"))]
fn postgres_target(_path: &Path) -> PathBuf {
    panic!("TICKLER_TEST_ENGINE=postgres needs the `postgres` feature (--features postgres)")
}

/// `url` with its database name replaced by `dbname`.
fn with_dbname(url: &str, dbname: &str) -> String {
    let scheme_end = url.find("://").expect("a postgres:// URL") + 3;
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
/// with `?1`, `?2`… placeholders (`$1`, `$2`… on PostgreSQL).
pub fn execute(path: &Path, sql: &str, params: &[Value]) -> u64 {
    if on_postgres() {
        return pg::execute(&target(path), sql, params);
    }
    let conn = sqlite(path);
    let params: Vec<&dyn rusqlite::ToSql> = params.iter().map(sqlite_param).collect();
    conn.execute(sql, params.as_slice())
        .unwrap_or_else(|e| panic!("{sql}: {e}")) as u64
}

/// Runs statements without parameters, such as a trigger a test installs
/// (whose SQL differs between the engines).
pub fn execute_batch(path: &Path, sql: &str) {
    if on_postgres() {
        return pg::execute_batch(&target(path), sql);
    }
    sqlite(path)
        .execute_batch(sql)
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// The first row of a query written as for [`execute`]; columns must be
/// integers (bool on PostgreSQL counts as one), text or NULL.
pub fn query_row(path: &Path, sql: &str, params: &[Value]) -> Vec<Value> {
    if on_postgres() {
        return pg::query_row(&target(path), sql, params);
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
}
