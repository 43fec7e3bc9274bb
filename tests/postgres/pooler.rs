//! PostgreSQL through PgBouncer (`.ci/postgres` starts one in transaction
//! mode and one in session mode in front of the test server): a pooler in
//! transaction mode is found at open, and tickler leaves nothing of its
//! own on the server connections that the pooler gives other clients
//! (no prepared statement, no session setting). PostgreSQL's alone: the
//! other engines have no such poolers. The contract's claim and pool
//! bodies run through both poolers too (`contract! { poolers: … }`).
#![cfg(feature = "postgres")]

use crate::support::pg;

use std::time::Duration;
use tickler::{JobContext, JobError, JobState, NewJob, Pooler, Queue, WorkerPool};

/// The URL of `db` through the PgBouncer of `var`, or `None` (with a note,
/// or a panic under CI) when there is none.
fn through(var: &str, db: &pg::TestDb) -> Option<String> {
    match std::env::var(var) {
        Ok(url) if !url.trim().is_empty() => Some(pg::with_dbname(&url, db.name())),
        _ => {
            assert!(!pg::in_ci(), "{var} is not set (.ci/postgres sets it)");
            eprintln!("note: skipped: {var} is not set (.ci/postgres starts PgBouncer)");
            None
        }
    }
}

/// One text value of a simple query.
fn text(client: &mut postgres::Client, sql: &str) -> String {
    client
        .simple_query(sql)
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .into_iter()
        .find_map(|m| match m {
            postgres::SimpleQueryMessage::Row(row) => Some(row.get(0).unwrap_or("").to_owned()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("{sql}: no row"))
}

/// The CI's pooler really is in transaction mode (else the contract's
/// cases through it would prove nothing): a statement a client prepares
/// by name is gone, for that client, once another client's transaction
/// has taken the server connection it was prepared on.
#[test]
fn the_transaction_pooler_gives_a_prepared_statement_to_someone_else() {
    let Some(db) = pg::test_database() else {
        return;
    };
    let Some(url) = through("TICKLER_TEST_PGBOUNCER_TX_URL", &db) else {
        return;
    };
    let mut first = pg::connect(&url, "tickler_test");
    let mut second = pg::connect(&url, "tickler_test");
    let statement = first.prepare("SELECT 1::bigint").unwrap();
    // The server connection `first` just gave back is the one the pooler
    // gives next (it reuses the last one freed): `second`'s transaction
    // holds it, so `first`'s next statement runs on another.
    let mut held = second.transaction().unwrap();
    held.batch_execute("SELECT 1").unwrap();
    let ran = first.query(&statement, &[]);
    held.commit().unwrap();
    let Err(e) = ran else {
        panic!("a named statement ran on another server connection: is the pooler in transaction mode?")
    };
    assert_eq!(
        e.code(),
        Some(&postgres::error::SqlState::INVALID_SQL_STATEMENT_NAME),
        "{e:?}"
    );
}

/// At open, with the default ([`Pooler::Detect`]), a pooler in transaction
/// mode is found (the queue says so in its location), and neither a
/// session pooler nor the server itself is taken for one.
#[test]
fn a_pooler_in_transaction_mode_is_found_at_open() {
    let Some(db) = pg::test_database() else {
        return;
    };
    let (Some(tx_url), Some(session_url)) = (
        through("TICKLER_TEST_PGBOUNCER_TX_URL", &db),
        through("TICKLER_TEST_PGBOUNCER_SESSION_URL", &db),
    ) else {
        return;
    };
    let note = "(through a pooler in transaction mode)";
    let pooled = Queue::open(&tx_url).unwrap();
    assert!(pooled.location().ends_with(note), "{}", pooled.location());
    for url in [session_url.as_str(), db.url()] {
        let queue = Queue::open(url).unwrap();
        assert!(!queue.location().contains(note), "{}", queue.location());
    }
    // Named, nothing is probed: the setting is taken as said.
    let named = Queue::builder(&tx_url)
        .postgres(|o| o.pooler(Pooler::Transaction))
        .open()
        .unwrap();
    assert!(named.location().ends_with(note), "{}", named.location());
    let session = Queue::builder(format!("{session_url}?pooler=session"))
        .open()
        .unwrap();
    assert!(!session.location().contains(note), "{}", session.location());
}

/// After a worker pool ran jobs through the pooler in transaction mode
/// (found at open, with the default setting), no server connection the
/// pooler holds has a prepared statement, a setting or a `LISTEN` of
/// tickler's: the next client given one finds it as it would
/// a fresh session. (With statements prepared by name and `SET jit =
/// off`, as tickler does on a direct connection, each server connection it
/// used would keep both.)
#[test]
fn nothing_of_ticklers_stays_on_the_poolers_server_connections() {
    let Some(db) = pg::test_database() else {
        return;
    };
    let Some(url) = through("TICKLER_TEST_PGBOUNCER_TX_URL", &db) else {
        return;
    };
    // Found at open (the pooler is idle: it gives the probe's second
    // connection the server connection the first just used).
    let queue = Queue::open(&url).unwrap();
    assert!(queue
        .location()
        .ends_with("(through a pooler in transaction mode)"));
    let ids = queue
        .enqueue_batch((0..200).map(|_| NewJob::new("noop")).collect())
        .unwrap();
    let mut pool = WorkerPool::builder(&queue)
        .threads(4)
        .handler("noop", |_ctx: &JobContext| -> Result<(), JobError> {
            Ok(())
        })
        .start()
        .unwrap();
    for _ in 0..20 {
        queue.enqueue(NewJob::new("noop")).unwrap();
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while queue.count(JobState::Succeeded).unwrap() < ids.len() as u64 + 20 {
        assert!(std::time::Instant::now() < deadline, "{:?}", queue.stats());
        std::thread::sleep(Duration::from_millis(50));
    }
    pool.shutdown(Duration::from_secs(5));
    // Each client in a transaction holds a server connection of its own:
    // eight at once see as many of the pool's as there are (at most 20).
    let mut clients: Vec<_> = (0..8).map(|_| pg::connect(&url, "tickler_test")).collect();
    let mut held: Vec<_> = clients
        .iter_mut()
        .map(|c| c.transaction().unwrap())
        .collect();
    let default_jit = text(&mut pg::connect(db.url(), "tickler_test"), "SHOW jit");
    let mut seen = std::collections::BTreeSet::new();
    for tx in &mut held {
        let row = tx
            .simple_query(
                "SELECT pg_backend_pid()::text || ' ' || \
                 (SELECT count(*) FROM pg_prepared_statements) || ' ' || \
                 current_setting('jit') || ' ' || (SELECT count(*) FROM pg_listening_channels())",
            )
            .unwrap()
            .into_iter()
            .find_map(|m| match m {
                postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
                _ => None,
            })
            .unwrap();
        let fields: Vec<&str> = row.split(' ').collect();
        let (pid, prepared, jit, listening) = (fields[0], fields[1], fields[2], fields[3]);
        seen.insert(pid.to_owned());
        assert_eq!(
            prepared, "0",
            "server connection {pid} keeps {prepared} prepared statements"
        );
        assert_eq!(
            jit, default_jit,
            "server connection {pid} keeps jit = {jit}"
        );
        assert_eq!(listening, "0", "server connection {pid} listens");
    }
    assert!(seen.len() >= 2, "only saw {seen:?}");
}

/// A startup parameter the pooler refuses (PgBouncer takes no `options`)
/// fails the open at once with the pooler's words, not after the retry
/// window: no retry changes the URL.
#[test]
fn a_startup_parameter_the_pooler_refuses_fails_the_open_at_once() {
    let Some(db) = pg::test_database() else {
        return;
    };
    let Some(url) = through("TICKLER_TEST_PGBOUNCER_TX_URL", &db) else {
        return;
    };
    let started = std::time::Instant::now();
    let err = Queue::open(format!("{url}?options=-c%20search_path%3Dpublic")).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("unsupported startup parameter"), "{text}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?} (the retry window is 30 s): {text}",
        started.elapsed()
    );
}
