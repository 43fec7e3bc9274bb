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
    /// PostgreSQL URL with its password replaced by `***`.
    pub fn location(&self) -> String {
        self.inner.engine.location()
    }

    /// Whether this queue lives in PostgreSQL (rather than a SQLite file).
    pub fn is_postgres(&self) -> bool {
        self.inner.engine.file().is_none()
    }

    /// The schema version this build writes (`PRAGMA user_version`).
    pub fn schema_version() -> i64 {
        crate::engine::file_schema_version_written()
    }

    /// The schema version (`PRAGMA user_version`) of the file at `path`,
    /// read without creating, migrating or otherwise changing it; `None` if
    /// there is no file. A new, empty file reads 0.
    ///
    /// # Errors
    /// [`Error::NotADatabase`] (not SQLite, or damaged), [`Error::ReadOnly`]
    /// (cannot be opened), [`Error::Sqlite`].
    pub fn file_schema_version(path: impl AsRef<Path>) -> Result<Option<i64>> {
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
    /// [`Error::Io`] if the log cannot be opened or synced.
    pub fn sync(&self) -> Result<()> {
        self.engine().sync()
    }

    /// The durability this queue was opened with.
    pub fn durability(&self) -> Durability {
        self.inner.config.durability
    }

    /// Copies the WAL into the database file and truncates the WAL: up to
    /// four PASSIVE checkpoints, then `PRAGMA wal_checkpoint(TRUNCATE)`,
    /// each step waiting up to the busy timeout for other connections'
    /// writers, readers and checkpoints. SQLite checkpoints on its own
    /// every ~1000 pages and tickler's write path truncates a WAL past
    /// 16 MiB, so this is for operators and tests. This process's writers
    /// wait for the whole call (it runs on the write connection); while the
    /// TRUNCATE step waits it holds SQLite's write lock, so every writer of
    /// the file waits with it. A reader
    /// holding an old snapshot keeps part of the WAL from being copied; this
    /// then returns at once with `complete` false (rather than holding the
    /// writers up for the whole busy timeout), and can be called again later.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if called inside
    /// [`Queue::complete_with`]; [`Error::DiskFull`] if the database file
    /// cannot grow to take the copied pages; [`Error::Sqlite`] for other
    /// SQLite failures.
    pub fn checkpoint(&self) -> Result<Checkpoint> {
        self.engine().checkpoint()
    }

    /// How long this process's write transactions (through any clone of
    /// this `Queue`) waited for the write lock so far.
    pub fn write_lock_waits(&self) -> WriteLockWaits {
        self.engine().write_lock_waits()
    }

    /// A watcher that wakes when this file may hold new claimable work: at
    /// once for commits through any clone of this `Queue`, and for commits
    /// by other processes when the operating system reports a write to the
    /// file's `-wal` file (inotify, FSEvents or kqueue), after which
    /// [`ChangeWatcher::wait`] checks `PRAGMA data_version` on its own
    /// connection (a read of shared memory, no query of the jobs table).
    /// Where no such notification is available, `wait` polls
    /// `data_version` instead.
    ///
    /// # Errors
    /// [`Error::Sqlite`] if its connection cannot be opened.
    pub fn watcher(&self) -> Result<ChangeWatcher> {
        Ok(ChangeWatcher::new(self.engine().watcher()?))
    }

    /// Whether the queue file at `path` and its `-wal` and `-shm` files
    /// (those that exist) are private to their owner: no read, write or
    /// execute permission for group or others. Jobs' payloads (a shell
    /// job's `env`, say) are readable by whoever can read these files.
    /// [`QueueBuilder::open`] logs a warning when they are not; an
    /// application that keeps secrets in payloads can refuse to go on.
    /// Always true where files have no Unix permission bits.
    ///
    /// # Errors
    /// [`Error::Io`] if `path` cannot be examined (it does not exist, or a
    /// folder on the way is not searchable).
    pub fn file_is_private(path: impl AsRef<Path>) -> Result<bool> {
        crate::engine::file_is_private(path.as_ref())
    }

    /// [`Queue::file_is_private`] for this queue's file.
    ///
    /// # Errors
    /// As [`Queue::file_is_private`].
    pub fn is_private(&self) -> Result<bool> {
        match self.inner.engine.file() {
            Some(file) => Queue::file_is_private(file),
            None => Ok(true),
        }
    }

    /// Size of the file's `-wal` file in bytes (0 if there is none).
    pub fn wal_bytes(&self) -> u64 {
        self.inner
            .engine
            .file()
            .map_or(0, crate::engine::file_wal_bytes)
    }
}
