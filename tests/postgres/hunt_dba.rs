//! Failures other PostgreSQL-backed queues met when the database was set
//! up by a DBA rather than by the queue: a role that may use the tables but
//! not create any, timeouts set for every session, idle sessions cut by the
//! server, a server time zone far from UTC.
#![cfg(feature = "postgres")]

use crate::support::pg;

use pg::test_database;
use std::time::Duration;
use tickler::{JobState, NewJob, Queue};

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// `url` with `user` as its user (URL form `postgres://user@host…`).
fn as_user(url: &str, user: &str) -> String {
    let scheme_end = url.find("://").expect("a URL") + 3;
    let rest = &url[scheme_end..];
    let host_at = rest.find('@').map_or(0, |at| at + 1);
    format!("{}{user}@{}", &url[..scheme_end], &rest[host_at..])
}

fn alter_database(db: &pg::TestDb, setting: &str) {
    db.connect()
        .batch_execute(&format!("ALTER DATABASE \"{}\" SET {setting}", db.name()))
        .expect("ALTER DATABASE");
}

/// graphile-worker #132 and #151: the application runs as a role that may
/// read and write the queue's tables but not create tables (PostgreSQL 15
/// no longer lets every role create in `public`); the schema was migrated
/// by its owner. Opening the queue must not need CREATE when there is
/// nothing to migrate.
#[test]
fn a_role_without_create_opens_a_migrated_database() {
    let Some(db) = test_database() else { return };
    let role = format!("tickler_app_{:08x}", fastrand::u32(..));
    {
        let owner = Queue::open(db.url()).expect("the owner migrates");
        owner.enqueue(NewJob::new("work")).expect("enqueue");
    }
    let mut admin = db.connect();
    admin
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN;
             REVOKE CREATE ON SCHEMA public FROM PUBLIC;
             GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role};
             GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {role};"
        ))
        .expect("create the application's role");
    let result = (|| -> tickler::Result<()> {
        let app = Queue::open(as_user(db.url(), &role))?;
        let id = app.enqueue(NewJob::new("work"))?;
        let lease = app.claim("default", "w", 2, secs(30))?;
        assert_eq!(lease.len(), 2);
        for l in &lease {
            app.complete(l)?;
        }
        assert_eq!(app.get(id)?.state, JobState::Succeeded);
        Ok(())
    })();
    let server = db.server_url().to_owned();
    drop(admin);
    drop(db);
    pg::connect(&server, "tickler_test_harness")
        .batch_execute(&format!("DROP ROLE IF EXISTS {role}"))
        .expect("DROP ROLE");
    result.expect("the application's role uses a migrated queue");
}

/// graphile_worker_rs #465, n8n #34685: processes that start together on a
/// fresh database race the schema install; here the DBA also set a
/// `lock_timeout` for every session (a common safety net), so the ones
/// waiting for the first one's migration are cancelled after 10 ms.
#[test]
fn processes_starting_together_migrate_once_under_a_dba_lock_timeout() {
    let Some(db) = test_database() else { return };
    alter_database(&db, "lock_timeout = '10ms'");
    let handles: Vec<_> = (0..6)
        .map(|_| {
            let url = db.url().to_owned();
            std::thread::spawn(move || {
                Queue::builder(&url)
                    .busy_retry(secs(5))
                    .open()
                    .map(|q| q.enqueue(NewJob::new("work")).map(|_| ()))
            })
        })
        .collect();
    for h in handles {
        h.join()
            .expect("thread")
            .expect("open")
            .expect("enqueue after open");
    }
    let row = db
        .connect()
        .query_one(
            "SELECT count(*), count(DISTINCT version) FROM tickler_schema_migrations",
            &[],
        )
        .expect("versions");
    let (rows, versions): (i64, i64) = (row.get(0), row.get(1));
    assert!(versions > 0);
    assert_eq!(rows, versions, "each migration applied once");
}

/// matrix-authentication-service #2625, JobRunr #784: connections the
/// server cut (here by the DBA's `idle_session_timeout`) must not stop the
/// queue or reach the application as errors.
#[test]
fn idle_sessions_cut_by_the_server_reach_no_user_code() {
    let Some(db) = test_database() else { return };
    alter_database(&db, "idle_session_timeout = '150ms'");
    let queue = Queue::open(db.url()).expect("open");
    for round in 0..6 {
        std::thread::sleep(Duration::from_millis(300));
        let id = queue
            .enqueue(NewJob::new("work"))
            .unwrap_or_else(|e| panic!("enqueue, round {round}: {e}"));
        std::thread::sleep(Duration::from_millis(300));
        let leases = queue
            .claim("default", "w", 1, secs(30))
            .unwrap_or_else(|e| panic!("claim, round {round}: {e}"));
        assert_eq!(leases.len(), 1);
        std::thread::sleep(Duration::from_millis(300));
        queue
            .complete(&leases[0])
            .unwrap_or_else(|e| panic!("complete, round {round}: {e}"));
        assert_eq!(queue.get(id).expect("get").state, JobState::Succeeded);
    }
}

/// pg-boss #58, raystack/entropy #91: a server (or database) whose time zone
/// is not UTC shifted due times by the offset. tickler keeps milliseconds
/// since the epoch and reads the server's clock as an instant.
#[test]
fn a_server_time_zone_far_from_utc_moves_nothing() {
    let Some(db) = test_database() else { return };
    alter_database(&db, "timezone = 'Pacific/Kiritimati'");
    let queue = Queue::open(db.url()).expect("open");
    let ours = queue.clock().now_ms();
    let local = chrono::Utc::now().timestamp_millis();
    assert!(
        (ours - local).abs() < 5_000,
        "queue clock {ours} vs this machine {local}"
    );
    let soon = queue
        .enqueue(NewJob::new("work").delay(secs(3600)))
        .expect("enqueue");
    let now = queue.enqueue(NewJob::new("work")).expect("enqueue");
    let leases = queue.claim("default", "w", 5, secs(30)).expect("claim");
    assert_eq!(leases.iter().map(|l| l.job_id).collect::<Vec<_>>(), [now]);
    let due = queue.get(soon).expect("get").run_at.timestamp_millis() - ours;
    assert!((3_595_000..3_605_000).contains(&due), "due in {due} ms");
}
