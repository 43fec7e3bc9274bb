//! `Queue::open_connection` hands the application a connection with
//! tickler's settings (WAL, `synchronous` per `Durability`, foreign keys,
//! busy handling) and runs the `QueueBuilder::on_connection` hook on it, so
//! the application and tickler never disagree about the file.

use crate::support::app_tx;

use app_tx::{ms, raw, secs, temp_db};
use rusqlite::TransactionBehavior;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tickler::{Durability, Error, NewJob, Queue};

fn pragma_i64(conn: &rusqlite::Connection, name: &str) -> i64 {
    conn.query_row(&format!("PRAGMA {name}"), [], |r| r.get(0))
        .unwrap_or_else(|e| panic!("PRAGMA {name}: {e}"))
}

fn journal_mode(conn: &rusqlite::Connection) -> String {
    conn.query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap()
}

#[test]
fn open_connection_uses_wal_and_the_queues_synchronous_level() {
    for (durability, level) in [(Durability::Full, 2), (Durability::Normal, 1)] {
        let (_dir, path) = temp_db();
        let queue = Queue::builder(&path)
            .sqlite(|o| o.durability(durability))
            .open()
            .unwrap();
        let conn = queue.open_connection().unwrap();
        assert_eq!(journal_mode(&conn), "wal", "{durability:?}");
        assert_eq!(pragma_i64(&conn, "synchronous"), level, "{durability:?}");
        assert_eq!(pragma_i64(&conn, "foreign_keys"), 1, "{durability:?}");
        // It can write (not a read-only reader connection).
        assert_eq!(pragma_i64(&conn, "query_only"), 0, "{durability:?}");
        conn.execute_batch("CREATE TABLE app (x INTEGER)").unwrap();
        // A plain connection of the application sees WAL too: the mode is
        // stored in the file, so the two cannot disagree.
        assert_eq!(journal_mode(&raw(&path)), "wal");
    }
}

#[test]
fn the_on_connection_hook_runs_on_open_connection() {
    let (_dir, path) = temp_db();
    let calls = Arc::new(AtomicUsize::new(0));
    let hook_calls = Arc::clone(&calls);
    let queue = Queue::builder(&path)
        .sqlite(|o| {
            o.on_connection(move |conn| {
                hook_calls.fetch_add(1, Ordering::SeqCst);
                conn.execute_batch("PRAGMA cache_size = -12345; PRAGMA temp_store = MEMORY;")
            })
        })
        .open()
        .unwrap();
    // The writer ran it at open.
    assert!(calls.load(Ordering::SeqCst) >= 1);

    let before = calls.load(Ordering::SeqCst);
    let conn = queue.open_connection().unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), before + 1);
    assert_eq!(pragma_i64(&conn, "cache_size"), -12345);
    assert_eq!(pragma_i64(&conn, "temp_store"), 2);
    // tickler's own settings still hold after the hook.
    assert_eq!(journal_mode(&conn), "wal");
    assert_eq!(pragma_i64(&conn, "synchronous"), 2);
    let second = queue.open_connection().unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), before + 2);
    assert_eq!(pragma_i64(&second, "cache_size"), -12345);
    // A plain connection does not get the hook's settings.
    assert_ne!(pragma_i64(&raw(&path), "cache_size"), -12345);
}

#[test]
fn a_failing_hook_fails_open_connection() {
    let (_dir, path) = temp_db();
    let fail = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let hook_fail = Arc::clone(&fail);
    let queue = Queue::builder(&path)
        .sqlite(|o| {
            o.on_connection(move |conn| {
                if hook_fail.load(Ordering::SeqCst) {
                    conn.execute_batch("INSERT INTO no_such_table VALUES (1)")
                } else {
                    Ok(())
                }
            })
        })
        .open()
        .unwrap();
    fail.store(true, Ordering::SeqCst);
    let err = queue.open_connection().unwrap_err();
    assert!(matches!(err, Error::Sqlite(_)), "{err:?}");
    assert!(err.to_string().contains("no_such_table"), "{err}");
}

