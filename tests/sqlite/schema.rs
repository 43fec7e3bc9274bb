//! The file format: a fresh file is at the current schema version, in WAL
//! mode and private to its owner; a newer or foreign file is refused with a
//! typed error and left untouched; the table's CHECK constraints reject rows
//! that no tickler state allows, whoever writes them.

use crate::support::common;

use std::path::Path;
use tickler::{Error, NewJob, Queue};

fn user_version(path: &Path) -> i64 {
    common::raw(path)
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap()
}

#[test]
fn fresh_file_has_current_schema_version_and_wal() {
    let (_dir, path) = common::temp_db();
    let queue = Queue::open(&path).unwrap();
    assert!(tickler::Ops::schema_version() >= 1);

    let conn = common::raw(&path);
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, tickler::Ops::schema_version());
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode.to_lowercase(), "wal");
    let tables: i64 = conn
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'tickler_jobs'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(tables, 1);
    drop(conn);

    // Reopening migrates nothing and keeps the data.
    let id = queue.enqueue(NewJob::new("k")).unwrap();
    drop(queue);
    let again = Queue::open(&path).unwrap();
    assert_eq!(user_version(&path), tickler::Ops::schema_version());
    assert_eq!(again.get(id).unwrap().kind, "k");
}

#[cfg(unix)]
#[test]
fn new_file_is_private_to_its_owner() {
    use std::os::unix::fs::PermissionsExt;
    let (_dir, path) = common::temp_db();
    let queue = Queue::open(&path).unwrap();
    queue.enqueue(NewJob::new("secret")).unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "database file mode {mode:o}");
    // SQLite gives the -wal and -shm files the database file's mode: they
    // hold the same data.
    for suffix in ["-wal", "-shm"] {
        let side = path.with_file_name(format!("jobs.db{suffix}"));
        let meta = std::fs::metadata(&side)
            .unwrap_or_else(|e| panic!("{suffix} file missing while the queue is open: {e}"));
        let mode = meta.permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{suffix} file mode {mode:o}");
    }
}

#[test]
fn newer_schema_is_refused_and_left_unchanged() {
    let (_dir, path) = common::temp_db();
    let id = {
        let queue = Queue::open(&path).unwrap();
        queue.enqueue(NewJob::new("from-the-future")).unwrap()
    };
    let newer = tickler::Ops::schema_version() + 1;
    common::raw(&path)
        .execute_batch(&format!("PRAGMA user_version = {newer}"))
        .unwrap();
    let bytes_before = std::fs::read(&path).unwrap();

    match Queue::open(&path) {
        Err(Error::SchemaTooNew { found, supported }) => {
            assert_eq!(found, newer);
            assert_eq!(supported, tickler::Ops::schema_version());
        }
        other => panic!("expected SchemaTooNew, got {other:?}"),
    }
    assert_eq!(user_version(&path), newer, "user_version was changed");
    assert_eq!(common::row_count(&path), 1);
    let kind: String = common::raw(&path)
        .query_row("SELECT kind FROM tickler_jobs WHERE id = ?1", [id.0], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(kind, "from-the-future");
    assert_eq!(
        std::fs::read(&path).unwrap(),
        bytes_before,
        "refused file was written"
    );
}

#[test]
fn foreign_database_with_newer_user_version_is_refused() {
    let (_dir, path) = common::temp_db();
    common::raw(&path)
        .execute_batch("CREATE TABLE mine (x INTEGER); PRAGMA user_version = 1000;")
        .unwrap();
    let err = Queue::open(&path).unwrap_err();
    assert!(
        matches!(err, Error::SchemaTooNew { found: 1000, .. }),
        "{err:?}"
    );
    assert_eq!(user_version(&path), 1000);
    let tickler_tables: i64 = common::raw(&path)
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE name LIKE 'tickler_%'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(tickler_tables, 0, "schema was added to a refused file");
}

fn garbage(len: usize, seed: u64) -> Vec<u8> {
    let mut rng = fastrand::Rng::with_seed(seed);
    (0..len).map(|_| rng.u8(..)).collect()
}

#[test]
fn garbage_file_is_not_a_database_and_left_unchanged() {
    let (dir, _) = common::temp_db();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("random.db", garbage(16 * 1024, 1)),
        ("small.db", garbage(300, 2)),
        (
            "text.db",
            b"these are my notes, not a database\n".repeat(200),
        ),
    ];
    for (name, bytes) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, &bytes).unwrap();
        match Queue::open(&path) {
            Err(Error::NotADatabase { path: reported }) => assert_eq!(reported, path),
            other => panic!("{name}: expected NotADatabase, got {other:?}"),
        }
        assert_eq!(
            std::fs::read(&path).unwrap(),
            bytes,
            "{name}: the file was modified"
        );
    }
}

