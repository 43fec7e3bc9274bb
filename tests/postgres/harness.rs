//! The PostgreSQL test harness does what the engine's tests rely on: each
//! test gets a database of its own that is gone after it, connections can
//! be cut from the server side, and the server can be restarted in the
//! middle of a test. (Needs a server: `.ci/postgres` starts one.)
#![cfg(feature = "postgres")]

use crate::support::pg;

use pg::{exclusive_server, terminate_connections, test_database};
use postgres::Client;

fn database_exists(client: &mut Client, name: &str) -> bool {
    let row = client
        .query_one(
            "SELECT count(*) FROM pg_database WHERE datname = $1",
            &[&name],
        )
        .expect("pg_database");
    row.get::<_, i64>(0) == 1
}

fn current_database(client: &mut Client) -> String {
    client
        .query_one("SELECT current_database()", &[])
        .expect("current_database")
        .get(0)
}

/// The next query on `client` fails: its connection was cut.
fn assert_cut(client: &mut Client, what: &str) {
    assert!(
        client.simple_query("SELECT 1").is_err(),
        "{what}: the connection still answers"
    );
    assert!(client.is_closed(), "{what}: the connection is not closed");
}

#[test]
fn two_test_databases_are_distinct_and_usable_at_once() {
    let Some(a) = test_database() else { return };
    let Some(b) = test_database() else { return };
    assert_ne!(a.name(), b.name());
    assert_ne!(a.url(), b.url());
    let mut ca = a.connect();
    let mut cb = b.connect();
    assert_eq!(current_database(&mut ca), a.name());
    assert_eq!(current_database(&mut cb), b.name());

    // The same table name in both, different contents, written from two
    // threads at once, each on its own connection.
    let fill = |mut client: Client, rows: i64| {
        std::thread::spawn(move || {
            client
                .batch_execute("CREATE TABLE t (n bigint)")
                .expect("create");
            for n in 0..rows {
                client
                    .execute("INSERT INTO t VALUES ($1)", &[&n])
                    .expect("insert");
            }
            client
        })
    };
    let (ta, tb) = (fill(ca, 100), fill(cb, 7));
    let mut ca = ta.join().expect("thread a");
    let mut cb = tb.join().expect("thread b");
    let count = |c: &mut Client| -> i64 {
        c.query_one("SELECT count(*) FROM t", &[])
            .expect("count")
            .get(0)
    };
    assert_eq!(count(&mut ca), 100);
    assert_eq!(count(&mut cb), 7);
    // Both still open and usable together.
    assert_eq!(count(&mut a.connect()), 100);
    assert_eq!(count(&mut cb), 7);
}

#[test]
fn a_dropped_test_database_is_gone_even_with_a_connection_left_open() {
    let Some(db) = test_database() else { return };
    let name = db.name().to_owned();
    let mut admin = pg::connect(db.server_url(), "pg_harness_admin");
    let mut left_open = db.connect();
    left_open
        .batch_execute("CREATE TABLE t (n bigint); INSERT INTO t VALUES (1)")
        .expect("use it");
    assert!(database_exists(&mut admin, &name), "created");

    drop(db);

    assert!(!database_exists(&mut admin, &name), "{name} still exists");
    assert_cut(&mut left_open, "the connection to the dropped database");
}

#[test]
fn terminate_connections_cuts_the_named_ones_then_all() {
    let Some(db) = test_database() else { return };
    let Some(other) = test_database() else { return };
    let mut victim = db.connect_as("pg_harness_victim");
    let mut bystander = db.connect_as("pg_harness_bystander");
    let mut elsewhere = other.connect_as("pg_harness_victim");
    for c in [&mut victim, &mut bystander, &mut elsewhere] {
        c.simple_query("SELECT 1").expect("open");
    }

    let cut = terminate_connections(db.url(), Some("pg_harness_victim"));
    assert_eq!(cut, 1, "one connection of that name in that database");
    assert_cut(&mut victim, "the named connection");
    bystander
        .simple_query("SELECT 1")
        .expect("a connection of another name lives on");
    elsewhere
        .simple_query("SELECT 1")
        .expect("a connection to another database lives on");

    let cut = terminate_connections(db.url(), None);
    assert_eq!(cut, 1, "the bystander was the last one");
    assert_cut(&mut bystander, "all connections");
    elsewhere
        .simple_query("SELECT 1")
        .expect("a connection to another database lives on");
    // The database itself is untouched.
    db.connect().simple_query("SELECT 1").expect("reconnect");
}

#[test]
fn restart_server_restarts_it() {
    let _exclusive = exclusive_server();
    let Some(db) = test_database() else { return };
    if !pg::can_restart_server() {
        assert!(
            !pg::in_ci(),
            "TICKLER_TEST_DATABASE_URL is set but TICKLER_TEST_PG_CTL is not \
             (.ci/postgres sets both)"
        );
        eprintln!("note: restart test skipped: TICKLER_TEST_PG_CTL is not set");
        return;
    }
    let mut before = db.connect();
    before
        .batch_execute("CREATE TABLE t (n bigint); INSERT INTO t VALUES (42)")
        .expect("write");
    let started_before: std::time::SystemTime = before
        .query_one("SELECT pg_postmaster_start_time()", &[])
        .expect("start time")
        .get(0);

    assert!(pg::restart_server());

    assert_cut(&mut before, "a connection opened before the restart");
    let mut after = db.connect();
    let started_after: std::time::SystemTime = after
        .query_one("SELECT pg_postmaster_start_time()", &[])
        .expect("start time")
        .get(0);
    assert!(
        started_after > started_before,
        "the server did not restart: started {started_before:?}, then {started_after:?}"
    );
    let n: i64 = after
        .query_one("SELECT n FROM t", &[])
        .expect("committed data survives")
        .get(0);
    assert_eq!(n, 42);
}