#[test]
fn open_connection_waits_for_a_write_lock_held_briefly_elsewhere() {
    let (_dir, path) = temp_db();
    let queue = Queue::open(&path).unwrap();
    let mut app = queue.open_connection().unwrap();
    app.execute_batch("CREATE TABLE app (x INTEGER)").unwrap();

    // Another connection holds the write lock for 300 ms.
    let holder_path = path.clone();
    let (locked_tx, locked_rx) = std::sync::mpsc::channel();
    let holder = std::thread::spawn(move || {
        let mut conn = raw(&holder_path);
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .unwrap();
        tx.execute("INSERT INTO app VALUES (1)", []).unwrap();
        locked_tx.send(()).unwrap();
        std::thread::sleep(ms(300));
        tx.commit().unwrap();
    });
    locked_rx.recv_timeout(secs(10)).unwrap();

    // The application's transaction waits instead of failing with BUSY.
    let started = Instant::now();
    let tx = app
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .expect("BEGIN IMMEDIATE should wait out a short lock");
    let waited = started.elapsed();
    tx.execute("INSERT INTO app VALUES (2)", []).unwrap();
    queue.enqueue_tx(&tx, NewJob::new("after_wait")).unwrap();
    tx.commit().unwrap();
    holder.join().unwrap();
    assert!(waited >= ms(100), "did not wait for the lock: {waited:?}");
    let rows: i64 = raw(&path)
        .query_row("SELECT count(*) FROM app", [], |r| r.get(0))
        .unwrap();
    assert_eq!(rows, 2);
}

/// The hook is documented as "must not change journal_mode or synchronous";
/// tickler reads its pragmas back before the hook runs, not after, so a
/// hook that does change them goes unnoticed and the queue's durability
/// promise silently no longer holds.
#[test]
fn a_hook_cannot_silently_weaken_durability() {
    let (_dir, path) = temp_db();
    let opened = Queue::builder(&path)
        .sqlite(|o| o.durability(Durability::Full))
        .sqlite(|o| o.on_connection(|conn| conn.execute_batch("PRAGMA synchronous = OFF")))
        .open();
    match opened {
        Err(Error::PragmaMismatch { .. }) => {}
        Err(e) => panic!("unexpected error {e:?}"),
        Ok(queue) => {
            let conn = queue.open_connection();
            match conn {
                Err(Error::PragmaMismatch { .. }) => {}
                Err(e) => panic!("unexpected error {e:?}"),
                Ok(conn) => assert_eq!(
                    pragma_i64(&conn, "synchronous"),
                    2,
                    "Durability::Full, but the application's connection runs synchronous=OFF"
                ),
            }
        }
    }
}

/// On Apple systems fsync() leaves writes in the drive's cache; SQLite
/// flushes it (F_FULLFSYNC) only under `fullfsync` (every sync) or
/// `checkpoint_fullfsync` (a checkpoint's). `Full` must set the first on
/// every connection, both durabilities the second, and a hook must not
/// undo them. Read as pragmas, so that this holds on every system the
/// tests run on, where the flag is stored but changes nothing.
#[test]
fn connections_flush_the_drive_as_their_durability_promises() {
    for (durability, fullfsync) in [(Durability::Full, 1), (Durability::Normal, 0)] {
        let (_dir, path) = temp_db();
        let queue = Queue::builder(&path)
            .sqlite(|o| o.durability(durability))
            .open()
            .unwrap();
        let conn = queue.open_connection().unwrap();
        assert_eq!(pragma_i64(&conn, "fullfsync"), fullfsync, "{durability:?}");
        assert_eq!(
            pragma_i64(&conn, "checkpoint_fullfsync"),
            1,
            "{durability:?}"
        );
        drop(conn);
        let weakened = Queue::builder(&path)
            .sqlite(|o| o.durability(durability))
            .sqlite(|o| {
                o.on_connection(|conn| conn.execute_batch("PRAGMA checkpoint_fullfsync = 0"))
            })
            .open();
        assert!(
            matches!(weakened, Err(Error::PragmaMismatch { .. })),
            "{durability:?}: {weakened:?}"
        );
    }
}
