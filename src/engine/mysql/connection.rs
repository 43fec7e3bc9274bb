//! MySQL's connections and transactions: the r2d2 pool of sessions set up
//! the same way (UTC, strict SQL, utf8mb4, READ COMMITTED, rows matched
//! counted), [`Tx`] (a transaction, autocommit, or the application's own
//! transaction, with savepoints for statements that may fail alone), the
//! retry of a whole transaction through deadlocks, lock waits, lost
//! connections and restarts; and the engine's [`Capabilities`].

use super::Store;
use crate::clock::Clock;
use crate::engine::types::{AppTxKind, Durability, Retries, Returned, ValidJob};
use crate::engine::{Capabilities, Watch};
use crate::error::{mysql_unanswered, Error, Result};
use crate::job::JobId;
use crate::lease::Lease;
use mysql::consts::CapabilityFlags;
use mysql::prelude::Queryable;
use mysql::{Params, Row, Value};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// What every session runs first. InnoDB's default REPEATABLE READ takes
/// gap and next-key locks on the rows a locking read passes, which makes
/// concurrent claims and enqueues wait for each other; strict mode turns
/// a value the column cannot hold into an error instead of a warning and a
/// changed value; UTC makes `NOW()` the Unix time the schema stores.
///
/// `autocommit` and `completion_type` are set because a server's
/// configuration may change them (`autocommit = 0` in a my.cnf), and a
/// single statement's write is acknowledged as committed;
/// `sql_select_limit` because it would cut a claim's or a list's rows.
const SESSION_SETUP: [&str; 2] = [
    "SET NAMES utf8mb4 COLLATE utf8mb4_bin, time_zone = '+00:00', \
     SESSION sql_mode = 'STRICT_ALL_TABLES,NO_ENGINE_SUBSTITUTION,ERROR_FOR_DIVISION_BY_ZERO', \
     SESSION autocommit = 1, SESSION completion_type = 0, SESSION sql_select_limit = DEFAULT",
    "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED, READ WRITE",
];

/// How a connection uses TLS, as MySQL's own clients name it (their
/// `--ssl-mode`): the URL's `ssl-mode` parameter, with `ssl-ca` for the
/// file of the certificate authorities to trust besides the built-in
/// (Mozilla's) roots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SslMode {
    /// Plain TCP (the default when the URL names no TLS parameter).
    Disabled,
    /// Encrypted, without checking the server's certificate: protects
    /// against listening, not against a server that pretends.
    Required,
    /// Encrypted, and the certificate must be signed by a trusted
    /// authority; its name is not checked.
    VerifyCa,
    /// Encrypted, the certificate trusted and issued for the host name of
    /// the URL (the default when the URL gives `ssl-ca` alone).
    VerifyIdentity,
}

impl SslMode {
    fn parse(value: &str) -> Result<SslMode> {
        match value.to_ascii_uppercase().replace('-', "_").as_str() {
            "DISABLED" => Ok(SslMode::Disabled),
            "REQUIRED" => Ok(SslMode::Required),
            "VERIFY_CA" => Ok(SslMode::VerifyCa),
            "VERIFY_IDENTITY" => Ok(SslMode::VerifyIdentity),
            "PREFERRED" => Err(Error::Config(
                "ssl-mode=PREFERRED is not supported: it falls back to plain TCP when the \
                 server offers no TLS, so it protects nothing; use REQUIRED, VERIFY_CA or \
                 VERIFY_IDENTITY, or DISABLED"
                    .into(),
            )),
            other => Err(Error::Config(format!(
                "ssl-mode={other} is not a TLS mode: use DISABLED, REQUIRED, VERIFY_CA or \
                 VERIFY_IDENTITY"
            ))),
        }
    }

    fn name(self) -> &'static str {
        match self {
            SslMode::Disabled => "DISABLED",
            SslMode::Required => "REQUIRED",
            SslMode::VerifyCa => "VERIFY_CA",
            SslMode::VerifyIdentity => "VERIFY_IDENTITY",
        }
    }
}

/// The URL for the `mysql` client, without tickler's own parameters
/// (`ssl-mode`, `ssl-ca`), which the client would refuse as unknown.
fn split_tls_params(url: &str) -> Result<(String, Option<SslMode>, Option<std::path::PathBuf>)> {
    let url = match url.strip_prefix("mariadb://") {
        Some(rest) => format!("mysql://{rest}"),
        None => url.to_owned(),
    };
    let mut parsed =
        url::Url::parse(&url).map_err(|e| Error::Config(format!("not a MySQL URL ({e})")))?;
    let mut mode = None;
    let mut ca = None;
    let mut rest: Vec<(String, String)> = Vec::new();
    for (key, value) in parsed.query_pairs() {
        match key.as_ref() {
            "ssl-mode" | "ssl_mode" | "sslmode" => mode = Some(SslMode::parse(&value)?),
            "ssl-ca" | "ssl_ca" => ca = Some(std::path::PathBuf::from(value.as_ref())),
            _ => rest.push((key.into_owned(), value.into_owned())),
        }
    }
    if rest.is_empty() {
        parsed.set_query(None);
    } else {
        parsed.query_pairs_mut().clear().extend_pairs(rest);
    }
    Ok((parsed.into(), mode, ca))
}