/// Inserts one row with raw SQL: a valid pending job, with some columns
/// replaced by SQL literals.
fn insert_raw(conn: &rusqlite::Connection, overrides: &[(&str, &str)]) -> rusqlite::Result<usize> {
    let mut columns: Vec<(&str, String)> = vec![
        ("queue", "'default'".into()),
        ("kind", "'k'".into()),
        ("payload", "'null'".into()),
        ("status", "'pending'".into()),
        ("priority", "0".into()),
        ("run_at", "1000".into()),
        ("attempts", "0".into()),
        ("max_attempts", "3".into()),
        ("created_at", "1000".into()),
    ];
    for (name, value) in overrides {
        match columns.iter_mut().find(|(c, _)| c == name) {
            Some(slot) => slot.1 = (*value).to_owned(),
            None => columns.push((name, (*value).to_owned())),
        }
    }
    let names: Vec<&str> = columns.iter().map(|(c, _)| *c).collect();
    let values: Vec<&str> = columns.iter().map(|(_, v)| v.as_str()).collect();
    conn.execute(
        &format!(
            "INSERT INTO tickler_jobs ({}) VALUES ({})",
            names.join(", "),
            values.join(", ")
        ),
        [],
    )
}

#[test]
fn check_constraints_reject_impossible_rows() {
    let (_dir, path) = common::temp_db();
    drop(Queue::open(&path).unwrap());
    let conn = common::raw(&path);

    // Controls: rows that tickler states allow go in.
    let valid: &[&[(&str, &str)]] = &[
        &[],
        &[
            ("status", "'running'"),
            ("run_token", "'t'"),
            ("claimed_at", "1000"),
            ("lease_expires_at", "2000"),
            ("attempts", "1"),
        ],
        &[("status", "'succeeded'"), ("finished_at", "2000")],
        &[("status", "'scheduled'"), ("unique_key", "'u'")],
        &[
            ("status", "'dead'"),
            ("finished_at", "2000"),
            ("unique_key", "'u'"),
        ],
    ];
    for row in valid {
        insert_raw(&conn, row).unwrap_or_else(|e| panic!("valid row {row:?} refused: {e}"));
    }
    let count = common::row_count(&path);

    let impossible: &[(&str, &[(&str, &str)])] = &[
        ("unknown status", &[("status", "'paused'")]),
        ("max_attempts 0", &[("max_attempts", "0")]),
        ("negative attempts", &[("attempts", "-1")]),
        (
            "running without run_token",
            &[
                ("status", "'running'"),
                ("claimed_at", "1000"),
                ("lease_expires_at", "2000"),
            ],
        ),
        (
            "running without lease",
            &[
                ("status", "'running'"),
                ("run_token", "'t'"),
                ("claimed_at", "1000"),
            ],
        ),
        (
            "succeeded without finished_at",
            &[("status", "'succeeded'")],
        ),
        ("dead without finished_at", &[("status", "'dead'")]),
        (
            "cancelled without finished_at",
            &[("status", "'cancelled'")],
        ),
        ("pending with finished_at", &[("finished_at", "2000")]),
        ("empty kind", &[("kind", "''")]),
        ("empty queue", &[("queue", "''")]),
        ("payload not JSON", &[("payload", "'{not json'")]),
        ("zero timeout", &[("timeout_ms", "0")]),
        ("text run_at (STRICT)", &[("run_at", "'tomorrow'")]),
        (
            "second unfinished holder of a unique_key",
            &[("unique_key", "'u'")],
        ),
    ];
    for (what, row) in impossible {
        match insert_raw(&conn, row) {
            Err(rusqlite::Error::SqliteFailure(e, msg)) => assert_eq!(
                e.code,
                rusqlite::ErrorCode::ConstraintViolation,
                "{what}: {msg:?}"
            ),
            other => panic!("{what}: row was not rejected: {other:?}"),
        }
    }
    assert_eq!(common::row_count(&path), count, "a rejected row was stored");
}

