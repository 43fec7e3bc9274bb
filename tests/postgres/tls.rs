//! PostgreSQL's TLS, with libpq's meanings of `sslmode`: what each mode
//! checks, seen from the server (`pg_stat_ssl` of tickler's own
//! connections, the listener's too), and what a client sends to a server
//! that offers no TLS. `.ci/postgres` turns TLS on with a certificate
//! authority it makes (`TICKLER_TEST_PG_TLS_DIR`): the server's
//! certificate names `localhost` alone, and the role `tickler_cert` logs
//! in by a client certificate over TLS only. Engine-specific: TLS is how
//! a client reaches this server, not a guarantee of the queue.
#![cfg(feature = "postgres")]

use crate::support::pg;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tickler::{Error, NewJob, Queue, RootCerts, SslMode};

/// The folder of the test certificates, or `None` (with a note) without
/// one outside CI.
fn tls_dir() -> Option<PathBuf> {
    match std::env::var_os("TICKLER_TEST_PG_TLS_DIR") {
        Some(dir) if !dir.is_empty() => Some(PathBuf::from(dir)),
        _ => {
            assert!(
                !pg::in_ci(),
                "TICKLER_TEST_PG_TLS_DIR is not set: .ci/postgres makes the certificates"
            );
            eprintln!("note: skipped: TICKLER_TEST_PG_TLS_DIR is not set (run under .ci/postgres)");
            None
        }
    }
}

/// `url` with its host replaced by `host`, logging in as `user`, and
/// `query` (`k=v&…`, percent-encoded) appended.
fn with(url: &str, user: &str, host: &str, query: &str) -> String {
    let (scheme, rest) = url.split_once("://").expect("a URL");
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    let (_, port_and_path) = rest.split_once(':').expect("a port");
    format!("{scheme}://{user}@{host}:{port_and_path}?{query}")
}

/// A path for a URL's query.
fn q(path: &std::path::Path) -> String {
    let text = path.to_str().expect("a UTF-8 path");
    text.replace('%', "%25")
        .replace(' ', "%20")
        .replace('&', "%26")
}