/// The client's TLS options for `mode` and `ca`, on top of those the URL
/// gave the client itself (a client certificate, say).
fn tls_opts(
    from_url: Option<mysql::SslOpts>,
    mode: Option<SslMode>,
    ca: Option<std::path::PathBuf>,
) -> Result<Option<mysql::SslOpts>> {
    let mode = match (mode, &ca, &from_url) {
        (Some(mode), _, _) => mode,
        (None, Some(_), _) => SslMode::VerifyIdentity,
        (None, None, Some(_)) => return Ok(from_url),
        (None, None, None) => SslMode::Disabled,
    };
    if mode == SslMode::Disabled {
        if ca.is_some() || from_url.is_some() {
            return Err(Error::Config(
                "ssl-mode=DISABLED with TLS parameters (ssl-ca, a client certificate): \
                 leave out one or the other"
                    .into(),
            ));
        }
        return Ok(None);
    }
    if !cfg!(feature = "mysql-tls") {
        return Err(Error::Config(format!(
            "ssl-mode={} needs TLS, and this build of tickler has none: enable its \
             `mysql-tls` feature (TLS through rustls)",
            mode.name()
        )));
    }
    if let Some(path) = &ca {
        if let Err(e) = std::fs::metadata(path) {
            return Err(Error::Config(format!(
                "ssl-ca={}: cannot read the file ({e})",
                path.display()
            )));
        }
    }
    let base = from_url.unwrap_or_default();
    Ok(Some(
        base.with_root_cert_path(ca.map(std::borrow::Cow::Owned))
            .with_danger_skip_domain_validation(mode != SslMode::VerifyIdentity)
            .with_danger_accept_invalid_certs(mode == SslMode::Required),
    ))
}

/// Prepared statements each pooled connection keeps, unless the URL's
/// `stmt_cache_size` says otherwise. Every connection's statements count
/// against the server's `max_prepared_stmt_count` (16,382 by default,
/// shared by every client), and batches and `IN` lists of each size are
/// statements of their own: 64 keeps tickler's fixed statements cached
/// and lets 255 connections run before the server's limit.
const STMT_CACHE_SIZE: usize = 64;

/// Whether the URL's query string sets `name`.
fn names_setting(url: &str, name: &str) -> bool {
    url.split_once('?').is_some_and(|(_, query)| {
        query
            .split('&')
            .any(|pair| pair.split('=').next() == Some(name))
    })
}

/// The shortest wait for a server's answer, so that a short retry window
/// still lets a large batch or claim run.
const MIN_ANSWER_WAIT: Duration = Duration::from_secs(10);

/// How long tickler's connections wait for the server to answer one
/// statement (or to take one) before giving the connection up as lost:
/// the retry window, which is as long as a caller agreed to wait, and at
/// least [`MIN_ANSWER_WAIT`], and longer than a lock is waited for
/// (`lock_wait`), so that the server's own "lock wait timeout" arrives
/// first and is retried, rather than the connection given up. Without it
/// a server that stops answering while its host still acknowledges (a
/// stopped or frozen process, an address moved away in a failover)
/// blocks a call until it answers again, or for the kernel's 15 minutes.
pub(super) fn answer_wait(window: Duration, lock_wait: Duration) -> Duration {
    window
        .max(lock_wait + Duration::from_secs(2))
        .max(MIN_ANSWER_WAIT)
}

/// The client options of a `mysql://` (or `mariadb://`) URL, with
/// tickler's session setup and defaults the URL does not set. A row lock,
/// or a table's metadata lock (held by DDL), is waited for at most
/// `busy_timeout` (at least 1 s, InnoDB's unit) rather than the server's
/// 50 s and one day: the wait is then retried as a whole transaction, as
/// a busy SQLite file is. Reads and writes on the socket give up after
/// [`answer_wait`] of `window` and that lock wait.
pub(super) fn opts(url: &str, busy_timeout: Duration, window: Duration) -> Result<mysql::Opts> {
    let (url, mode, ca) = split_tls_params(url)?;
    let parsed = mysql::Opts::from_url(&url)?;
    let ssl = tls_opts(parsed.get_ssl_opts().cloned(), mode, ca)?;
    let connect_timeout = parsed
        .get_tcp_connect_timeout()
        .unwrap_or(Duration::from_secs(10));
    let mut init: Vec<String> = SESSION_SETUP.iter().map(|s| (*s).to_owned()).collect();
    let lock_wait = busy_timeout.as_secs().max(1);
    init.push(format!(
        "SET SESSION innodb_lock_wait_timeout = {lock_wait}, lock_wait_timeout = {lock_wait}"
    ));
    init.extend(parsed.get_init());
    let stmt_cache_size = if names_setting(&url, "stmt_cache_size") {
        parsed.get_stmt_cache_size()
    } else {
        STMT_CACHE_SIZE
    };
    Ok(mysql::OptsBuilder::from_opts(parsed)
        .init(init)
        .prefer_socket(false)
        .ssl_opts(ssl)
        .tcp_connect_timeout(Some(connect_timeout))
        .read_timeout(Some(answer_wait(window, Duration::from_secs(lock_wait))))
        .write_timeout(Some(answer_wait(window, Duration::from_secs(lock_wait))))
        .stmt_cache_size(stmt_cache_size)
        .additional_capabilities(CapabilityFlags::CLIENT_FOUND_ROWS)
        .into())
}