#[test]
fn concurrent_first_opens_of_a_new_file_all_succeed() {
    const THREADS: usize = 8;
    for round in 0..5 {
        let (_dir, path) = common::temp_db();
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(THREADS));
        let threads: Vec<_> = (0..THREADS)
            .map(|t| {
                let path = path.clone();
                let barrier = barrier.clone();
                std::thread::spawn(move || {
                    barrier.wait();
                    let queue = Queue::open(&path)
                        .unwrap_or_else(|e| panic!("round {round}, thread {t}: open failed: {e}"));
                    queue.enqueue(NewJob::new("k")).unwrap();
                })
            })
            .collect();
        for t in threads {
            t.join().expect("opener panicked");
        }
        assert_eq!(user_version(&path), tickler::Ops::schema_version());
        assert_eq!(common::row_count(&path), THREADS as i64);
    }
}

/// SQLite 3.7.0 to 3.51.2 can lose committed transactions, or corrupt the
/// file, when a checkpoint starts while another connection's commit resets
/// the WAL (SQLite's "WAL-reset bug", fixed in 3.51.3). tickler checkpoints
/// from every process that writes, so the SQLite it is built with must be
/// past it: this fails if a dependency change brings an older one back.
#[test]
fn the_sqlite_tickler_is_built_with_has_the_wal_reset_fix() {
    let dir = tempfile::tempdir().unwrap();
    let queue = tickler::Queue::open(dir.path().join("q.db")).unwrap();
    let conn = queue.open_connection().unwrap();
    let version: String = conn
        .query_row("SELECT sqlite_version()", [], |r| r.get(0))
        .unwrap();
    let number: Vec<u32> = version.split('.').map(|p| p.parse().unwrap()).collect();
    assert!(
        number.as_slice() >= [3, 51, 3].as_slice(),
        "SQLite {version} has the WAL-reset bug (fixed in 3.51.3)"
    );
}

/// The status CHECK is loosened in place to admit `blocked` (SQLite cannot
/// alter a CHECK): a file written by the previous schema keeps its jobs and
/// passes SQLite's integrity check, its unique keys still hold, and a
/// blocked job can be stored in it at once, on the connection that
/// migrated it and on others.
#[cfg(unix)]
#[test]
fn a_file_of_the_schema_before_limits_migrates_keeping_its_jobs() {
    let (_dir, path) = common::temp_db();
    let schema = include_str!("../../src/engine/sqlite/schema.sql");
    let before = &schema[..schema.find("\n-- migration: 9").expect("migration 9")];
    {
        let conn = common::raw(&path);
        conn.execute_batch("PRAGMA journal_mode = WAL").unwrap();
        let body = before[before.find("-- migration: 1").unwrap()..].to_owned();
        conn.execute_batch(&format!("BEGIN; {body}; PRAGMA user_version = 8; COMMIT;"))
            .unwrap();
        insert_raw(&conn, &[("unique_key", "'only-one'")]).unwrap();
        insert_raw(&conn, &[("status", "'blocked'")]).unwrap_err();
    }
    let queue = Queue::open(&path).unwrap();
    assert_eq!(user_version(&path), tickler::Ops::schema_version());
    let kept = queue.get(tickler::JobId(1)).unwrap();
    assert_eq!(kept.unique_key.as_deref(), Some("only-one"));
    assert_eq!(
        queue
            .enqueue(NewJob::new("k").unique_key("only-one"))
            .unwrap(),
        tickler::JobId(1)
    );
    queue.set_limit("l", tickler::Limit::per_key(1)).unwrap();
    let a = queue.enqueue(NewJob::new("k").limit("l", "x")).unwrap();
    let b = queue.enqueue(NewJob::new("k").limit("l", "x")).unwrap();
    let claimed = queue
        .manual()
        .claim("default", "w", 10, common::secs(30))
        .unwrap();
    assert_eq!(claimed.len(), 2, "job 1 and one of a, b");
    let blocked = if claimed.iter().any(|l| l.job_id == a) {
        b
    } else {
        a
    };
    assert_eq!(
        queue.get(blocked).unwrap().state,
        tickler::JobState::Blocked
    );
    let conn = common::raw(&path);
    let check: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok");
    insert_raw(&conn, &[("status", "'blocked'")]).unwrap();
    insert_raw(&conn, &[("status", "'waiting'")]).unwrap();
    insert_raw(&conn, &[("status", "'asleep'")]).unwrap_err();
}

