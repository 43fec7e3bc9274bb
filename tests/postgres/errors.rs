//! PostgreSQL's: what the server said reaches the caller (its message,
//! SQLSTATE, detail and hint, not the client library's "db error"), and
//! a refusal no retry cures (a wrong password, a database that does not
//! exist, a missing privilege) fails at once instead of being retried for
//! the whole retry window. `.ci/postgres` checks the password of the role
//! `tickler_password` alone; every other login there is trusted.
#![cfg(feature = "postgres")]

use crate::support::pg;

use std::time::{Duration, Instant};
use tickler::{Error, NewJob, Queue};

/// The role whose password the test server checks.
const ROLE: &str = "tickler_password";

/// Held by a test for as long as it uses the role (one per server, whose
/// password the tests change).
static ROLE_USER: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// `url` logging in as `user` with `password`.
fn as_user(url: &str, user: &str, password: &str) -> String {
    let (scheme, rest) = url.split_once("://").expect("a URL");
    let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    format!("{scheme}://{user}:{password}@{host}")
}

/// Opens `url` with a retry window of a minute; the error and how long
/// the open took.
fn open_fails(url: &str) -> (Error, Duration) {
    let start = Instant::now();
    let result = open_with_a_long_window(url);
    match result {
        Ok(_) => panic!("the open of {url} succeeded"),
        Err(e) => (e, start.elapsed()),
    }
}

/// The role for this test alone, with `password`.
fn take_role(db: &pg::TestDb, password: &str) -> std::sync::MutexGuard<'static, ()> {
    let guard = ROLE_USER
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    set_role(db, password);
    guard
}

/// Whether the server refuses the role with a wrong password.
fn checks_password(db: &pg::TestDb) -> bool {
    postgres::Client::connect(&as_user(db.url(), ROLE, "wrong"), postgres::NoTls).is_err()
}

/// `url` opened with a retry window of a minute.
fn open_with_a_long_window(url: &str) -> tickler::Result<Queue> {
    Queue::builder(url)
        .busy_timeout(Duration::from_secs(5))
        .busy_retry(Duration::from_secs(55))
        .open()
}

/// Sets the checked role's password.
fn set_role(db: &pg::TestDb, password: &str) {
    let mut admin = db.connect();
    admin
        .batch_execute(&format!(
            "DO $$ BEGIN
               IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{ROLE}') THEN
                 CREATE ROLE {ROLE} LOGIN;
               END IF;
             END $$;
             ALTER ROLE {ROLE} PASSWORD '{password}';"
        ))
        .unwrap();
}

#[test]
fn refusals_no_retry_cures_fail_the_open_at_once_with_the_servers_reason() {
    let Some(db) = pg::test_database() else {
        return;
    };
    let _role = take_role(&db, "right");
    // As on PostgreSQL 15 and later by default: nobody else may create in
    // `public`.
    db.connect()
        .batch_execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
        .unwrap();
    // A server that does not check this role's password (one not started
    // by `.ci/postgres`) cannot show a wrong one refused.
    if !checks_password(&db) {
        assert!(!pg::in_ci(), "the server does not check {ROLE}'s password");
        eprintln!("note: skipped: the server does not check {ROLE}'s password");
        return;
    }

    // A wrong password: the server's reason and SQLSTATE, at once.
    let (e, took) = open_fails(&as_user(db.url(), ROLE, "wrong"));
    let text = e.to_string();
    assert!(matches!(e, Error::Postgres(_)), "{e:?}");
    assert!(
        text.contains("password authentication failed") && text.contains("28P01"),
        "{text}"
    );
    assert!(
        took < Duration::from_secs(20),
        "the open took {took:?}: {text}"
    );

    // The right password on a database whose schema it may not write to.
    let (e, took) = open_fails(&as_user(db.url(), ROLE, "right"));
    let text = e.to_string();
    assert!(
        text.contains("permission denied") && text.contains("42501"),
        "{text}"
    );
    assert!(
        took < Duration::from_secs(20),
        "the open took {took:?}: {text}"
    );

    // A database that does not exist: its name and SQLSTATE.
    let missing = pg::with_dbname(db.url(), "tickler_no_such_database");
    let (e, took) = open_fails(&missing);
    let text = e.to_string();
    assert!(
        text.contains("\"tickler_no_such_database\" does not exist") && text.contains("3D000"),
        "{text}"
    );
    assert!(!text.contains("db error"), "{text}");
    assert!(
        took < Duration::from_secs(20),
        "the open took {took:?}: {text}"
    );

    // Given the privilege, the same login opens the queue: the refusals
    // above were the password's and the privilege's.
    db.connect()
        .batch_execute(&format!("GRANT CREATE ON SCHEMA public TO {ROLE}"))
        .unwrap();
    let queue = Queue::open(as_user(db.url(), ROLE, "right")).expect("open with the privilege");
    queue.enqueue(NewJob::new("k")).unwrap();
}

/// A password changed while the queue runs: a call fails with the
/// server's reason once the pool cannot open a connection, not after the
/// whole retry window with a pool timeout.
#[test]
fn a_password_changed_under_a_running_queue_fails_calls_with_the_reason() {
    let Some(db) = pg::test_database() else {
        return;
    };
    let _role = take_role(&db, "right");
    db.connect()
        .batch_execute(&format!("GRANT CREATE ON SCHEMA public TO {ROLE}"))
        .unwrap();
    let queue = open_with_a_long_window(&as_user(db.url(), ROLE, "right")).expect("open");
    queue.enqueue(NewJob::new("k")).unwrap();
    set_role(&db, "changed");
    pg::terminate_connections(db.url(), Some("tickler"));
    let start = Instant::now();
    let e = queue
        .enqueue(NewJob::new("k"))
        .expect_err("an enqueue without a connection succeeded");
    let took = start.elapsed();
    let text = e.to_string();
    assert!(
        text.contains("password authentication failed") && text.contains("28P01"),
        "{text}"
    );
    assert!(
        took < Duration::from_secs(40),
        "the enqueue took {took:?}: {text}"
    );
}
