//! Jobs in the application's own transactions: written inside them
//! (`enqueue_tx`) and completed together with the handler's writes
//! (`complete_with`), on the engine's own connections.

use super::Queue;
use crate::engine::types::{AppTx, AppTxRef, AppWrites};
use crate::error::{Error, Result};
use crate::job::{JobId, NewJob};
use crate::lease::Lease;
use rusqlite::Connection;

impl Queue {
    /// Opens a new connection to this queue's file with the settings tickler
    /// uses (WAL, `synchronous` per [`Durability`](crate::Durability),
    /// tickler's busy handler, `foreign_keys`, and any
    /// [`crate::SqliteOptions::on_connection`] hook), for the application's own
    /// tables and for [`Queue::enqueue_tx`]. Using it keeps the application and
    /// tickler from disagreeing about the journal mode or durability of the
    /// shared file.
    ///
    /// Open write transactions on it with
    /// `transaction_with_behavior(TransactionBehavior::Immediate)`: a
    /// deferred transaction that reads and then writes can fail at once with
    /// `SQLITE_BUSY` when another connection wrote in between.
    ///
    /// # Errors
    /// [`Error::Sqlite`], [`Error::NotWal`], [`Error::PragmaMismatch`].
    pub fn open_connection(&self) -> Result<Connection> {
        self.engine().open_connection()
    }

