//! TLS to MySQL/MariaDB (`ssl-mode` and `ssl-ca` in the URL, feature
//! `mysql-tls`). MySQL's alone: each engine's client makes its own TLS
//! connections, and what is checked here is this client's setup. The
//! server of `.ci/mariadb` has a certificate issued for `localhost` only
//! by a test authority (`TICKLER_TEST_MYSQL_CA`); each test makes a user
//! that the server refuses over plain TCP (`REQUIRE SSL`), so a queue
//! that works with it works over TLS on every connection it opens (its
//! pool's, its watcher's, its clock's).
#![cfg(feature = "mysql")]

use tickler::{Error, Queue};

/// A URL the client never connects to: what is checked is refused first.
const NOWHERE: &str = "mysql://u@127.0.0.1:1/db";

fn open_err(url: &str) -> Error {
    match Queue::open(url) {
        Ok(_) => panic!("{url} opened"),
        Err(e) => e,
    }
}

#[test]
fn tls_settings_that_protect_nothing_or_are_misspelt_are_refused_at_open() {
    let e = open_err(&format!("{NOWHERE}?ssl-mode=PREFERRED"));
    assert!(
        matches!(&e, Error::Config(m) if m.contains("PREFERRED") && m.contains("plain TCP")),
        "{e}"
    );
    let e = open_err(&format!("{NOWHERE}?ssl-mode=VERIFY_FULL"));
    assert!(
        matches!(&e, Error::Config(m) if m.contains("VERIFY_FULL") && m.contains("VERIFY_IDENTITY")),
        "{e}"
    );
    let e = open_err(&format!("{NOWHERE}?ssl-mode=DISABLED&ssl-ca=ca.pem"));
    assert!(
        matches!(&e, Error::Config(m) if m.contains("DISABLED")),
        "{e}"
    );
}

#[cfg(not(feature = "mysql-tls"))]
#[test]
fn without_the_tls_feature_a_tls_url_says_which_feature_it_needs() {
    for mode in ["REQUIRED", "VERIFY_CA", "VERIFY_IDENTITY"] {
        let e = open_err(&format!("{NOWHERE}?ssl-mode={mode}"));
        assert!(
            matches!(&e, Error::Config(m) if m.contains(mode) && m.contains("`mysql-tls`")),
            "{e}"
        );
    }
}

#[cfg(feature = "mysql-tls")]
mod with_tls {
    use super::*;
    use crate::support::my;
    use mysql::prelude::Queryable;
    use std::time::Duration;
    use tickler::{JobContext, JobError, JobState, NewJob, WorkerPool};

    #[test]
    fn a_certificate_authority_file_that_cannot_be_read_is_named() {
        let e = open_err(&format!(
            "{NOWHERE}?ssl-mode=VERIFY_CA&ssl-ca=no-such-folder/ca.pem"
        ));
        assert!(
            matches!(&e, Error::Config(m) if m.contains("no-such-folder/ca.pem")),
            "{e}"
        );
    }

    /// The test authority, or `None` (failing under CI) when the server
    /// has no TLS.
    fn authority() -> Option<String> {
        match std::env::var("TICKLER_TEST_MYSQL_CA") {
            Ok(path) if !path.is_empty() => Some(path),
            _ => {
                assert!(
                    !my::in_ci(),
                    "a TLS test found no test authority: .ci/mariadb makes one \
                     (TICKLER_TEST_MYSQL_CA is not set; is openssl installed?)"
                );
                eprintln!("note: a TLS test skipped: TICKLER_TEST_MYSQL_CA is not set");
                None
            }
        }
    }

    /// A database and a user of its own that may connect over TLS only.
    struct TlsUser {
        db: my::TestDb,
        user: String,
        ca: String,
    }

    impl TlsUser {
        fn new() -> Option<TlsUser> {
            let ca = authority()?;
            let db = my::test_database()?;
            let user = format!("tls_{:012x}", fastrand::u64(..1 << 48));
            let name: String = db
                .connect()
                .query_first("SELECT DATABASE()")
                .unwrap()
                .unwrap();
            let mut admin = db.connect();
            admin
                .query_drop(format!(
                    "CREATE USER '{user}'@'%' IDENTIFIED BY 'secret' REQUIRE SSL"
                ))
                .unwrap();
            admin
                .query_drop(format!("GRANT ALL ON `{name}`.* TO '{user}'@'%'"))
                .unwrap();
            Some(TlsUser { db, user, ca })
        }

