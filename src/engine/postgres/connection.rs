//! PostgreSQL's connections and transactions: the r2d2 pool, [`Tx`] (a
//! transaction, or autocommit, with statements prepared once per
//! connection, and savepoints for statements that may fail alone), the
//! retry of a whole transaction through lost connections and restarts;
//! and the engine's [`Capabilities`].

use super::pooler::{self, Pooling};
use super::tls::Tls;
use super::Store;
use crate::clock::Clock;
use crate::engine::types::{AppTxKind, Retries, Returned, ValidJob};
use crate::engine::{Capabilities, Watch};
use crate::error::{Error, Result};
use crate::job::JobId;
use crate::lease::Lease;
use postgres::error::SqlState;
use postgres::types::{ToSql, Type};
use postgres::{Client, Row, Statement};
use std::collections::HashMap;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

/// Connections of the pool: the client, its prepared statements, and
/// whether it must be dropped rather than reused.
pub(crate) struct Conn {
    // First: dropped before the statements, whose `Close` then goes
    // nowhere rather than to a server connection a pooler gave another
    // client.
    pub(super) client: Client,
    statements: Statements,
    broken: bool,
    returned: Returned,
    pooling: Arc<Pooling>,
}

/// How a connection's statements are sent: prepared once by name and
/// kept, or (behind a pooler in transaction mode) each sent unnamed with
/// its parameters' types, which are what is kept.
pub(crate) struct Statements {
    named: HashMap<String, Statement>,
    types: HashMap<String, Vec<Type>>,
    unnamed: bool,
}

impl Statements {
    pub(super) fn new(unnamed: bool) -> Statements {
        Statements {
            named: HashMap::new(),
            types: HashMap::new(),
            unnamed,
        }
    }
}

impl Conn {
    /// Drops this connection at its return if `e` left it unusable.
    pub(super) fn mark_broken_by(&mut self, e: &Error) {
        if breaks_connection(e) {
            self.broken = true;
        }
    }

    /// Drops this connection at its return instead of reusing it.
    pub(super) fn drop_after_use(&mut self) {
        self.broken = true;
    }

    /// Sets the session back to how tickler opened it ([`SESSION_RESET`],
    /// then [`SESSION_SETUP`]), in one round trip, after the application's statements ran on this
    /// connection: a `SET search_path` of theirs would otherwise reach
    /// tickler's next statements here. A connection whose settings cannot
    /// be set back is dropped.
    pub(super) fn restore_session(&mut self) {
        // Behind a pooler in transaction mode the session is no one's:
        // what this would reset is some other server connection's.
        if self.broken || self.pooling.transaction_mode() {
            return;
        }
        if let Err(e) = self
            .client
            .batch_execute(&format!("{SESSION_RESET} {SESSION_SETUP}"))
        {
            log::warn!("dropping a connection whose settings could not be set back: {e}");
            self.broken = true;
        }
    }
}

/// What every connection of the pool sets for its session, over what a
/// DBA may have set for the role or the database:
///
/// - No JIT: tickler's statements each read a few index entries, but the
///   planner prices a `LIMIT` under a `NOT EXISTS` as a read of the whole
///   table, and past `jit_above_cost` (PostgreSQL 12 and later, where JIT
///   is on by default) each claim spent 300 ms compiling what runs in
///   0.3 ms.
/// - READ COMMITTED, which the claim's `SKIP LOCKED` and the fenced
///   outcomes are written for: under a `default_transaction_isolation` of
///   `repeatable read` or `serializable`, workers' claims failed each
///   other with serialization errors (125 retries for 4,000 jobs).
/// - A commit flushed to this server's disk before it is acknowledged: a
///   `synchronous_commit = off` lost acknowledged jobs in a crash (7 and
///   17 of about 18,000). Only `off` is raised (to `local`); any other
///   value already flushes, and a stronger one set for replication stays.
pub(super) const SESSION_SETUP: &str = "SET jit = off; \
     SET default_transaction_isolation = 'read committed'; \
     SELECT set_config('synchronous_commit', 'local', false) \
     WHERE current_setting('synchronous_commit') = 'off';";

/// What the application's statements may leave on a connection of
/// tickler's, undone after them: its settings (`RESET ALL`), and what
/// `RESET ALL` keeps: a `SET ROLE` or `SET SESSION AUTHORIZATION` (tickler's
/// next statements would run as that role, and a role without rights on
/// tickler's tables fails them; a role the deployment made the default,
/// `ALTER ROLE … SET role`, comes back), advisory locks held for the
/// session, and temporary tables. `DISCARD ALL` would also drop the prepared statements
/// tickler keeps for the connection.
const SESSION_RESET: &str = "SET SESSION AUTHORIZATION DEFAULT; RESET ALL; \
     SELECT pg_advisory_unlock_all(); DISCARD TEMP;";