/// `opts` with the server's statement time limit lifted for tickler's
/// sessions, on MariaDB (`max_statement_time`, in seconds) or MySQL
/// (`max_execution_time`, in ms, which names the variable differently). A
/// DBA's limit would end a statement that only waits for a row lock with
/// an error no retry is for; tickler bounds its lock waits with
/// `busy_timeout` and its answer waits with [`answer_wait`] instead. A
/// URL's own `init` runs after, so a limit it sets holds.
pub(super) fn lift_statement_limit(opts: mysql::Opts, mariadb: bool) -> mysql::Opts {
    let mut init = opts.get_init();
    init.insert(
        0,
        if mariadb {
            "SET SESSION max_statement_time = 0".into()
        } else {
            "SET SESSION max_execution_time = 0".into()
        },
    );
    mysql::OptsBuilder::from_opts(opts).init(init).into()
}

/// Opens one connection before the pool does, so that what no retry can
/// cure (a wrong password, a missing database, a certificate that is not
/// trusted, a server without TLS when TLS is asked for) is an error at
/// open that says so, instead of the pool's timeout. A server that does
/// not answer yet (restarting, say) is tried again until `window` ends.
/// The connection it opened tells which server it is (`true`: MariaDB).
pub(super) fn first_connection(
    opts: &mysql::Opts,
    describe: &str,
    window: Duration,
) -> Result<bool> {
    let deadline = Instant::now() + window;
    let mut pause = Duration::from_millis(50);
    loop {
        match mysql::Conn::new(opts.clone()).map_err(mysql_unanswered) {
            // VERSION(), not the handshake's version: MariaDB's handshake
            // says 5.5.5 before its own version for old clients.
            Ok(mut conn) => match conn.query_first::<String, _>("SELECT VERSION()") {
                Ok(version) => return Ok(version.is_some_and(|v| v.contains("MariaDB"))),
                // Cut right after it was made (a DBA killing sessions, a
                // proxy, a restart): the server answered, so try again.
                Err(e) if lost_connection(&e) && Instant::now() + pause < deadline => {
                    log::warn!("the first connection to {describe} was lost ({e}); retrying");
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
                Err(e) => return Err(Error::Mysql(e)),
            },
            // A wrong password or a missing database is final; a server
            // shutting down, full, or killing the session is not.
            Err(mysql::Error::MySqlError(server)) => {
                let e = Error::Mysql(mysql::Error::MySqlError(server));
                if !retryable(&e) || Instant::now() + pause >= deadline {
                    return Err(e);
                }
                log::warn!("cannot connect to {describe} yet ({e}); retrying");
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            Err(e) if not_answering(&e) && Instant::now() + pause < deadline => {
                log::warn!("cannot connect to {describe} yet ({e}); retrying");
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            Err(e) => {
                let tls = match opts.get_ssl_opts() {
                    None => String::new(),
                    Some(ssl) if ssl.accept_invalid_certs() => " over TLS (REQUIRED)".into(),
                    Some(ssl) if ssl.skip_domain_validation() => " over TLS (VERIFY_CA)".into(),
                    Some(_) => " over TLS (VERIFY_IDENTITY)".into(),
                };
                return Err(Error::Config(format!(
                    "cannot connect to {describe}{tls}: {e}"
                )));
            }
        }
    }
}

/// A connection of the pool, and whether it must be dropped rather than
/// reused.
pub(crate) struct Conn {
    pub(super) conn: mysql::Conn,
    broken: bool,
    returned: Returned,
    restore: Arc<str>,
}

impl Conn {
    /// Drops this connection at its return if `e` left it unusable.
    pub(super) fn mark_broken_by(&mut self, e: &Error) {
        if breaks_connection(e) {
            self.broken = true;
        }
    }

    /// Sets again, in one round trip, the session tickler set up (its
    /// settings, the URL's `init` statements and the database), after the
    /// application's statements ran on this connection: a `SET` or a
    /// `USE` of theirs would otherwise reach tickler's next statements
    /// here (a `USE` would send them to another database's queue). A
    /// connection whose session cannot be set again is dropped.
    pub(super) fn restore_session(&mut self) {
        if self.broken {
            return;
        }
        if let Err(e) = self.conn.query_drop(&*self.restore) {
            log::warn!("dropping a connection whose session could not be set again: {e}");
            self.broken = true;
        }
    }
}

/// Makes the pool's connections, and remembers why the last one could not
/// be made or checked.
pub(crate) struct Manager {
    opts: mysql::Opts,
    last_fault: Arc<Mutex<Option<Fault>>>,
    restore: Arc<str>,
    /// Set at each new connection: the server's clock is read again soon
    /// (it may be another server's, after a failover).
    pub(super) connected: Arc<std::sync::atomic::AtomicBool>,
}

/// Why the last connection could not be made or checked, and when.
pub(crate) struct Fault {
    at: Instant,
    message: String,
    unanswered: bool,
}

impl Manager {
    /// Remembers the fault of a connect or a check, and forgets it once
    /// one succeeds.
    fn note<T>(
        &self,
        result: std::result::Result<T, mysql::Error>,
    ) -> std::result::Result<T, mysql::Error> {
        let mut last = self
            .last_fault
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match result {
            Ok(value) => {
                *last = None;
                Ok(value)
            }
            Err(e) => {
                let unanswered = crate::error::mysql_waited_out(&e);
                let e = mysql_unanswered(e);
                *last = Some(Fault {
                    at: Instant::now(),
                    message: e.to_string(),
                    unanswered,
                });
                Err(e)
            }
        }
    }

    /// Whether a check of this pool's gave up waiting for the server within
    /// the last answer wait: r2d2 checks its idle connections one after
    /// another, each for a whole answer wait, so while the server is
    /// silent they fail at once instead (and are dropped).
    fn silent(&self) -> bool {
        let wait = self
            .opts
            .get_read_timeout()
            .copied()
            .unwrap_or(MIN_ANSWER_WAIT);
        self.last_fault
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .is_some_and(|f| f.unanswered && f.at.elapsed() < wait)
    }
}

impl r2d2::ManageConnection for Manager {
    type Connection = Conn;
    type Error = mysql::Error;

    fn connect(&self) -> std::result::Result<Conn, mysql::Error> {
        let conn = self.note(mysql::Conn::new(self.opts.clone()))?;
        self.connected
            .store(true, std::sync::atomic::Ordering::SeqCst);
        Ok(Conn {
            conn,
            broken: false,
            returned: Returned::now(),
            restore: Arc::clone(&self.restore),
        })
    }

    fn is_valid(&self, conn: &mut Conn) -> std::result::Result<(), mysql::Error> {
        if !conn.returned.needs_check() {
            return Ok(());
        }
        if self.silent() {
            return Err(mysql::Error::IoError(std::io::Error::new(
                std::io::ErrorKind::WouldBlock,
                "the server did not answer another connection's check a moment ago",
            )));
        }
        self.note(conn.conn.ping())
    }

    fn has_broken(&self, conn: &mut Conn) -> bool {
        conn.returned = Returned::now();
        conn.broken
    }
}

/// Positional parameters as the client takes them.
pub(crate) fn params(values: Vec<Value>) -> Params {
    if values.is_empty() {
        Params::Empty
    } else {
        Params::Positional(values)
    }
}

/// Parameters of a statement, each converted with `mysql::Value::from`.
macro_rules! args {
    ($($v:expr),* $(,)?) => { vec![$(::mysql::Value::from($v)),*] };
}
pub(crate) use args;

/// `n` placeholders, comma-separated, for an `IN (…)` list.
pub(crate) fn marks(n: usize) -> String {
    let mut s = String::with_capacity(n * 3);
    for i in 0..n {
        if i > 0 {
            s.push_str(", ");
        }
        s.push('?');
    }
    s
}

/// Statements in one transaction of tickler's (or in autocommit, or in the
/// application's transaction `Q`), prepared once per connection by the
/// client's statement cache.
pub(crate) struct Tx<'a, Q: Queryable = mysql::Conn> {
    q: &'a mut Q,
    in_transaction: bool,
}

impl<'a, Q: Queryable> Tx<'a, Q> {
    /// Statements inside a transaction already open on `q`.
    pub(crate) fn inside(q: &'a mut Q) -> Self {
        Tx {
            q,
            in_transaction: true,
        }
    }

    /// Runs one statement; returns the rows it matched.
    pub(crate) fn exec(&mut self, sql: &str, values: Vec<Value>) -> Result<u64> {
        let result = self.q.exec_iter(sql, params(values))?;
        let n = result.affected_rows();
        drop(result);
        Ok(n)
    }

    /// Runs one INSERT; returns the rows it matched and the first id it
    /// drew (or set with `LAST_INSERT_ID(expr)`).
    pub(crate) fn insert(&mut self, sql: &str, values: Vec<Value>) -> Result<(u64, Option<u64>)> {
        let result = self.q.exec_iter(sql, params(values))?;
        let out = (result.affected_rows(), result.last_insert_id());
        drop(result);
        Ok(out)
    }

    pub(crate) fn rows(&mut self, sql: &str, values: Vec<Value>) -> Result<Vec<Row>> {
        Ok(self.q.exec(sql, params(values))?)
    }

    pub(crate) fn first(&mut self, sql: &str, values: Vec<Value>) -> Result<Option<Row>> {
        Ok(self.q.exec_first(sql, params(values))?)
    }

    /// The `columns` of up to `limit` jobs matching `condition` (its
    /// markers take `values`; found through `index`), in `order`, each locked, skipping those
    /// another transaction holds. Found by a plain read and then locked by
    /// primary key: a locking range scan on InnoDB also locks the first row
    /// past its range until the transaction ends, which may be a pending job
    /// that a claim beside it would then skip. Also returns whether the plain
    /// read found `limit` jobs (there may be more, though some were skipped).
    pub(crate) fn lock_found(
        &mut self,
        columns: &str,
        index: &str,
        condition: &str,
        order: &str,
        values: Vec<Value>,
        limit: i64,
    ) -> Result<(Vec<Row>, bool)> {
        let mut found = values.clone();
        found.push(Value::from(limit));
        let ids: Vec<Value> = self
            .rows(
                &format!(
                    "SELECT id FROM tickler_jobs FORCE INDEX ({index})
                     WHERE {condition} {order} LIMIT ?"
                ),
                found,
            )?
            .iter()
            .map(|r| super::rows::get::<i64>(r, 0).map(Value::from))
            .collect::<Result<_>>()?;
        if ids.is_empty() {
            return Ok((Vec::new(), false));
        }
        let full = ids.len() as i64 >= limit;
        let sql = format!(
            "SELECT {columns} FROM tickler_jobs FORCE INDEX (PRIMARY)
             WHERE id IN ({}) AND {condition} {order} FOR UPDATE SKIP LOCKED",
            marks(ids.len())
        );
        let mut values = values;
        values.splice(0..0, ids);
        Ok((self.rows(&sql, values)?, full))
    }

    /// [`Tx::exec`] of a statement with named markers ([`named`]).
    pub(crate) fn exec_named(&mut self, sql: &str, values: &[(&str, Value)]) -> Result<u64> {
        let (sql, values) = named(sql, values);
        self.exec(&sql, values)
    }

    /// [`Tx::rows`] of a statement with named markers ([`named`]).
    pub(crate) fn rows_named(&mut self, sql: &str, values: &[(&str, Value)]) -> Result<Vec<Row>> {
        let (sql, values) = named(sql, values);
        self.rows(&sql, values)
    }

    /// Runs statements given as text (no parameters, not prepared).
    pub(crate) fn batch(&mut self, sql: &str) -> Result<()> {
        Ok(self.q.query_drop(sql)?)
    }

    /// Runs `f` inside a savepoint: an error of the database confined to
    /// it (a constraint, a trigger's SIGNAL, a value the server refuses)
    /// is `Ok(Err(_))` and undoes `f`'s statements alone. In autocommit
    /// every statement is alone already.
    pub(crate) fn isolated<T>(
        &mut self,
        f: impl FnOnce(&mut Tx<'_, Q>) -> Result<T>,
    ) -> Result<Result<T>> {
        if !self.in_transaction {
            return match f(self) {
                Ok(value) => Ok(Ok(value)),
                Err(e) if statement_level(&e) => Ok(Err(e)),
                Err(e) => Err(e),
            };
        }
        self.batch("SAVEPOINT tickler_item")?;
        match f(self) {
            Ok(value) => {
                self.batch("RELEASE SAVEPOINT tickler_item")?;
                Ok(Ok(value))
            }
            Err(e) if statement_level(&e) => {
                self.batch("ROLLBACK TO SAVEPOINT tickler_item")?;
                Ok(Err(e))
            }
            Err(e) => {
                // Undone too, for a caller whose transaction goes on (the
                // application's); a lost connection undoes it anyway.
                let _ = self.batch("ROLLBACK TO SAVEPOINT tickler_item");
                Err(e)
            }
        }
    }
}

pub(crate) use crate::engine::types::Attempt;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Begin,
    Body,
    Commit,
}

/// How MySQL retries: from 5 ms, with InnoDB's deadlocks among a busy
/// pool's transactions (expected now and then) logged at debug level only.
pub(super) const RETRIES: Retries = Retries {
    engine: "MySQL",
    first_pause: Duration::from_millis(5),
    retryable,
    quiet: is_deadlock,
};

impl Store {
    pub(crate) fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    /// The URL without its password, for messages.
    pub(crate) fn describe(&self) -> String {
        crate::engine::redacted_location(&self.url)
    }

    /// Runs `f` in a READ COMMITTED transaction on a pooled connection and
    /// commits. A deadlock, a lock wait timeout, a lost connection, a
    /// server restarting or read-only (a failover) retries the whole
    /// transaction on another connection with jittered backoff for up to
    /// the retry window; `f` may therefore run more than once and must not
    /// have effects outside the transaction.
    pub(crate) fn write<T>(&self, f: impl FnMut(&mut Tx<'_>, Attempt) -> Result<T>) -> Result<T> {
        self.run(false, f)
    }

    /// [`Store::write`] for a write of one statement, in autocommit: one
    /// round trip instead of three.
    pub(crate) fn write_autocommit<T>(
        &self,
        f: impl FnMut(&mut Tx<'_>, Attempt) -> Result<T>,
    ) -> Result<T> {
        self.run(true, f)
    }

    /// A read in its own transaction (one snapshot), retried as [`Store::write`].
    pub(crate) fn read<T>(&self, mut f: impl FnMut(&mut Tx<'_>) -> Result<T>) -> Result<T> {
        self.write(|tx, _| f(tx))
    }

    fn run<T>(
        &self,
        autocommit: bool,
        mut f: impl FnMut(&mut Tx<'_>, Attempt) -> Result<T>,
    ) -> Result<T> {
        let mut attempt = Attempt::default();
        RETRIES.run(self.retry_window, || {
            self.try_once(&mut f, attempt, autocommit)
                .map_err(|(e, phase)| {
                    if phase == Phase::Commit {
                        attempt.after_unknown_commit = true;
                    }
                    e
                })
        })
    }

    fn try_once<T>(
        &self,
        f: &mut impl FnMut(&mut Tx<'_>, Attempt) -> Result<T>,
        attempt: Attempt,
        autocommit: bool,
    ) -> std::result::Result<T, (Error, Phase)> {
        let mut pooled = self.pool.get().map_err(|e| (e, Phase::Begin))?;
        let conn = &mut *pooled;
        let result = (|| {
            if !autocommit {
                conn.conn
                    .query_drop("START TRANSACTION")
                    .map_err(|e| (Error::from(e), Phase::Begin))?;
            }
            let mut tx = Tx {
                q: &mut conn.conn,
                in_transaction: !autocommit,
            };
            let value = f(&mut tx, attempt).map_err(|e| {
                // A statement that lost its connection in autocommit may
                // have committed: unknown, as with a failed COMMIT. One the
                // server refused (a deadlock, a lock wait) was rolled back.
                let phase = if autocommit && server_code(&e).is_none() {
                    Phase::Commit
                } else {
                    Phase::Body
                };
                (e, phase)
            })?;
            if !autocommit {
                conn.conn
                    .query_drop("COMMIT")
                    .map_err(|e| (Error::from(e), Phase::Commit))?;
            }
            Ok(value)
        })();
        if let Err((e, phase)) = &result {
            // A transaction left open would hold its locks on a reused
            // connection: one that cannot roll back is dropped.
            // A connection the error broke (lost, or given up after the
            // answer wait) is not asked: the server rolls back what it left
            // open when it goes, and asking would wait a second time.
            let broken = breaks_connection(e);
            let rolled_back = broken
                || autocommit
                || *phase == Phase::Commit
                || conn.conn.query_drop("ROLLBACK").is_ok();
            if broken || !rolled_back {
                conn.broken = true;
            }
        }
        result
    }

    /// Runs `f` on a pooled connection outside any transaction (the open's
    /// checks and DDL, which MySQL commits by itself), retried as
    /// [`Store::write`] is; a connection the error leaves unusable (lost,
    /// or on a server turned read-only) is dropped, not pooled again.
    pub(super) fn on_connection<T>(
        &self,
        window: Duration,
        mut f: impl FnMut(&mut mysql::Conn) -> Result<T>,
    ) -> Result<T> {
        on_connection(&self.pool, window, &mut f)
    }

    /// A connection of the pool, for the application's transactions.
    /// Checked with a round trip however recently it was used (the
    /// application's statements are not retried), and taken again while
    /// the check fails, within the retry window.
    pub(crate) fn pooled(&self) -> Result<r2d2::PooledConnection<Manager>> {
        RETRIES.run(self.retry_window, || {
            let mut pooled = self.pool.get()?;
            if let Err(e) = pooled.conn.ping() {
                pooled.broken = true;
                return Err(Error::from(e));
            }
            Ok(pooled)
        })
    }
}

impl Capabilities for Store {
    fn name(&self) -> &'static str {
        "MySQL"
    }

    fn clock(&self) -> Arc<dyn Clock> {
        Arc::clone(&self.clock)
    }

    fn location(&self) -> String {
        self.describe()
    }

    fn durability(&self) -> Durability {
        self.durability
    }

    fn watcher(&self) -> Result<Box<dyn Watch>> {
        Ok(Box::new(Store::watcher(self)))
    }

    fn enqueue_in_app_tx(
        &self,
        tx: AppTxKind<'_, '_>,
        rows: &[ValidJob],
        now: i64,
    ) -> Result<Vec<JobId>> {
        match tx {
            AppTxKind::Mysql(tx) => self.enqueue_in(tx, rows, now),
            other => Err(crate::engine::wrong_app_tx(&other, "MySQL")),
        }
    }

    fn complete_with(
        &self,
        lease: &Lease,
        app_writes: &mut dyn FnMut(AppTxKind<'_, '_>) -> Result<()>,
    ) -> Result<()> {
        Store::complete_with(self, lease, &mut |tx| app_writes(AppTxKind::Mysql(tx)))
    }
}

/// The pool of a `Store`. A caller that timed out waiting for a
/// connection learns why no connection came: r2d2 hands the last
/// connection error to one waiter only, and none to a waiter whose
/// connections were all taken by statements the server did not answer.
#[derive(Clone)]
pub(super) struct Connections {
    pool: r2d2::Pool<Manager>,
    last_fault: Arc<Mutex<Option<Fault>>>,
    timeout: Duration,
    /// Set at each new connection ([`Manager`]'s).
    pub(super) connected: Arc<std::sync::atomic::AtomicBool>,
}

impl Connections {
    /// A pooled connection, within the pool's timeout.
    ///
    /// # Errors
    /// [`Error::Pool`], or [`Error::Mysql`] (an I/O error, retried as a
    /// lost connection) naming the last connection fault when r2d2's own
    /// error names none.
    pub(super) fn get(&self) -> Result<r2d2::PooledConnection<Manager>> {
        self.pool.get().map_err(|e| {
            let bare = e.to_string() == "timed out waiting for connection";
            let fault = self
                .last_fault
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .as_ref()
                .filter(|f| f.at.elapsed() < self.timeout * 2)
                .map(|f| (f.at, f.message.clone()));
            match fault {
                Some((at, fault)) if bare => {
                    Error::Mysql(mysql::Error::IoError(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!(
                            "no pooled connection came free within {:?} ({} open, {} idle); \
                             a connection failed {:.1} s ago: {fault}",
                            self.timeout,
                            self.pool.state().connections,
                            self.pool.state().idle_connections,
                            at.elapsed().as_secs_f64()
                        ),
                    )))
                }
                _ => Error::Pool(e),
            }
        })
    }
}

/// [`Store::on_connection`] on `pool`.
pub(super) fn on_connection<T>(
    pool: &Connections,
    window: Duration,
    f: &mut impl FnMut(&mut mysql::Conn) -> Result<T>,
) -> Result<T> {
    RETRIES.run(window, || {
        let mut pooled = pool.get()?;
        let result = f(&mut pooled.conn);
        if let Err(e) = &result {
            pooled.mark_broken_by(e);
        }
        result
    })
}

/// The pool of a `Store`: at least two connections (a claim may run while
/// an outcome commits), one kept open.
pub(super) fn connection_pool(opts: mysql::Opts, max_connections: u32) -> Connections {
    // As for PostgreSQL: r2d2's helper threads end with the pool.
    let helpers = scheduled_thread_pool::ScheduledThreadPool::builder()
        .num_threads(3)
        .thread_name_pattern("tickler-mysql-pool-{}")
        .on_drop_behavior(scheduled_thread_pool::OnPoolDropBehavior::DiscardPendingScheduled)
        .build();
    // Longer than a server may take not to answer, so that a waiter whose
    // connection is being opened or checked sees that fail, not its own
    // timeout first.
    let timeout = opts
        .get_read_timeout()
        .map_or(Duration::from_secs(10), |wait| {
            *wait + Duration::from_secs(1)
        });
    let last_fault = Arc::default();
    let connected = Arc::default();
    let pool = r2d2::Pool::builder()
        .thread_pool(Arc::new(helpers))
        .max_size(max_connections.max(2))
        .min_idle(Some(1))
        .connection_timeout(timeout)
        .error_handler(Box::new(ConnectFailed))
        .build_unchecked(Manager {
            restore: session_statements(&opts).into(),
            opts,
            last_fault: Arc::clone(&last_fault),
            connected: Arc::clone(&connected),
        });
    Connections {
        pool,
        connected,
        last_fault,
        timeout,
    }
}

/// The statements that set up a connection's session (`opts`'s `init`
/// and its database), as one text of several statements.
fn session_statements(opts: &mysql::Opts) -> String {
    let mut statements = opts.get_init();
    if let Some(db) = opts.get_db_name() {
        statements.push(format!("USE `{}`", db.replace('`', "``")));
    }
    statements.join("; ")
}

/// Logs a connection the pool could not open as a warning that says why
/// (the pool and `Store::write` retry it), not as r2d2's bare ERROR.
#[derive(Debug)]
struct ConnectFailed;

impl r2d2::HandleError<mysql::Error> for ConnectFailed {
    fn handle_error(&self, error: mysql::Error) {
        log::warn!("cannot open a MySQL connection ({error}); retrying");
    }
}

/// The server's error code, if the error is the server's.
pub(crate) fn server_code(e: &Error) -> Option<u16> {
    match e {
        Error::Mysql(mysql::Error::MySqlError(server)) => Some(server.code),
        _ => None,
    }
}

fn is_deadlock(e: &Error) -> bool {
    server_code(e) == Some(1213)
}

/// Errors after which the same transaction may succeed on another try:
/// a deadlock (1213, InnoDB rolled the transaction back), a lock wait
/// timeout (1205), the server's prepared statements all taken (1461: the
/// connection is dropped, and its statements with it), a row changed
/// under a snapshot (1020, MariaDB), a
/// statement to prepare again (1615), too many connections (1040), the
/// server shutting down (1053) or the session killed (1927, 4031: idle too
/// long), a server read-only (1290, 1836, 1792: a failover, the next
/// connection may reach the new primary), a network error on the server's
/// side (1158 to 1161), a connection lost or not made on ours, or no
/// pooled connection within its timeout.
pub(crate) fn retryable(e: &Error) -> bool {
    match e {
        Error::Pool(_) => true,
        Error::Mysql(mysql::Error::MySqlError(server)) => matches!(
            server.code,
            1213 | 1205
                | 1461
                | 1020
                | 1615
                | 1040
                | 1053
                | 1927
                | 4031
                | 1290
                | 1836
                | 1792
                | 1158
                | 1159
                | 1160
                | 1161
        ),
        Error::Mysql(other) => lost_connection(other) && !too_large(other),
        _ => false,
    }
}

/// A packet larger than `max_allowed_packet`: the same statement would be
/// refused again. (Raised while reading too, leaving the stream mid-packet,
/// so the connection is still dropped. The client crate does not export
/// the codec's error type: its variant is matched by name.)
fn too_large(e: &mysql::Error) -> bool {
    matches!(e, mysql::Error::CodecError(codec) if format!("{codec:?}") == "PacketTooLarge")
}

/// The client's errors of a connection that is gone or never came.
/// A server that is not there yet (refused, reset, timed out), as opposed
/// to one that answered and said no. A certificate the client refused is
/// an I/O error too, of kind `InvalidData`: that one is not retried.
fn not_answering(e: &mysql::Error) -> bool {
    use std::io::ErrorKind as K;
    match e {
        mysql::Error::IoError(io) => matches!(
            io.kind(),
            K::ConnectionRefused
                | K::ConnectionReset
                | K::ConnectionAborted
                | K::NotConnected
                | K::TimedOut
                | K::BrokenPipe
                | K::UnexpectedEof
        ),
        mysql::Error::DriverError(d) => matches!(
            d,
            mysql::DriverError::ConnectTimeout | mysql::DriverError::CouldNotConnect(_)
        ),
        _ => false,
    }
}

fn lost_connection(e: &mysql::Error) -> bool {
    use mysql::DriverError as D;
    match e {
        mysql::Error::IoError(_) | mysql::Error::CodecError(_) => true,
        mysql::Error::DriverError(d) => matches!(
            d,
            D::ConnectTimeout
                | D::CouldNotConnect(_)
                | D::PacketOutOfSync
                | D::UnexpectedPacket
                | D::Timeout
                | D::SetupError
        ),
        _ => false,
    }
}

/// Errors after which the connection must not be reused.
fn breaks_connection(e: &Error) -> bool {
    match e {
        Error::Mysql(mysql::Error::MySqlError(server)) => matches!(
            server.code,
            1461 | 1615 | 1053 | 1927 | 4031 | 1290 | 1836 | 1792 | 1158 | 1159 | 1160 | 1161
        ),
        Error::Mysql(other) => lost_connection(other),
        _ => false,
    }
}

/// Errors confined to one statement (its data or a constraint), which
/// [`Tx::isolated`] keeps from failing the rest of a batch: SQLSTATE class
/// 22 (data), 23 (integrity), 45 (a trigger's SIGNAL), and the codes of
/// values the server refuses under other states (1366, 1292, 1265: a value
/// the column cannot hold; 3819: a CHECK).
pub(crate) fn statement_level(e: &Error) -> bool {
    match e {
        Error::ConstraintViolated { .. } => true,
        Error::Mysql(mysql::Error::MySqlError(server)) => {
            let class = server.state.get(..2).unwrap_or("");
            matches!(class, "22" | "23" | "45")
                || matches!(server.code, 1366 | 1292 | 1265 | 3819 | 4025)
        }
        _ => false,
    }
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("mysql::Store")
            .field("url", &self.describe())
            .finish()
    }
}

/// A statement written with named markers (`:now`, `:id`, as the seam's
/// `fence!` and `retry_or_dead!` are given them) as MySQL takes it:
/// positional `?`s, with each marker's value repeated where it appears.
/// A `:name` not in `values` (or inside a quoted string) is left as it is.
pub(crate) fn named(sql: &str, values: &[(&str, Value)]) -> (String, Vec<Value>) {
    let mut out = String::with_capacity(sql.len());
    let mut bound = Vec::new();
    let mut quoted = false;
    let mut rest = sql;
    while let Some(c) = rest.chars().next() {
        if c == '\'' {
            quoted = !quoted;
        }
        if c == ':' && !quoted {
            let name_len = rest[1..]
                .find(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '_'))
                .unwrap_or(rest.len() - 1);
            let name = &rest[1..1 + name_len];
            if let Some((_, value)) = values.iter().find(|(n, _)| *n == name) {
                out.push('?');
                bound.push(value.clone());
                rest = &rest[1 + name_len..];
                continue;
            }
        }
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    (out, bound)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_markers_become_positional_in_order() {
        let (sql, values) = named(
            "SET a = :now, b = CASE WHEN :at <= :now THEN ':now' END WHERE id = :id AND x = :other",
            &[
                ("now", Value::from(1i64)),
                ("at", Value::from(2i64)),
                ("id", Value::from(3i64)),
            ],
        );
        assert_eq!(
            sql,
            "SET a = ?, b = CASE WHEN ? <= ? THEN ':now' END WHERE id = ? AND x = :other"
        );
        assert_eq!(
            values,
            vec![
                Value::from(1i64),
                Value::from(2i64),
                Value::from(1i64),
                Value::from(3i64)
            ]
        );
    }
}
