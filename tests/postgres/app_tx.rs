//! Jobs inside the application's own PostgreSQL transactions: enqueued if
//! and only if the caller commits; completed together with the handler's
//! writes, or neither when the lease was lost.
#![cfg(feature = "postgres")]

use crate::support::pg;

use std::time::Duration;
use tickler::{Error, JobState, NewJob, Queue};

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn orders(client: &mut postgres::Client) -> i64 {
    client
        .query_one("SELECT count(*) FROM orders", &[])
        .unwrap()
        .get(0)
}

#[test]
fn a_job_enqueued_in_the_callers_transaction_exists_only_if_it_commits() {
    let Some(db) = pg::test_database() else {
        return;
    };
    let queue = Queue::open(db.url()).expect("open");
    let mut app = db.connect();
    app.batch_execute("CREATE TABLE orders (id bigint)")
        .unwrap();

    let mut tx = app.transaction().unwrap();
    tx.execute("INSERT INTO orders VALUES (1)", &[]).unwrap();
    let kept = queue.enqueue_tx(&mut tx, NewJob::new("mail")).unwrap();
    tx.commit().unwrap();

    let mut tx = app.transaction().unwrap();
    tx.execute("INSERT INTO orders VALUES (2)", &[]).unwrap();
    let dropped = queue.enqueue_tx(&mut tx, NewJob::new("mail")).unwrap();
    tx.rollback().unwrap();

    assert_eq!(queue.get(kept).unwrap().state, JobState::Pending);
    assert!(matches!(queue.get(dropped), Err(Error::NotFound(_))));
    assert_eq!(orders(&mut app), 1);
}

#[test]
fn a_refused_job_leaves_the_callers_transaction_usable() {
    let Some(db) = pg::test_database() else {
        return;
    };
    let queue = Queue::open(db.url()).expect("open");
    let mut app = db.connect();
    app.batch_execute(
        "CREATE TABLE orders (id bigint);
         CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF NEW.kind = 'refused' THEN RAISE EXCEPTION 'no such jobs here'; END IF;
             RETURN NEW;
         END $$;
         CREATE TRIGGER refuse BEFORE INSERT ON tickler_jobs
             FOR EACH ROW EXECUTE FUNCTION refuse();",
    )
    .unwrap();
    let mut tx = app.transaction().unwrap();
    tx.execute("INSERT INTO orders VALUES (1)", &[]).unwrap();
    let refused = queue.enqueue_tx(&mut tx, NewJob::new("mail").queue("a\0b"));
    assert!(
        matches!(refused, Err(Error::InvalidArgument(_))),
        "{refused:?}"
    );
    let refused = queue.enqueue_tx(&mut tx, NewJob::new(""));
    assert!(matches!(refused, Err(Error::EmptyKind)), "{refused:?}");
    // Refused by the server (a trigger of the application's): the insert
    // ran in a savepoint, so the transaction goes on.
    let refused = queue.enqueue_tx(&mut tx, NewJob::new("refused"));
    assert!(refused.is_err(), "{refused:?}");
    tx.execute("INSERT INTO orders VALUES (2)", &[]).unwrap();
    tx.commit().unwrap();
    assert_eq!(orders(&mut app), 2);
}

#[test]
fn completion_commits_with_the_handlers_writes_or_not_at_all() {
    let Some(db) = pg::test_database() else {
        return;
    };
    let queue = Queue::open(db.url()).expect("open");
    let mut app = db.connect();
    app.batch_execute("CREATE TABLE orders (id bigint)")
        .unwrap();
    let id = queue.enqueue(NewJob::new("charge")).unwrap();
    let lease = queue
        .manual()
        .claim("default", "w", 1, secs(30))
        .unwrap()
        .remove(0);

    // The lease is lost (cancelled): the handler's write rolls back too.
    let other = queue.enqueue(NewJob::new("charge")).unwrap();
    let lost_lease = queue
        .manual()
        .claim("default", "w", 1, secs(30))
        .unwrap()
        .remove(0);
    assert_eq!(lost_lease.job_id, other);
    queue.cancel(other).unwrap();
    let lost = queue.complete_with(&lost_lease, |tx: &mut tickler::postgres::Transaction| {
        tx.execute("INSERT INTO orders VALUES (99)", &[])?;
        Ok(())
    });
    assert!(matches!(lost, Err(Error::LeaseLost { .. })), "{lost:?}");

    // An error of the application's: nothing written, the job still held.
    let aborted: tickler::Result<()> =
        queue.complete_with(&lease, |tx: &mut tickler::postgres::Transaction| {
            tx.execute("INSERT INTO orders VALUES (7)", &[])?;
            Err(Error::aborted("no stock"))
        });
    assert!(matches!(aborted, Err(Error::Aborted(_))));
    assert_eq!(queue.get(id).unwrap().state, JobState::Running);

    let n = queue
        .complete_with(&lease, |tx: &mut tickler::postgres::Transaction| {
            tx.execute("INSERT INTO orders VALUES (1)", &[])?;
            Ok(5)
        })
        .unwrap();
    assert_eq!(n, 5);
    assert_eq!(queue.get(id).unwrap().state, JobState::Succeeded);
    assert_eq!(orders(&mut app), 1);
}