/// Whether each of the connections of `application_name` to `db` uses TLS.
fn tls_of(db: &pg::TestDb, application_name: &str) -> Vec<bool> {
    db.connect()
        .query(
            "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)
             WHERE a.datname = current_database() AND a.application_name = $1",
            &[&application_name],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// Opens `url` with a short retry window.
fn open(url: &str) -> tickler::Result<Queue> {
    Queue::builder(url)
        .busy_timeout(Duration::from_secs(2))
        .busy_retry(Duration::from_secs(3))
        .open()
}

/// The open's error text, and how long it took to fail.
fn refused(url: &str) -> (String, Duration) {
    let start = Instant::now();
    match open(url) {
        Ok(_) => panic!("{url} opened"),
        Err(e) => (e.to_string(), start.elapsed()),
    }
}

#[test]
fn verify_full_to_the_named_host_uses_tls_on_every_connection_the_listeners_too() {
    let (Some(db), Some(dir)) = (pg::test_database(), tls_dir()) else {
        return;
    };
    let app = "tickler_tls_full";
    let url = with(
        db.url(),
        "postgres",
        "localhost",
        &format!(
            "application_name={app}&sslmode=verify-full&sslrootcert={}",
            q(&dir.join("ca.crt"))
        ),
    );
    let queue = open(&url).expect("verify-full to localhost");
    let _watcher = queue
        .manual()
        .watcher()
        .expect("a watcher starts the listener");
    let lease = pg::enqueue_and_claim(&queue, NewJob::new("work"));
    queue.manual().complete(&lease).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let listening = loop {
        let n: i64 = db
            .connect()
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND application_name = $1
                   AND query LIKE 'LISTEN%'",
                &[&app],
            )
            .unwrap()
            .get(0);
        if n > 0 || Instant::now() > deadline {
            break n;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(listening, 1, "the listener did not connect");
    let tls = tls_of(&db, app);
    assert!(tls.len() >= 2, "{tls:?}");
    assert!(tls.iter().all(|&on| on), "a connection in clear: {tls:?}");
}

#[test]
fn verify_full_refuses_a_wrong_host_name_and_an_unknown_authority_at_once() {
    let (Some(db), Some(dir)) = (pg::test_database(), tls_dir()) else {
        return;
    };
    let ca = q(&dir.join("ca.crt"));
    // The certificate names localhost, not 127.0.0.1.
    let (text, took) = refused(&with(
        db.url(),
        "postgres",
        "127.0.0.1",
        &format!("sslmode=verify-full&sslrootcert={ca}"),
    ));
    assert!(
        text.contains("NotValidForName") || text.contains("not valid for name"),
        "{text}"
    );
    assert!(text.contains("sslmode=verify-full"), "{text}");
    assert!(text.contains("subjectAltName"), "no hint: {text}");
    assert!(
        took < Duration::from_secs(2),
        "retried for {took:?}: {text}"
    );
    let (text, took) = refused(&with(
        db.url(),
        "postgres",
        "localhost",
        &format!(
            "sslmode=verify-full&sslrootcert={}",
            q(&dir.join("other-ca.crt"))
        ),
    ));
    assert!(
        text.contains("UnknownIssuer") || text.contains("unknown issuer"),
        "{text}"
    );
    assert!(
        took < Duration::from_secs(2),
        "retried for {took:?}: {text}"
    );
    // What the server's certificate is checked against is named.
    assert!(text.contains("other-ca.crt"), "{text}");
}

#[test]
fn verify_ca_checks_the_authority_and_not_the_host_name() {
    let (Some(db), Some(dir)) = (pg::test_database(), tls_dir()) else {
        return;
    };
    let app = "tickler_tls_ca";
    let url = with(
        db.url(),
        "postgres",
        "127.0.0.1",
        &format!(
            "application_name={app}&sslmode=verify-ca&sslrootcert={}",
            q(&dir.join("ca.crt"))
        ),
    );
    let queue = open(&url).expect("verify-ca to 127.0.0.1");
    queue.enqueue(NewJob::new("work")).unwrap();
    let tls = tls_of(&db, app);
    assert!(!tls.is_empty() && tls.iter().all(|&on| on), "{tls:?}");
    // As libpq: with root certificates, require checks the authority too.
    let (text, _) = refused(&with(
        db.url(),
        "postgres",
        "127.0.0.1",
        &format!(
            "sslmode=require&sslrootcert={}",
            q(&dir.join("other-ca.crt"))
        ),
    ));
    assert!(
        text.contains("UnknownIssuer") || text.contains("unknown issuer"),
        "{text}"
    );
    let (text, _) = refused(&with(
        db.url(),
        "postgres",
        "127.0.0.1",
        &format!(
            "sslmode=verify-ca&sslrootcert={}",
            q(&dir.join("other-ca.crt"))
        ),
    ));
    assert!(
        text.contains("UnknownIssuer") || text.contains("unknown issuer"),
        "{text}"
    );
}

#[test]
fn prefer_is_the_default_and_uses_tls_require_too_and_disable_does_not() {
    let (Some(db), Some(_)) = (pg::test_database(), tls_dir()) else {
        return;
    };
    for (query, app, expect) in [
        ("", "tickler_tls_default", true),
        ("sslmode=prefer", "tickler_tls_prefer", true),
        ("sslmode=require", "tickler_tls_require", true),
        ("sslmode=disable", "tickler_tls_disable", false),
    ] {
        let url = with(
            db.url(),
            "postgres",
            "127.0.0.1",
            &format!("application_name={app}&{query}"),
        );
        let queue = open(&url).unwrap_or_else(|e| panic!("{query:?}: {e}"));
        queue.enqueue(NewJob::new("work")).unwrap();
        let tls = tls_of(&db, app);
        assert!(!tls.is_empty(), "{query:?}: no connection");
        assert!(tls.iter().all(|&on| on == expect), "{query:?}: {tls:?}");
    }
}

#[test]
fn the_builders_settings_win_over_the_urls() {
    let (Some(db), Some(dir)) = (pg::test_database(), tls_dir()) else {
        return;
    };
    let app = "tickler_tls_builder";
    let url = with(
        db.url(),
        "postgres",
        "localhost",
        &format!("application_name={app}&sslmode=disable"),
    );
    let queue = Queue::builder(&url)
        .postgres(|o| {
            o.ssl_mode(SslMode::VerifyFull)
                .ssl_root_certs(RootCerts::File(dir.join("ca.crt")))
        })
        .open()
        .expect("verify-full from the builder");
    queue.enqueue(NewJob::new("work")).unwrap();
    let tls = tls_of(&db, app);
    assert!(!tls.is_empty() && tls.iter().all(|&on| on), "{tls:?}");
    let wrong = Queue::builder(&url)
        .postgres(|o| {
            o.ssl_mode(SslMode::VerifyFull)
                .ssl_root_certs(RootCerts::File(dir.join("other-ca.crt")))
        })
        .busy_retry(Duration::from_secs(3))
        .open();
    match wrong {
        Err(Error::Config(text)) => assert!(text.contains("other-ca.crt"), "{text}"),
        other => panic!("the builder's roots were not used: {:?}", other.map(|_| ())),
    }
}

#[test]
fn a_client_certificate_logs_in_where_the_server_asks_for_one() {
    let (Some(db), Some(dir)) = (pg::test_database(), tls_dir()) else {
        return;
    };
    let mut admin = db.connect();
    pg::ensure_role(&mut admin, "tickler_cert", "LOGIN");
    admin
        .batch_execute("GRANT ALL ON SCHEMA public TO tickler_cert")
        .unwrap();
    let ca = q(&dir.join("ca.crt"));
    let base = format!("sslmode=verify-full&sslrootcert={ca}");
    let queue = open(&with(
        db.url(),
        "tickler_cert",
        "localhost",
        &format!(
            "{base}&sslcert={}&sslkey={}",
            q(&dir.join("client.crt")),
            q(&dir.join("client.key"))
        ),
    ))
    .expect("logged in by the client certificate");
    let id = queue.enqueue(NewJob::new("work")).unwrap();
    assert!(queue.get(id).is_ok());
    // Without it the server refuses the login: at once, with its reason.
    let start = Instant::now();
    match open(&with(db.url(), "tickler_cert", "localhost", &base)) {
        Err(Error::Postgres(e)) => {
            assert_eq!(e.code().map(|c| c.code()), Some("28000"), "{e:?}");
            let text = Error::Postgres(e).to_string();
            assert!(text.contains("certificate"), "{text}");
        }
        other => panic!("{:?}", other.map(|_| ())),
    }
    assert!(start.elapsed() < Duration::from_secs(2));
    // A certificate of another authority: refused at once too (over TLS
    // 1.3 the server's alert comes after the handshake, on the first read).
    let start = Instant::now();
    let text = match open(&with(
        db.url(),
        "tickler_cert",
        "localhost",
        &format!(
            "{base}&sslcert={}&sslkey={}",
            q(&dir.join("stranger.crt")),
            q(&dir.join("stranger.key"))
        ),
    )) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("a certificate of another authority logged in"),
    };
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "retried for {:?}: {text}",
        start.elapsed()
    );
    assert!(
        text.to_lowercase().contains("unknown") || text.contains("Alert"),
        "{text}"
    );
}

#[test]
fn bad_certificate_files_are_refused_naming_the_file() {
    let Some(db) = pg::test_database() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let not_pem = dir.path().join("ca.crt");
    std::fs::write(&not_pem, "not a certificate\n").unwrap();
    let url = with(
        db.url(),
        "postgres",
        "localhost",
        &format!("sslmode=verify-full&sslrootcert={}", q(&not_pem)),
    );
    match open(&url) {
        Err(Error::Config(text)) => {
            assert!(
                text.contains("sslrootcert") && text.contains("ca.crt"),
                "{text}"
            )
        }
        other => panic!("{:?}", other.map(|_| ())),
    }
    let url = with(
        db.url(),
        "postgres",
        "localhost",
        &format!(
            "sslmode=require&sslcert={}&sslkey={}",
            q(&dir.path().join("client.crt")),
            q(&dir.path().join("missing.key"))
        ),
    );
    match open(&url) {
        Err(Error::Config(text)) => assert!(text.contains("client.crt"), "{text}"),
        other => panic!("{:?}", other.map(|_| ())),
    }
}

/// What a fake server that offers no TLS received from each client after
/// its "no" to the TLS request. It asks for the password in clear
/// (`AuthenticationCleartextPassword`) when a startup message comes.
struct NoTlsServer {
    port: u16,
    received: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl NoTlsServer {
    fn start() -> NoTlsServer {
        Self::answering(b'N')
    }

    /// A server that answers the TLS request with `answer`: `N` (no TLS:
    /// then as above) or `S` (yes, then it closes the connection, as a
    /// server restarting in the middle of the handshake).
    fn answering(answer: u8) -> NoTlsServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let received = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&received);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                let log = Arc::clone(&log);
                std::thread::spawn(move || {
                    stream
                        .set_read_timeout(Some(Duration::from_secs(2)))
                        .unwrap();
                    let mut request = [0u8; 8];
                    if stream.read_exact(&mut request).is_err() {
                        return;
                    }
                    // SSLRequest: length 8, code 80877103.
                    assert_eq!(request, [0, 0, 0, 8, 4, 210, 22, 47], "not an SSLRequest");
                    stream.write_all(&[answer]).unwrap();
                    if answer == b'S' {
                        log.lock().unwrap().push(Vec::new());
                        return;
                    }
                    let mut after = Vec::new();
                    let mut buf = [0u8; 4096];
                    let mut asked = false;
                    while let Ok(n) = stream.read(&mut buf) {
                        if n == 0 {
                            break;
                        }
                        after.extend_from_slice(&buf[..n]);
                        if !asked {
                            asked = true;
                            let _ = stream.write_all(&[b'R', 0, 0, 0, 8, 0, 0, 0, 3]);
                        }
                    }
                    log.lock().unwrap().push(after);
                });
            }
        });
        NoTlsServer { port, received }
    }

    fn url(&self, query: &str) -> String {
        format!(
            "postgres://tickler:the-password@127.0.0.1:{}/db?{query}",
            self.port
        )
    }

    /// Waits until `n` clients have gone, and returns what they sent.
    fn sent(&self, n: usize) -> Vec<Vec<u8>> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let got = self.received.lock().unwrap().clone();
            if got.len() >= n || Instant::now() > deadline {
                return got;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// `require` sends nothing, least of all the password, to a server that
/// offers no TLS; `prefer` goes on in clear as libpq does (which is why
/// the docs say to require TLS), and the server sees the password: the
/// fake server would see a leak.
#[test]
fn require_sends_nothing_in_clear_to_a_server_without_tls() {
    let server = NoTlsServer::start();
    let start = Instant::now();
    let text = match open(&server.url("sslmode=require&connect_timeout=5")) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("require connected to a server without TLS"),
    };
    assert!(text.contains("TLS"), "{text}");
    assert!(start.elapsed() < Duration::from_secs(2), "retried: {text}");
    let sent = server.sent(1);
    assert!(!sent.is_empty(), "the client never came");
    for after in &sent {
        assert!(
            after.is_empty(),
            "require sent {} bytes in clear",
            after.len()
        );
    }

    let server = NoTlsServer::start();
    let _ = Queue::builder(server.url("sslmode=prefer&connect_timeout=5"))
        .busy_timeout(Duration::from_millis(100))
        .busy_retry(Duration::from_millis(100))
        .open();
    let sent = server.sent(1);
    assert!(
        sent.iter().any(|after| contains(after, b"the-password")),
        "prefer did not go on in clear: {sent:?}"
    );
}

/// A connection cut in the middle of the TLS handshake (a server
/// restarting, a pooler resetting) is retried like any lost connection,
/// not taken for a refused certificate.
#[test]
fn a_connection_cut_during_the_handshake_is_retried() {
    let server = NoTlsServer::answering(b'S');
    let start = Instant::now();
    let result = Queue::builder(server.url("sslmode=require&connect_timeout=5"))
        .busy_timeout(Duration::from_millis(500))
        .busy_retry(Duration::from_millis(1_000))
        .open();
    let text = match result {
        Err(e) => e.to_string(),
        Ok(_) => panic!("opened a server that cut every handshake"),
    };
    let tries = server.sent(3).len();
    assert!(
        tries >= 3,
        "tried {tries} time(s) in {:?}: {text}",
        start.elapsed()
    );
    let said = text.to_lowercase();
    assert!(
        said.contains("reset") || said.contains("closed") || said.contains("eof"),
        "{text}"
    );
}