/// A file of schema 9 (limits without rates) holding a limit and a job
/// blocked on it migrates to the current schema: the limit is kept, with
/// no rate, the blocked job is still blocked and readable, and a rate can
/// be set on it at once.
#[cfg(unix)]
#[test]
fn a_file_of_the_schema_before_rates_migrates_keeping_its_limits() {
    let (_dir, path) = common::temp_db();
    let schema = include_str!("../../src/engine/sqlite/schema.sql");
    let before = &schema[..schema.find("\n-- migration: 10").expect("migration 10")];
    {
        let conn = common::raw(&path);
        conn.execute_batch("PRAGMA journal_mode = WAL").unwrap();
        let body = before[before.find("-- migration: 1").unwrap()..].to_owned();
        conn.execute_batch(&format!("BEGIN; {body}; PRAGMA user_version = 9; COMMIT;"))
            .unwrap();
        conn.execute_batch(
            "INSERT INTO tickler_limits (name, max_per_key, max_total, updated_at)
             VALUES ('sync', 2, 5, 0)",
        )
        .unwrap();
        insert_raw(
            &conn,
            &[
                ("status", "'blocked'"),
                ("limit_name", "'sync'"),
                ("limit_key", "'a'"),
            ],
        )
        .unwrap();
    }
    let queue = Queue::open(&path).unwrap();
    assert_eq!(user_version(&path), tickler::Ops::schema_version());
    let limits = queue.limits().unwrap();
    assert_eq!(limits.len(), 1);
    assert_eq!(
        limits[0].limit,
        tickler::Limit::per_key(2).total(5),
        "kept, with no rate"
    );
    let job = queue.get(tickler::JobId(1)).unwrap();
    assert_eq!(
        (job.state, job.rate_deferrals),
        (tickler::JobState::Blocked, 0)
    );
    queue
        .set_limit(
            "sync",
            tickler::Limit::per_key(2).with_rate(1, common::secs(60)),
        )
        .unwrap();
    assert_eq!(
        queue.get(tickler::JobId(1)).unwrap().state,
        tickler::JobState::Pending,
        "released: the key holds nothing"
    );
    let conn = common::raw(&path);
    let check: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok");
}

/// A file of the schema before schedules could name a limit opens with its
/// schedules kept, limiting nothing, and a schedule stored again names one.
#[cfg(unix)]
#[test]
fn a_file_of_the_schema_before_schedule_limits_migrates_keeping_its_schedules() {
    let (_dir, path) = common::temp_db();
    let schema = include_str!("../../src/engine/sqlite/schema.sql");
    let before = &schema[..schema.find("\n-- migration: 11").expect("migration 11")];
    {
        let conn = common::raw(&path);
        conn.execute_batch("PRAGMA journal_mode = WAL").unwrap();
        let body = before[before.find("-- migration: 1").unwrap()..].to_owned();
        conn.execute_batch(&format!("BEGIN; {body}; PRAGMA user_version = 10; COMMIT;"))
            .unwrap();
    }
    {
        // Stored by the build of that schema, in its columns.
        let conn = common::raw(&path);
        conn.execute_batch(
            "INSERT INTO tickler_schedules (name, cron, time_zone, queue, kind, payload,
                 max_attempts, misfire, misfire_grace_ms, next_tick_at, created_at, updated_at,
                 handled_from)
             VALUES ('nightly', '0 3 * * *', 'UTC', 'default', 'backup', 'null', 3,
                 'fire_once', 60000, 0, 0, 0, 0)",
        )
        .unwrap();
    }
    let queue = Queue::open(&path).unwrap();
    assert_eq!(user_version(&path), tickler::Ops::schema_version());
    let kept = queue.get_schedule("nightly").unwrap();
    assert_eq!((kept.kind.as_str(), kept.limit), ("backup", None));
    let run = queue.manual().run_due_ticks().unwrap();
    assert_eq!(run.jobs.len(), 1, "its overdue tick fires");
    assert_eq!(queue.get(run.jobs[0]).unwrap().limit, None);
    let named = queue
        .upsert_schedule(
            tickler::NewSchedule::new("nightly", "0 3 * * *", "backup").limit("disk", "sda"),
        )
        .unwrap();
    assert_eq!(
        named.limit.map(|l| (l.name, l.key, l.weight)),
        Some(("disk".into(), "sda".into(), 1))
    );
}
