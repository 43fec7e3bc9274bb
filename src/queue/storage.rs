//! What the store under a queue is and can do, as the engine's
//! capabilities say: where it lives, its schema version, durability and
//! sync, checkpoints, write-lock waits, the change watcher, and the file's
//! permissions.

use super::ChangeWatcher;
use super::Queue;
use crate::engine::types::*;
use crate::error::Result;
use crate::metrics::WriteLockWaits;
use std::path::Path;

impl Queue {
    /// The file this queue works on; on PostgreSQL, an empty path (see
    /// [`Queue::location`]).
    pub fn path(&self) -> &Path {
        self.inner.engine.file().unwrap_or(Path::new(""))
    }

    /// Where this queue lives, for messages: the file's path, or the
    /// server's URL with its password replaced by `***` (on PostgreSQL
    /// followed by ` (through a pooler in transaction mode)` when tickler
    /// talks to one, [`crate::Pooler`]).
    pub fn location(&self) -> String {
        self.inner.engine.location()
    }

    /// See [`Ops::schema_version`](crate::Ops::schema_version).
    pub(crate) fn schema_version() -> i64 {
        crate::engine::file_schema_version_written()
    }

    /// See [`Ops::file_schema_version`](crate::Ops::file_schema_version).
    pub(crate) fn file_schema_version(path: impl AsRef<Path>) -> Result<Option<i64>> {
        crate::engine::file_schema_version(path.as_ref())
    }

    /// Makes every commit so far durable by fsyncing the `-wal` file
    /// (without taking SQLite's write lock, so writers in other threads and
    /// processes go on meanwhile). In WAL mode a commit is the frames it
    /// appended to the log; once those are on disk, recovery after a power
    /// loss replays them. Used after [`OutcomeSync::Deferred`] commits. Does
    /// nothing under [`Durability::Normal`], whose promise stops at crashes
    /// of the process.
    ///
    /// # Errors
    /// [`Error::Io`](crate::Error::Io) if the log cannot be opened or synced.
    pub fn sync(&self) -> Result<()> {
        self.engine().sync()
    }

    /// The durability of this queue's commits: on SQLite the one it was
    /// opened with ([`SqliteOptions::durability`]); on PostgreSQL
    /// [`Durability::Full`], as the server's settings make every commit
    /// durable before it is acknowledged.
    pub fn durability(&self) -> Durability {
        self.engine().durability()
    }

    /// See [`Ops::checkpoint`](crate::Ops::checkpoint).
    pub(crate) fn checkpoint(&self) -> Result<Checkpoint> {
        self.engine().checkpoint()
    }

    /// See [`Ops::write_lock_waits`](crate::Ops::write_lock_waits).
    pub(crate) fn write_lock_waits(&self) -> WriteLockWaits {
        self.engine().write_lock_waits()
    }

    /// See [`Manual::watcher`](crate::Manual::watcher).
    pub(crate) fn watcher(&self) -> Result<ChangeWatcher> {
        Ok(ChangeWatcher::new(self.engine().watcher()?))
    }

    /// See [`Ops::file_is_private`](crate::Ops::file_is_private).
    pub(crate) fn file_is_private(path: impl AsRef<Path>) -> Result<bool> {
        crate::engine::file_is_private(path.as_ref())
    }

    /// See [`Ops::is_private`](crate::Ops::is_private).
    pub(crate) fn is_private(&self) -> Result<bool> {
        match self.inner.engine.file() {
            Some(file) => Queue::file_is_private(file),
            None => Ok(true),
        }
    }

    /// See [`Ops::wal_bytes`](crate::Ops::wal_bytes).
    pub(crate) fn wal_bytes(&self) -> u64 {
        self.inner
            .engine
            .file()
            .map_or(0, crate::engine::file_wal_bytes)
    }
}
