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
