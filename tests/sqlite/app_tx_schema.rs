//! tickler's schema coexists with the application's own in one file: its
//! migrations leave the application's tables, indexes, triggers, views and
//! rows exactly as they were, and everything tickler creates is named
//! `tickler_*` (apart from SQLite's own bookkeeping for tickler's tables:
//! `sqlite_sequence` for AUTOINCREMENT and `sqlite_autoindex_tickler_*`).

use crate::support::app_tx;

use app_tx::{raw, secs, temp_db};
use rusqlite::types::Value;
use std::collections::BTreeSet;
use std::path::Path;
use tickler::{JobState, NewJob, Queue};

/// An application schema with the names a job-queue schema might want too
/// (`jobs`, `schedules`, `queue`), an AUTOINCREMENT table, an index, a
/// trigger and a view, and some rows.
const APP_SCHEMA: &str = "
    CREATE TABLE jobs (
        id       INTEGER PRIMARY KEY AUTOINCREMENT,
        title    TEXT NOT NULL,
        status   TEXT NOT NULL DEFAULT 'open',
        run_at   INTEGER
    );
    CREATE INDEX jobs_by_status ON jobs (status, run_at);
    CREATE TABLE schedules (name TEXT PRIMARY KEY, cron TEXT) WITHOUT ROWID;
    CREATE TABLE queue (pos INTEGER PRIMARY KEY, item BLOB);
    CREATE TABLE audit (id INTEGER PRIMARY KEY, what TEXT NOT NULL);
    CREATE TRIGGER jobs_audit AFTER INSERT ON jobs
        BEGIN INSERT INTO audit (what) VALUES ('new job ' || NEW.title); END;
    CREATE VIEW open_jobs AS SELECT id, title FROM jobs WHERE status = 'open';
    INSERT INTO jobs (title, run_at) VALUES ('paint the fence', 1714564800000);
    INSERT INTO jobs (title, status) VALUES ('mow the lawn', 'done');
    INSERT INTO jobs (title) VALUES ('fix the roof');
    DELETE FROM jobs WHERE title = 'fix the roof';
    INSERT INTO schedules VALUES ('weekly', '0 9 * * MON');
    INSERT INTO queue VALUES (1, x'00ff10'), (2, NULL);
";

/// `(type, name, tbl_name, sql)` of every schema object.
type Objects = BTreeSet<(String, String, String, Option<String>)>;

fn objects(conn: &rusqlite::Connection) -> Objects {
    conn.prepare("SELECT type, name, tbl_name, sql FROM sqlite_master")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap()
}

fn is_tickler(object: &(String, String, String, Option<String>)) -> bool {
    object.1.starts_with("tickler_") || object.2.starts_with("tickler_")
}

/// Every row of every application table, in rowid/key order.
fn app_rows(conn: &rusqlite::Connection) -> Vec<(String, Vec<Vec<Value>>)> {
    let tables = [
        ("jobs", "id"),
        ("schedules", "name"),
        ("queue", "pos"),
        ("audit", "id"),
    ];
    tables
        .iter()
        .map(|(table, key)| {
            let mut stmt = conn
                .prepare(&format!("SELECT * FROM {table} ORDER BY {key}"))
                .unwrap();
            let n = stmt.column_count();
            let rows = stmt
                .query_map([], |r| (0..n).map(|i| r.get::<_, Value>(i)).collect())
                .unwrap()
                .collect::<rusqlite::Result<Vec<Vec<Value>>>>()
                .unwrap();
            (table.to_string(), rows)
        })
        .collect()
}

fn sequences(conn: &rusqlite::Connection) -> Vec<(String, i64)> {
    conn.prepare("SELECT name, seq FROM sqlite_sequence ORDER BY name")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap()
}

fn create_app_file(path: &Path) {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.execute_batch(APP_SCHEMA).unwrap();
}