    /// Writes `job` inside the caller's own transaction `tx` (an
    /// [`AppTx`]: `&rusqlite::Transaction` on SQLite, `&mut
    /// postgres::Transaction` on PostgreSQL): the job exists if and only if
    /// the caller commits. Closes the gap where an application commits its
    /// data and crashes before enqueueing.
    ///
    /// Same validation, errors and unique_key behaviour as
    /// [`Queue::enqueue`]. Durability is the caller's commit's. Worker pools
    /// in any process see the job once the caller commits (their watchers
    /// notice commits from every connection on SQLite; on PostgreSQL the
    /// transaction also gets a `NOTIFY`, which the server delivers at
    /// commit).
    ///
    /// On SQLite, open `tx` on [`Queue::open_connection`] with
    /// `transaction_with_behavior(TransactionBehavior::Immediate)`, and
    /// call only through `tx`: a plain [`Queue::enqueue`] from the thread
    /// that holds an open write transaction on another connection waits
    /// for that transaction (and ends in [`Error::Busy`]). On PostgreSQL
    /// the insert runs in a savepoint, so a refused job leaves `tx` usable.
    ///
    /// ```no_run
    /// # fn main() -> tickler::Result<()> {
    /// use tickler::rusqlite::TransactionBehavior;
    /// let queue = tickler::Queue::open("app.db")?;
    /// let mut conn = queue.open_connection()?;
    /// let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    /// tx.execute("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY)", [])?;
    /// tx.execute("INSERT INTO orders DEFAULT VALUES", [])?;
    /// queue.enqueue_tx(&tx, tickler::NewJob::new("send_receipt"))?;
    /// tx.commit()?; // the order and its job, or neither
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`Queue::enqueue`]; [`Error::Unsupported`] for a transaction of
    /// another engine than the queue's. On a validation error nothing was
    /// written and the caller's transaction is open and usable. On SQLite's
    /// [`Error::DiskFull`] SQLite has already rolled back the caller's whole
    /// transaction (nothing of it lands; its commit fails with "no
    /// transaction is active"). On PostgreSQL, `Error::Postgres` for the
    /// server's errors (not retried: the transaction is the caller's).
    pub fn enqueue_tx<'a, 'b: 'a>(&self, tx: impl AppTx<'a, 'b>, job: NewJob) -> Result<JobId> {
        Ok(self.enqueue_batch_tx(tx, vec![job])?.remove(0))
    }

    /// [`Queue::enqueue_tx`] for several jobs: all or none, in the caller's
    /// transaction. Returns ids in input order.
    ///
    /// # Errors
    /// As [`Queue::enqueue_batch`].
    pub fn enqueue_batch_tx<'a, 'b: 'a>(
        &self,
        tx: impl AppTx<'a, 'b>,
        jobs: Vec<NewJob>,
    ) -> Result<Vec<JobId>> {
        let tx = tx.into_app_tx().0;
        let now = self.now_ms();
        let rows = jobs
            .into_iter()
            .map(|job| self.validate(job, now))
            .collect::<Result<Vec<_>>>()?;
        self.engine().enqueue_in_app_tx(tx, &rows, now)
    }

    /// Runs `app_writes` and marks the job succeeded in one transaction
    /// of tickler's: the handler's own writes to the queue's database and
    /// the job's completion commit together or not at all. If the lease was
    /// lost (reaped, cancelled), the fenced completion matches no row, the
    /// whole transaction rolls back, the application's writes too, and the
    /// caller gets [`Error::LeaseLost`].
    ///
    /// `app_writes` is a closure over the engine's transaction, with its
    /// type named ([`AppWrites`]): `|tx: &rusqlite::Transaction|` on SQLite,
    /// `|tx: &mut postgres::Transaction|` on PostgreSQL. It runs once.
    ///
    /// This gives exactly-once effects for effects inside the database.
    /// Effects outside it (HTTP calls, e-mail) stay at-least-once: key them
    /// by the job id or run_token.
    ///
    /// - **SQLite**: one `BEGIN IMMEDIATE` transaction on tickler's write
    ///   connection, committed with the queue's
    ///   [`Durability`](crate::Durability). It holds the write lock of the
    ///   whole file while `app_writes` runs: keep it short (a few statements).
    ///   `app_writes` must not open its own transaction nor call other `Queue`
    ///   writes (they return [`Error::InvalidArgument`]; write through `tx`,
    ///   e.g. [`Queue::enqueue_tx`]). A busy error it returns comes back as
    ///   [`Error::Aborted`], not retried; only a busy `BEGIN`, before
    ///   `app_writes` ran, is.
    /// - **PostgreSQL**: one transaction on one of tickler's connections,
    ///   tried once: an error during the commit leaves it unknown whether it
    ///   committed (the job's next outcome then says so with
    ///   [`Error::LeaseLost`]). Other `Queue` writes inside `app_writes`
    ///   are not refused as on SQLite, but they run on other connections,
    ///   in transactions of their own that commit whatever becomes of this
    ///   one: write through `tx` (e.g. [`Queue::enqueue_tx`]) what must
    ///   commit with the completion. The connection goes back to tickler's
    ///   pool afterwards, with its settings set back (`RESET ALL`); other
    ///   session state (temporary tables, advisory locks, `SET SESSION
    ///   AUTHORIZATION`) stays: prefer `SET LOCAL`.
    /// - **MySQL/MariaDB**: as on PostgreSQL, one transaction (READ
    ///   COMMITTED) on one of tickler's connections, tried once. The
    ///   connection goes back to tickler's pool with tickler's session set
    ///   again (its settings, `autocommit`, `sql_select_limit`, the URL's
    ///   `init` and the database, so a `USE` in `app_writes` does not move
    ///   the queue); other session state (user variables, temporary
    ///   tables, `GET_LOCK` locks, other settings) stays.
    ///
    /// On the server engines the fenced completion runs first, before
    /// `app_writes`: the job's row is locked before any of the
    /// application's (the order of tickler's other transactions), and a
    /// lost lease is known before the application's writes run. A
    /// deadlock, a lock wait past the busy timeout or a lost connection
    /// met there, before `app_writes` ran, is tried again within the
    /// queue's retry window (busy timeout plus busy retry), as every other
    /// transaction of tickler's is; "tried once" means `app_writes` runs
    /// at most once.
    ///
    /// `app_writes` may return [`Error::Aborted`] (or any error) to roll
    /// everything back.
    ///
    /// ```no_run
    /// # fn main() -> tickler::Result<()> {
    /// # let queue = tickler::Queue::open("app.db")?;
    /// # let leases = queue.manual().claim("default", "me", 1, std::time::Duration::from_secs(30))?;
    /// # let lease = &leases[0];
    /// queue.complete_with(lease, |tx: &tickler::rusqlite::Transaction| {
    ///     tx.execute("INSERT INTO exports (job) VALUES (?1)", [lease.job_id.0])?;
    ///     Ok(())
    /// })?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`Error::LeaseLost`]; the error `app_writes` returned;
    /// [`Error::Unsupported`] for a closure over another engine's
    /// transaction; [`Error::Busy`], [`Error::DiskFull`], [`Error::Sqlite`]
    /// on SQLite, `Error::Postgres` on PostgreSQL, `Error::Mysql` on
    /// MySQL. On any error but one during a server's commit itself,
    /// nothing was written.
    pub fn complete_with<T, M>(
        &self,
        lease: &Lease,
        app_writes: impl AppWrites<T, M>,
    ) -> Result<T> {
        let mut app_writes = Some(app_writes);
        let mut value = None;
        self.engine().complete_with(lease, &mut |tx| {
            let writes = app_writes.take().ok_or_else(|| {
                Error::aborted(
                    "app_writes runs once, and its transaction was to be tried again; \
                     nothing was written",
                )
            })?;
            value = Some(writes.write(AppTxRef(tx))?);
            Ok(())
        })?;
        // A job that ran after this one may be pending now.
        self.engine().wake_watchers();
        value.ok_or_else(|| Error::aborted("app_writes did not run; nothing was written"))
    }
}
