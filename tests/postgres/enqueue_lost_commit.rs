//! An enqueue whose COMMIT landed but whose acknowledgement was lost with
//! the connection (a server restart or a cut at that moment) is retried by
//! tickler; the retry must not insert the jobs a second time. Found by the
//! PostgreSQL torture run (`tests/postgres/torture_short.rs`): after a server
//! restart the database held one job more than the producer was told of,
//! with the same payload as the job after it.
//!
//! A proxy between the queue and the server forwards everything but drops
//! the connection instead of passing on the server's reply to one write
//! that committed: a COMMIT, or an INSERT in autocommit (a reply ending
//! in ReadyForQuery "idle").
#![cfg(feature = "postgres")]

use crate::support::pg;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use tickler::{NewJob, Queue, SslMode};

/// Forwards connections to `server` (host:port); while `armed`, the first
/// server reply that completes a committed write is not passed on: both
/// sides of that connection are shut down instead.
fn proxy(server: String, armed: Arc<AtomicBool>, cut: Arc<AtomicUsize>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(client) = client else { return };
            let Ok(upstream) = TcpStream::connect(&server) else {
                continue;
            };
            let (mut c_read, mut u_write) =
                (client.try_clone().unwrap(), upstream.try_clone().unwrap());
            std::thread::spawn(move || {
                let mut buf = [0u8; 16 * 1024];
                while let Ok(n) = c_read.read(&mut buf) {
                    if n == 0 || u_write.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
                let _ = u_write.shutdown(Shutdown::Both);
            });
            let (mut u_read, mut c_write) = (upstream, client);
            let (armed, cut) = (armed.clone(), cut.clone());
            std::thread::spawn(move || {
                let mut buf = [0u8; 16 * 1024];
                while let Ok(n) = u_read.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    let has =
                        |pattern: &[u8]| buf[..n].windows(pattern.len()).any(|w| w == pattern);
                    // ReadyForQuery, idle: outside a transaction, so what
                    // the reply answers has committed.
                    let commit_done =
                        has(b"Z\0\0\0\x05I") && (has(b"COMMIT\0") || has(b"INSERT 0 "));
                    if commit_done && armed.swap(false, Ordering::SeqCst) {
                        cut.fetch_add(1, Ordering::SeqCst);
                        break;
                    }
                    if c_write.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
                let _ = c_write.shutdown(Shutdown::Both);
                let _ = u_read.shutdown(Shutdown::Both);
            });
        }
    });
    port
}

#[test]
fn an_enqueue_whose_commit_reply_was_lost_is_not_inserted_twice() {
    let Some(db) = pg::test_database() else {
        return;
    };
    let url = db.url().to_owned();
    // postgres://user@host:port/db → host:port
    let authority = url.split("://").nth(1).unwrap().split('/').next().unwrap();
    let server = authority.rsplit('@').next().unwrap().to_owned();
    let armed = Arc::new(AtomicBool::new(false));
    let cut = Arc::new(AtomicUsize::new(0));
    let port = proxy(server.clone(), armed.clone(), cut.clone());
    let via_proxy = url.replacen(&server, &format!("127.0.0.1:{port}"), 1);
    // In clear: the proxy reads the server's replies.
    let queue = Queue::builder(&via_proxy)
        .postgres(|o| o.listen(false).ssl_mode(SslMode::Disable))
        .open()
        .expect("open through the proxy");

    armed.store(true, Ordering::SeqCst);
    let id = queue
        .enqueue(NewJob::new("once").payload(serde_json::json!({ "n": 1 })))
        .expect("enqueue, retried through the lost reply");
    assert_eq!(
        cut.load(Ordering::SeqCst),
        1,
        "the proxy cut no COMMIT reply"
    );

    let mut client = db.connect();
    let ids: Vec<i64> = client
        .query(
            "SELECT id FROM tickler_jobs WHERE kind = 'once' ORDER BY id",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(ids, vec![id.0], "one enqueue, one job");
}
