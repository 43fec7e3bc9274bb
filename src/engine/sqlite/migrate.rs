//! SQLite's schema versions: `schema.sql`, split into numbered
//! migrations, applied in one write transaction when a file is opened;
//! the version is the file's `PRAGMA user_version`.

use super::connection::open_error;
use super::Store;
use crate::error::{Error, Result};
use rusqlite::{Connection, OpenFlags};
use std::path::Path;

/// The schema version this build writes (`PRAGMA user_version`).
pub(crate) fn schema_version() -> i64 {
    migrations().last().map(|(v, _)| *v).unwrap_or(0)
}

/// See [`crate::Queue::file_schema_version`].
pub(crate) fn file_schema_version(path: &Path) -> Result<Option<i64>> {
    if !path.exists() {
        return Ok(None);
    }
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| open_error(path, e))?;
    conn.query_row("PRAGMA user_version", [], |r| r.get(0))
        .map(Some)
        .map_err(|e| open_error(path, e))
}

impl Store {
    pub(crate) fn migrate(&self) -> Result<()> {
        let latest = schema_version();
        self.write(|tx| {
            let found: i64 = tx.query_row("PRAGMA user_version", [], |r| r.get(0))?;
            if found > latest {
                return Err(Error::SchemaTooNew {
                    found,
                    supported: latest,
                });
            }
            for (version, sql) in migrations().into_iter().filter(|(v, _)| *v > found) {
                tx.execute_batch(sql)?;
                tx.execute_batch(&format!("PRAGMA user_version = {version}"))?;
            }
            Ok(())
        })
    }
}

/// The whole schema, split into migrations by `-- migration: N` lines.
const SCHEMA_SQL: &str = include_str!("schema.sql");

/// `(version, sql)` for each `-- migration: N` section of schema.sql.
fn migrations() -> Vec<(i64, &'static str)> {
    let mut out = Vec::new();
    let mut rest = SCHEMA_SQL;
    const MARK: &str = "\n-- migration: ";
    while let Some(at) = rest.find(MARK) {
        let after = &rest[at + MARK.len()..];
        let line_end = after.find('\n').unwrap_or(after.len());
        let version: i64 = after[..line_end]
            .trim()
            .parse()
            .expect("schema.sql: `-- migration: N` needs a number");
        let body = &after[line_end..];
        let end = body.find(MARK).unwrap_or(body.len());
        out.push((version, &body[..end]));
        rest = &body[end..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_are_numbered_from_one_without_gaps() {
        let versions: Vec<i64> = migrations().iter().map(|(v, _)| *v).collect();
        assert!(!versions.is_empty());
        for (i, v) in versions.iter().enumerate() {
            assert_eq!(*v, i as i64 + 1);
        }
    }
}
