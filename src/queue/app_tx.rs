//! Jobs in the application's own transactions: written inside them
//! (`enqueue_tx`) and completed together with the handler's writes
//! (`complete_with`), on the engine's own connections.

use super::Queue;
use crate::error::{Error, Result};
use crate::job::{JobId, NewJob};
use crate::lease::Lease;
use rusqlite::Connection;

impl Queue {
    /// Opens a new connection to this queue's file with the settings tickler
    /// uses (WAL, `synchronous` per [`Durability`], tickler's busy handler,
    /// `foreign_keys`, and any [`QueueBuilder::on_connection`] hook), for
    /// the application's own tables and for [`Queue::enqueue_tx`]. Using it
    /// keeps the application and tickler from disagreeing about the journal
    /// mode or durability of the shared file.
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

    /// Writes `job` inside the caller's own transaction `tx`, opened on a
    /// connection to this queue's file (see [`Queue::open_connection`]): the
    /// job exists if and only if the caller commits. Closes the gap where an
    /// application commits its data and crashes before enqueueing.
    ///
    /// Same validation, errors and unique_key behaviour as
    /// [`Queue::enqueue`]. Durability is the caller's commit's. Worker pools
    /// in any process see the job once the caller commits (their watchers
    /// notice commits from every connection).
    ///
    /// Call it only through `tx`: a plain [`Queue::enqueue`] from the thread
    /// that holds an open write transaction on another connection waits for
    /// that transaction (and ends in [`Error::Busy`]).
    ///
    /// # Errors
    /// As [`Queue::enqueue`]. On a validation error nothing was written and
    /// the caller's transaction is open and usable. On [`Error::DiskFull`]
    /// SQLite has already rolled back the caller's whole transaction
    /// (nothing of it lands; its commit fails with "no transaction is
    /// active").
    pub fn enqueue_tx(&self, tx: &rusqlite::Transaction<'_>, job: NewJob) -> Result<JobId> {
        Ok(self.enqueue_batch_tx(tx, vec![job])?.remove(0))
    }

    /// [`Queue::enqueue_tx`] for several jobs: all or none, in the caller's
    /// transaction. Returns ids in input order.
    ///
    /// # Errors
    /// As [`Queue::enqueue_batch`].
    pub fn enqueue_batch_tx(
        &self,
        tx: &rusqlite::Transaction<'_>,
        jobs: Vec<NewJob>,
    ) -> Result<Vec<JobId>> {
        let now = self.now_ms();
        let rows = jobs
            .into_iter()
            .map(|job| self.validate(job, now))
            .collect::<Result<Vec<_>>>()?;
        self.engine().enqueue_in_sqlite_tx(tx, &rows, now)
    }