#[test]
fn the_apps_tables_rows_and_schema_survive_tickler_migrations_untouched() {
    let (_dir, path) = temp_db();
    create_app_file(&path);
    let before_conn = raw(&path);
    let objects_before = objects(&before_conn);
    let rows_before = app_rows(&before_conn);
    let seq_before = sequences(&before_conn);
    assert_eq!(seq_before, vec![("jobs".to_owned(), 3)]);
    assert!(objects_before.iter().all(|o| !is_tickler(o)));
    drop(before_conn);

    // Migrate, use the queue, and open again (migrations re-checked).
    {
        let queue = Queue::open(&path).unwrap();
        let id = queue.enqueue(NewJob::new("tickle")).unwrap();
        let lease = queue
            .manual()
            .claim("default", "w", 1, secs(30))
            .unwrap()
            .remove(0);
        assert_eq!(lease.job_id, id);
        queue.manual().complete(&lease).unwrap();
        queue
            .enqueue(NewJob::new("later").delay(secs(3600)))
            .unwrap();
    }
    let queue = Queue::open(&path).unwrap();
    assert_eq!(queue.count(JobState::Succeeded).unwrap(), 1);
    assert_eq!(queue.count(JobState::Scheduled).unwrap(), 1);
    drop(queue);

    let after_conn = raw(&path);
    let objects_after = objects(&after_conn);
    let app_after: Objects = objects_after
        .iter()
        .filter(|o| !is_tickler(o))
        .cloned()
        .collect();
    assert_eq!(
        app_after, objects_before,
        "the application's schema objects changed"
    );
    assert_eq!(
        app_rows(&after_conn),
        rows_before,
        "the application's rows changed"
    );
    // sqlite_sequence is shared: the app's counter is untouched and the only
    // new entry is tickler's.
    let seq_after = sequences(&after_conn);
    let app_seq: Vec<_> = seq_after
        .iter()
        .filter(|(name, _)| !name.starts_with("tickler_"))
        .cloned()
        .collect();
    assert_eq!(app_seq, seq_before, "the app's AUTOINCREMENT counter moved");
    // The app's trigger and view still work.
    after_conn
        .execute("INSERT INTO jobs (title) VALUES ('after tickler')", [])
        .unwrap();
    let audited: i64 = after_conn
        .query_row(
            "SELECT count(*) FROM audit WHERE what = 'new job after tickler'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(audited, 1);
    let new_id: i64 = after_conn
        .query_row(
            "SELECT id FROM jobs WHERE title = 'after tickler'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(new_id, 4, "the app's AUTOINCREMENT sequence was reset");
    let open: i64 = after_conn
        .query_row("SELECT count(*) FROM open_jobs", [], |r| r.get(0))
        .unwrap();
    assert_eq!(open, 2);
    assert_eq!(
        after_conn
            .query_row("PRAGMA integrity_check", [], |r| r.get::<_, String>(0))
            .unwrap(),
        "ok"
    );
}

#[test]
fn every_object_tickler_creates_is_named_tickler() {
    let (_dir, path) = temp_db();
    create_app_file(&path);
    let before = objects(&raw(&path));
    drop(Queue::open(&path).unwrap());
    let after = objects(&raw(&path));
    let created: Vec<_> = after.difference(&before).collect();
    assert!(!created.is_empty());
    assert!(created.iter().any(|o| o.1 == "tickler_jobs"), "{created:?}");
    for object in &created {
        let (kind, name, table, _) = object;
        let named = name.starts_with("tickler_");
        // SQLite's implicit index for a tickler table's key.
        let sqlite_index_of_tickler = name.starts_with("sqlite_autoindex_tickler_")
            && kind == "index"
            && table.starts_with("tickler_");
        assert!(
            named || sqlite_index_of_tickler,
            "tickler created {kind} {name:?} (on {table:?}), not named tickler_*"
        );
        if kind != "table" {
            assert!(
                table.starts_with("tickler_"),
                "tickler's {kind} {name:?} is on a table not its own: {table:?}"
            );
        }
    }
    assert!(
        before.is_subset(&after),
        "an application object disappeared"
    );
}

#[test]
fn in_a_fresh_file_tickler_creates_only_its_own_objects() {
    let (_dir, path) = temp_db();
    drop(Queue::open(&path).unwrap());
    let conn = raw(&path);
    for (kind, name, table, _) in objects(&conn) {
        let ok = name.starts_with("tickler_")
            || (name == "sqlite_sequence" && kind == "table")
            || (name.starts_with("sqlite_autoindex_tickler_") && table.starts_with("tickler_"));
        assert!(ok, "unexpected {kind} {name:?} on {table:?}");
    }
}

/// Many applications version their own schema with `PRAGMA user_version`
/// (the rusqlite_migration crate, for one). tickler keeps its schema
/// version there too, so the two collide.
#[test]
#[ignore = "KNOWN LIMITATION (documented in the crate docs): tickler keeps its schema version in PRAGMA user_version, which an application may also use: an app at user_version 1 or 2 gets tickler's migrations skipped (no tickler_jobs) and its version overwritten; at 3+ Queue::open refuses with SchemaTooNew"]
fn the_apps_user_version_neither_confuses_nor_is_changed_by_tickler() {
    for app_version in [1, 2, 7] {
        let (_dir, path) = temp_db();
        create_app_file(&path);
        raw(&path)
            .execute_batch(&format!("PRAGMA user_version = {app_version}"))
            .unwrap();
        let queue = Queue::open(&path).unwrap_or_else(|e| {
            panic!("app at user_version {app_version}: Queue::open failed: {e}")
        });
        queue
            .enqueue(NewJob::new("tickle"))
            .unwrap_or_else(|e| panic!("app at user_version {app_version}: enqueue failed: {e}"));
        drop(queue);
        let found: i64 = raw(&path)
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(
            found, app_version,
            "tickler changed the application's user_version"
        );
    }
}
