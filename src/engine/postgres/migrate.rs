//! PostgreSQL's schema versions: `schema.sql`, split into numbered
//! migrations, applied by one process at a time (an advisory lock) and
//! recorded in `tickler_schema_migrations`.

use super::connection::Tx;
use super::Store;
use crate::error::{Error, Result};

impl Store {
    pub(super) fn migrate(&self) -> Result<()> {
        let latest = schema_version();
        self.write(|tx, _| {
            // An up-to-date schema needs no DDL, which a role that may only
            // use the tables (PostgreSQL 15 lets no role create in
            // `public` by default) could not run.
            if let Some(found) = applied_version(tx)? {
                if found > latest {
                    return Err(Error::SchemaTooNew {
                        found,
                        supported: latest,
                    });
                }
                if found == latest {
                    return Ok(());
                }
            }
            // Waiting for another process's migration is expected here,
            // whatever timeouts the DBA set for every session.
            tx.batch_execute("SET LOCAL lock_timeout = 0; SET LOCAL statement_timeout = 0")?;
            // One migrator at a time across processes; the lock ends with
            // the transaction.
            tx.execute("SELECT pg_advisory_xact_lock(7369401254420385313)", &[])?;
            tx.execute(
                "CREATE TABLE IF NOT EXISTS tickler_schema_migrations (
                     version BIGINT PRIMARY KEY,
                     applied_at TIMESTAMPTZ NOT NULL DEFAULT now())",
                &[],
            )?;
            let found: i64 = tx
                .query_one(
                    "SELECT coalesce(max(version), 0) FROM tickler_schema_migrations",
                    &[],
                )?
                .get(0);
            if found > latest {
                return Err(Error::SchemaTooNew {
                    found,
                    supported: latest,
                });
            }
            for (version, sql) in migrations().into_iter().filter(|(v, _)| *v > found) {
                tx.batch_execute(sql)?;
                tx.execute(
                    "INSERT INTO tickler_schema_migrations (version) VALUES ($1)",
                    &[&version],
                )?;
            }
            Ok(())
        })
    }
}

/// The schema version recorded in the database, `None` before the first
/// migration.
fn applied_version(tx: &mut Tx<'_>) -> Result<Option<i64>> {
    let exists: bool = tx
        .query_one(
            "SELECT to_regclass('tickler_schema_migrations') IS NOT NULL",
            &[],
        )?
        .get(0);
    if !exists {
        return Ok(None);
    }
    Ok(Some(
        tx.query_one(
            "SELECT coalesce(max(version), 0) FROM tickler_schema_migrations",
            &[],
        )?
        .get(0),
    ))
}

/// The schema, split into migrations by `-- migration: N` lines.
const SCHEMA_SQL: &str = include_str!("schema.sql");

fn migrations() -> Vec<(i64, &'static str)> {
    // A marker counts at the start of a line only: the file's header
    // mentions the marker's form in its text.
    const MARKER: &str = "\n-- migration: ";
    let mut out = Vec::new();
    let mut rest = SCHEMA_SQL;
    while let Some(at) = rest.find(MARKER) {
        let after = &rest[at + MARKER.len()..];
        let line_end = after.find('\n').unwrap_or(after.len());
        let version: i64 = after[..line_end].trim().parse().unwrap_or(0);
        let body = &after[line_end..];
        let end = body.find(MARKER).unwrap_or(body.len());
        out.push((version, &body[..end]));
        rest = &body[end..];
    }
    out
}

/// The schema version this build writes on PostgreSQL.
pub(crate) fn schema_version() -> i64 {
    migrations().last().map(|(v, _)| *v).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_split() {
        let m = migrations();
        assert_eq!(m.first().map(|(v, _)| *v), Some(1));
        assert!(m[0].1.contains("CREATE TABLE tickler_jobs"));
    }
}