    /// Runs `app_writes` and marks the job succeeded in one `BEGIN
    /// IMMEDIATE` transaction on tickler's write connection: the handler's
    /// own writes to tables in this file and the job's completion commit
    /// together or not at all. If the lease was lost (reaped, cancelled),
    /// the fenced completion matches no row, the whole transaction rolls
    /// back, the application's writes too, and the caller gets
    /// [`Error::LeaseLost`].
    ///
    /// This gives exactly-once effects for effects inside this file. Effects
    /// outside it (HTTP calls, e-mail) stay at-least-once: key them by the
    /// job id or run_token.
    ///
    /// Committed with the queue's [`Durability`]. `app_writes` runs inside
    /// the write transaction, holding SQLite's write lock for the whole
    /// file: keep it short (a few statements), and do no other work in it.
    /// It must not open its own transaction nor call other `Queue` writes
    /// (they return [`Error::InvalidArgument`]; write through `tx`, e.g.
    /// [`Queue::enqueue_tx`]). It may return [`Error::Aborted`] (or any
    /// error) to roll everything back; a busy error it returns comes back
    /// as [`Error::Aborted`], not retried.
    ///
    /// # Errors
    /// [`Error::LeaseLost`]; the error `app_writes` returned; [`Error::Busy`],
    /// [`Error::DiskFull`], [`Error::Sqlite`]. On any error nothing was
    /// written.
    pub fn complete_with<T>(
        &self,
        lease: &Lease,
        app_writes: impl FnOnce(&rusqlite::Transaction<'_>) -> Result<T>,
    ) -> Result<T> {
        let mut app_writes = Some(app_writes);
        let mut value = None;
        self.engine().complete_with_sqlite(lease, &mut |tx| {
            let writes = app_writes.take().ok_or_else(|| {
                Error::aborted(
                    "the commit after app_writes was refused as busy; nothing was written",
                )
            })?;
            value = Some(writes(tx)?);
            Ok(())
        })?;
        value.ok_or_else(|| Error::aborted("app_writes did not run; nothing was written"))
    }
}

/// Jobs written and completed inside the application's own PostgreSQL
/// transactions (feature `postgres`; the `postgres` crate, version 0.19):
/// the PostgreSQL forms of [`Queue::enqueue_tx`] and
/// [`Queue::complete_with`].
#[cfg(feature = "postgres")]
impl Queue {
    /// Writes `job` inside the caller's own transaction `tx`, on a
    /// connection to this queue's database: the job exists if and only if
    /// the caller commits. Same validation, errors and unique_key behaviour
    /// as [`Queue::enqueue`]; a refused job (a validation error, or a
    /// statement the server refused) leaves `tx` usable (the insert runs in
    /// a savepoint). The transaction also gets a `NOTIFY`, which PostgreSQL
    /// delivers at commit: worker pools on every machine wake then.
    ///
    /// # Errors
    /// As [`Queue::enqueue`]; [`Error::Unsupported`] on a SQLite queue;
    /// [`Error::Postgres`] for the server's errors (not retried: the
    /// transaction is the caller's).
    pub fn enqueue_pg_tx(&self, tx: &mut postgres::Transaction<'_>, job: NewJob) -> Result<JobId> {
        Ok(self.enqueue_batch_pg_tx(tx, vec![job])?.remove(0))
    }

    /// [`Queue::enqueue_pg_tx`] for several jobs: all or none, in the
    /// caller's transaction. Returns ids in input order.
    ///
    /// # Errors
    /// As [`Queue::enqueue_pg_tx`].
    pub fn enqueue_batch_pg_tx(
        &self,
        tx: &mut postgres::Transaction<'_>,
        jobs: Vec<NewJob>,
    ) -> Result<Vec<JobId>> {
        let now = self.now_ms();
        let rows = jobs
            .into_iter()
            .map(|job| self.validate(job, now))
            .collect::<Result<Vec<_>>>()?;
        self.engine().enqueue_in_pg_tx(tx, &rows)
    }

    /// Runs `app_writes` and marks the job succeeded in one transaction on
    /// one of tickler's connections: the handler's writes to the database
    /// and the job's completion commit together or not at all. If the
    /// lease was lost, the fenced completion matches no row, everything
    /// rolls back and the caller gets [`Error::LeaseLost`]. `app_writes`
    /// runs once: this is not retried through a lost connection (an error
    /// during the commit leaves it unknown whether it committed; the
    /// job's next outcome then says so with [`Error::LeaseLost`]).
    ///
    /// # Errors
    /// [`Error::LeaseLost`]; the error `app_writes` returned;
    /// [`Error::Postgres`]; [`Error::Unsupported`] on a SQLite queue. On
    /// any error but one during the commit itself, nothing was written.
    pub fn complete_with_pg<T>(
        &self,
        lease: &Lease,
        app_writes: impl FnOnce(&mut postgres::Transaction<'_>) -> Result<T>,
    ) -> Result<T> {
        let mut app_writes = Some(app_writes);
        let mut value = None;
        self.engine().complete_with_pg(lease, &mut |tx| {
            let writes = app_writes
                .take()
                .ok_or_else(|| Error::aborted("app_writes runs once; nothing more was written"))?;
            value = Some(writes(tx)?);
            Ok(())
        })?;
        value.ok_or_else(|| Error::aborted("app_writes did not run; nothing was written"))
    }
}