        /// The database's URL as this user, on `host`, with `params`.
        fn url(&self, host: &str, params: &str) -> String {
            let url = self.db.url();
            let (_, rest) = url.split_once('@').expect("a URL with a user");
            let (_, port_and_db) = rest.split_once(':').expect("a URL with a port");
            let params = params.replace("{ca}", &self.ca);
            format!("mysql://{}:secret@{host}:{port_and_db}?{params}", self.user)
        }
    }

    impl Drop for TlsUser {
        fn drop(&mut self) {
            let _ = self
                .db
                .connect()
                .query_drop(format!("DROP USER IF EXISTS '{}'@'%'", self.user));
        }
    }

    /// Opens `url`, runs one job through a pool and checks it succeeded.
    fn runs_a_job(url: &str) {
        let queue = Queue::open(url).unwrap_or_else(|e| panic!("{url}: {e}"));
        let id = queue.enqueue(NewJob::new("tls")).unwrap();
        let mut pool = WorkerPool::builder(&queue)
            .threads(1)
            .handler("tls", |_: &JobContext| -> Result<(), JobError> { Ok(()) })
            .start()
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while queue.get(id).unwrap().state != JobState::Succeeded {
            assert!(std::time::Instant::now() < deadline, "the job did not run");
            std::thread::sleep(Duration::from_millis(20));
        }
        pool.shutdown(Duration::from_secs(5));
    }

    #[test]
    fn a_queue_works_over_tls_that_checks_the_certificate_and_its_name() {
        let Some(user) = TlsUser::new() else { return };
        runs_a_job(&user.url("localhost", "ssl-mode=VERIFY_IDENTITY&ssl-ca={ca}"));
        // ssl-ca alone means VERIFY_IDENTITY.
        runs_a_job(&user.url("localhost", "ssl-ca={ca}"));
    }

    #[test]
    fn a_user_that_requires_tls_is_refused_over_plain_tcp_with_the_servers_reason() {
        let Some(user) = TlsUser::new() else { return };
        let e = open_err(&user.url("localhost", "ssl-mode=DISABLED"));
        // The server's own refusal (1045, access denied), at once: not the
        // pool's timeout after retrying what no retry can cure.
        match &e {
            Error::Mysql(mysql::Error::MySqlError(server)) => {
                assert_eq!(server.code, 1045, "{e}");
                assert!(server.message.contains(&user.user), "{e}");
            }
            other => panic!("not the server's refusal: {other:?}"),
        }
    }

    #[test]
    fn verify_identity_refuses_a_certificate_issued_for_another_name() {
        let Some(user) = TlsUser::new() else { return };
        // The certificate names `localhost`; 127.0.0.1 is another name.
        let e = open_err(&user.url("127.0.0.1", "ssl-mode=VERIFY_IDENTITY&ssl-ca={ca}"));
        assert!(
            matches!(&e, Error::Config(m)
                if m.contains("over TLS (VERIFY_IDENTITY)") && m.contains("not valid for name")),
            "{e}"
        );
        // VERIFY_CA does not check the name.
        runs_a_job(&user.url("127.0.0.1", "ssl-mode=VERIFY_CA&ssl-ca={ca}"));
    }

    #[test]
    fn verify_ca_refuses_an_authority_it_was_not_told_to_trust() {
        let Some(user) = TlsUser::new() else { return };
        // Without ssl-ca only the built-in roots are trusted.
        let e = open_err(&user.url("localhost", "ssl-mode=VERIFY_CA"));
        assert!(
            matches!(&e, Error::Config(m) if m.contains("over TLS (VERIFY_CA)") && m.contains("UnknownIssuer")),
            "{e}"
        );
        // REQUIRED encrypts without checking: the server still sees TLS.
        runs_a_job(&user.url("localhost", "ssl-mode=REQUIRED"));
    }
}
