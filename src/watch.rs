//! Wake-ups when the queue may hold new work, whatever the engine: a
//! [`ChangeWatcher`] is woken at once by commits through this process's
//! `Queue`s, and by other processes' commits through the engine's own
//! signal, behind the seam's `Watch` (SQLite: file-change notifications
//! of the `-wal` file and `PRAGMA data_version`,
//! `src/engine/sqlite/watch.rs`; PostgreSQL: `LISTEN`,
//! `src/engine/postgres/watch.rs`).

use crate::engine::Watch;
use crate::error::Result;
use crossbeam_channel::Sender;
use std::time::Duration;

/// Wakes a fetcher when the queue may hold new work; see
/// [`crate::Manual::watcher`].
#[derive(Debug)]
pub struct ChangeWatcher {
    source: Box<dyn Watch>,
    wake_tx: Sender<()>,
}

/// Wakes one [`ChangeWatcher`]; see [`ChangeWatcher::waker`].
#[derive(Debug, Clone)]
pub struct Waker(Sender<()>);

impl Waker {
    /// Makes the watcher's current or next `wait` return at once.
    pub fn wake(&self) {
        let _ = self.0.try_send(());
    }
}

impl ChangeWatcher {
    pub(crate) fn new(source: Box<dyn Watch>) -> ChangeWatcher {
        ChangeWatcher {
            wake_tx: source.wake_sender(),
            source,
        }
    }

    /// Waits up to `timeout` for a change. Returns true on a change (or a
    /// [`Waker::wake`]), false on timeout.
    ///
    /// On SQLite, commits by other processes are seen when the operating
    /// system reports a write to the `-wal` file (then `PRAGMA
    /// data_version` is checked at 1, 2, 4 … ms for up to 100 ms, until the
    /// commit is visible); an idle watcher makes no other wake-up. Where
    /// there are no file notifications, `data_version` is checked every
    /// `poll`, doubling while nothing changes up to 50 ms (or `poll`, if
    /// longer).
    ///
    /// On PostgreSQL, commits by other processes are seen through `LISTEN`
    /// (a notification sent after each commit that may make work
    /// claimable). While the listening connection is down, or when
    /// listening is turned off ([`crate::PostgresOptions::listen`]), `wait`
    /// returns true every `poll` or the builder's fallback poll, whichever
    /// is longer, so that callers look again.
    ///
    /// # Errors
    /// [`crate::Error::Sqlite`] if `PRAGMA data_version` fails.
    pub fn wait(&mut self, timeout: Duration, poll: Duration) -> Result<bool> {
        self.source.wait(timeout, poll)
    }

    /// A handle that wakes this watcher's [`ChangeWatcher::wait`] from any
    /// thread (for example to tell a sleeping fetcher to stop or that a
    /// worker slot came free).
    pub fn waker(&self) -> Waker {
        Waker(self.wake_tx.clone())
    }

    /// True if any connection committed since the last call (or since the
    /// watcher was made), as far as the engine can tell: on PostgreSQL
    /// without a live `LISTEN`, always true. Drains pending in-process
    /// wake-ups.
    ///
    /// # Errors
    /// [`crate::Error::Sqlite`] if `PRAGMA data_version` fails.
    pub fn changed(&mut self) -> Result<bool> {
        self.source.changed()
    }
}