#[test]
fn a_transaction_of_the_other_engine_is_refused() {
    let Some(db) = pg::test_database() else {
        return;
    };
    let queue = Queue::open(db.url()).expect("open");
    assert!(matches!(
        queue.open_connection(),
        Err(Error::Unsupported { .. })
    ));
    assert!(matches!(
        queue.ops().checkpoint(),
        Err(Error::Unsupported { .. })
    ));
    let dir = tempfile::tempdir().unwrap();
    let file = Queue::open(dir.path().join("q.db")).unwrap();
    let mut app = db.connect();
    let mut tx = app.transaction().unwrap();
    assert!(matches!(
        file.enqueue_tx(&mut tx, NewJob::new("x")),
        Err(Error::Unsupported { .. })
    ));
    drop(tx);
    assert_eq!(file.count(JobState::Pending).unwrap(), 0);
    // The one enqueue_tx, given a rusqlite transaction on a PostgreSQL
    // queue, refuses it and writes nothing anywhere.
    let mut conn = file.open_connection().unwrap();
    let sqlite_tx = conn.transaction().unwrap();
    assert!(matches!(
        queue.enqueue_tx(&sqlite_tx, NewJob::new("x")),
        Err(Error::Unsupported {
            engine: "PostgreSQL",
            ..
        })
    ));
    sqlite_tx.commit().unwrap();
    assert_eq!(file.count(JobState::Pending).unwrap(), 0);
    assert_eq!(queue.count(JobState::Pending).unwrap(), 0);
}

/// PostgreSQL's: `RESET ALL` keeps a `SET ROLE`. An application that
/// switched to a role of its own inside `complete_with` (a role with no
/// rights on tickler's tables, say) left tickler's pooled connection
/// running every later statement as that role, and each failed with
/// "permission denied". tickler's connections go back to the role they
/// logged in as.
#[test]
fn a_role_set_in_complete_with_does_not_stay_on_ticklers_connection() {
    let Some(db) = pg::test_database() else {
        return;
    };
    let mut admin = db.connect();
    pg::ensure_role(&mut admin, "tickler_no_rights", "NOLOGIN");
    let queue = Queue::builder(db.url())
        .postgres(|o| o.max_connections(2))
        .open()
        .expect("open");
    for round in 0..3 {
        let lease = pg::enqueue_and_claim(&queue, NewJob::new("k"));
        queue
            .complete_with(&lease, |tx: &mut tickler::postgres::Transaction| {
                tx.batch_execute("SET ROLE tickler_no_rights")?;
                Ok(())
            })
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
    }
    for n in 0..20 {
        queue
            .enqueue(NewJob::new("after"))
            .unwrap_or_else(|e| panic!("enqueue {n} after the application's SET ROLE: {e}"));
        let lease = queue
            .manual()
            .claim("default", "w", 1, secs(30))
            .unwrap_or_else(|e| panic!("claim {n}: {e}"))
            .remove(0);
        let user = queue
            .complete_with(&lease, |tx: &mut tickler::postgres::Transaction| {
                let row = tx.query_one("SELECT current_user = session_user", &[])?;
                Ok(row.get::<_, bool>(0))
            })
            .unwrap();
        assert!(user, "round {n}: tickler's connection runs as another role");
    }
}

/// PostgreSQL's: the reset after `complete_with` must not drop a role the
/// deployment made the login's default (`ALTER ROLE … SET role`, or the
/// database's, as here), under which tickler's tables were created:
/// `SET SESSION AUTHORIZATION DEFAULT` alone leaves no role set.
#[test]
fn a_default_role_of_the_login_stays_after_complete_with() {
    let Some(db) = pg::test_database() else {
        return;
    };
    let mut admin = db.connect();
    pg::ensure_role(&mut admin, "tickler_owner", "NOLOGIN");
    admin
        .batch_execute(&format!(
            "GRANT CREATE, USAGE ON SCHEMA public TO tickler_owner;
             ALTER DATABASE \"{}\" SET role = 'tickler_owner';",
            db.name()
        ))
        .unwrap();
    let queue = Queue::builder(db.url())
        .postgres(|o| o.max_connections(2))
        .open()
        .expect("open");
    for round in 0..6 {
        let lease = pg::enqueue_and_claim(&queue, NewJob::new("k"));
        let user: String = queue
            .complete_with(&lease, |tx: &mut tickler::postgres::Transaction| {
                let user = tx.query_one("SELECT current_user::text", &[])?.get(0);
                tx.batch_execute("SET ROLE NONE")?;
                Ok(user)
            })
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert_eq!(user, "tickler_owner", "round {round}");
    }
}
