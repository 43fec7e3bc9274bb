//! MySQL's schema versions: `schema.sql`, split into numbered migrations,
//! applied by one process at a time (`GET_LOCK`) and recorded in
//! `tickler_schema_migrations`; then a check that every table is InnoDB's.

use super::Store;
use crate::error::{Error, Result};
use mysql::prelude::Queryable;

/// The tables tickler claims in: all must be InnoDB's (row locks,
/// `SKIP LOCKED`, transactions).
const TABLES: [&str; 5] = [
    "tickler_jobs",
    "tickler_holders",
    "tickler_schedules",
    "tickler_paused_queues",
    "tickler_schema_migrations",
];

/// How long a process waits for another's migration, in seconds.
const MIGRATION_WAIT_S: u64 = 300;

/// Each `GET_LOCK` waits this long (seconds) and is asked again until
/// [`MIGRATION_WAIT_S`] have passed: one long wait would outlast the
/// connection's wait for an answer (`connection::answer_wait`).
const LOCK_STEP_S: u64 = 5;

/// The migration's lock in `database`. `GET_LOCK` names are the server's,
/// so one name for every database would make the migrations of all
/// databases on a server wait for each other, and one stuck (a host gone
/// without closing its connection, which the server keeps for hours)
/// hold back the opens of all. Names hold 64 characters at most: a long
/// database name is cut, and databases that share their first 48
/// characters share a lock, which only makes their migrations wait.
fn lock_name(database: &str) -> String {
    let mut end = database.len().min(48);
    while !database.is_char_boundary(end) {
        end -= 1;
    }
    format!("tickler_migrate:{}", &database[..end])
}

/// ER_DUP_FIELDNAME: "Duplicate column name".
const DUPLICATE_COLUMN: u16 = 1060;

impl Store {
    pub(super) fn migrate(&self, conn: &mut mysql::Conn) -> Result<()> {
        let latest = schema_version();
        let database: Option<String> = conn.query_first("SELECT DATABASE()")?.flatten();
        let Some(database) = database else {
            return Err(Error::Config(format!(
                "{} names no database: give one as mysql://user@host/DATABASE",
                self.describe()
            )));
        };
        let lock = lock_name(&database);
        // An up-to-date schema needs no DDL, which a user that may only
        // use the tables could not run.
        if let Some(found) = applied_version(conn)? {
            if found > latest {
                return Err(Error::SchemaTooNew {
                    found,
                    supported: latest,
                });
            }
            if found == latest {
                return self.check_engines(conn);
            }
        }
        let asked = std::time::Instant::now();
        let locked = loop {
            let locked: Option<i64> = conn
                .exec_first("SELECT GET_LOCK(?, ?)", (&lock, LOCK_STEP_S))?
                .flatten();
            // 0 is a wait that ran out; 1 the lock, NULL an error (killed).
            if locked != Some(0) || asked.elapsed().as_secs() >= MIGRATION_WAIT_S {
                break locked;
            }
        };
        match locked {
            Some(1) => {}
            Some(_) => {
                return Err(Error::Config(format!(
                    "another process has been migrating the schema in {} for {MIGRATION_WAIT_S} s \
                     (GET_LOCK('{lock}') not granted)",
                    self.describe()
                )))
            }
            None => {
                return Err(Error::Config(format!(
                    "GET_LOCK('{lock}') failed in {} (the server returned NULL: \
                     the query was killed or the server ran out of memory)",
                    self.describe()
                )))
            }
        }
        let applied = (|| -> Result<()> {
            conn.query_drop(
                "CREATE TABLE IF NOT EXISTS tickler_schema_migrations (
                     version BIGINT NOT NULL PRIMARY KEY,
                     applied_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)
                 ) ENGINE = InnoDB ROW_FORMAT = DYNAMIC",
            )?;
            let found: i64 = conn
                .query_first("SELECT coalesce(max(version), 0) FROM tickler_schema_migrations")?
                .unwrap_or(0);
            if found > latest {
                return Err(Error::SchemaTooNew {
                    found,
                    supported: latest,
                });
            }
            for (version, sql) in migrations().into_iter().filter(|(v, _)| *v > found) {
                for statement in statements(sql) {
                    match conn.query_drop(statement) {
                        // An ALTER TABLE that added its columns before the
                        // connection was cut (both servers apply one ALTER
                        // atomically), in a migration not yet recorded.
                        Err(mysql::Error::MySqlError(e)) if e.code == DUPLICATE_COLUMN => {}
                        other => other?,
                    }
                }
                conn.exec_drop(
                    "INSERT INTO tickler_schema_migrations (version) VALUES (?)",
                    (version,),
                )?;
            }
            Ok(())
        })();
        let released = conn.exec_drop("DO RELEASE_LOCK(?)", (&lock,));
        applied?;
        released?;
        self.check_engines(conn)
    }

    /// Refuses tables of another storage engine than InnoDB (made by hand,
    /// or substituted by a server without InnoDB).
    fn check_engines(&self, conn: &mut mysql::Conn) -> Result<()> {
        let found: Vec<(String, Option<String>)> = conn.query(
            "SELECT TABLE_NAME, ENGINE FROM information_schema.TABLES
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME LIKE 'tickler\\_%'",
        )?;
        for (table, engine) in found {
            if !TABLES.contains(&table.as_str()) {
                continue;
            }
            if !engine
                .as_deref()
                .is_some_and(|e| e.eq_ignore_ascii_case("InnoDB"))
            {
                return Err(Error::Config(format!(
                    "table {table} in {} uses the storage engine {}, but tickler needs InnoDB \
                     (row locks, SKIP LOCKED, transactions): ALTER TABLE {table} ENGINE = InnoDB",
                    self.describe(),
                    engine.as_deref().unwrap_or("(none)")
                )));
            }
        }
        Ok(())
    }
}

/// The schema version recorded in the database, `None` before the first
/// migration.
fn applied_version(conn: &mut mysql::Conn) -> Result<Option<i64>> {
    let exists: i64 = conn
        .query_first(
            "SELECT count(*) FROM information_schema.TABLES
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'tickler_schema_migrations'",
        )?
        .unwrap_or(0);
    if exists == 0 {
        return Ok(None);
    }
    Ok(Some(
        conn.query_first("SELECT coalesce(max(version), 0) FROM tickler_schema_migrations")?
            .unwrap_or(0),
    ))
}

/// The schema, split into migrations by `-- migration: N` lines.
const SCHEMA_SQL: &str = include_str!("schema.sql");

fn migrations() -> Vec<(i64, &'static str)> {
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

/// One migration's statements: its text without comment lines, cut at
/// each semicolon that ends a line.
fn statements(sql: &str) -> Vec<String> {
    let text: String = sql
        .lines()
        .filter(|l| !l.trim_start().starts_with("--"))
        .map(|l| format!("{l}\n"))
        .collect();
    text.split(";\n")
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The schema version this build writes on MySQL.
pub(crate) fn schema_version() -> i64 {
    migrations().last().map(|(v, _)| *v).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_split_into_statements() {
        let m = migrations();
        assert_eq!(m.first().map(|(v, _)| *v), Some(1));
        let first = statements(m[0].1);
        assert_eq!(first.len(), 3, "{first:#?}");
        assert!(first[0].starts_with("CREATE TABLE IF NOT EXISTS tickler_jobs"));
        assert!(first.iter().all(|s| !s.contains("--")), "{first:#?}");
    }
}