/// After a try whose earlier one's `COMMIT` went unanswered: returns once
/// the server's synchronous standbys (if it has any) confirm everything
/// written here so far. What this try read of the earlier one's writes may
/// be on this server alone: a session ended while its `COMMIT` waited for
/// the standby leaves that commit local and visible, and a failover then
/// loses it. A commit of its own that wrote to the WAL waits for the
/// standby up to a later point (a transaction id alone does not: the
/// server waits only for commits that wrote WAL). Where the DBA revoked
/// the function, this warns once and confirms nothing.
fn confirm_replicated(client: &mut Client) -> Result<()> {
    static REFUSED: std::sync::Once = std::sync::Once::new();
    match client.batch_execute("SELECT pg_logical_emit_message(true, 'tickler', '')") {
        Ok(()) => Ok(()),
        Err(e)
            if matches!(
                e.code(),
                Some(&SqlState::INSUFFICIENT_PRIVILEGE | &SqlState::UNDEFINED_FUNCTION)
            ) =>
        {
            REFUSED.call_once(|| {
                log::warn!(
                    "after a COMMIT whose answer was lost, tickler cannot wait for a \
                     synchronous standby to have it ({}): grant EXECUTE on \
                     pg_logical_emit_message(boolean, text, text) to tickler's role, or a \
                     failover right after such a commit may lose what it acknowledged",
                    crate::error::postgres_text(&e)
                );
            });
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

/// Socket settings for a server that stops answering without a word (a
/// host that lost power, a network partition, a failover that moved the
/// address): TCP gives up on data the peer does not acknowledge within
/// [`UNACKNOWLEDGED_MAX`] (the kernel's own limit is about 15 minutes of
/// retransmissions, for which a statement, a pool's check or `COMMIT`
/// waited), and keepalives end a connection whose peer stays silent for
/// about 11 s while tickler waits for an answer or holds it idle. A live
/// server's kernel acknowledges at once however long a statement runs,
/// so neither cuts a slow statement. Each is left as the URL sets it
/// (`tcp_user_timeout`, `keepalives`, `keepalives_idle`,
/// `keepalives_interval`, `keepalives_retries`).
pub(super) fn detect_a_silent_peer(config: &mut postgres::Config) {
    if config.get_tcp_user_timeout().is_none() {
        config.tcp_user_timeout(UNACKNOWLEDGED_MAX);
    }
    // The client library's default, which a URL cannot be told apart from.
    if config.get_keepalives_idle() == Duration::from_secs(2 * 60 * 60) {
        config.keepalives_idle(Duration::from_secs(5));
    }
    if config.get_keepalives_interval().is_none() {
        config.keepalives_interval(Duration::from_secs(2));
    }
    if config.get_keepalives_retries().is_none() {
        config.keepalives_retries(3);
    }
}

/// How long sent data may stay unacknowledged before TCP ends the
/// connection ([`detect_a_silent_peer`]).
pub(super) const UNACKNOWLEDGED_MAX: Duration = Duration::from_secs(10);

/// How long a pooled connection's check waits for the server's answer: a
/// server that accepts and stays silent (stopped, or overwhelmed) fails
/// the check instead of holding the caller, who is given another
/// connection or the pool's error within its window.
const CHECK_ANSWER_MAX: Duration = Duration::from_secs(5);

/// Makes the pool's connections; a connection that failed in a way that
/// makes it useless (closed, or on a server that became read-only after a
/// failover) is dropped rather than given out again.
pub(crate) struct Manager {
    config: postgres::Config,
    tls: Tls,
    refused: Refused,
    pooling: Arc<Pooling>,
    /// Set at each new connection: the server's clock is read again soon
    /// (it may be another server's, after a failover).
    pub(super) connected: Arc<std::sync::atomic::AtomicBool>,
    /// When a check last waited out [`CHECK_ANSWER_MAX`] for the server:
    /// r2d2 checks its idle connections one after another, so while the
    /// server is silent the others fail at once instead (and are
    /// dropped), rather than one whole wait each.
    silent_at: std::sync::Mutex<Option<std::time::Instant>>,
}

impl Manager {
    fn silent(&self) -> bool {
        self.silent_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some_and(|at| at.elapsed() < CHECK_ANSWER_MAX)
    }
}

impl r2d2::ManageConnection for Manager {
    type Connection = Conn;
    type Error = postgres::Error;

    fn connect(&self) -> std::result::Result<Conn, postgres::Error> {
        let mut client = self.tls.connect(&self.config)?;
        let unnamed = self.pooling.transaction_mode();
        if !unnamed {
            client.batch_execute(SESSION_SETUP)?;
        }
        *self.refused.lock().unwrap_or_else(PoisonError::into_inner) = None;
        self.connected
            .store(true, std::sync::atomic::Ordering::SeqCst);
        Ok(Conn {
            client,
            statements: Statements::new(unnamed),
            broken: false,
            returned: Returned::now(),
            pooling: Arc::clone(&self.pooling),
        })
    }

    fn is_valid(&self, conn: &mut Conn) -> std::result::Result<(), postgres::Error> {
        if !conn.returned.needs_check() && !conn.client.is_closed() {
            return Ok(());
        }
        if self.silent() {
            // The client library's errors cannot be made outside it: a
            // check that may not wait gives one at once (and the
            // connection is dropped after it).
            return conn.client.is_valid(Duration::ZERO);
        }
        let started = std::time::Instant::now();
        let checked = conn.client.is_valid(CHECK_ANSWER_MAX);
        if checked.is_err() && started.elapsed() >= CHECK_ANSWER_MAX {
            *self
                .silent_at
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = Some(std::time::Instant::now());
        }
        checked
    }

    fn has_broken(&self, conn: &mut Conn) -> bool {
        conn.returned = Returned::now();
        conn.broken || conn.client.is_closed()
    }
}

/// Where a [`Tx`]'s statements run.
pub(crate) enum Session<'a> {
    /// In a transaction (or savepoint).
    Transaction(postgres::Transaction<'a>),
    /// Each statement its own transaction (autocommit): one round trip
    /// for a single-statement write.
    Autocommit(&'a mut Client),
}

/// Statements in one transaction (or, for single-statement writes, in
/// autocommit), prepared once per connection or sent unnamed
/// ([`Statements`]).
pub(crate) struct Tx<'a> {
    pub(super) tx: Session<'a>,
    pub(super) statements: &'a mut Statements,
}

/// A statement as a [`Tx`] sends it.
enum Sent<'p> {
    Named(Statement),
    Unnamed(Vec<(&'p (dyn ToSql + Sync), Type)>),
}

impl Tx<'_> {
    fn statement<'p>(&mut self, sql: &str, params: &[&'p (dyn ToSql + Sync)]) -> Result<Sent<'p>> {
        if self.statements.unnamed {
            let types = match self.statements.types.get(sql) {
                Some(types) => types.clone(),
                None => {
                    let types = pooler::parameter_types(sql, params)?;
                    self.statements.types.insert(sql.to_owned(), types.clone());
                    types
                }
            };
            return Ok(Sent::Unnamed(params.iter().copied().zip(types).collect()));
        }
        if let Some(s) = self.statements.named.get(sql) {
            return Ok(Sent::Named(s.clone()));
        }
        let prepared = match &mut self.tx {
            Session::Transaction(tx) => tx.prepare(sql)?,
            Session::Autocommit(client) => client.prepare(sql)?,
        };
        self.statements
            .named
            .insert(sql.to_owned(), prepared.clone());
        Ok(Sent::Named(prepared))
    }

    pub(crate) fn query(&mut self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<Vec<Row>> {
        Ok(match (self.statement(sql, params)?, &mut self.tx) {
            (Sent::Named(s), Session::Transaction(tx)) => tx.query(&s, params)?,
            (Sent::Named(s), Session::Autocommit(client)) => client.query(&s, params)?,
            (Sent::Unnamed(p), Session::Transaction(tx)) => tx.query_typed(sql, &p)?,
            (Sent::Unnamed(p), Session::Autocommit(client)) => client.query_typed(sql, &p)?,
        })
    }

    /// Sends `sql` unnamed whatever the mode: parsed and planned at this
    /// run only, for a statement whose text changes from call to call (a
    /// large claim's size), which a connection's cache would only fill.
    pub(crate) fn query_unprepared(
        &mut self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>> {
        let types = pooler::parameter_types(sql, params)?;
        let typed: Vec<_> = params.iter().copied().zip(types).collect();
        Ok(match &mut self.tx {
            Session::Transaction(tx) => tx.query_typed(sql, &typed)?,
            Session::Autocommit(client) => client.query_typed(sql, &typed)?,
        })
    }

    pub(crate) fn query_opt(
        &mut self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>> {
        Ok(match (self.statement(sql, params)?, &mut self.tx) {
            (Sent::Named(s), Session::Transaction(tx)) => tx.query_opt(&s, params)?,
            (Sent::Named(s), Session::Autocommit(client)) => client.query_opt(&s, params)?,
            (Sent::Unnamed(p), Session::Transaction(tx)) => tx.query_typed_opt(sql, &p)?,
            (Sent::Unnamed(p), Session::Autocommit(client)) => client.query_typed_opt(sql, &p)?,
        })
    }

    pub(crate) fn query_one(&mut self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<Row> {
        Ok(match (self.statement(sql, params)?, &mut self.tx) {
            (Sent::Named(s), Session::Transaction(tx)) => tx.query_one(&s, params)?,
            (Sent::Named(s), Session::Autocommit(client)) => client.query_one(&s, params)?,
            (Sent::Unnamed(p), Session::Transaction(tx)) => tx.query_typed_one(sql, &p)?,
            (Sent::Unnamed(p), Session::Autocommit(client)) => client.query_typed_one(sql, &p)?,
        })
    }

    pub(crate) fn execute(&mut self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<u64> {
        Ok(match (self.statement(sql, params)?, &mut self.tx) {
            (Sent::Named(s), Session::Transaction(tx)) => tx.execute(&s, params)?,
            (Sent::Named(s), Session::Autocommit(client)) => client.execute(&s, params)?,
            (Sent::Unnamed(p), Session::Transaction(tx)) => tx.execute_typed(sql, &p)?,
            (Sent::Unnamed(p), Session::Autocommit(client)) => client.execute_typed(sql, &p)?,
        })
    }

    /// Runs statements given as text (no parameters, not prepared).
    pub(crate) fn batch_execute(&mut self, sql: &str) -> Result<()> {
        match &mut self.tx {
            Session::Transaction(tx) => tx.batch_execute(sql)?,
            Session::Autocommit(client) => client.batch_execute(sql)?,
        }
        Ok(())
    }

    /// Commits the transaction (nothing to do in autocommit).
    pub(crate) fn commit(self) -> Result<()> {
        if let Session::Transaction(tx) = self.tx {
            tx.commit()?;
        }
        Ok(())
    }

    /// Runs `f` inside a savepoint: an error of the database confined to
    /// it (a constraint, a trigger's exception, a value the server refuses)
    /// is `Ok(Err(_))` and undoes `f`'s statements alone. In autocommit
    /// every statement is alone already.
    pub(crate) fn isolated<T>(
        &mut self,
        f: impl FnOnce(&mut Tx<'_>) -> Result<T>,
    ) -> Result<Result<T>> {
        let Session::Transaction(tx) = &mut self.tx else {
            return match f(self) {
                Ok(value) => Ok(Ok(value)),
                Err(e) if statement_level(&e) => Ok(Err(e)),
                Err(e) => Err(e),
            };
        };
        let mut inner = Tx {
            tx: Session::Transaction(tx.savepoint("tickler_item")?),
            statements: self.statements,
        };
        match f(&mut inner) {
            Ok(value) => {
                inner.commit()?;
                Ok(Ok(value))
            }
            Err(e) if statement_level(&e) => {
                if let Session::Transaction(savepoint) = inner.tx {
                    savepoint.rollback()?;
                }
                Ok(Err(e))
            }
            Err(e) => Err(e),
        }
    }
}

pub(crate) use crate::engine::types::Attempt;

/// How PostgreSQL retries: from 10 ms, every retried error a warning but
/// a session the server ended for idling ([`ended_while_idle`]).
pub(super) const RETRIES: Retries = Retries {
    engine: "PostgreSQL",
    first_pause: Duration::from_millis(10),
    retryable,
    quiet: ended_while_idle,
};

/// A pooled connection the server ended while it waited in the pool, by a
/// DBA's `idle_session_timeout` (57P05): normal under that setting, for
/// every idle connection over and over, so it is said once per process
/// (at info level) and each replacement after that only at debug level.
/// The pool's own check of a connection it is about to give out meets the
/// same ([`ConnectFailed`]).
fn ended_while_idle(e: &Error) -> bool {
    match e {
        Error::Postgres(e) => ended_for_idling(e),
        _ => false,
    }
}

/// [`ended_while_idle`] for the client library's error.
fn ended_for_idling(e: &postgres::Error) -> bool {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if e.code() != Some(&SqlState::IDLE_SESSION_TIMEOUT) {
        return false;
    }
    if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
        log::info!(
            "the server ends sessions idle longer than its idle_session_timeout; tickler \
             replaces each such connection when it next needs one (said once)"
        );
    }
    true
}

impl Store {
    pub(crate) fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    /// The URL without its password, for messages.
    pub(crate) fn describe(&self) -> String {
        crate::engine::redacted_location(&self.url)
    }

    /// Runs `f` in a READ COMMITTED transaction on a pooled connection and
    /// commits. A connection lost (the server restarted or cut it), a
    /// server that became read-only (a failover), a deadlock or a
    /// serialization failure retries the whole transaction on another
    /// connection with jittered backoff for up to the retry window; `f`
    /// may therefore run more than once and must not have effects outside
    /// the transaction.
    pub(crate) fn write<T>(&self, f: impl FnMut(&mut Tx<'_>, Attempt) -> Result<T>) -> Result<T> {
        self.run(false, f)
    }

    /// [`Store::write`] for writes whose statements are each right on
    /// their own (as under READ COMMITTED they would be anyway), in
    /// autocommit: one round trip for one statement instead of three.
    pub(crate) fn write_autocommit<T>(
        &self,
        f: impl FnMut(&mut Tx<'_>, Attempt) -> Result<T>,
    ) -> Result<T> {
        self.run(true, f)
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

    /// A read in its own transaction (one snapshot), retried as [`Store::write`].
    pub(crate) fn read<T>(&self, mut f: impl FnMut(&mut Tx<'_>) -> Result<T>) -> Result<T> {
        self.write(|tx, _| f(tx))
    }

    fn try_once<T>(
        &self,
        f: &mut impl FnMut(&mut Tx<'_>, Attempt) -> Result<T>,
        attempt: Attempt,
        autocommit: bool,
    ) -> std::result::Result<T, (Error, Phase)> {
        let mut conn = self.connection().map_err(|e| (e, Phase::Begin))?;
        let conn = &mut *conn;
        if self.pooling.transaction_mode() && !conn.statements.unnamed {
            // Made before a pooler was found: its statements were
            // prepared on server connections that are now anyone's.
            conn.statements.unnamed = true;
            conn.broken = true;
        }
        let result = (|| {
            let session = if autocommit {
                Session::Autocommit(&mut conn.client)
            } else {
                Session::Transaction(
                    conn.client
                        .transaction()
                        .map_err(|e| (e.into(), Phase::Begin))?,
                )
            };
            let mut tx = Tx {
                tx: session,
                statements: &mut conn.statements,
            };
            let value = f(&mut tx, attempt).map_err(|e| {
                // A statement that failed in autocommit may have failed
                // after its commit: unknown, as with a failed COMMIT.
                let phase = if autocommit {
                    Phase::Commit
                } else {
                    Phase::Body
                };
                (e, phase)
            })?;
            tx.commit().map_err(|e| (e, Phase::Commit))?;
            if attempt.after_unknown_commit {
                confirm_replicated(&mut conn.client).map_err(|e| (e, Phase::Commit))?;
            }
            Ok(value)
        })();
        match result {
            Err((e, phase)) => {
                conn.mark_broken_by(&e);
                Err((self.pooling.after_error(e), phase))
            }
            ok => ok,
        }
    }

    /// A connection of the pool ([`pooled_from`]).
    pub(crate) fn connection(&self) -> Result<r2d2::PooledConnection<Manager>> {
        pooled_from(&self.pool, &self.refused, || self.describe())
    }

    /// A connection of the pool, for the application's transactions:
    /// checked with a round trip however recently it was used (the
    /// application's statements are not retried), and taken again while
    /// the check fails, within the retry window.
    pub(crate) fn pooled(&self) -> Result<r2d2::PooledConnection<Manager>> {
        RETRIES.run(self.retry_window, || {
            let mut pooled = self.connection()?;
            if let Err(e) = pooled.client.is_valid(CHECK_ANSWER_MAX) {
                pooled.broken = true;
                return Err(Error::Postgres(e));
            }
            Ok(pooled)
        })
    }
}

impl Capabilities for Store {
    fn name(&self) -> &'static str {
        "PostgreSQL"
    }

    fn clock(&self) -> Arc<dyn Clock> {
        Arc::clone(&self.clock)
    }

    fn location(&self) -> String {
        if self.pooling.transaction_mode() {
            format!("{} (through a pooler in transaction mode)", self.describe())
        } else {
            self.describe()
        }
    }

    fn watcher(&self) -> Result<Box<dyn Watch>> {
        Ok(Box::new(Store::watcher(self)))
    }

    fn enqueue_in_app_tx(
        &self,
        tx: AppTxKind<'_, '_>,
        rows: &[ValidJob],
        _now: i64,
    ) -> Result<Vec<JobId>> {
        match tx {
            AppTxKind::Postgres(tx) => self.enqueue_in(tx, rows),
            other => Err(crate::engine::wrong_app_tx(&other, "PostgreSQL")),
        }
    }

    fn complete_with(
        &self,
        lease: &Lease,
        app_writes: &mut dyn FnMut(AppTxKind<'_, '_>) -> Result<()>,
    ) -> Result<()> {
        Store::complete_with(self, lease, &mut |tx| app_writes(AppTxKind::Postgres(tx)))
    }
}

/// The pool of a `Store`: at least two connections (a claim may run while
/// an outcome commits), one kept open.
pub(super) fn connection_pool(
    config: &postgres::Config,
    tls: &Tls,
    max_connections: u32,
    refused: &Refused,
    pooling: &Arc<Pooling>,
    connected: &Arc<std::sync::atomic::AtomicBool>,
) -> r2d2::Pool<Manager> {
    // r2d2's own helper threads would otherwise wait for the pool's
    // next scheduled idle check (up to 30 s) after the pool is
    // dropped, holding nothing but living on: an application that
    // opens and drops queues would collect them.
    let helpers = scheduled_thread_pool::ScheduledThreadPool::builder()
        .num_threads(3)
        .thread_name_pattern("tickler-pg-pool-{}")
        .on_drop_behavior(scheduled_thread_pool::OnPoolDropBehavior::DiscardPendingScheduled)
        .build();
    r2d2::Pool::builder()
        .thread_pool(Arc::new(helpers))
        .max_size(max_connections.max(2))
        .min_idle(Some(1))
        .connection_timeout(Duration::from_secs(10))
        .error_handler(Box::new(ConnectFailed(refused.clone())))
        .build_unchecked(Manager {
            config: config.clone(),
            tls: tls.clone(),
            refused: refused.clone(),
            connected: Arc::clone(connected),
            pooling: Arc::clone(pooling),
            silent_at: std::sync::Mutex::new(None),
        })
}

/// What the pool does with a connection it could not open. r2d2's default
/// logs an ERROR reading only "db error" or "error connecting to server":
/// alarming while the server restarts (the pool and `Store::write` retry
/// through that), and silent on the cause when it does not come back. A
/// refusal no retry cures is kept for the callers whose wait for a
/// connection then times out.
#[derive(Debug)]
struct ConnectFailed(Refused);

impl r2d2::HandleError<postgres::Error> for ConnectFailed {
    fn handle_error(&self, error: postgres::Error) {
        let text = crate::error::postgres_text(&error);
        let mut refused = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        // r2d2 also sends here the failed check of an idle connection it
        // was about to give out (and then opens another).
        if ended_for_idling(&error) {
            log::debug!("replacing a pooled connection the server ended ({text})");
        } else if never_cured(&error) {
            log::warn!("cannot open a PostgreSQL connection ({text})");
            *refused = Some((std::time::Instant::now(), text));
        } else {
            log::warn!("cannot open a PostgreSQL connection ({text}); retrying");
            *refused = None;
        }
    }
}

/// The last refusal of a new connection that no retry cures (a password
/// changed since the open, a database dropped, a privilege revoked), and
/// when it came; cleared by a connection made or failing otherwise.
pub(super) type Refused = Arc<std::sync::Mutex<Option<(std::time::Instant, String)>>>;

/// A connection of `pool`. A wait that timed out while new connections
/// were being refused for a reason no retry cures fails with that reason
/// ([`Error::Config`]), not with the pool's timeout retried for the whole
/// retry window.
pub(super) fn pooled_from(
    pool: &r2d2::Pool<Manager>,
    refused: &Refused,
    describe: impl FnOnce() -> String,
) -> Result<r2d2::PooledConnection<Manager>> {
    pool.get().map_err(|e| {
        let refusal = refused
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .filter(|(at, _)| at.elapsed() < Duration::from_secs(60))
            .map(|(_, text)| text.clone());
        match refusal {
            Some(text) => Error::Config(format!(
                "no connection to {} could be opened: {text}",
                describe()
            )),
            None => Error::Pool(e),
        }
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Begin,
    Body,
    Commit,
}

/// Errors after which the same transaction may succeed on another try: the
/// connection or server went away, the server is starting or shutting
/// down, it is read-only (a failover: the next connection may reach the
/// new primary), a deadlock or serialization failure, too many
/// connections for now, a lock not granted within the session's
/// `lock_timeout` or a statement cancelled past a DBA's `statement_timeout`
/// (tickler's statements are short, so one that runs that long waited for
/// a lock: contention of the moment; its own long work goes in batches), a session
/// the server ended while it waited in the pool, a prepared
/// statement whose table changed under it (the connection is replaced),
/// or no pooled connection within its timeout.
pub(crate) fn retryable(e: &Error) -> bool {
    match e {
        Error::Pool(_) => true,
        Error::Postgres(e) => {
            if never_cured(e) {
                return false;
            }
            if e.is_closed() || stale_plan(e) || ended_session(e) || pooler::symptom(e) {
                return true;
            }
            match e.code() {
                None => e.as_db_error().is_none(),
                Some(code) => {
                    code.code().starts_with("08")
                        || [
                            SqlState::T_R_SERIALIZATION_FAILURE,
                            SqlState::T_R_DEADLOCK_DETECTED,
                            SqlState::ADMIN_SHUTDOWN,
                            SqlState::CRASH_SHUTDOWN,
                            SqlState::CANNOT_CONNECT_NOW,
                            SqlState::TOO_MANY_CONNECTIONS,
                            SqlState::READ_ONLY_SQL_TRANSACTION,
                            SqlState::LOCK_NOT_AVAILABLE,
                        ]
                        .contains(code)
                        || past_statement_timeout(e)
                }
            }
        }
        _ => false,
    }
}

/// A statement the server cancelled because it ran past `statement_timeout`
/// (not one an operator cancelled: `pg_cancel_backend` is not undone by
/// running the statement again).
fn past_statement_timeout(e: &postgres::Error) -> bool {
    e.as_db_error().is_some_and(|db| {
        *db.code() == SqlState::QUERY_CANCELED && db.message().contains("statement timeout")
    })
}

/// Errors no retry cures: the server refused the login (a wrong password,
/// an unknown role, a `pg_hba.conf` without a line for this client), the
/// database does not exist, a privilege is missing; or the client cannot
/// even try (a malformed setting, TLS asked for and refused). The server
/// sends the first ones as FATAL while it ends the session it was opening,
/// which would otherwise read as a session ended while idle, and retried.
pub(super) fn never_cured(e: &postgres::Error) -> bool {
    // A pooler's refusal of a startup parameter (PgBouncer's
    // "unsupported startup parameter: options"): the URL must change.
    if e.as_db_error().is_some_and(|db| {
        *db.code() == SqlState::PROTOCOL_VIOLATION
            && db.message().starts_with("unsupported startup parameter")
    }) {
        return true;
    }
    if let Some(code) = e.code() {
        return code.code().starts_with("28")
            || *code == SqlState::INVALID_CATALOG_NAME
            || *code == SqlState::INSUFFICIENT_PRIVILEGE;
    }
    // The client's own errors, known only by their text (their kind is
    // private to the client library).
    e.as_db_error().is_none()
        && [
            "authentication error",
            "invalid configuration",
            "invalid connection string",
        ]
        .contains(&e.to_string().as_str())
        || (tls_failed(e) && !tls_cut(e))
        // TLS 1.3: a refused client certificate comes as an alert after
        // the handshake, on the first read, as an I/O error.
        || rustls_cause(e).is_some()
}

/// A TLS failure that a retry may cure: the connection was cut during the
/// handshake (a restart, a pooler's reset), which the client library
/// reports as a TLS error like a refused certificate. Refusals (a
/// certificate, an alert, no TLS on the server) are not I/O errors or
/// carry rustls's error.
fn tls_cut(e: &postgres::Error) -> bool {
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        if cause.is::<rustls::Error>() {
            return false;
        }
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind::{
                BrokenPipe, ConnectionAborted, ConnectionReset, TimedOut, UnexpectedEof,
            };
            // Other kinds are refusals too (a host name that is no TLS
            // server name comes as InvalidInput).
            return matches!(
                io.kind(),
                UnexpectedEof | ConnectionReset | ConnectionAborted | BrokenPipe | TimedOut
            ) && !io
                .get_ref()
                .is_some_and(|inner| inner.is::<rustls::Error>());
        }
        source = cause.source();
    }
    false
}

/// rustls's own error behind a TLS failure (a refused certificate, an
/// alert), where there is one: the TLS layer hands it on inside an I/O
/// error, whose `source` skips it.
fn rustls_cause(e: &postgres::Error) -> Option<&rustls::Error> {
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        if let Some(found) = cause.downcast_ref::<rustls::Error>() {
            return Some(found);
        }
        let inner = cause
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref());
        if let Some(found) = inner.and_then(|i| i.downcast_ref::<rustls::Error>()) {
            return Some(found);
        }
        source = cause.source();
    }
    None
}

/// The client library's text for every failure of TLS: the server offers
/// none, or its certificate or handshake was refused (the cause follows
/// as the error's source).
const TLS_FAILED: &str = "error performing TLS handshake";

fn tls_failed(e: &postgres::Error) -> bool {
    e.as_db_error().is_none() && e.to_string() == TLS_FAILED
}

/// Opens one connection before the pool does (and returns it), so that what no retry can
/// cure ([`never_cured`]) fails the open at once with the server's reason
/// instead of the pool's timeout 30 s later. A server that does not
/// accept connections yet (starting, restarting, full) is tried again
/// until `window` ends, and the last error is the one returned.
pub(super) fn first_connection(
    config: &postgres::Config,
    tls: &Tls,
    describe: &str,
    window: Duration,
) -> Result<Client> {
    let deadline = std::time::Instant::now() + window;
    let mut pause = Duration::from_millis(50);
    loop {
        match tls.connect(config) {
            Ok(client) => return Ok(client),
            // The server's refusal keeps its type and SQLSTATE.
            Err(e) if never_cured(&e) && e.as_db_error().is_some() => {
                return Err(Error::Postgres(e))
            }
            Err(e) if never_cured(&e) => {
                let text = crate::error::postgres_text(&e);
                let checks = if tls_failed(&e) {
                    format!(" ({})", tls.checks(rustls_cause(&e)))
                } else {
                    String::new()
                };
                return Err(Error::Config(format!(
                    "cannot connect to {describe}: {text}{checks}"
                )));
            }
            Err(e) => {
                if std::time::Instant::now() + pause >= deadline {
                    return Err(Error::Postgres(e));
                }
                log::warn!(
                    "cannot connect to {describe} yet ({}); retrying",
                    crate::error::postgres_text(&e)
                );
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_secs(1));
            }
        }
    }
}

/// A statement prepared before its table's columns changed type (an
/// operator's ALTER TABLE, a newer version's migration in a rolling
/// deploy): PostgreSQL refuses it on every later use, so the connection
/// and its prepared statements are dropped.
fn stale_plan(e: &postgres::Error) -> bool {
    e.as_db_error().is_some_and(|db| {
        *db.code() == SqlState::FEATURE_NOT_SUPPORTED
            && db
                .message()
                .starts_with("cached plan must not change result type")
    })
}

/// An error the server sent as it ended the session (FATAL or PANIC: a
/// DBA's `idle_session_timeout` or `idle_in_transaction_session_timeout`,
/// `pg_terminate_backend`, a shutdown). A connection taken from the pool
/// without a check may have been ended while it waited there, and its
/// first statement reads this instead of running: the connection is
/// dropped and the work retried on another.
fn ended_session(e: &postgres::Error) -> bool {
    use postgres::error::Severity;
    e.as_db_error().is_some_and(|db| {
        matches!(
            db.parsed_severity(),
            Some(Severity::Fatal) | Some(Severity::Panic)
        )
    })
}

/// Errors after which the connection must not be reused.
fn breaks_connection(e: &Error) -> bool {
    match e {
        Error::Postgres(e) => {
            e.is_closed()
                || stale_plan(e)
                || ended_session(e)
                || pooler::symptom(e)
                || e.code().is_some_and(|c| {
                    c.code().starts_with("08")
                        || *c == SqlState::READ_ONLY_SQL_TRANSACTION
                        || *c == SqlState::ADMIN_SHUTDOWN
                })
                || (e.code().is_none() && e.as_db_error().is_none())
        }
        _ => false,
    }
}

/// Errors confined to one statement (its data or a constraint), which
/// [`Tx::isolated`] keeps from failing the rest of a batch.
pub(crate) fn statement_level(e: &Error) -> bool {
    match e {
        Error::ConstraintViolated { .. } => true,
        Error::Postgres(e) => e.code().is_some_and(|c| {
            let class = &c.code()[..2];
            // 22: data exception; 23: integrity constraint; P0: raised by
            // a trigger.
            class == "22" || class == "23" || class == "P0"
        }),
        _ => false,
    }
}

/// Text PostgreSQL can store: its `text` type refuses the NUL character,
/// which a handler's error message may contain.
pub(crate) fn storable(text: &str) -> std::borrow::Cow<'_, str> {
    if text.contains('\0') {
        std::borrow::Cow::Owned(text.replace('\0', "\u{FFFD}"))
    } else {
        std::borrow::Cow::Borrowed(text)
    }
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("postgres::Store")
            .field("url", &self.describe())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Every record logged in this test binary (no other test logs).
    static LOGGED: Mutex<Vec<(log::Level, String)>> = Mutex::new(Vec::new());

    struct Capture;

    impl log::Log for Capture {
        fn enabled(&self, _: &log::Metadata<'_>) -> bool {
            true
        }
        fn log(&self, record: &log::Record<'_>) {
            LOGGED
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push((record.level(), record.args().to_string()));
        }
        fn flush(&self) {}
    }

    /// A connection the pool cannot open (as while the server restarts)
    /// is retried, by the pool and by `Store::write`'s window: it is a
    /// warning that says why, not an error. (r2d2's own handler logged
    /// each failed attempt as an ERROR reading only "db error".)
    #[test]
    fn failed_connection_attempts_are_warnings_that_say_why() {
        if log::set_boxed_logger(Box::new(Capture)).is_ok() {
            log::set_max_level(log::LevelFilter::Trace);
        }
        // Nothing listens on port 1.
        let config: postgres::Config = "postgres://tickler@127.0.0.1:1/none".parse().unwrap();
        let tls = Tls::new(&Default::default(), &Default::default()).unwrap();
        let pooling = Arc::new(Pooling::new(crate::Pooler::Session));
        let pool = connection_pool(
            &config,
            &tls,
            2,
            &Refused::default(),
            &pooling,
            &Arc::default(),
        );
        assert!(pool.get_timeout(Duration::from_millis(300)).is_err());
        let logged = LOGGED
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let attempts: Vec<_> = logged
            .iter()
            .filter(|(_, text)| text.contains("127.0.0.1:1") || text.contains("error"))
            .collect();
        assert!(!attempts.is_empty(), "nothing logged: {logged:?}");
        for (level, text) in attempts {
            assert_eq!(*level, log::Level::Warn, "{text}");
            assert!(
                text.contains("connection refused") || text.contains("Connection refused"),
                "{text}"
            );
        }
    }
}
